//! Memory windows through the engine (issue 40 item 6; IBA 10.6.7, Linux rxe's
//! `rxe_mw.c` as the reference): a window bound by a work request on B's QP gives A
//! exactly its range and rights, a rebind retires the old R_Key, a type 2 window is
//! freed by A's SEND with Invalidate, a region with a window bound cannot be
//! deregistered, and binds complete in send-queue order.

mod support;

use std::time::Duration;

use nic::verbs::{CompletionQueue, DeregError, QpOptions};
use rdma::transport::{Access, MwType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion};

const WINDOW: u64 = 0x3000;

fn wait(cq: &mut CompletionQueue, what: &str) -> WorkCompletion {
    cq.wait(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: no completion"))
}

#[test]
fn windows_give_a_peer_a_range_and_are_retired_by_rebind_and_invalidation() {
    let (a, b) = support::device_pair("mw_pair", 1024, |c| c);
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (mut qa, mut qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let la = a.reg_mr(64 << 10, support::ALL).unwrap();
    let lb = b.reg_mr(64 << 10, support::ALL | Access::MW_BIND).unwrap();
    let mut w1 = b.alloc_mw(MwType::One).unwrap();
    let first = w1.rkey();
    let base = lb.va() + 0x1000;
    let key = qb
        .bind_mw(
            1,
            &mut w1,
            Some(&lb),
            (base, WINDOW),
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    assert_ne!(key, first);
    let c = wait(&mut cb, "bind");
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (1, WcOpcode::BindMw, WcStatus::Success)
    );
    // A WRITE through the window, read back through it.
    let data: Vec<u8> = (0..WINDOW as usize).map(|i| (i * 7 + 1) as u8).collect();
    la.write(0, &data);
    let write = |id, rkey, at, len| {
        let op = SendOp::Write {
            remote_va: at,
            rkey,
        };
        SendWr::signaled(id, op, la.sge(0, len))
    };
    qa.post_send(write(2, key, base, WINDOW as u32)).unwrap();
    assert_eq!(wait(&mut ca, "WRITE").status, WcStatus::Success);
    let mut got = vec![0u8; WINDOW as usize];
    lb.read(0x1000, &mut got);
    assert!(got == data, "the bytes landed in the region");
    let read = SendWr::signaled(
        3,
        SendOp::Read {
            remote_va: base + 16,
            rkey: key,
        },
        la.sge(0x8000, 1000),
    );
    qa.post_send(read).unwrap();
    assert_eq!(wait(&mut ca, "READ").status, WcStatus::Success);
    let mut back = vec![0u8; 1000];
    la.read(0x8000, &mut back);
    assert_eq!(back, data[16..1016]);
    // A region with a window bound is not deregistered: the handle comes back.
    let lb = match b.dereg_mr(lb) {
        Err(DeregError::WindowsBound(mr)) => mr,
        other => panic!("{other:?}"),
    };
    // Rebinding retires the old key: a WRITE with it is a remote access error.
    let key2 = qb
        .bind_mw(4, &mut w1, Some(&lb), (base, 64), Access::REMOTE_READ)
        .unwrap();
    assert_eq!(wait(&mut cb, "rebind").status, WcStatus::Success);
    assert_ne!(key2, key);
    qa.post_send(write(5, key, base, 8)).unwrap();
    assert_eq!(wait(&mut ca, "stale key").status, WcStatus::RemAccessErr);
    drop((qa, qb));

    // Type 2: bound to B's new QP only; A's SEND with Invalidate frees it.
    let (mut qa, mut qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let mut w2 = b.alloc_mw(MwType::Two).unwrap();
    let k2 = qb
        .bind_mw(6, &mut w2, Some(&lb), (base, 256), Access::REMOTE_WRITE)
        .unwrap();
    assert_eq!(wait(&mut cb, "type 2 bind").status, WcStatus::Success);
    qa.post_send(write(7, k2, base, 256)).unwrap();
    assert_eq!(wait(&mut ca, "type 2 WRITE").status, WcStatus::Success);
    qb.post_recv(RecvWr {
        wr_id: 8,
        sge: lb.sge(0x8000, 64),
    })
    .unwrap();
    qa.post_send(SendWr::signaled(9, SendOp::SendInv(k2), la.sge(0, 64)))
        .unwrap();
    assert_eq!(
        wait(&mut ca, "SEND with Invalidate").status,
        WcStatus::Success
    );
    let r = wait(&mut cb, "its receive");
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.imm, r.byte_len),
        (8, WcStatus::Success, WcOpcode::RecvInv, Some(k2), 64)
    );
    qa.post_send(write(10, k2, base, 8)).unwrap();
    assert_eq!(
        wait(&mut ca, "WRITE after the invalidation").status,
        WcStatus::RemAccessErr
    );
    // Unbind the type 1 window (length 0): the region may go now.
    drop((qa, qb));
    let (_qa, mut qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    qb.bind_mw(11, &mut w1, None, (0, 0), Access::empty())
        .unwrap();
    assert_eq!(wait(&mut cb, "unbind").status, WcStatus::Success);
    b.dealloc_mw(w2).unwrap();
    b.dealloc_mw(w1).unwrap();
    b.dereg_mr(lb).unwrap();
}

/// A bind behind an unacknowledged 256 KiB WRITE completes after it, a failed
/// bind (a region without `MW_BIND`) completes with `MW_BIND_ERR` and moves the QP
/// to ERR, flushing what follows.
#[test]
fn binds_complete_in_order_and_a_failed_one_stops_the_queue() {
    let (a, b) = support::device_pair("mw_order", 1024, |c| c);
    let (mut ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (mut qa, _qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let la = a.reg_mr(256 << 10, support::ALL | Access::MW_BIND).unwrap();
    let plain = a.reg_mr(4096, support::ALL).unwrap();
    let lb = b.reg_mr(256 << 10, support::ALL).unwrap();
    let mut w = a.alloc_mw(MwType::One).unwrap();
    qa.post_send(support::write_wr(1, &la, 0, &lb, 0, 256 << 10))
        .unwrap();
    qa.bind_mw(2, &mut w, Some(&la), (la.va(), 4096), Access::REMOTE_READ)
        .unwrap();
    let first = wait(&mut ca, "first");
    let second = wait(&mut ca, "second");
    assert_eq!(
        [(first.wr_id, first.opcode), (second.wr_id, second.opcode)],
        [(1, WcOpcode::RdmaWrite), (2, WcOpcode::BindMw)]
    );
    assert_eq!(second.status, WcStatus::Success);
    let before = w.rkey();
    qa.bind_mw(
        3,
        &mut w,
        Some(&plain),
        (plain.va(), 64),
        Access::REMOTE_READ,
    )
    .unwrap();
    qa.post_send(support::write_wr(4, &la, 0, &lb, 0, 64))
        .unwrap();
    let bad = wait(&mut ca, "failed bind");
    assert_eq!(
        (bad.wr_id, bad.opcode, bad.status),
        (3, WcOpcode::BindMw, WcStatus::MwBindErr)
    );
    let flushed = wait(&mut ca, "flushed");
    assert_eq!((flushed.wr_id, flushed.status), (4, WcStatus::WrFlushErr));
    w.set_rkey(before);
    a.dealloc_mw(w).unwrap();
}
