//! Two NIC engines back to back on a ring pair move data by RDMA WRITE and
//! READ, contents verified, for every congestion control.
//!
//! The volume per (CC, operation) is `RSNIC_TEST_BYTES` (default 1 GiB in a
//! release build, 64 MiB in a debug build, where everything is ~20x slower).

mod support;

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Eal, Port};
use nic::verbs::{CompletionQueue, Device, MemoryRegion, QueuePair};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

const BUF: usize = 16 << 20;
const MSG: usize = 64 << 10;

fn total_bytes() -> usize {
    std::env::var("RSNIC_TEST_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            64 << 20
        } else {
            1 << 30
        })
}

struct Pair {
    a: Device,
    b: Device,
    cq_a: CompletionQueue,
    _cq_b: CompletionQueue,
    qa: QueuePair,
    _qb: QueuePair,
}

fn pair(name: &str, cc: CcKind) -> Pair {
    let (a, b) = support::device_pair(name, 4096, |c| c);
    connect_devices(a, b, cc)
}

fn connect_devices(a: Device, b: Device, cc: CcKind) -> Pair {
    let cq_a = a.create_cq(1024).unwrap();
    let cq_b = b.create_cq(1024).unwrap();
    let (qa, qb) = support::connect_qps(&a, &b, &cq_a, &cq_b, support::with_cc(cc));
    Pair {
        a,
        b,
        cq_a,
        _cq_b: cq_b,
        qa,
        _qb: qb,
    }
}

/// As [`pair`] over ports `pa` and `pb`, with both engines on one
/// poll-mode thread.
fn connect_group(pa: Port, pb: Port, cc: CcKind) -> Pair {
    let (a, b) = support::device_group(pa, pb);
    connect_devices(a, b, cc)
}

fn fill(mr: &MemoryRegion, pass: u64) {
    let mut chunk = vec![0u8; 1 << 20];
    for c in 0..mr.len() / chunk.len() {
        for (i, w) in chunk.chunks_mut(8).enumerate() {
            let v = pass
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((c * (1 << 17) + i) as u64);
            w.copy_from_slice(&v.to_le_bytes());
        }
        mr.write(c * chunk.len(), &chunk);
    }
}

fn same(x: &MemoryRegion, y: &MemoryRegion) -> bool {
    let (mut bx, mut by) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    (0..x.len() / bx.len()).all(|c| {
        x.read(c * bx.len(), &mut bx);
        y.read(c * by.len(), &mut by);
        bx == by
    })
}

/// Moves `total` bytes from `src` to `dst` in 64 KiB messages with up to
/// `depth` outstanding, `pass` by `pass` over the 16 MiB buffers, checking
/// the destination after each pass.
fn run(p: &mut Pair, read: bool, total: usize) -> f64 {
    run_with_depth(p, read, total, 64)
}

