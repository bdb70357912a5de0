//! The verbs lifecycle on real engines (a DPDK ring pair): `modify_qp`
//! through ERR (flush), RESET and back to RTS, busy CQs and PDs refused,
//! async events, the blocking CQ wait on its eventfd, and regions over the
//! caller's memory. 100k QPs created and destroyed: `qp_churn.rs`.

mod support;

use std::time::{Duration, Instant};

use dpdk::{Eal, Port};
use nic::contract::EngineError;
use nic::verbs::{
    AsyncEvent, CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QpTransition,
    QueuePair, VerbsError,
};
use rdma::transport::{QpState, SendOp, SendWr, Sge, WcOpcode, WcStatus};

use support::{qps_live, recv_wr as recv, ALL};

/// Two devices on a ring pair, with pools small enough that the tests of
/// this file fit the test EAL's memory side by side.
fn pair(name: &str) -> (Device, Device) {
    // Idle engines yield: two spinning engines and the test thread on two
    // cores would make every slow-path round trip wait for a time slice.
    support::device_pair(name, 1024, |c| DeviceConfig {
        pool_size: 4095,
        idle_yield: true,
        ..c
    })
}

/// A WRITE of `len` bytes from the start of `src` to the start of `dst`.
fn write(wr_id: u64, src: &MemoryRegion, dst: &MemoryRegion, len: u32) -> SendWr {
    support::write_wr(wr_id, src, 0, dst, 0, len)
}

fn connected(
    a: &Device,
    b: &Device,
    ca: &CompletionQueue,
    cb: &CompletionQueue,
) -> (QueuePair, QueuePair) {
    support::connect_qps(a, b, ca, cb, QpOptions::default())
}

