//! The NIC's TX pipeline alone against `dpdk-testpmd --forward-mode=txonly`
//! on the same `net_null` vdev, alternating in the same run, one core each
//! (docs/design.md §9: ratios in one run).
//!
//! - testpmd txonly: per burst of 32, `rte_mempool_get_bulk`, then per
//!   packet a reset and a copy of its prebuilt 42-byte Ethernet/IPv4/UDP
//!   template (no per-packet field changes, no CRC; 64 B frames), then
//!   `rte_eth_tx_burst` (net_null frees the mbufs).
//! - ours: a stream of RoCEv2 RDMA WRITE Only packets from one QP, as the
//!   NIC's TX pipeline builds them: per burst of 32, one
//!   `Mempool::alloc_bulk`, then per packet `nic::io::fill_frame_tpl` with the
//!   QP's `rdma::wire::HeaderTemplate` (headers copied from the template, IPv4
//!   length/checksum, UDP length, BTH opcode/pad/PSN and RETH written, the
//!   1-byte payload copied, the ICRC from the template's precomputed state),
//!   then one `TxQueue::send`. Each packet has the next PSN, a RETH VA one
//!   byte further and its own payload byte (a 1-byte WRITE, perftest's
//!   smallest message: 70 B of headers + 1 + 3 pad + 4 ICRC = 78 B).
//!   Correctness is checked while measuring: the first packet of every 1024th
//!   burst is parsed by `rdma::wire::parse_frame` with ICRC verification and
//!   its PSN, VA and payload compared with what was asked; any failure aborts
//!   the benchmark.
//!
//! `cargo bench -p bench --bench tx_pipeline` (TXP_SECS per side and round,
//! default 6; TXP_ROUNDS, default 2; TXP_PATH=frame measures the general
//! `nic::io::build_frame` path instead of the template).

