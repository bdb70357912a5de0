//! Every responder-side error the requester must hear about is NAK-ed (IBA 9.7.5.2:
//! invalid request 0x61, remote access error 0x62, remote operational error 0x63, as
//! rxe's `rxe_resp.c` answers them): the requester completes the WR with the matching
//! status (REM_INV_REQ_ERR, REM_ACCESS_ERR, REM_OP_ERR), flushes the rest and enters
//! ERR; the responder enters ERR too, touches no memory, and completes the receive WQE
//! a SEND was using with its local status.

mod common;
use common::*;
use rdma::transport::*;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};
use rdma::wire::Opcode;

fn recv(h: &mut Host, id: u64, addr: u64, len: u32, lkey: u32) {
    let r = RecvWr {
        wr_id: id,
        sge: Sge { addr, len, lkey },
    };
    h.qp.post_recv(r, &h.mrs).unwrap();
}

/// What one error case must produce.
struct Expect {
    nak: NakCode,
    status: WcStatus,
    /// The responder's completion of the receive WQE, if the message used one.
    recv: Option<WcStatus>,
}

/// Posts `op` (then a SEND that must be flushed) from A, runs the exchange with
/// `tamper` on A's packets, and checks the outcome.
fn check(
    what: &str,
    mut a: Host,
    mut b: Host,
    op: SendOp,
    len: u32,
    tamper: impl FnMut(&mut TxPacket),
    e: Expect,
) {
    let ak = a.mr.lkey;
    let data: Vec<u8> = (0..len.max(8)).map(|i| i as u8 ^ 0x5A).collect();
    a.mem.write(A_BASE, &data);
    a.qp.post_send(wr(1, op, A_BASE, len, ak), &a.mrs).unwrap();
    a.qp.post_send(
        wr(
            2,
            SendOp::Write {
                remote_va: B_BASE,
                rkey: b.mr.rkey,
            },
            A_BASE,
            8,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    let before = b.mem.bytes.clone();
    let answers = exchange(&mut a, &mut b, tamper);
    let naks: Vec<_> = answers
        .iter()
        .filter_map(|p| p.repr.aeth.map(|x| (p.repr.bth.opcode, x.syndrome)))
        .filter(|(_, s)| !matches!(s, AethSyndrome::Ack { .. }))
        .collect();
    assert_eq!(
        naks,
        vec![(Opcode::Acknowledge, AethSyndrome::Nak(e.nak))],
        "{what}: B's NAKs"
    );
    let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        vec![(1, e.status), (2, WcStatus::WrFlushErr)],
        "{what}: A's completions"
    );
    assert_eq!(a.qp.state(), QpState::Err, "{what}");
    assert_eq!(b.qp.state(), QpState::Err, "{what}");
    assert_eq!(b.qp.counters().nak_error_sent, 1, "{what}");
    assert!(
        a.events.iter().any(
            |x| matches!(x, QpEvent::Nak { syndrome: AethSyndrome::Nak(c), .. } if *c == e.nak)
        ),
        "{what}: NAK event"
    );
    if let Some(st) = e.recv {
        assert_eq!(
            b.cq.first().map(|c| (c.wr_id, c.status)),
            Some((900, st)),
            "{what}: B's receive WQE"
        );
    }
    let wrote_past_recv =
        b.mem.bytes[..0x4000] != before[..0x4000] || b.mem.bytes[0x8000..] != before[0x8000..];
    assert!(
        !wrote_past_recv,
        "{what}: responder memory outside the receive buffer changed"
    );
}

fn invalid(recv: Option<WcStatus>) -> Expect {
    Expect {
        nak: NakCode::InvalidRequest,
        status: WcStatus::RemInvReqErr,
        recv,
    }
}

#[test]
fn send_longer_than_the_receive_buffer_is_nak_0x61_and_loc_len_err() {
    for (pmtu, len) in [(256, 600), (1024, 600), (256, 513)] {
        let (a, mut b) = pair(pmtu, false, 0);
        let bl = b.mr.lkey;
        recv(&mut b, 900, B_BASE + 0x4000, 512, bl);
        let what = format!("SEND {len} into 512 at pmtu {pmtu}");
        check(
            &what,
            a,
            b,
            SendOp::Send,
            len,
            |_| {},
            invalid(Some(WcStatus::LocLenErr)),
        );
    }
}

#[test]
fn bad_opcode_sequence_is_nak_0x61() {
    // A WRITE whose FIRST never came: its MIDDLE arrives at the expected PSN.
    let (a, b) = pair(256, false, 0);
    let bk = b.mr.rkey;
    let op = SendOp::Write {
        remote_va: B_BASE + 0x9000,
        rkey: bk,
    };
    let mut first = true;
    let tamper = |p: &mut TxPacket| {
        if first && p.repr.bth.opcode == Opcode::WriteFirst {
            first = false;
            p.repr.bth.opcode = Opcode::WriteMiddle;
            p.repr.reth = None;
        }
    };
    check(
        "WRITE MIDDLE without FIRST",
        a,
        b,
        op,
        600,
        tamper,
        invalid(None),
    );
    // A SEND FIRST inside a SEND message (its LAST turned into another FIRST).
    let (a, mut b) = pair(256, false, 0);
    let bl = b.mr.lkey;
    recv(&mut b, 900, B_BASE + 0x4000, 0x2000, bl);
    let tamper = |p: &mut TxPacket| {
        if p.repr.bth.opcode == Opcode::SendMiddle {
            p.repr.bth.opcode = Opcode::SendFirst;
        }
    };
    check(
        "SEND FIRST inside a SEND",
        a,
        b,
        SendOp::Send,
        600,
        tamper,
        invalid(Some(WcStatus::RemInvReqErr)),
    );
}

#[test]
fn length_errors_are_nak_0x61() {
    type Case = (&'static str, u32, fn(&mut TxPacket));
    let cases: [Case; 3] = [
        // The WRITE carries more than its RETH announced.
        ("WRITE longer than its DMA length", 200, |p| {
            if let Some(r) = p.repr.reth.as_mut() {
                r.dma_len = 100;
            }
        }),
        // The WRITE ends before its announced length.
        ("WRITE shorter than its DMA length", 200, |p| {
            if let Some(r) = p.repr.reth.as_mut() {
                r.dma_len = 300;
            }
        }),
        // A READ of more than 2^31 bytes.
        ("READ above the maximum message", 64, |p| {
            if let Some(r) = p.repr.reth.as_mut() {
                r.dma_len = 0x8000_0001;
            }
        }),
    ];
    for (what, len, tamper) in cases {
        let (a, b) = pair(256, false, 0);
        let bk = b.mr.rkey;
        let op = if what.starts_with("READ") {
            SendOp::Read {
                remote_va: B_BASE + 0x9000,
                rkey: bk,
            }
        } else {
            SendOp::Write {
                remote_va: B_BASE + 0x9000,
                rkey: bk,
            }
        };
        check(what, a, b, op, len, tamper, invalid(None));
    }
}

#[test]
fn misaligned_atomic_is_nak_0x61() {
    let (a, b) = pair(256, false, 0);
    let op = SendOp::FetchAdd {
        remote_va: B_BASE + 0x9004,
        rkey: b.mr.rkey,
        add: 1,
    };
    check(
        "FetchAdd at VA % 8 == 4",
        a,
        b,
        op,
        8,
        |_| {},
        invalid(None),
    );
}

#[test]
fn rkey_and_va_violations_are_nak_0x62() {
    let access = || Expect {
        nak: NakCode::RemoteAccessError,
        status: WcStatus::RemAccessErr,
        recv: None,
    };
    let end = B_BASE + MEM_LEN as u64;
    for case in 0..5 {
        let (a, mut b) = pair(256, false, 0);
        let bk = b.mr.rkey;
        let wo = b
            .mrs
            .register(B_BASE + 0x9000, 0x1000, Access::REMOTE_WRITE)
            .unwrap();
        let (what, op, len) = match case {
            0 => (
                "READ past the region",
                SendOp::Read {
                    remote_va: end - 100,
                    rkey: bk,
                },
                200,
            ),
            1 => (
                "READ without REMOTE_READ",
                SendOp::Read {
                    remote_va: B_BASE + 0x9000,
                    rkey: wo.rkey,
                },
                64,
            ),
            2 => (
                "WRITE with an unknown rkey",
                SendOp::Write {
                    remote_va: B_BASE,
                    rkey: bk ^ 0x300,
                },
                64,
            ),
            3 => (
                "ATOMIC without REMOTE_ATOMIC",
                SendOp::CompareSwap {
                    remote_va: B_BASE + 0x9000,
                    rkey: wo.rkey,
                    compare: 0,
                    swap: 1,
                },
                8,
            ),
            _ => (
                "ATOMIC past the region",
                SendOp::FetchAdd {
                    remote_va: end,
                    rkey: bk,
                    add: 1,
                },
                8,
            ),
        };
        check(what, a, b, op, len, |_| {}, access());
    }
}

/// IBA C9-88: a zero-length RDMA WRITE or READ need carry no valid R_Key or VA, and
/// the responder checks neither (rxe `check_rkey`): UCX's rc_verbs flushes a QP with a
/// zero-length WRITE to rkey 0 at VA 0. Both complete, both QPs stay in RTS and no
/// byte of B changes.
#[test]
fn zero_length_write_and_read_check_no_rkey() {
    for op in [
        SendOp::Write {
            remote_va: 0,
            rkey: 0,
        },
        SendOp::Read {
            remote_va: 0,
            rkey: 0,
        },
    ] {
        let (mut a, mut b) = pair(256, false, 0);
        let ak = a.mr.lkey;
        a.qp.post_send(wr(1, op, A_BASE, 0, ak), &a.mrs).unwrap();
        let before = b.mem.bytes.clone();
        exchange(&mut a, &mut b, |_| {});
        let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, vec![(1, WcStatus::Success)], "{op:?}");
        assert_eq!(a.qp.state(), QpState::Rts, "{op:?}");
        assert_eq!(b.qp.state(), QpState::Rts, "{op:?}");
        assert_eq!(b.qp.counters().nak_error_sent, 0, "{op:?}");
        assert!(b.mem.bytes == before, "{op:?}: B's memory changed");
    }
}

#[test]
fn receive_buffer_deregistered_after_post_is_nak_0x63() {
    let (a, mut b) = pair(256, false, 0);
    let buf = b
        .mrs
        .register(B_BASE + 0x4000, 0x1000, Access::LOCAL_WRITE)
        .unwrap();
    recv(&mut b, 900, B_BASE + 0x4000, 0x1000, buf.lkey);
    b.mrs.deregister(buf.lkey).unwrap();
    let e = Expect {
        nak: NakCode::RemoteOperationalError,
        status: WcStatus::RemOpErr,
        recv: Some(WcStatus::LocQpOpErr),
    };
    check(
        "SEND into a deregistered buffer",
        a,
        b,
        SendOp::Send,
        100,
        |_| {},
        e,
    );
}
