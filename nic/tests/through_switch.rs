//! Two NIC engines through the switch core in-process, with a shaped
//! bottleneck: host A <-> ring pair <-> switch port 0; switch port 1 (shaped)
//! <-> ring pair <-> host B. WRITE and READ, contents verified, for each CC;
//! the switch's queue, CE marks and INT records show the CC at work.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{lcore, Eal, Mbuf, Mempool, Port, TscClock};
use nic::verbs::{Device, DeviceConfig, MemoryRegion, QpOptions, RemoteQp};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};
use switch::config::PortDefaults;
use switch::dataplane::{Dataplane, PortIo, StatsSink};
use switch::{Config, PortCounters, Switch};

const A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const B_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const SW0_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x00];
const SW1_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0x01];
const BUF: usize = 8 << 20;

/// Bytes per operation and CC: `RSNIC_TEST_BYTES` (default 1 GiB in a
/// release build, as the clean back-to-back tests; 32 MiB in a debug build).
fn total_bytes() -> usize {
    std::env::var("RSNIC_TEST_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            32 << 20
        } else {
            1 << 30
        })
}
const MSG: usize = 64 << 10;

struct Quiet;
impl StatsSink for Quiet {
    fn report(&mut self, _: &Switch<Mbuf>, _: &[u16], _: &[PortCounters], _: u64) {}
}

fn config(p0: u16, p1: u16, bottleneck: &str) -> Config {
    let mut cfg = Config::two_hosts(
        p0,
        p1,
        PortDefaults {
            speed: Some("100Gbps".into()),
            buf_max: Some("2MiB".into()),
            k_min: Some("20KiB".into()),
            k_max: Some("200KiB".into()),
            p_max: Some(0.2),
            k_drop: Some("100KiB".into()),
            ..PortDefaults::default()
        },
    );
    cfg.ports[1].own.speed = Some(bottleneck.into());
    cfg
}

