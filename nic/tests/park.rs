//! Engines that park when idle (`DeviceConfig::idle_yield`, nic::park):
//! two devices on the two ends of a ring pair turned by one thread
//! (`Device::open_group`), so that nothing but a doorbell, a command, the
//! stop or a timer ends a park (no bound for frames: they come from the
//! same thread). A lost wake-up hangs the test; the waits below fail it
//! after seconds instead.

mod support;

use std::time::{Duration, Instant};

use dpdk::{Eal, Port};
use nic::verbs::{Device, QpOptions, RemoteQp};
use rdma::transport::{Access, WcStatus};

/// Two parking devices on one thread, on the two ends of a ring pair.
fn parking_pair(eal: &'static Eal, name: &str) -> (Device, Device) {
    let (pa, pb) = Port::ring_pair(eal, name, 1024).unwrap();
    let mut devs =
        support::parking_group(eal, vec![(pa, [10, 7, 0, 1]), (pb, [10, 7, 0, 2])], None);
    let b = devs.pop().unwrap();
    let a = devs.pop().unwrap();
    (a, b)
}

/// Waits until the group's thread has parked more than `than` times.
fn wait_parked(dev: &Device, than: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let n = dev.counters().engine_parks;
        if n > than {
            return n;
        }
        assert!(Instant::now() < end, "the idle engine never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every post to a parked engine is served: WRITEs posted one at a time,
/// each after the thread parked (so the doorbell's wake is what starts
/// it), and some back to back while it runs; each lands and completes.
/// Commands (creating and connecting QPs) reach a parked engine too.
#[test]
fn a_parked_engine_wakes_for_posts_and_commands() {
    let eal = Eal::for_tests();
    let (a, b) = parking_pair(eal, "park_posts");
    // Idle from the start: the thread parks before anything exists; what
    // follows are commands to a parked engine.
    wait_parked(&a, 0);
    let mut ca = a.create_cq(64).unwrap();
    let cb = b.create_cq(64).unwrap();
    let (mut qa, qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (a.reg_mr(128, acc).unwrap(), b.reg_mr(128, acc).unwrap());
    let mut parks = 0;
    for i in 1..=40u64 {
        if i % 2 == 1 {
            // Let the thread park first.
            parks = wait_parked(&a, parks);
        }
        support::write8(&mut qa, i, &ma, &mb);
        support::completes(&mut ca, i);
        let mut x = [0u8; 8];
        mb.read(64, &mut x);
        assert_eq!(u64::from_le_bytes(x), i, "WRITE {i} did not land");
    }
    // Back to back: the pipeline never waits for a park to end.
    for i in 41..=200u64 {
        support::write8(&mut qa, i, &ma, &mb);
    }
    for i in 41..=200u64 {
        support::completes(&mut ca, i);
    }
    drop((qa, qb));
    // The stop wakes it too (close waits for the thread).
    a.close();
    b.close();
}

/// A parked engine still fires its timers: a WRITE to a QP that does not
/// exist on the other end is never ACKed, so only the retransmit timer
/// (1 ms, one retry) ends it, with RETRY_EXC_ERR, while the thread parks
/// between the timeouts with nothing else to wake it.
#[test]
fn a_parked_engine_fires_its_timers() {
    let eal = Eal::for_tests();
    let (a, b) = parking_pair(eal, "park_timers");
    let mut ca = a.create_cq(64).unwrap();
    let opts = QpOptions {
        timeout_ns: 1_000_000,
        retry_cnt: 1,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&ca, &ca, opts).unwrap();
    let cb = b.create_cq(64).unwrap();
    let qb = b.create_qp(&cb, &cb, QpOptions::default()).unwrap();
    let mut ghost: RemoteQp = qb.remote_info();
    ghost.qpn += 1000; // nobody there: the frames are dropped
    qa.connect(&ghost).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (a.reg_mr(128, acc).unwrap(), b.reg_mr(128, acc).unwrap());
    let before = wait_parked(&a, 0);
    support::write8(&mut qa, 1, &ma, &mb);
    let wc = ca
        .wait(Duration::from_secs(5))
        .expect("no completion: the parked engine missed its retransmit timer");
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    // The counters are published about every millisecond, not with the
    // completion: wait for them (a busy machine delays the publication).
    let end = Instant::now() + Duration::from_secs(5);
    while a.counters().timeouts < 2 {
        assert!(
            Instant::now() < end,
            "two timeouts (the first try and the retry), counted: {}",
            a.counters().timeouts
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    wait_parked(&a, before);
}

/// Completion moderation (`CompletionQueue::wait_batch`): a program parked
/// for two completions sleeps through the first and is woken by the
/// second. The first is a WRITE to a QP nobody answers, failed by its
/// retransmit timer after milliseconds (long after the wait's spin); the
/// second is a WRITE on a connected QP sharing the CQ, posted by another
/// thread 50 ms later. Woken at the first, the wait returns one; a lost
/// wake-up at the second, none until its timeout.
#[test]
fn a_moderated_waiter_sleeps_until_its_count() {
    let eal = Eal::for_tests();
    let (a, b) = parking_pair(eal, "park_moderated");
    let mut ca = a.create_cq(64).unwrap();
    let cb = b.create_cq(64).unwrap();
    let opts = QpOptions {
        timeout_ns: 1_000_000,
        retry_cnt: 1,
        ..QpOptions::default()
    };
    let mut ghost_qp = a.create_qp(&ca, &ca, opts).unwrap();
    let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cb, &cb, QpOptions::default()).unwrap();
    let mut ghost: RemoteQp = qb.remote_info();
    ghost.qpn += 1000; // nobody there: the frames are dropped
    ghost_qp.connect(&ghost).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (a.reg_mr(128, acc).unwrap(), b.reg_mr(128, acc).unwrap());
    support::write8(&mut ghost_qp, 1, &ma, &mb);
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        support::write8(&mut qa, 2, &ma, &mb);
        (qa, ma, mb)
    });
    let start = Instant::now();
    let mut out = [rdma::transport::WorkCompletion::BLANK; 4];
    let n = ca.wait_batch(&mut out, 2, Duration::from_secs(10));
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "woken by the timeout");
    assert_eq!(n, 2, "woken before both completions were queued");
    assert_eq!(
        (out[0].wr_id, out[0].status, out[1].wr_id, out[1].status),
        (1, WcStatus::RetryExcErr, 2, WcStatus::Success)
    );
    assert!(waited >= Duration::from_millis(50));
    let _ = later.join().unwrap();
    drop(qb);
}
