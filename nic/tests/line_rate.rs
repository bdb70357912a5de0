//! A NIC without congestion control (CC `none`) stays a good citizen:
//! - its QPs together never send faster than its line rate
//!   (`DeviceConfig::line_rate_bps`, crate::port_shaper), although each is
//!   paced at the line rate;
//! - into a slow peer (a 1 Gbit/s link with a 512 KiB queue that drops what
//!   does not fit, crate::impair::run_throttled) it backs off on go-back-N
//!   rounds (crate::gbn_backoff), so that under 10 % of what it sends is
//!   retransmitted (without the backoff, most of it is).
//!
//! - with many QPs, each 64 KiB WRITE is acknowledged about once: the
//!   scheduler's quantum keeps a message's packets together
//!   (`sched::scheduler::NIC_QUANTUM_BYTES`).
//!
//! The bounds are on counters and upper bounds on a rate: a loaded host
//! can only make the NIC slower, never faster.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Eal, Port};
use impair::{run_throttled, ImpairCounters, Throttle, ThrottledPath};
use nic::verbs::{CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

/// Posts `total` bytes of WRITEs of `msg` bytes from `src` to `dst` on
/// every QP in turn, at most `depth` outstanding per QP, and waits for all.
fn write_all(
    dev: &Device,
    qps: &mut [QueuePair],
    cq: &mut CompletionQueue,
    (src, dst): (&MemoryRegion, &MemoryRegion),
    total: usize,
    msg: usize,
    depth: usize,
) {
    let n = total / msg;
    let (mut posted, mut done) = (0, 0);
    let mut outstanding = vec![0usize; qps.len()];
    let end = Instant::now() + Duration::from_secs(180);
    while done < n {
        assert!(
            Instant::now() < end,
            "stalled at {done}/{n}: {:?}\n{}",
            qps.iter().map(|q| q.describe()).collect::<Vec<_>>(),
            dev.counters()
        );
        for (k, qp) in qps.iter_mut().enumerate() {
            if posted < n && outstanding[k] < depth {
                let off = (posted * msg) % dst.len();
                qp.post_send(SendWr {
                    wr_id: k as u64,
                    op: SendOp::Write {
                        remote_va: dst.va() + off as u64,
                        rkey: dst.rkey(),
                    },
                    sge: Sge {
                        addr: src.va() + off as u64,
                        len: msg as u32,
                        lkey: src.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
                posted += 1;
                outstanding[k] += 1;
            }
        }
        while let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success);
            outstanding[wc.wr_id as usize] -= 1;
            done += 1;
        }
        std::thread::yield_now();
    }
}

/// Two NICs on a ring pair (A's line at `line_bps`, if given) with `n`
/// connected QP pairs of `opts`, A's on one CQ, and a 4 MiB region on each
/// side (A's to read, B's to write). Hold it whole: a field left out of a
/// destructuring is dropped at once, and B's QPs with it.
struct Pairs {
    a: Device,
    b: Device,
    src: MemoryRegion,
    dst: MemoryRegion,
    cq: CompletionQueue,
    senders: Vec<QueuePair>,
    _receivers: Vec<QueuePair>,
    _cq_b: CompletionQueue,
}

fn pairs(name: &str, line_bps: Option<u64>, n: usize, opts: QpOptions) -> Pairs {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, name, 4096).unwrap();
    let mut ca = DeviceConfig::new([10, 0, 0, 1]);
    if let Some(l) = line_bps {
        ca.line_rate_bps = l;
    }
    let a = Device::open(eal, pa, ca).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let src = a.reg_mr(4 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(4 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let cq = a.create_cq(256).unwrap();
    let cq_b = b.create_cq(256).unwrap();
    let (mut senders, mut receivers) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let mut qa = a.create_qp(&cq, &cq, opts).unwrap();
        let mut qb = b.create_qp(&cq_b, &cq_b, opts).unwrap();
        qa.connect(&qb.remote_info()).unwrap();
        qb.connect(&qa.remote_info()).unwrap();
        senders.push(qa);
        receivers.push(qb);
    }
    Pairs {
        a,
        b,
        src,
        dst,
        cq,
        senders,
        _receivers: receivers,
        _cq_b: cq_b,
    }
}

fn pattern(mr: &MemoryRegion) -> Vec<u8> {
    let p: Vec<u8> = (0..mr.len()).map(|i| (i * 13 + 5) as u8).collect();
    mr.write(0, &p);
    p
}

#[test]
fn qps_together_never_exceed_the_line_rate() {
    // 4 QPs without CC are not paced (`QpCore::pacing_rate`): the port's
    // shaper alone holds them to the line rate together.
    const LINE: u64 = 200_000_000;
    const TOTAL: usize = 16 << 20;
    let mut p = pairs("linerate", Some(LINE), 4, QpOptions::default());
    let before = p.a.counters().tx_bytes;
    let t0 = Instant::now();
    write_all(
        &p.a,
        &mut p.senders,
        &mut p.cq,
        (&p.src, &p.dst),
        TOTAL,
        64 << 10,
        4,
    );
    let elapsed = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(5));
    let sent = p.a.counters().tx_bytes - before;
    // Frames only (preamble, gap and FCS not counted), minus the bucket the
    // shaper may spend at once: at most the line rate.
    let rate = (sent.saturating_sub(64 << 10) * 8) as f64 / elapsed;
    let c = p.a.counters();
    eprintln!(
        "4 QPs, CC none, line rate {} Gbit/s: {:.3} Gbit/s of frames ({sent} B in {elapsed:.3} s); \
         {} retransmits, {} timeouts, {} go-back-N backoffs",
        LINE as f64 / 1e9,
        rate / 1e9,
        c.retransmits,
        c.timeouts,
        c.gbn_backoffs
    );
    assert!(sent >= TOTAL as u64, "{sent}");
    assert!(rate <= LINE as f64, "{:.3} Gbit/s", rate / 1e9);
}

/// 32 QPs without CC, one 64 KiB WRITE each in flight, at path MTUs 4096
/// and 1024: the receiver acknowledges each message about once per RX burst
/// its packets fill (one burst at 4096, two at 1024; a message that
/// straddles one more gets one more ACK). With a quantum that a message's
/// last frames did not fit in, they waited for the round robin's next
/// turn, after every other QP's message: one ACK more a message, or two.
#[test]
fn with_many_qps_a_64_kib_write_is_acknowledged_about_once() {
    const QPS: usize = 32;
    const MSG: usize = 64 << 10;
    for mtu in [4096, 1024] {
        let opts = QpOptions {
            mtu,
            ..QpOptions::default()
        };
        let mut p = pairs(&format!("acks{mtu}"), None, QPS, opts);
        let acks_before = p.b.counters().tx_acks;
        let msgs = 16 * QPS;
        write_all(
            &p.a,
            &mut p.senders,
            &mut p.cq,
            (&p.src, &p.dst),
            msgs * MSG,
            MSG,
            1,
        );
        let acks = p.b.counters().tx_acks - acks_before;
        let per_msg = acks as f64 / msgs as f64;
        let bursts = (MSG / mtu as usize).div_ceil(dpdk::BURST_SIZE);
        eprintln!(
            "MTU {mtu}: {acks} ACKs for {msgs} messages of 64 KiB on {QPS} QPs \
             ({per_msg:.2} each, {bursts} RX bursts a message)"
        );
        assert!(acks >= msgs as u64, "every message is acknowledged");
        assert!(
            per_msg < bursts as f64 + 0.75,
            "MTU {mtu}: {per_msg:.2} ACKs a message"
        );
    }
}

#[test]
fn without_cc_the_nic_backs_off_from_a_slow_peer() {
    const TOTAL: usize = 48 << 20;
    let eal = Eal::for_tests();
    let (pa, mut m1) = Port::ring_pair(eal, "slowpeer1", 4096).unwrap();
    let (mut m2, pb) = Port::ring_pair(eal, "slowpeer2", 4096).unwrap();
    let pool =
        dpdk::Mempool::new(eal, "slowpeer", 8191, 64, dpdk::Mempool::DEFAULT_DATA_ROOM).unwrap();
    let (r1, t1) = m1.configure_single(&pool).unwrap();
    let (r2, t2) = m2.configure_single(&pool).unwrap();
    let stage_counters = Arc::new(ImpairCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let stage = {
        let (c, s) = (stage_counters.clone(), stop.clone());
        std::thread::spawn(move || {
            let slow = Throttle {
                rate_bps: 1_000_000_000,
                queue_bytes: 512 << 10,
            };
            let mut paths = [
                ThrottledPath::new(r1, t2, Some(slow)),
                ThrottledPath::new(r2, t1, None),
            ];
            run_throttled(&mut paths, &c, &s);
        })
    };
    let (a, b) = support::device_group(pa, pb);
    let src = a.reg_mr(8 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(8 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let want = pattern(&src);
    let mut cq = a.create_cq(64).unwrap();
    let cq_b = b.create_cq(64).unwrap();
    // A retransmit timeout of 1 s (IBA code 18) instead of 67 ms: on a
    // loaded shared host a starved engine thread makes a 67 ms timer fire
    // spuriously, and those go-back-N rounds are not the slow link's doing.
    let opts = QpOptions {
        cc: CcKind::None,
        timeout_ns: 4_096 << 18,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&cq, &cq, opts).unwrap();
    let mut qb = b.create_qp(&cq_b, &cq_b, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let mut qps = [qa];
    write_all(&a, &mut qps, &mut cq, (&src, &dst), TOTAL, 256 << 10, 8);
    std::thread::sleep(Duration::from_millis(5));
    stop.store(true, Ordering::Relaxed);
    stage.join().unwrap();
    let mut got = vec![0u8; dst.len()];
    dst.read(0, &mut got);
    assert!(got == want, "the data arrived intact");
    let c = a.counters();
    let dropped = stage_counters.dropped.load(Ordering::Relaxed);
    let share = c.retransmits as f64 / c.tx_data_packets as f64;
    eprintln!(
        "slow peer: {} data packets sent, {} retransmitted ({:.1} %), {} go-back-N backoffs, \
         {} timeouts; the 1 Gbit/s link dropped {dropped}",
        c.tx_data_packets,
        c.retransmits,
        share * 100.0,
        c.gbn_backoffs,
        c.timeouts
    );
    assert!(
        dropped > 0,
        "the slow link never overflowed: nothing tested"
    );
    assert!(c.gbn_backoffs > 0, "{c}");
    assert!(share < 0.10, "{:.1} % retransmitted:\n{c}", share * 100.0);
}