/// One pair of NICs and a switch at a time (each spins a core).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_cc(cc: CcKind) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let tag = match cc {
        CcKind::None => "no",
        CcKind::Dcqcn => "dq",
        CcKind::Hpcc => "hp",
        CcKind::RxHpcc => "rh",
        CcKind::Ldcp => "ld",
    };
    let pool = Mempool::new(
        eal,
        &format!("ts_{tag}"),
        16383,
        128,
        Mempool::DEFAULT_DATA_ROOM,
    )
    .unwrap();
    let (pa, mut s0) = Port::ring_pair(eal, &format!("ts{tag}a"), 4096).unwrap();
    let (mut s1, pb) = Port::ring_pair(eal, &format!("ts{tag}b"), 4096).unwrap();
    let (rx0, tx0) = s0.configure_single(&pool).unwrap();
    let (rx1, tx1) = s1.configure_single(&pool).unwrap();
    let sw: Switch<Mbuf> = Switch::from_config(&config(s0.id(), s1.id(), "5Gbps")).unwrap();
    let mut dp = Dataplane::new(
        sw,
        vec![
            PortIo::new(s0.id(), rx0, tx0),
            PortIo::new(s1.id(), rx1, tx1),
        ],
        TscClock::new(eal),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let worker = lcore::spawn_pinned(eal, "ts-switch", None, move || {
        dp.run(&s2, 0, &mut Quiet);
        dp
    })
    .unwrap();

    let mut ca = DeviceConfig::new([10, 0, 0, 1]);
    ca.mac = Some(A_MAC);
    ca.line_rate_bps = 5_000_000_000;
    ca.pool_size = 4095;
    // The switch core parses the first segment only: keep frames in one.
    ca.copy_threshold = 2048;
    let mut cb = DeviceConfig::new([10, 0, 1, 2]);
    cb.mac = Some(B_MAC);
    cb.line_rate_bps = 5_000_000_000;
    cb.pool_size = 4095;
    cb.copy_threshold = 2048;
    // Both NICs on one poll thread and the switch on another: two spinning
    // threads for two cores, so that no RTT waits for a scheduler slice.
    let mut devs = Device::open_group(eal, vec![(pa, ca), (pb, cb)], None).unwrap();
    let (b, a) = (devs.pop().unwrap(), devs.pop().unwrap());
    let mut cqa = a.create_cq(1024).unwrap();
    let cqb = b.create_cq(1024).unwrap();
    let opts = QpOptions {
        cc,
        mtu: 1024,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&cqa, &cqa, opts).unwrap();
    let mut qb = b.create_qp(&cqb, &cqb, opts).unwrap();
    let (ia, ib) = (qa.remote_info(), qb.remote_info());
    qa.connect(&RemoteQp {
        mac: Some(SW0_MAC),
        ..ib
    })
    .unwrap();
    qb.connect(&RemoteQp {
        mac: Some(SW1_MAC),
        ..ia
    })
    .unwrap();

    let la = a.reg_mr(BUF, Access::LOCAL_WRITE).unwrap();
    let rb = b
        .reg_mr(
            BUF,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let pattern = |m: &MemoryRegion, seed: u8| {
        let chunk: Vec<u8> = (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(7) as u8) ^ seed)
            .collect();
        for c in 0..m.len() / chunk.len() {
            m.write(c * chunk.len(), &chunk);
        }
    };
    let equal = |x: &MemoryRegion, y: &MemoryRegion| {
        let (mut bx, mut by) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
        (0..x.len() / bx.len()).all(|c| {
            x.read(c * bx.len(), &mut bx);
            y.read(c * by.len(), &mut by);
            bx == by
        })
    };
    let start = Instant::now();
    let passes = total_bytes().div_ceil(BUF);
    for (read, pass) in [false, true]
        .into_iter()
        .flat_map(|r| (0..passes).map(move |p| (r, p)))
    {
        pattern(
            if read { &rb } else { &la },
            (pass as u8) ^ (read as u8) << 7,
        );
        let msgs = BUF / MSG;
        let (mut posted, mut done) = (0usize, 0usize);
        let deadline = Instant::now() + Duration::from_secs(120);
        while done < msgs {
            while posted < msgs && posted - done < 32 {
                let off = (posted * MSG) as u64;
                let op = if read {
                    SendOp::Read {
                        remote_va: rb.va() + off,
                        rkey: rb.rkey(),
                    }
                } else {
                    SendOp::Write {
                        remote_va: rb.va() + off,
                        rkey: rb.rkey(),
                    }
                };
                qa.post_send(SendWr {
                    wr_id: posted as u64,
                    op,
                    sge: Sge {
                        addr: la.va() + off,
                        len: MSG as u32,
                        lkey: la.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
                posted += 1;
            }
            match cqa.poll_one() {
                Some(wc) => {
                    assert_eq!(
                        wc.status,
                        WcStatus::Success,
                        "{cc} {wc:?}\nA:\n{}B:\n{}",
                        a.counters(),
                        b.counters()
                    );
                    done += 1;
                }
                None => {
                    assert!(
                        Instant::now() < deadline,
                        "{cc}: stalled at {done}/{msgs} in pass {pass}: {}",
                        qa.describe().unwrap_or_default()
                    );
                    std::thread::yield_now();
                }
            }
        }
        assert!(
            equal(&la, &rb),
            "{cc}: {} contents differ in pass {pass}",
            if read { "READ" } else { "WRITE" }
        );
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let dp = worker.join().unwrap();
    let sw = &dp.switch;
    let c1 = *sw.counters(s1.id()).unwrap();
    let c0 = *sw.counters(s0.id()).unwrap();
    let (ca_, cb_) = (a.counters(), b.counters());
    eprintln!(
        "{cc}: 2 x {} MiB through a 5 Gbit/s port in {secs:.1} s; to B: max queue {} B, CE {}, WRED drops {}, tail drops {}, INT {}; to A: max queue {} B, INT {}; A retransmits {}, B rx CE {}",
        (passes * BUF) >> 20,
        c1.queue_max_bytes,
        c1.ce_marked,
        c1.wred_drops,
        c1.tail_drops,
        c1.int_pushed,
        c0.queue_max_bytes,
        c0.int_pushed,
        ca_.retransmits,
        cb_.rx_ce_marked
    );
    assert!(c1.tx_packets > 0 && c0.tx_packets > 0);
    if matches!(cc, CcKind::Hpcc | CcKind::RxHpcc) {
        assert!(
            c1.int_pushed > 0,
            "{cc}: data crossed the switch without INT"
        );
    }
    drop((qa, qb));
    a.close();
    b.close();
}

per_cc!(run_cc: through_switch_cc_none, through_switch_cc_dcqcn, through_switch_cc_hpcc, through_switch_cc_rx_hpcc, through_switch_cc_ldcp);
