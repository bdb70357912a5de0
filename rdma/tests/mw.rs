//! Memory windows through the RC transport (IBA 10.6.7; Linux rxe `rxe_mw.c` as the
//! reference): binds and local invalidations as work requests that send nothing and
//! complete in send-queue order, remote access through a window's R_Key (its range,
//! its rights, its QP for type 2B), and SEND with Invalidate (IBA 9.3.8, 10.6.7.2.4).

mod common;

use common::*;
use rdma::transport::*;
use rdma::wire::Opcode;

/// The access of the region windows are bound to.
const REGION: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC)
    .union(Access::MW_BIND);

/// The R_Key after a bind of the window of `rkey` (`ibv_inc_rkey`).
fn inc(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

/// A region of B's memory that windows may be bound to: 64 KiB at B_BASE + 64 KiB.
fn bindable(b: &mut Host) -> Mr {
    b.mrs.register(B_BASE + 0x1_0000, 0x1_0000, REGION).unwrap()
}

fn bind_wr(id: u64, mw: u32, mr: &Mr, va: u64, len: u64, access: Access) -> SendWr {
    let b = MwBind::new(mw, inc(mw), mr.lkey, va, len, access);
    wr(id, SendOp::BindMw(b), 0, 0, 0)
}

fn statuses(cq: &[WorkCompletion]) -> Vec<(u64, WcOpcode, WcStatus)> {
    cq.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect()
}

/// A type 1 window bound by B's QP: A's WRITE, READ and ATOMIC through its R_Key
/// reach exactly its range with exactly its rights; the old R_Key, a range past it
/// and an operation it does not allow are remote access errors.
#[test]
fn type_1_window_gives_a_peer_its_range_and_rights_only() {
    let (mut a, mut b) = pair(1024, false, 0x10);
    let mr = bindable(&mut b);
    let mw = b.mrs.alloc_window(0, MwType::One).unwrap();
    let va = B_BASE + 0x1_2000;
    let rw = Access::REMOTE_WRITE | Access::REMOTE_READ;
    b.qp.post_local(bind_wr(7, mw.rkey, &mr, va, 0x2000, rw), &mut b.mrs)
        .unwrap();
    assert!(b.qp.poll_tx(0).is_none(), "a bind sends nothing");
    b.drain();
    assert_eq!(statuses(&b.cq), [(7, WcOpcode::BindMw, WcStatus::Success)]);
    let key = inc(mw.rkey);
    // A WRITE of 5 packets through the window lands in the region.
    let data = fill(&mut a, A_BASE, 5000, 3);
    let op = SendOp::Write {
        remote_va: va + 100,
        rkey: key,
    };
    a.qp.post_send(wr(1, op, A_BASE, 5000, a.mr.lkey), &a.mrs)
        .unwrap();
    exchange(&mut a, &mut b, |_| {});
    assert_eq!(
        statuses(&a.cq),
        [(1, WcOpcode::RdmaWrite, WcStatus::Success)]
    );
    assert_eq!(b.mem.read(va + 100, 5000), &data[..]);
    // A READ of it back.
    let op = SendOp::Read {
        remote_va: va + 100,
        rkey: key,
    };
    a.qp.post_send(wr(2, op, A_BASE + 0x8000, 5000, a.mr.lkey), &a.mrs)
        .unwrap();
    exchange(&mut a, &mut b, |_| {});
    assert_eq!(a.cq[1].status, WcStatus::Success);
    assert_eq!(a.mem.read(A_BASE + 0x8000, 5000), &data[..]);
    // No ATOMIC right on the window: refused, though the region has one.
    let op = SendOp::FetchAdd {
        remote_va: va,
        rkey: key,
        add: 1,
    };
    a.qp.post_send(wr(3, op, A_BASE, 8, a.mr.lkey), &a.mrs)
        .unwrap();
    exchange(&mut a, &mut b, |_| {});
    assert_eq!(a.cq[2].status, WcStatus::RemAccessErr);
    assert_eq!(a.qp.state(), QpState::Err);

    // Past the window's end, and with the pre-bind R_Key: each on a fresh pair.
    for (rkey, at) in [(key, va + 0x2000 - 8), (mw.rkey, va)] {
        let (mut a, mut b) = pair(1024, false, 0x10);
        let mr = bindable(&mut b);
        let w = b.mrs.alloc_window(0, MwType::One).unwrap();
        assert_eq!(w.rkey, mw.rkey, "same seed, same key");
        b.qp.post_local(bind_wr(7, w.rkey, &mr, va, 0x2000, rw), &mut b.mrs)
            .unwrap();
        let op = SendOp::Write {
            remote_va: at,
            rkey,
        };
        a.qp.post_send(wr(1, op, A_BASE, 16, a.mr.lkey), &a.mrs)
            .unwrap();
        exchange(&mut a, &mut b, |_| {});
        assert_eq!(
            statuses(&a.cq),
            [(1, WcOpcode::RdmaWrite, WcStatus::RemAccessErr)],
            "rkey {rkey:#x} at {at:#x}"
        );
    }
}

/// A type 2B window is bound to B's QP: A reaches it through that QP; A's SEND with
/// Invalidate frees it (B's receive says which R_Key, `IBV_WC_WITH_INV`), and a
/// WRITE after that is a remote access error.
#[test]
fn send_with_invalidate_frees_a_type_2_window() {
    let (mut a, mut b) = pair(1024, false, 0x10);
    let mr = bindable(&mut b);
    let mw = b.mrs.alloc_window(0, MwType::Two).unwrap();
    let va = B_BASE + 0x1_0000;
    b.qp.post_local(
        bind_wr(9, mw.rkey, &mr, va, 0x1000, Access::REMOTE_WRITE),
        &mut b.mrs,
    )
    .unwrap();
    let key = inc(mw.rkey);
    assert_eq!(b.mrs.window(key).unwrap().binding.unwrap().qpn, Some(0x22));
    let data = fill(&mut a, A_BASE, 64, 1);
    let write = |id, rkey| {
        let op = SendOp::Write {
            remote_va: va,
            rkey,
        };
        wr(id, op, A_BASE, 64, 0)
    };
    a.qp.post_send(
        SendWr {
            sge: Sge {
                lkey: a.mr.lkey,
                ..write(1, key).sge
            },
            ..write(1, key)
        },
        &a.mrs,
    )
    .unwrap();
    exchange(&mut a, &mut b, |_| {});
    assert_eq!(b.mem.read(va, 64), &data[..]);
    // SEND with Invalidate of 3 packets: the IETH on the last one only.
    b.qp.post_recv(
        RecvWr {
            wr_id: 50,
            sge: Sge {
                addr: B_BASE,
                len: 4096,
                lkey: b.mr.lkey,
            },
        },
        &b.mrs,
    )
    .unwrap();
    let msg = fill(&mut a, A_BASE + 0x1000, 2500, 9);
    a.qp.post_send(
        wr(2, SendOp::SendInv(key), A_BASE + 0x1000, 2500, a.mr.lkey),
        &a.mrs,
    )
    .unwrap();
    let mut opcodes = vec![];
    exchange(&mut a, &mut b, |p| {
        opcodes.push((p.repr.bth.opcode, p.repr.ieth.map(|i| i.0)))
    });
    assert_eq!(
        opcodes,
        [
            (Opcode::SendFirst, None),
            (Opcode::SendMiddle, None),
            (Opcode::SendLastInv, Some(key))
        ]
    );
    let r = b.cq.iter().find(|w| w.wr_id == 50).expect("the receive");
    assert_eq!(
        (r.status, r.opcode, r.byte_len, r.imm),
        (WcStatus::Success, WcOpcode::RecvInv, 2500, Some(key))
    );
    assert_eq!(b.mem.read(B_BASE, 2500), &msg[..]);
    assert_eq!(
        a.cq.last().map(|w| (w.wr_id, w.opcode, w.status)),
        Some((2, WcOpcode::Send, WcStatus::Success))
    );
    assert!(b.mrs.window(key).unwrap().binding.is_none(), "free again");
    assert_eq!(b.mrs.windows_bound(mr.lkey), 0);
    let w = write(3, key);
    a.qp.post_send(
        SendWr {
            sge: Sge {
                lkey: a.mr.lkey,
                ..w.sge
            },
            ..w
        },
        &a.mrs,
    )
    .unwrap();
    exchange(&mut a, &mut b, |_| {});
    assert_eq!(
        a.cq.last().map(|w| (w.wr_id, w.status)),
        Some((3, WcStatus::RemAccessErr))
    );
}

/// A SEND with Invalidate whose R_Key is no bound type 2 window (a type 1 window, a
/// free one, a region) is an invalid request: B's receive completes with
/// `REM_INV_REQ_ERR`, A's SEND too, both QPs enter ERR (rxe: `RESPST_ERR_INVALIDATE_RKEY`).
#[test]
fn send_with_invalidate_of_a_wrong_key_is_an_invalid_request() {
    for case in 0..3 {
        let (mut a, mut b) = pair(1024, false, 0x10);
        let mr = bindable(&mut b);
        let t1 = b.mrs.alloc_window(0, MwType::One).unwrap();
        b.qp.post_local(
            bind_wr(9, t1.rkey, &mr, mr.va, 64, Access::REMOTE_READ),
            &mut b.mrs,
        )
        .unwrap();
        let free = b.mrs.alloc_window(0, MwType::Two).unwrap();
        let key = [inc(t1.rkey), free.rkey, mr.rkey][case];
        b.qp.post_recv(
            RecvWr {
                wr_id: 50,
                sge: Sge {
                    addr: B_BASE,
                    len: 64,
                    lkey: b.mr.lkey,
                },
            },
            &b.mrs,
        )
        .unwrap();
        a.qp.post_send(wr(2, SendOp::SendInv(key), A_BASE, 16, a.mr.lkey), &a.mrs)
            .unwrap();
        exchange(&mut a, &mut b, |_| {});
        let r = b.cq.iter().find(|w| w.wr_id == 50).expect("the receive");
        assert_eq!(r.status, WcStatus::RemInvReqErr, "case {case}");
        assert_eq!(
            statuses(&a.cq),
            [(2, WcOpcode::Send, WcStatus::RemInvReqErr)],
            "case {case}"
        );
        assert_eq!((a.qp.state(), b.qp.state()), (QpState::Err, QpState::Err));
        assert!(b.mrs.window(inc(t1.rkey)).unwrap().binding.is_some());
    }
}

/// Local operations complete in send-queue order: a bind posted behind an
/// unacknowledged WRITE completes after it, and before the SEND behind it; an
/// unsignaled one completes silently; a LOCAL_INV frees a type 2 window.
#[test]
fn local_operations_complete_in_send_queue_order() {
    let (mut a, mut b) = pair(1024, false, 0x10);
    let mr = a.mrs.register(A_BASE + 0x2_0000, 0x1000, REGION).unwrap();
    let t2 = a.mrs.alloc_window(0, MwType::Two).unwrap();
    fill(&mut a, A_BASE, 8192, 5);
    let op = SendOp::Write {
        remote_va: B_BASE,
        rkey: b.mr.rkey,
    };
    a.qp.post_send(wr(1, op, A_BASE, 8192, a.mr.lkey), &a.mrs)
        .unwrap();
    let bind = bind_wr(2, t2.rkey, &mr, mr.va, 0x1000, Access::REMOTE_READ);
    a.qp.post_local(bind, &mut a.mrs).unwrap();
    let quiet = SendWr {
        signaled: false,
        ..wr(3, SendOp::LocalInv(inc(t2.rkey)), 0, 0, 0)
    };
    a.qp.post_local(quiet, &mut a.mrs).unwrap();
    b.qp.post_recv(
        RecvWr {
            wr_id: 60,
            sge: Sge {
                addr: B_BASE + 0x8000,
                len: 64,
                lkey: b.mr.lkey,
            },
        },
        &b.mrs,
    )
    .unwrap();
    a.qp.post_send(wr(4, SendOp::Send, A_BASE, 64, a.mr.lkey), &a.mrs)
        .unwrap();
    // Executed already (at post), but not completed before the WRITE is acknowledged.
    assert!(a.mrs.window(inc(t2.rkey)).unwrap().binding.is_none());
    a.drain();
    assert!(a.cq.is_empty(), "{:?}", a.cq);
    let mut sent = vec![];
    exchange(&mut a, &mut b, |p| sent.push(p.repr.bth.psn));
    assert_eq!(
        sent.len(),
        9,
        "8 WRITE packets and the SEND, nothing for the binds"
    );
    assert!(sent.windows(2).all(|w| w[1] == (w[0] + 1) & 0xFF_FFFF));
    assert_eq!(
        statuses(&a.cq),
        [
            (1, WcOpcode::RdmaWrite, WcStatus::Success),
            (2, WcOpcode::BindMw, WcStatus::Success),
            (4, WcOpcode::Send, WcStatus::Success),
        ]
    );
    assert_eq!(a.qp.sq_outstanding(), 0);
}

/// A bind that fails (here: a region without `MW_BIND`) completes with
/// `MW_BIND_ERR` in its turn; the QP enters ERR, and what was posted after it is
/// flushed without a packet, a local invalidation included (not executed).
#[test]
fn a_failed_bind_stops_the_send_queue() {
    let (mut a, mut b) = pair(1024, false, 0x10);
    let t1 = a.mrs.alloc_window(0, MwType::One).unwrap();
    let t2 = a.mrs.alloc_window(0, MwType::Two).unwrap();
    let good = a.mrs.register(A_BASE + 0x2_0000, 0x1000, REGION).unwrap();
    let bind = bind_wr(1, t2.rkey, &good, good.va, 64, Access::REMOTE_READ);
    a.qp.post_local(bind, &mut a.mrs).unwrap();
    a.drain();
    assert_eq!(statuses(&a.cq), [(1, WcOpcode::BindMw, WcStatus::Success)]);
    let bad = bind_wr(2, t1.rkey, &a.mr, A_BASE, 64, Access::REMOTE_READ);
    a.qp.post_local(bad, &mut a.mrs).unwrap();
    a.qp.post_local(wr(3, SendOp::LocalInv(inc(t2.rkey)), 0, 0, 0), &mut a.mrs)
        .unwrap();
    a.qp.post_send(wr(4, SendOp::Send, A_BASE, 8, a.mr.lkey), &a.mrs)
        .unwrap();
    let sent = exchange(&mut a, &mut b, |_| {});
    assert!(sent.is_empty());
    assert_eq!(b.qp.expected_psn(), 0x10, "nothing reached B");
    assert_eq!(
        statuses(&a.cq),
        [
            (1, WcOpcode::BindMw, WcStatus::Success),
            (2, WcOpcode::BindMw, WcStatus::MwBindErr),
            (3, WcOpcode::LocalInv, WcStatus::WrFlushErr),
            (4, WcOpcode::Send, WcStatus::WrFlushErr),
        ]
    );
    assert_eq!(a.qp.state(), QpState::Err);
    assert!(
        a.mrs.window(inc(t2.rkey)).unwrap().binding.is_some(),
        "the flushed LOCAL_INV did not run"
    );
    // A LOCAL_INV of a type 1 window: LOC_QP_OP_ERR.
    let (mut a, _b) = pair(1024, false, 0x10);
    let t1 = a.mrs.alloc_window(0, MwType::One).unwrap();
    a.qp.post_local(wr(5, SendOp::LocalInv(t1.rkey), 0, 0, 0), &mut a.mrs)
        .unwrap();
    a.drain();
    assert_eq!(
        statuses(&a.cq),
        [(5, WcOpcode::LocalInv, WcStatus::LocQpOpErr)]
    );
    // post_send refuses local operations, post_local anything else.
    assert!(matches!(
        a.qp.post_send(wr(6, SendOp::LocalInv(1), 0, 0, 0), &a.mrs),
        Err(QpError::InvalidWr(_))
    ));
}