/// A QP with outstanding sends and receives moved to ERR: every one
/// completes with WR_FLUSH_ERR, and so does one posted in ERR; the QP is
/// then reset, brought back to RTS with `modify_qp` (the peer too) and
/// moves data again. The program's own ERR raises no QP-fatal event.
#[test]
fn err_flushes_then_reset_and_reuse() {
    let (a, b) = pair("life_err");
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (mut qa, mut qb) = connected(&a, &b, &ca, &cb);
    let src = a.reg_mr(4096, ALL).unwrap();
    let dst = b.reg_mr(4096, ALL).unwrap();
    src.write(0, b"before the reset");

    // B stops answering (ERR drops what arrives), so A's WRITEs stay
    // outstanding; A also waits for two SENDs that never come.
    qb.modify_qp(QpTransition::Err).unwrap();
    assert_eq!(qb.state().unwrap(), QpState::Err);
    qa.post_recv(recv(100, &src, 64)).unwrap();
    qa.post_recv(recv(101, &src, 64)).unwrap();
    for id in 1..=3 {
        qa.post_send(write(id, &src, &dst, 16)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(ca.poll_one().is_none(), "nothing completes before the ERR");
    qa.modify_qp(QpTransition::Err).unwrap();
    let mut flushed: Vec<(u64, WcOpcode)> = (0..5)
        .map(|_| {
            let wc = ca.wait(Duration::from_secs(5)).expect("flushed completion");
            assert_eq!(wc.status, WcStatus::WrFlushErr, "{wc:?}");
            (wc.wr_id, wc.opcode)
        })
        .collect();
    flushed.sort_by_key(|f| f.0);
    assert_eq!(
        flushed,
        [
            (1, WcOpcode::RdmaWrite),
            (2, WcOpcode::RdmaWrite),
            (3, WcOpcode::RdmaWrite),
            (100, WcOpcode::Recv),
            (101, WcOpcode::Recv)
        ]
    );
    qa.post_send(write(4, &src, &dst, 16)).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion in ERR");
    assert_eq!((wc.wr_id, wc.status), (4, WcStatus::WrFlushErr));
    // B's receive CQ: nothing was posted there, nothing flushed.
    assert!(cb.poll_one().is_none());

    // Illegal: ERR -> RTS.
    match qa.modify_qp(QpTransition::Rts) {
        Err(VerbsError::Engine(EngineError::Transport { .. })) => {}
        other => panic!("ERR -> RTS must be refused, got {other:?}"),
    }

    // RESET, INIT, RTR, RTS on both ends; then a WRITE goes through.
    for q in [&mut qa, &mut qb] {
        q.modify_qp(QpTransition::Reset).unwrap();
        assert_eq!(q.state().unwrap(), QpState::Reset);
        assert!(matches!(
            q.post_recv(recv(0, &src, 8)),
            Err(VerbsError::NotReady { .. })
        ));
        q.modify_qp(QpTransition::Init).unwrap();
    }
    let (ra, rb) = (qa.remote_info(), qb.remote_info());
    qa.modify_qp(QpTransition::Rtr(rb)).unwrap();
    qb.modify_qp(QpTransition::Rtr(ra)).unwrap();
    assert_eq!(qa.state().unwrap(), QpState::Rtr);
    assert!(matches!(
        qa.post_send(write(5, &src, &dst, 16)),
        Err(VerbsError::NotReady { .. })
    ));
    qa.modify_qp(QpTransition::Rts).unwrap();
    qb.modify_qp(QpTransition::Rts).unwrap();
    assert_eq!(qa.state().unwrap(), QpState::Rts);
    qa.post_send(write(6, &src, &dst, 16)).unwrap();
    let wc = ca
        .wait(Duration::from_secs(5))
        .expect("completion after reuse");
    assert_eq!((wc.wr_id, wc.status), (6, WcStatus::Success), "{wc:?}");
    let mut got = [0u8; 16];
    dst.read(0, &mut got);
    assert_eq!(&got, b"before the reset");
    assert!(
        ca.poll_one().is_none(),
        "the reset dropped nothing into the CQ"
    );
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        a.events().try_next(),
        None,
        "an ERR by the program is no event"
    );
    assert_eq!(b.events().try_next(), None);
}

/// `destroy_cq` on a CQ a QP completes into is refused with the handle
/// back (EBUSY); so is `dealloc_pd` on a PD with a region or a QP. Both go
/// once their users are gone.
#[test]
fn busy_cq_and_pd_are_refused() {
    let (a, _b) = pair("life_busy");
    let cq = a.create_cq(16).unwrap();
    let qp = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let cq = match a.destroy_cq(cq) {
        Err(busy) => {
            assert!(
                matches!(busy.error, VerbsError::Engine(EngineError::CqBusy(_))),
                "{busy}"
            );
            busy.handle
        }
        Ok(()) => panic!("a CQ in use was destroyed"),
    };
    // The CQ still works for new QPs.
    let qp2 = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    a.destroy_qp(qp).unwrap();
    assert!(a.destroy_cq(cq).is_err(), "qp2 still uses it");
    drop(qp2);
    let cq = a.create_cq(16).unwrap();
    a.destroy_cq(cq).unwrap();

    let pd = a.alloc_pd();
    let mr = pd.reg_mr(4096, ALL).unwrap();
    let pd = match a.dealloc_pd(pd) {
        Err(busy) => {
            assert!(matches!(
                busy.error,
                VerbsError::Engine(EngineError::PdBusy(_))
            ));
            busy.handle
        }
        Ok(()) => panic!("a PD with a region was deallocated"),
    };
    let cq = a.create_cq(16).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    a.dereg_mr(mr).unwrap();
    let pd = a.dealloc_pd(pd).expect_err("the QP holds it").handle;
    a.destroy_qp(qp).unwrap();
    a.dealloc_pd(pd).unwrap();
}

/// A CQ dropped while its QP lives goes when the QP goes; its id is then
/// free (the engine's CQ table does not grow over create/drop cycles).
#[test]
fn a_dropped_cq_is_freed_with_its_last_qp() {
    let (a, _b) = pair("life_orphan");
    for _ in 0..100 {
        let cq = a.create_cq(16).unwrap();
        let qp = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
        drop(cq);
        drop(qp);
    }
    assert_eq!(qps_live(&a, 0), 0);
    // Two live CQs: ids 0 and 1 again if the 100 freed theirs.
    let (c0, c1) = (a.create_cq(4).unwrap(), a.create_cq(4).unwrap());
    assert_eq!((c0.id(), c1.id()), (0, 1));
    let q = a.create_qp(&c0, &c1, QpOptions::default()).unwrap();
    assert!(q.describe().is_ok());
}

/// A program sleeping on a CQ's completion channel wakes when a SEND
/// lands, having used almost no CPU while it waited (it slept in the
/// kernel, it did not spin).
#[test]
fn blocking_wait_wakes_on_a_completion() {
    let (a, b) = pair("life_wait");
    let ca = a.create_cq(16).unwrap();
    let mut cb = b.create_cq_with_channel(16).unwrap();
    assert!(cb.channel_fd().is_some());
    let (mut qa, mut qb) = connected(&a, &b, &ca, &cb);
    let src = a.reg_mr(4096, ALL).unwrap();
    let dst = b.reg_mr(4096, ALL).unwrap();
    src.write(0, b"wake up");
    qb.post_recv(recv(7, &dst, 64)).unwrap();
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        let cpu0 = thread_cpu();
        let wc = cb.wait_blocking(Duration::from_secs(10)).unwrap();
        (wc, t0.elapsed(), thread_cpu() - cpu0)
    });
    std::thread::sleep(Duration::from_millis(300));
    qa.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sge: Sge {
            addr: src.va(),
            len: 7,
            lkey: src.lkey(),
        },
        signaled: false,
        solicited: false,
    })
    .unwrap();
    let (wc, waited, cpu) = waiter.join().unwrap();
    let wc = wc.expect("woken by the completion, not the timeout");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (7, WcStatus::Success, 7)
    );
    assert!(waited >= Duration::from_millis(250), "waited {waited:?}");
    assert!(
        cpu < Duration::from_millis(50),
        "the waiter used {cpu:?} of CPU in {waited:?}: it spun"
    );
    let mut got = [0u8; 7];
    dst.read(0, &mut got);
    assert_eq!(&got, b"wake up");
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // utime and stime, fields 14 and 15, after the ")" of the name.
    let rest = &t[t.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    Duration::from_millis((f[0] + f[1]) * 10)
}