use bench::testpmd::{median, Rounds};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{lcore, Burst, Mempool, Port};
use nic::io::{build_frame, fill_frame_tpl, Payload, TxPools};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::RethRepr;
use rdma::wire::{
    bth, parse_frame, BthRepr, Ecn, EthernetAddress, HeaderTemplate, Ipv4Address, Opcode,
    ParseOptions,
};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs = env("TXP_SECS", 6).max(3);
    let rounds = env("TXP_ROUNDS", 2).max(1);
    let use_tpl = std::env::var("TXP_PATH").map_or(true, |p| p != "frame");
    let cores = lcore::available_cores();
    let (main_core, tx_core) = (*cores.first().unwrap(), *cores.last().unwrap());
    let lcores = format!("{main_core},{tx_core}");
    let mut tp_eal: Vec<&str> = vec!["-l", &lcores];
    tp_eal.extend_from_slice(&["--vdev", "net_null0"]);
    let tp_app = [
        "--forward-mode=txonly",
        "--txpkts=64",
        "--nb-cores=1",
        "--burst=32",
        "--txd=1024",
        "--mbcache=250",
    ];

    let (eal, mem) = bench::memory::init_eal("tx_pipeline", 128, 1024);
    let hdr_pool = Mempool::new(eal, "txp_hdr", 16384, 250, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let bare_pool = Mempool::new(eal, "txp_bare", 1024, 32, 0).unwrap();
    let mut port = Port::open(eal, "net_null0").expect("net_null0");
    let (_rx, tx) = port.configure_single(&hdr_pool).expect("configure");
    let mut tx = Some(tx);

    println!(
        "TX pipeline ({}): valid 1-byte RoCEv2 WRITE Only frames into net_null, 1 core, burst 32, {secs} s per side, {rounds} rounds, ours on {mem}",
        if use_tpl { "header template, nic::io::fill_frame_tpl" } else { "nic::io::build_frame" }
    );
    let mut report = Rounds::new("dpdk-testpmd txonly");
    for round in 1..=rounds {
        // testpmd txonly reports Tx-pps; the parser reads Rx-pps lines, so
        // count its TX side by running the same parser on Tx-pps.
        let tp = bench::testpmd::run_tx(&tp_eal, &tp_app, secs).unwrap_or_else(|e| panic!("{e}"));
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let checked = Arc::new(AtomicU64::new(0));
        let (c2, s2, c3) = (count.clone(), stop.clone(), checked.clone());
        let (hdr2, bare2) = (hdr_pool.clone(), bare_pool.clone());
        let mut txq = tx.take().unwrap();
        let worker = lcore::spawn_pinned(eal, "txp", Some(tx_core), move || {
            // The TX mbufs of this thread, as an engine has its own.
            let mut pools2 = TxPools::new(hdr2, bare2, nic::io::COPY_THRESHOLD).expect("TX pools");
            let fb = FrameBuilder {
                net: NetHeaders {
                    src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
                    dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
                    src_ip: Ipv4Address([10, 0, 0, 1]),
                    dst_ip: Ipv4Address([10, 0, 0, 2]),
                    udp_src_port: 0xC011,
                    dscp: 26,
                    ttl: 64,
                },
                int: None,
            };
            // 14 + 20 + 8 + 12 + 16 = 70 B of headers + 4 B ICRC already
            // exceed 64 B: the smallest valid WRITE carries no payload.
            // Use a 1-byte WRITE, as perftest's smallest message.
            const QPN: u32 = 0x12;
            let tpl = HeaderTemplate::new(fb, QPN, bth::DEFAULT_PKEY).expect("template");
            let mut burst: Burst = Burst::new();
            let mut psn = 0u32;
            let mut va = 0x1000u64;
            let mut sent = 0u64;
            let mut bursts = 0u64;
            let mut checked = 0u64;
            let opts = ParseOptions::default();
            while !s2.load(Ordering::Relaxed) {
                let first = burst.len();
                // All or nothing: on an exhausted pool, send what is left.
                if use_tpl && pools2.hdr.pool().alloc_bulk(&mut burst).is_ok() {
                    let mut bad = burst.len();
                    for (k, m) in burst.as_mut_slice()[first..].iter_mut().enumerate() {
                        let payload = [psn as u8];
                        let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, QPN, psn));
                        pkt.reth = Some(RethRepr {
                            va,
                            rkey: 0x100,
                            dma_len: 1,
                        });
                        if fill_frame_tpl(
                            m,
                            &tpl,
                            &pkt,
                            Ecn::Ect0,
                            Payload::Copy(&payload),
                            &mut pools2,
                        )
                        .is_err()
                        {
                            bad = first + k;
                            break;
                        }
                        psn = (psn + 1) & 0xFF_FFFF;
                        va += 1;
                    }
                    while burst.len() > bad {
                        burst.pop();
                    }
                } else if !use_tpl {
                    while !burst.is_full() {
                        let payload = [psn as u8];
                        let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, QPN, psn));
                        pkt.reth = Some(RethRepr {
                            va,
                            rkey: 0x100,
                            dma_len: 1,
                        });
                        match build_frame(
                            &fb,
                            &pkt,
                            Ecn::Ect0,
                            Payload::Copy(&payload),
                            &mut pools2,
                        ) {
                            Ok(m) => {
                                let _ = burst.push(m);
                            }
                            Err(_) => break,
                        }
                        psn = (psn + 1) & 0xFF_FFFF;
                        va += 1;
                    }
                }
                bursts += 1;
                if bursts % 1024 == 1 && first < burst.len() {
                    // The packet built first in this burst carries PSN/VA
                    // (burst.len() - first) steps back.
                    let back = (burst.len() - first) as u32;
                    let want_psn = psn.wrapping_sub(back) & 0xFF_FFFF;
                    let want_va = va - u64::from(back);
                    let f = parse_frame(burst.as_slice()[first].data(), &opts, |_| false)
                        .unwrap_or_else(|e| panic!("invalid frame built: {e}"));
                    let r = f.reth.expect("RETH");
                    assert!(
                        f.bth.opcode == Opcode::WriteOnly
                            && f.bth.psn == want_psn
                            && r.va == want_va
                            && f.payload == [want_psn as u8],
                        "wrong frame: PSN {} (want {want_psn}), VA {:#x} (want {want_va:#x})",
                        f.bth.psn,
                        r.va
                    );
                    checked += 1;
                }
                sent += txq.send(&mut burst) as u64;
                c2.store(sent, Ordering::Relaxed);
            }
            c3.store(checked, Ordering::Relaxed);
            burst.clear();
            txq
        })
        .unwrap();
        let mut rates = Vec::new();
        let mut last = (Instant::now(), 0u64);
        for _ in 0..secs {
            std::thread::sleep(Duration::from_secs(1));
            let now = (Instant::now(), count.load(Ordering::Relaxed));
            rates.push((now.1 - last.1) as f64 / now.0.duration_since(last.0).as_secs_f64());
            last = now;
        }
        stop.store(true, Ordering::Relaxed);
        tx = Some(worker.join().unwrap());
        let mpps = median(rates.into_iter().skip(1).collect()) / 1e6;
        let checked = checked.load(Ordering::Relaxed);
        assert!(checked > 0, "no built frame was verified");
        report.record(round, &tp, mpps, &format!(" ({checked} frames verified)"));
    }
    report.finish();
}