fn run_with_depth(p: &mut Pair, read: bool, total: usize, depth: usize) -> f64 {
    let access_src = Access::LOCAL_WRITE | Access::REMOTE_READ;
    let access_dst = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    // WRITE: A's memory -> B's. READ: A reads B's memory into its own.
    let (local, remote) = if read {
        (
            p.a.reg_mr(BUF, Access::LOCAL_WRITE).unwrap(),
            p.b.reg_mr(BUF, access_src).unwrap(),
        )
    } else {
        (
            p.a.reg_mr(BUF, Access::LOCAL_WRITE).unwrap(),
            p.b.reg_mr(BUF, access_dst).unwrap(),
        )
    };
    let (src, dst) = if read {
        (&remote, &local)
    } else {
        (&local, &remote)
    };
    let start = Instant::now();
    for pass in 0..(total / BUF).max(1) as u64 {
        fill(src, pass + 1);
        let msgs = BUF / MSG;
        let (mut posted, mut done) = (0usize, 0usize);
        let deadline = Instant::now() + Duration::from_secs(120);
        while done < msgs {
            while posted < msgs && posted - done < depth {
                let off = (posted * MSG) as u64;
                let op = if read {
                    SendOp::Read {
                        remote_va: remote.va() + off,
                        rkey: remote.rkey(),
                    }
                } else {
                    SendOp::Write {
                        remote_va: remote.va() + off,
                        rkey: remote.rkey(),
                    }
                };
                p.qa.post_send(SendWr {
                    wr_id: posted as u64,
                    op,
                    sge: Sge {
                        addr: local.va() + off,
                        len: MSG as u32,
                        lkey: local.lkey(),
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
                posted += 1;
            }
            if let Some(wc) = p.cq_a.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                assert_eq!(wc.wr_id, done as u64, "completions in order");
                done += 1;
            } else {
                assert!(
                    Instant::now() < deadline,
                    "stalled at {done}/{msgs} in pass {pass}\n  A: {}\n  B: {}\n  \
                     counters A: {:?}\n  counters B: {:?}",
                    p.qa.describe().unwrap_or_default(),
                    p._qb.describe().unwrap_or_default(),
                    p.a.counters(),
                    p.b.counters(),
                );
                // Leave the CPU to the two engines.
                std::thread::yield_now();
            }
        }
        assert!(
            same(src, dst),
            "pass {pass}: destination differs from source"
        );
    }
    let secs = start.elapsed().as_secs_f64();
    (total.max(BUF) as f64 * 8.0) / secs / 1e9
}

/// One pair of spinning engines at a time: this machine has two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn write_and_read(cc: CcKind) {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = pair(&format!("e_{}", cc.as_str().replace('-', "")), cc);
    let total = total_bytes();
    let only = std::env::var("RSNIC_TEST_ONLY").unwrap_or_default();
    let w = if only != "read" {
        run(&mut p, false, total)
    } else {
        0.0
    };
    let r = if only != "write" {
        run(&mut p, true, total)
    } else {
        0.0
    };
    let (ca, cb) = (p.a.counters(), p.b.counters());
    eprintln!(
        "{cc}: {} MiB WRITE at {w:.2} Gbit/s, READ at {r:.2} Gbit/s; A: {} tx {} rx, {} retransmits; B: {} acks sent",
        total >> 20,
        ca.tx_packets,
        ca.rx_packets,
        ca.retransmits,
        cb.tx_acks
    );
    if std::env::var("RSNIC_TEST_VERBOSE").is_ok() {
        eprintln!("A:\n{ca}B:\n{cb}");
    }
    assert_eq!(ca.rx_drop_icrc + cb.rx_drop_icrc, 0);
    assert_eq!(ca.rx_drop_malformed + cb.rx_drop_malformed, 0);
}

per_cc!(write_and_read: write_and_read_cc_none, write_and_read_cc_dcqcn, write_and_read_cc_hpcc, write_and_read_cc_rx_hpcc, write_and_read_cc_ldcp);

/// Loss, duplication and reordering between the NICs (an impairment stage
/// on its own thread between two ring pairs), 1 GiB by WRITE and 1 GiB by
/// READ per CC as the clean tests: go-back-N and the timer recover, contents
/// stay exact, the QP never stalls. Both engines share one poll thread
/// (`Device::open_group`), so the stage and the NICs have a core each.
fn lossy(cc: CcKind) {
    use impair::{run as impair, ImpairCounters, ImpairedPath, Impairment};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let (pa, mut m1) = Port::ring_pair(eal, &format!("lossy1{cc}"), 4096).unwrap();
    let (mut m2, pb) = Port::ring_pair(eal, &format!("lossy2{cc}"), 4096).unwrap();
    let pool = dpdk::Mempool::new(
        eal,
        &format!("lossy_dup{cc}"),
        8191,
        64,
        dpdk::Mempool::DEFAULT_DATA_ROOM,
    )
    .unwrap();
    let (r1, t1) = m1.configure_single(&pool).unwrap();
    let (r2, t2) = m2.configure_single(&pool).unwrap();
    let cfg = Impairment {
        drop: 0.002,
        duplicate: 0.002,
        reorder: 0.002,
        corrupt: 0.0,
        seed: 42,
    };
    let counters = Arc::new(ImpairCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2, p2) = (counters.clone(), stop.clone(), pool.clone());
    let stage = std::thread::spawn(move || {
        let mut paths = [ImpairedPath::new(r1, t2), ImpairedPath::new(r2, t1)];
        impair(&mut paths, &cfg, &p2, &c2, &s2);
    });
    let mut p = connect_group(pa, pb, cc);
    // 16 messages in flight, so that a go-back-N costs at most 1 MiB.
    let total = total_bytes();
    let w = run_with_depth(&mut p, false, total, 16);
    let r = run_with_depth(&mut p, true, total, 16);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    stage.join().unwrap();
    let (ca, cb) = (p.a.counters(), p.b.counters());
    let dropped = counters.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let dup = counters
        .duplicated
        .load(std::sync::atomic::Ordering::Relaxed);
    let reo = counters
        .reordered
        .load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "lossy {cc}: {} MiB each way (WRITE {w:.2}, READ {r:.2} Gbit/s); stage dropped {dropped}, duplicated {dup}, reordered {reo}; A retransmits {} timeouts {}; B duplicates {} out-of-sequence {} seq NAKs {}",
        total >> 20,
        ca.retransmits,
        ca.timeouts,
        cb.rx_duplicates,
        cb.rx_out_of_sequence,
        cb.tx_seq_naks
    );
    assert!(
        dropped > 0 && dup > 0 && reo > 0,
        "the stage impaired nothing"
    );
    assert!(
        ca.retransmits > 0,
        "losses were recovered by retransmission"
    );
    assert!(cb.rx_duplicates > 0, "duplicates were seen and dropped");
}

per_cc!(lossy: lossy_link_cc_none, lossy_link_cc_dcqcn, lossy_link_cc_hpcc, lossy_link_cc_rx_hpcc, lossy_link_cc_ldcp);

/// Both NICs' engines on ONE poll-mode thread (`Device::open_group`, how the
/// testbed fits N hosts on two cores): WRITE and READ complete, contents
/// verified, and closing the devices one by one ends the shared thread.
#[test]
fn two_engines_on_one_thread() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "grp", 4096).unwrap();
    let mut p = connect_group(pa, pb, CcKind::Hpcc);
    let total = (total_bytes() / 8).max(BUF);
    let w = run(&mut p, false, total);
    let r = run(&mut p, true, total);
    eprintln!("one thread: WRITE {w:.2} Gbit/s, READ {r:.2} Gbit/s");
    let Pair { a, b, qa, _qb, .. } = p;
    drop((qa, _qb));
    // Closing A must not stop B's engine: B still serves its slow path
    // (a CQ is created by the engine itself), then closes and the shared
    // thread ends with it.
    a.close();
    b.create_cq(16)
        .expect("B's engine still runs after A closed");
    b.close();
}
