//! A device whose QPs are sharded over several engines (one lcore each),
//! with a dispatcher that owns the port (nic::shard): QPs on every shard move
//! data by WRITE and READ, contents verified, against a sharded and an
//! unsharded peer; both shards carry traffic; a QP whose CQs are on two
//! shards is refused.

mod support;

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Eal, Port};
use nic::verbs::{CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair};
use rdma::transport::{SendOp, SendWr, Sge, WcStatus};

const QPS: usize = 4;
const BUF: usize = 1 << 20;
const MSG: usize = 64 << 10;

fn config(ip: u8) -> DeviceConfig {
    let mut c = DeviceConfig::new([10, 0, 0, ip]);
    // Two devices of up to three threads each on a 2-core machine.
    c.idle_yield = true;
    c.pool_size = 4095;
    c
}

/// One QP of A and its peer on B, with A's CQ; the flow uses its own
/// `BUF` window (at `off`) of the two regions every flow shares, so QPs on
/// both shards send from the same registered memory at once.
struct Flow {
    qa: QueuePair,
    _qb: QueuePair,
    cq: CompletionQueue,
    _cq_b: CompletionQueue,
    off: usize,
}

/// A's region and B's, shared by the flows.
struct Regions {
    local: MemoryRegion,
    remote: MemoryRegion,
}

fn regions(a: &Device, b: &Device) -> Regions {
    Regions {
        local: a.reg_mr(QPS * BUF, support::ALL).unwrap(),
        remote: b.reg_mr(QPS * BUF, support::ALL).unwrap(),
    }
}

fn flows(a: &Device, b: &Device, cc: CcKind) -> Vec<Flow> {
    (0..QPS)
        .map(|k| {
            let (cq, cq_b) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
            let (qa, qb) = support::connect_qps(a, b, &cq, &cq_b, support::with_cc(cc));
            Flow {
                qa,
                _qb: qb,
                cq,
                _cq_b: cq_b,
                off: k * BUF,
            }
        })
        .collect()
}

fn pattern(flow: usize, pass: usize) -> Vec<u8> {
    (0..BUF)
        .map(|i| (i.wrapping_mul(31) ^ flow.wrapping_mul(7) ^ pass) as u8)
        .collect()
}

