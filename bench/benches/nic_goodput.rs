//! Single-QP RDMA WRITE goodput between two NIC engines back to back on a
//! ring pair, 64 KiB messages, 64 outstanding, for each congestion control.
//! Both engines run on one poll-mode core (`Device::open_group`) and the
//! benchmark thread, which only posts and polls, has the other;
//! GOODPUT_LAYOUT=split gives each engine its own core instead (the thread
//! then shares one).
//!
//! `cargo bench -p bench --bench nic_goodput` (GOODPUT_SECS per CC, default
//! 5; GOODPUT_CC, a comma list, default all; GOODPUT_MSG bytes, default 65536).

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{lcore, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

fn main() {
    let secs: u64 = std::env::var("GOODPUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let msg: usize = std::env::var("GOODPUT_MSG")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(65536);
    let kinds: Vec<CcKind> = match std::env::var("GOODPUT_CC") {
        Ok(s) => s.split(',').map(|k| k.parse().expect("cc kind")).collect(),
        Err(_) => CcKind::ALL.to_vec(),
    };
    let (eal, mem) = bench::memory::init_eal("nic_goodput", 256, 1024);
    let cores = lcore::available_cores();
    // GOODPUT_LAYOUT=split: one engine per core (the layout of two hosts);
    // default group: both engines on one core (Device::open_group), the
    // benchmark thread pinned to the other, as `roce-perf --loopback` runs.
    let grouped = std::env::var("GOODPUT_LAYOUT").map_or(true, |v| v != "split");
    if grouped && cores.len() > 1 {
        lcore::pin_current(cores[0]);
    }
    println!(
        "single-QP RDMA WRITE goodput, ring pair, {msg} B messages, 64 outstanding, {secs} s per CC, engines {}, memory: {mem}",
        if grouped { "on one core" } else { "one per core" }
    );
    for (n, kind) in kinds.into_iter().enumerate() {
        let (pa, pb) = Port::ring_pair(eal, &format!("gp{n}"), 4096).unwrap();
        let (a, b) = if grouped {
            // Both engines on one poll-mode thread on the last core; this
            // thread has the first.
            let mut devs = Device::open_group(
                eal,
                vec![
                    (pa, DeviceConfig::new([10, 0, 0, 1])),
                    (pb, DeviceConfig::new([10, 0, 0, 2])),
                ],
                cores.last().copied(),
            )
            .unwrap();
            let b = devs.pop().unwrap();
            (devs.pop().unwrap(), b)
        } else {
            // One engine per core; this thread shares a core with one.
            let mut ca = DeviceConfig::new([10, 0, 0, 1]);
            ca.core = cores.first().copied();
            let mut cb = DeviceConfig::new([10, 0, 0, 2]);
            cb.core = cores.last().copied();
            (
                Device::open(eal, pa, ca).unwrap(),
                Device::open(eal, pb, cb).unwrap(),
            )
        };
        let mut cqa = a.create_cq(1024).unwrap();
        let cqb = b.create_cq(1024).unwrap();
        let opts = QpOptions {
            cc: kind,
            ..QpOptions::default()
        };
        let mut qa = a.create_qp(&cqa, &cqa, opts).unwrap();
        let mut qb = b.create_qp(&cqb, &cqb, opts).unwrap();
        qa.connect(&qb.remote_info()).unwrap();
        qb.connect(&qa.remote_info()).unwrap();
        let buf = 16 << 20;
        let src = a.reg_mr(buf, Access::LOCAL_WRITE).unwrap();
        let dst = b
            .reg_mr(buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let slots = buf / msg;
        let (mut posted, mut done) = (0u64, 0u64);
        let mut warm_at: Option<(Instant, u64)> = None;
        let start = Instant::now();
        loop {
            while posted - done < 64 {
                let off = ((posted as usize) % slots * msg) as u64;
                qa.post_send(SendWr {
                    wr_id: posted,
                    op: SendOp::Write {
                        remote_va: dst.va() + off,
                        rkey: dst.rkey(),
                    },
                    sge: Sge {
                        addr: src.va() + off,
                        len: msg as u32,
                        lkey: src.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
                posted += 1;
            }
            match cqa.poll_one() {
                Some(wc) => {
                    assert_eq!(wc.status, WcStatus::Success);
                    done += 1;
                }
                None => std::thread::sleep(Duration::from_micros(50)),
            }
            let el = start.elapsed();
            if warm_at.is_none() && el > Duration::from_secs(1) {
                warm_at = Some((Instant::now(), done));
            }
            if el > Duration::from_secs(secs + 1) {
                break;
            }
        }
        let (t0, d0) = warm_at.unwrap();
        let gbps = (done - d0) as f64 * msg as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9;
        let c = a.counters();
        println!(
            "  {:<8} {gbps:7.2} Gbit/s goodput ({} retransmits, {} timeouts)",
            kind.as_str(),
            c.retransmits,
            c.timeouts
        );
        drop((qa, qb));
        a.close();
        b.close();
    }
}