/// A WRITE with a key the peer does not know sends A's QP to ERR on its
/// own: the program hears of it as a QP-fatal event.
#[test]
fn a_fatal_qp_error_is_an_async_event() {
    let (a, b) = pair("life_fatal");
    let (mut ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let (mut qa, _qb) = connected(&a, &b, &ca, &cb);
    let src = a.reg_mr(4096, ALL).unwrap();
    let dst = b.reg_mr(4096, ALL).unwrap();
    let mut wr = write(1, &src, &dst, 16);
    wr.op = SendOp::Write {
        remote_va: dst.va(),
        rkey: dst.rkey() ^ 0x5500,
    };
    qa.post_send(wr).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    let ev = a.events().next_timeout(Duration::from_secs(2));
    assert_eq!(ev, Some(AsyncEvent::QpFatal { qpn: qa.qpn() }));
}

/// A region over the caller's own memory: a WRITE from one program buffer
/// lands in another program buffer, and deregistering hands the memory
/// back.
#[test]
fn regions_over_the_callers_memory() {
    let (a, b) = pair("life_user_mr");
    let (mut ca, cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let (mut qa, _qb) = connected(&a, &b, &ca, &cb);
    let mut src_buf: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let mut dst_buf = vec![0u8; 8192];
    // SAFETY: both vectors outlive their regions (deregistered below,
    // before the vectors are read or dropped).
    let (src, dst) = unsafe {
        (
            a.reg_user_mr(src_buf.as_mut_ptr(), src_buf.len(), ALL)
                .unwrap(),
            b.reg_user_mr(dst_buf.as_mut_ptr(), dst_buf.len(), ALL)
                .unwrap(),
        )
    };
    assert_eq!(src.va(), src_buf.as_ptr() as u64);
    qa.post_send(write(1, &src, &dst, 8192)).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    a.dereg_mr(src).unwrap();
    b.dereg_mr(dst).unwrap();
    assert_eq!(dst_buf, src_buf);
    // SAFETY: a null region is refused before anything is registered.
    let null = unsafe { a.reg_user_mr(std::ptr::null_mut(), 64, ALL) };
    assert!(matches!(null, Err(VerbsError::EmptyRegion)));
}

/// The port's link going down and coming back up reaches the program as
/// PortDown then PortActive; a CQ too small for the completions raises
/// CqOverrun (held back, not lost).
#[test]
fn port_and_cq_events() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "life_port", 1024).unwrap();
    let link = pa.link_watch();
    // Idle engines yield: two spinning engines and the test thread on two
    // cores would make every slow-path round trip wait for a time slice.
    let cfg = |ip| DeviceConfig {
        pool_size: 4095,
        idle_yield: true,
        ..DeviceConfig::new(ip)
    };
    let a = Device::open(eal, pa, cfg([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, cfg([10, 0, 0, 2])).unwrap();
    let events = a.events();
    assert!(link.wait_up(Duration::from_secs(2)));
    // Let the engine see the link up before it goes down.
    std::thread::sleep(Duration::from_millis(50));
    link.set_up(false).unwrap();
    assert_eq!(
        events.next_timeout(Duration::from_secs(2)),
        Some(AsyncEvent::PortDown)
    );
    link.set_up(true).unwrap();
    assert_eq!(
        events.next_timeout(Duration::from_secs(2)),
        Some(AsyncEvent::PortActive)
    );

    let (mut ca, cb) = (a.create_cq(2).unwrap(), b.create_cq(16).unwrap());
    let (mut qa, _qb) = connected(&a, &b, &ca, &cb);
    let src = a.reg_mr(4096, ALL).unwrap();
    let dst = b.reg_mr(4096, ALL).unwrap();
    for id in 0..8 {
        qa.post_send(write(id, &src, &dst, 8)).unwrap();
    }
    let ev = events.next_timeout(Duration::from_secs(2));
    assert_eq!(
        ev,
        Some(AsyncEvent::CqOverrun {
            cq: ca.id(),
            lost: false
        })
    );
    for id in 0..8 {
        let wc = ca.wait(Duration::from_secs(5)).expect("held completion");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
    }
}

/// Retry attributes set in INIT (`ibv_modify_qp` gives them at RTR -> RTS;
/// QueuePair::set_retry) are what the engine's transport uses: towards a
/// QPN that does not exist, one retry of 1 ms ends the QP after 2 timeouts
/// (the creation values, 7 retries of 67 ms, would take 8 and half a
/// second), and once it may send they are refused.
#[test]
fn retry_attributes_set_before_rts_apply() {
    let (a, b) = pair("life_retry");
    let mut ca = a.create_cq(16).unwrap();
    let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    qa.modify_qp(QpTransition::Init).unwrap();
    assert!(qa.set_retry(1_000_000, 8, 0).is_err(), "3-bit counts");
    qa.set_retry(1_000_000, 1, 0).unwrap();
    let before = a.counters().timeouts;
    let remote = nic::contract::RemoteQp {
        qpn: 0xFF_FF00,
        psn: 0,
        ip: b.ip(),
        mac: Some(b.mac()),
        mtu: 1024,
        cc: QpOptions::default().cc,
    };
    qa.modify_qp(QpTransition::Rtr(remote)).unwrap();
    qa.modify_qp(QpTransition::Rts).unwrap();
    assert!(
        qa.set_retry(1_000_000, 2, 0).is_err(),
        "not once it may send"
    );
    let src = a.reg_mr(4096, ALL).unwrap();
    let mut wr = write(1, &src, &src, 16);
    wr.op = SendOp::Send;
    qa.post_send(wr).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::RetryExcErr);
    let end = Instant::now() + Duration::from_secs(2);
    while a.counters().timeouts - before < 2 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(a.counters().timeouts - before, 2);
}