/// Every flow WRITEs its local buffer into the remote one, then READs it
/// back into the (cleared) local one, all flows at once; contents checked.
fn write_then_read(fl: &mut [Flow], r: &Regions) {
    for (k, f) in fl.iter().enumerate() {
        r.local.write(f.off, &pattern(k, 1));
    }
    for read in [false, true] {
        if read {
            for f in fl.iter() {
                r.local.write(f.off, &vec![0u8; BUF]);
            }
        }
        for f in fl.iter_mut() {
            for m in 0..BUF / MSG {
                let off = (f.off + m * MSG) as u64;
                let op = if read {
                    SendOp::Read {
                        remote_va: r.remote.va() + off,
                        rkey: r.remote.rkey(),
                    }
                } else {
                    SendOp::Write {
                        remote_va: r.remote.va() + off,
                        rkey: r.remote.rkey(),
                    }
                };
                f.qa.post_send(SendWr {
                    wr_id: m as u64,
                    op,
                    sge: Sge {
                        addr: r.local.va() + off,
                        len: MSG as u32,
                        lkey: r.local.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for (k, f) in fl.iter_mut().enumerate() {
            for m in 0..BUF / MSG {
                let left = deadline.saturating_duration_since(Instant::now());
                let wc = f.cq.wait(left).unwrap_or_else(|| {
                    panic!(
                        "flow {k}: no completion {m} ({})",
                        f.qa.describe().unwrap_or_default()
                    )
                });
                assert_eq!(wc.status, WcStatus::Success, "flow {k}: {wc:?}");
                assert_eq!(wc.wr_id, m as u64, "flow {k}: completions in order");
            }
        }
        for (k, f) in fl.iter().enumerate() {
            let mut got = vec![0u8; BUF];
            if read {
                r.local.read(f.off, &mut got);
            } else {
                r.remote.read(f.off, &mut got);
            }
            assert!(
                got == pattern(k, 1),
                "flow {k}: {} differs",
                if read { "READ" } else { "WRITE" }
            );
        }
    }
}

/// How the two ends of a test are laid out.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// One queue pair per port: both ends sharded behind dispatchers.
    Dispatchers,
    /// One queue pair per port: A sharded, B one engine.
    Unsharded,
    /// A queue pair per shard on both ends, QPs on the same shard at both
    /// ends (frames arrive on their own shard's queue).
    Queues,
    /// A queue pair per shard, each QP's peer on the other shard: every
    /// frame arrives on the wrong shard's queue and is steered.
    QueuesCrossed,
}

#[test]
fn qps_on_every_shard_write_and_read_against_sharded_and_unsharded_peers() {
    let eal = Eal::for_tests();
    // HPCC puts an INT container on data (the dispatcher steers past it, in
    // the header segment of chained frames); DCQCN does not.
    for (name, layout, cc) in [
        ("shard_ss", Layout::Dispatchers, CcKind::Hpcc),
        ("shard_su", Layout::Unsharded, CcKind::Dcqcn),
        ("shard_qq", Layout::Queues, CcKind::Hpcc),
        ("shard_qx", Layout::QueuesCrossed, CcKind::Dcqcn),
    ] {
        let queues = matches!(layout, Layout::Queues | Layout::QueuesCrossed);
        let (pa, pb) = Port::ring_pair_queues(eal, name, 4096, if queues { 2 } else { 1 }).unwrap();
        let a = Device::open_sharded(eal, pa, config(1), &[None, None]).unwrap();
        let b = if layout == Layout::Unsharded {
            Device::open(eal, pb, config(2)).unwrap()
        } else {
            Device::open_sharded(eal, pb, config(2), &[None, None]).unwrap()
        };
        assert_eq!(a.shards(), 2);
        assert_eq!(a.has_dispatcher(), !queues, "{layout:?}");
        // Crossed: B's CQs (and so its QPs) start on its other shard.
        let _offset = (layout == Layout::QueuesCrossed).then(|| b.create_cq(1).unwrap());
        let mut fl = flows(&a, &b, cc);
        let r = regions(&a, &b);
        // CQs go round robin: the QPs are on both shards, in QPN ranges apart.
        let mut qpns: Vec<u32> = fl.iter().map(|f| f.qa.qpn()).collect();
        qpns.sort_unstable();
        assert!(
            qpns[QPS - 1] - qpns[0] >= nic::engine::MAX_QPS as u32,
            "{qpns:x?}"
        );
        // Several rounds: the race a shared region invites (two shards
        // attaching mbufs to it at once) needs many chances.
        for _ in 0..8 {
            write_then_read(&mut fl, &r);
        }
        // Counters are published about every millisecond.
        std::thread::sleep(Duration::from_millis(20));
        let per_shard = a.shard_counters();
        for (k, c) in per_shard.iter().enumerate() {
            assert!(
                c.tx_data_packets > 0 && c.rx_data_packets > 0,
                "{layout:?}: shard {k} carried nothing: {c:?}"
            );
        }
        let total = a.counters();
        // Crossed, every frame is steered once at its receiver; aligned,
        // none but the peer's gratuitous ARP (on its shard 1's queue).
        let steered = total.rx_steered + b.counters().rx_steered;
        match layout {
            Layout::QueuesCrossed => assert!(
                steered >= total.rx_data_packets,
                "{steered} steered of {total}"
            ),
            _ => assert!(steered <= 2, "{layout:?}: {steered} frames steered"),
        }
        assert_eq!(
            total.tx_data_packets,
            per_shard.iter().map(|c| c.tx_data_packets).sum::<u64>()
        );
        assert_eq!(total.rx_drop_icrc + total.rx_drop_malformed, 0);
        assert_eq!(total.rx_drop_unknown_qp, 0, "{total}");
        drop((fl, r));
        a.close();
        b.close();
    }
}

#[test]
fn a_qp_whose_cqs_are_on_two_shards_is_refused() {
    let eal = Eal::for_tests();
    let (pa, _pb) = Port::ring_pair(eal, "shard_cq", 1024).unwrap();
    let a = Device::open_sharded(eal, pa, config(1), &[None, None]).unwrap();
    let (c0, c1) = (a.create_cq(16).unwrap(), a.create_cq(16).unwrap());
    let err = a
        .create_qp(&c0, &c1, QpOptions::default())
        .err()
        .expect("CQs on two shards must be refused");
    assert!(err.to_string().contains("shard"), "{err}");
    assert!(a.create_qp(&c1, &c1, QpOptions::default()).is_ok());
    let mut cfg = config(1);
    cfg.pcap = Some(std::env::temp_dir().join("never.pcapng"));
    let (pc, _pd) = Port::ring_pair(eal, "shard_pcap", 1024).unwrap();
    assert!(Device::open_sharded(eal, pc, cfg, &[None]).is_err());
    let (pe, _pf) = Port::ring_pair(eal, "shard_none", 1024).unwrap();
    assert!(Device::open_sharded(eal, pe, config(1), &[]).is_err());
}

/// Waits until `dev`'s dispatcher has parked more than `than` times.
fn dispatcher_parked(dev: &Device, than: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let n = dev
            .dispatcher_counters()
            .expect("a dispatcher")
            .engine_parks;
        if n > than {
            return n;
        }
        assert!(Instant::now() < end, "the idle dispatcher never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// An idle dispatcher parks (nic::shard), and so do its shards; a WRITE or
/// READ posted while all of them sleep still completes: the doorbell wakes
/// the shard, the shard handing a frame to its dispatcher wakes that, the
/// peer's dispatcher finds the frame on its port within its bounded park
/// and wakes the peer's shard. A lost wake-up between a dispatcher and a
/// shard leaves a frame in a ring with nobody turning it: the wait fails.
#[test]
fn idle_dispatchers_park_and_frames_still_cross_them() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "shard_park", 4096).unwrap();
    let a = Device::open_sharded(eal, pa, config(1), &[None, None]).unwrap();
    let b = Device::open_sharded(eal, pb, config(2), &[None, None]).unwrap();
    assert!(a.has_dispatcher() && b.has_dispatcher());
    let mut fl = flows(&a, &b, CcKind::Dcqcn);
    let r = regions(&a, &b);
    let (mut pa_seen, mut pb_seen) = (0, 0);
    for i in 0..12usize {
        // Both dispatchers idle long enough to have parked since the last
        // message.
        pa_seen = dispatcher_parked(&a, pa_seen);
        pb_seen = dispatcher_parked(&b, pb_seen);
        let k = i % QPS;
        let f = &mut fl[k];
        let off = (f.off + i * 64) as u64;
        let read = i % 3 == 2;
        let want = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes();
        if read {
            r.remote.write(off as usize, &want);
        } else {
            r.local.write(off as usize, &want);
        }
        let op = if read {
            SendOp::Read {
                remote_va: r.remote.va() + off,
                rkey: r.remote.rkey(),
            }
        } else {
            SendOp::Write {
                remote_va: r.remote.va() + off,
                rkey: r.remote.rkey(),
            }
        };
        let sge = Sge {
            addr: r.local.va() + off,
            len: 8,
            lkey: r.local.lkey(),
        };
        if read {
            r.local.write(off as usize, &[0; 8]);
        }
        f.qa.post_send(SendWr {
            wr_id: i as u64,
            op,
            sge,
            signaled: true,
            solicited: false,
        })
        .unwrap();
        let wc = f
            .cq
            .wait(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("message {i} on flow {k}: no completion (a lost wake-up?)"));
        assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        let mut got = [0u8; 8];
        if read {
            r.local.read(off as usize, &mut got);
        } else {
            r.remote.read(off as usize, &mut got);
        }
        assert_eq!(
            got,
            want,
            "message {i} ({})",
            if read { "READ" } else { "WRITE" }
        );
    }
    let total = a.counters();
    assert_eq!(total.rx_drop_shard_full, 0, "{total}");
    drop((fl, r));
    a.close();
    b.close();
}

/// The shards of a device send on one port, so together they keep to its
/// line rate (nic::port_shaper::SharedLine): two QPs on two shards, each
/// paced at the line rate by itself, WRITE 2 MiB each at once; the whole
/// transfer cannot take less than 4 MiB's time on the line. (Each shard at
/// the line rate on its own would finish in half that time. A slow machine
/// only makes it take longer.)
#[test]
fn shards_share_the_port_line_rate() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair_queues(eal, "shard_line", 4096, 2).unwrap();
    let mut cfg = config(1);
    cfg.line_rate_bps = 1_000_000_000;
    let a = Device::open_sharded(eal, pa, cfg, &[None, None]).unwrap();
    // Queue k at one end is cabled to queue k at the other: B has a shard
    // per queue too.
    let b = Device::open_sharded(eal, pb, config(2), &[None, None]).unwrap();
    assert!(!a.has_dispatcher());
    let mut fl = flows(&a, &b, CcKind::None);
    let r = regions(&a, &b);
    // Two flows, on the two shards (CQs go round robin).
    let per_flow = 2usize << 20;
    let mut used = Vec::new();
    let start = Instant::now();
    for (k, f) in fl.iter_mut().enumerate().take(2) {
        for m in 0..per_flow / MSG {
            let off = (k * per_flow + m * MSG) as u64;
            let wr = support::write_wr(m as u64, &r.local, off, &r.remote, off, MSG as u32);
            f.qa.post_send(wr).unwrap();
        }
        used.push(f.qa.qpn());
    }
    for (k, f) in fl.iter_mut().enumerate().take(2) {
        for m in 0..per_flow / MSG {
            let wc =
                f.cq.wait(Duration::from_secs(30))
                    .unwrap_or_else(|| panic!("flow {k}: no completion {m}"));
            assert_eq!(wc.status, WcStatus::Success, "flow {k}: {wc:?}");
        }
    }
    let took = start.elapsed();
    assert!(
        used[1].abs_diff(used[0]) >= nic::engine::MAX_QPS as u32,
        "both flows on one shard: {used:x?}"
    );
    let line_time = Duration::from_secs_f64((2 * per_flow * 8) as f64 / 1e9);
    assert!(
        took.as_secs_f64() >= 0.95 * line_time.as_secs_f64(),
        "4 MiB in {took:?}: faster than the line ({line_time:?} at 1 Gbit/s)"
    );
    drop((fl, r));
    a.close();
    b.close();
}
