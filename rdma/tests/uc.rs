//! Unreliable connected QPs (IBA 9.8.3; rxe `rxe_resp.c` with `IB_QPT_UC`): SEND and
//! RDMA WRITE with and without immediate, segmented at the path MTU, never
//! acknowledged; a message arrives whole and in order or not at all.

mod common;
use common::*;
use proptest::prelude::*;
use rdma::transport::*;

const PMTU: u32 = 256;

fn uc_pair() -> (Host, Host) {
    let base = QpConfig {
        pmtu: PMTU,
        service: Service::Uc,
        ..Default::default()
    };
    pair_from(base, 0xFF_FFF0, 1)
}

fn recv(h: &mut Host, id: u64, va: u64, len: u32) {
    let lkey = h.mr.lkey;
    h.qp.post_recv(
        RecvWr {
            wr_id: id,
            sge: Sge {
                addr: va,
                len,
                lkey,
            },
        },
        &h.mrs,
    )
    .unwrap();
}

/// Everything A sends, handed to B in order (optionally dropping some packets by
/// index); B must never answer.
fn pump(a: &mut Host, b: &mut Host, mut drop: impl FnMut(usize) -> bool) -> Vec<TxPacket> {
    let mut sent = vec![];
    while let Some(p) = a.qp.poll_tx(0) {
        assert!(!p.repr.bth.ack_req, "UC asks for no ACK");
        assert_eq!(p.repr.bth.opcode.service(), Service::Uc);
        assert_eq!(p.ah, None);
        if !drop(sent.len()) {
            deliver(a, &p, b);
        }
        sent.push(p);
    }
    assert!(b.qp.poll_tx(0).is_none(), "a UC responder never sends");
    a.drain();
    b.drain();
    sent
}

#[test]
fn send_and_write_with_imm_arrive_and_complete_at_hand_out() {
    let (mut a, mut b) = uc_pair();
    let lk = a.mr.lkey;
    let m1 = fill(&mut a, A_BASE, 700, 1);
    let m2 = fill(&mut a, A_BASE + 0x1000, 600, 2);
    recv(&mut b, 10, B_BASE, 1024);
    recv(&mut b, 11, B_BASE + 0x1000, 64);
    a.qp.post_send(wr(1, SendOp::SendImm(0xABCD), A_BASE, 700, lk), &a.mrs)
        .unwrap();
    a.qp.post_send(
        wr(
            2,
            SendOp::WriteImm {
                remote_va: B_BASE + 0x4000,
                rkey: b.mr.rkey,
                imm: 7,
            },
            A_BASE + 0x1000,
            600,
            lk,
        ),
        &a.mrs,
    )
    .unwrap();
    let sent = pump(&mut a, &mut b, |_| false);
    let ops: Vec<u8> = sent.iter().map(|p| p.repr.bth.opcode as u8).collect();
    assert_eq!(ops, [0x20, 0x21, 0x23, 0x26, 0x27, 0x29]);
    // Completed when handed out, in order, with their lengths.
    let got: Vec<_> =
        a.cq.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect();
    assert_eq!(
        got,
        [(1, WcStatus::Success, 700), (2, WcStatus::Success, 600)]
    );
    assert_eq!(a.qp.sq_outstanding(), 0);
    assert_eq!(a.qp.next_timer(), None, "no retransmit timer");
    assert_eq!(b.mem.read(B_BASE, 700), &m1[..]);
    assert_eq!(b.mem.read(B_BASE + 0x4000, 600), &m2[..]);
    let rc: Vec<_> =
        b.cq.iter()
            .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len, c.imm))
            .collect();
    assert_eq!(
        rc,
        [
            (10, WcStatus::Success, WcOpcode::Recv, 700, Some(0xABCD)),
            (
                11,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                600,
                Some(7)
            )
        ]
    );
}

#[test]
fn read_and_atomics_are_refused_at_post() {
    let (mut a, _b) = uc_pair();
    let lk = a.mr.lkey;
    for op in [
        SendOp::Read {
            remote_va: 0,
            rkey: 1,
        },
        SendOp::FetchAdd {
            remote_va: 0,
            rkey: 1,
            add: 1,
        },
        SendOp::CompareSwap {
            remote_va: 0,
            rkey: 1,
            compare: 0,
            swap: 1,
        },
    ] {
        assert!(matches!(
            a.qp.post_send(wr(1, op, A_BASE, 8, lk), &a.mrs),
            Err(QpError::InvalidWr(_))
        ));
    }
    assert_eq!(a.qp.sq_outstanding(), 0);
    // A UD destination on a connected QP is refused too.
    let d = UdDest {
        ah: AhId(1.try_into().unwrap()),
        remote_qpn: 2,
        remote_qkey: 3,
    };
    assert!(matches!(
        a.qp.post_send_ud(wr(1, SendOp::Send, A_BASE, 8, lk), d, None, &a.mrs),
        Err(QpError::InvalidWr(_))
    ));
}

/// A lost middle packet drops its message (the rest of it too) and no receive WQE
/// is used; the next message resynchronises on its FIRST and lands in the WQE the
/// dropped one would have used.
#[test]
fn a_gap_drops_the_message_and_the_next_one_resyncs() {
    let (mut a, mut b) = uc_pair();
    let lk = a.mr.lkey;
    fill(&mut a, A_BASE, 600, 1);
    let m2 = fill(&mut a, A_BASE + 0x1000, 500, 2);
    recv(&mut b, 10, B_BASE, 1024);
    recv(&mut b, 11, B_BASE + 0x1000, 1024);
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 600, lk), &a.mrs)
        .unwrap();
    a.qp.post_send(wr(2, SendOp::Send, A_BASE + 0x1000, 500, lk), &a.mrs)
        .unwrap();
    pump(&mut a, &mut b, |i| i == 1);
    assert_eq!(a.cq.len(), 2, "the sender completes both");
    let rc: Vec<_> = b.cq.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(rc, [(10, 500)]);
    assert_eq!(b.mem.read(B_BASE, 500), &m2[..]);
    // The LAST and the next FIRST come ahead of the expected PSN; the LAST is dropped.
    assert_eq!(b.qp.counters().rx_out_of_sequence, 2);
    assert_eq!(b.qp.unreliable_counters().rx_msg_dropped, 1);
    assert_eq!(b.qp.state(), QpState::Rts);
}

/// No receive WQE: the SEND is dropped silently (no RNR NAK), counted; one posted
/// afterwards takes the next message.
#[test]
fn no_receive_wqe_drops_silently() {
    let (mut a, mut b) = uc_pair();
    let lk = a.mr.lkey;
    let m = fill(&mut a, A_BASE, 300, 3);
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 300, lk), &a.mrs)
        .unwrap();
    pump(&mut a, &mut b, |_| false);
    assert!(b.cq.is_empty());
    assert_eq!(b.qp.unreliable_counters().rx_no_recv_wqe, 1);
    assert_eq!(b.qp.counters().rnr_nak_sent, 0);
    recv(&mut b, 10, B_BASE, 512);
    a.qp.post_send(wr(2, SendOp::Send, A_BASE, 300, lk), &a.mrs)
        .unwrap();
    pump(&mut a, &mut b, |_| false);
    assert_eq!(b.cq.len(), 1);
    assert_eq!(b.mem.read(B_BASE, 300), &m[..]);
}

/// A message longer than its receive WQE completes the WQE with LOC_LEN_ERR, the
/// rest of the message is dropped, and the QP goes on with the next message.
#[test]
fn too_long_completes_loc_len_err_and_the_qp_stays_usable() {
    let (mut a, mut b) = uc_pair();
    let lk = a.mr.lkey;
    fill(&mut a, A_BASE, 700, 1);
    let m = fill(&mut a, A_BASE + 0x1000, 100, 2);
    recv(&mut b, 10, B_BASE, 300);
    recv(&mut b, 11, B_BASE + 0x1000, 300);
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 700, lk), &a.mrs)
        .unwrap();
    a.qp.post_send(wr(2, SendOp::Send, A_BASE + 0x1000, 100, lk), &a.mrs)
        .unwrap();
    pump(&mut a, &mut b, |_| false);
    let rc: Vec<_> =
        b.cq.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect();
    assert_eq!(
        rc,
        [(10, WcStatus::LocLenErr, 0), (11, WcStatus::Success, 100)]
    );
    assert_eq!(b.mem.read(B_BASE + 0x1000, 100), &m[..]);
    assert_eq!(b.qp.state(), QpState::Rts);
}

/// A duplicated or late packet (PSN behind the expected one) is dropped alone: a
/// message is never delivered twice, and one in progress is not disturbed.
#[test]
fn duplicates_and_late_packets_are_dropped_alone() {
    let (mut a, mut b) = uc_pair();
    let lk = a.mr.lkey;
    let m1 = fill(&mut a, A_BASE, 100, 1);
    let m2 = fill(&mut a, A_BASE + 0x1000, 400, 2);
    for k in 0..3 {
        recv(&mut b, 10 + k, B_BASE + 0x1000 * k, 1024);
    }
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 100, lk), &a.mrs)
        .unwrap();
    a.qp.post_send(wr(2, SendOp::Send, A_BASE + 0x1000, 400, lk), &a.mrs)
        .unwrap();
    let mut pkts = vec![];
    while let Some(p) = a.qp.poll_tx(0) {
        pkts.push(p);
    }
    assert_eq!(pkts.len(), 3);
    deliver(&a, &pkts[0], &mut b);
    deliver(&a, &pkts[1], &mut b);
    deliver(&a, &pkts[0], &mut b); // the ONLY again, inside message 2
    deliver(&a, &pkts[2], &mut b);
    deliver(&a, &pkts[1], &mut b); // message 2's FIRST, late
    b.drain();
    let rc: Vec<_> = b.cq.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(rc, [(10, 100), (11, 400)]);
    assert_eq!(b.mem.read(B_BASE, 100), &m1[..]);
    assert_eq!(b.mem.read(B_BASE + 0x1000, 400), &m2[..]);
    assert_eq!(b.qp.counters().rx_duplicates, 2);
}

/// A QP of one service drops the packets of another (rxe `check_type_state`).
#[test]
fn services_do_not_mix() {
    let (mut a, _) = uc_pair();
    let (mut ra, mut rb) = pair(PMTU, false, 0);
    let lk = ra.mr.lkey;
    recv(&mut rb, 1, B_BASE, 64);
    recv(&mut a, 1, A_BASE, 64);
    // RC SEND to a UC QP (its QPN): dropped.
    ra.qp
        .post_send(wr(1, SendOp::Send, A_BASE, 8, lk), &ra.mrs)
        .unwrap();
    let p = ra.qp.poll_tx(0).unwrap();
    let mut p2 = p;
    p2.repr.bth.dest_qp = a.qp.config().qpn;
    a.fb = ra.fb; // same addresses as the RC sender
    deliver(&ra, &p2, &mut a);
    assert!(a.cq.is_empty());
    assert_eq!(a.qp.counters().rx_dropped_state, 1);
    // The same packet as UC to the RC QP: dropped.
    let mut p3 = p;
    p3.repr.bth.opcode = rdma::wire::Opcode::UcSendOnly;
    deliver(&ra, &p3, &mut rb);
    assert!(rb.cq.is_empty());
    assert_eq!(rb.qp.counters().rx_dropped_state, 1);
    // As RC: delivered (the test can fail).
    deliver(&ra, &p, &mut rb);
    assert_eq!(rb.cq.len(), 1);
}

/// UC over a shared receive queue: the SRQ's WQEs are consumed in order and a
/// dropped message's WQE (held by the QP) takes the next message.
#[test]
fn uc_with_srq() {
    let base = QpConfig {
        pmtu: PMTU,
        service: Service::Uc,
        srq: true,
        ..Default::default()
    };
    let (mut a, mut b) = pair_from(base, 5, 1);
    let mut srq = Srq::new(8, 1, 0).unwrap();
    for k in 0..2 {
        srq.post(
            RecvWr {
                wr_id: 20 + k,
                sge: Sge {
                    addr: B_BASE + 0x1000 * k,
                    len: 1024,
                    lkey: b.mr.lkey,
                },
            },
            None,
        )
        .unwrap();
    }
    let lk = a.mr.lkey;
    fill(&mut a, A_BASE, 600, 1);
    let m2 = fill(&mut a, A_BASE + 0x1000, 300, 2);
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 600, lk), &a.mrs)
        .unwrap();
    a.qp.post_send(wr(2, SendOp::Send, A_BASE + 0x1000, 300, lk), &a.mrs)
        .unwrap();
    let mut i = 0;
    while let Some(p) = a.qp.poll_tx(0) {
        if i != 2 {
            // the LAST of message 1 is lost
            let mut buf = vec![0u8; 4096];
            let pl: Vec<u8> = match p.payload {
                Payload::Local { va, len, .. } => a.mem.read(va, len as usize).to_vec(),
                _ => vec![],
            };
            let n = a.fb.emit_frame(&p.repr, &pl, p.ecn, &mut buf).unwrap();
            let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| false).unwrap();
            let Host { qp, mrs, mem, .. } = &mut b;
            qp.on_rx_srq(&f, 0, mrs, mem, Some(&mut srq));
        }
        i += 1;
    }
    b.drain();
    let rc: Vec<_> = b.cq.iter().map(|c| (c.wr_id, c.byte_len)).collect();
    assert_eq!(rc, [(20, 300)]);
    assert_eq!(b.mem.read(B_BASE, 300), &m2[..]);
    assert_eq!(srq.len(), 1);
}

/// One message of the property test: a SEND (into a receive WQE) or a WRITE with
/// immediate (into its own region), `len` bytes, message `k`'s pattern.
#[derive(Debug, Clone, Copy)]
struct Msg {
    write: bool,
    len: u32,
}

fn msgs() -> impl Strategy<Value = Vec<Msg>> {
    proptest::collection::vec(
        (any::<bool>(), 0u32..=3 * PMTU + 17).prop_map(|(write, len)| Msg { write, len }),
        1..20,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over a link that loses, duplicates and reorders, every message the receiver
    /// completes is one the sender sent, whole (length, bytes, immediate), and they
    /// complete in sending order, each at most once; the sender completes every WQE
    /// with success; without loss, everything arrives. A dropped WRITE may leave
    /// part of its data in the region (IBA allows it), so only completed ones are
    /// checked.
    #[test]
    fn messages_arrive_whole_in_order_or_not_at_all(
        ms in msgs(),
        seed in any::<u64>(),
        loss in prop_oneof![Just(0u64), 0u64..250],
        dup in 0u64..250,
        jitter in prop_oneof![Just(0u64), 1u64..20_000],
    ) {
        let (mut a, mut b) = uc_pair();
        let lk = a.mr.lkey;
        let mut expect = vec![];
        for (k, m) in ms.iter().enumerate() {
            let src = A_BASE + 0x1000 * k as u64;
            expect.push(fill(&mut a, src, m.len as usize, k as u8 * 37 + 1));
            let op = if m.write {
                SendOp::WriteImm { remote_va: B_BASE + 0x20000 + 0x1000 * k as u64, rkey: b.mr.rkey, imm: k as u32 }
            } else {
                SendOp::SendImm(k as u32)
            };
            a.qp.post_send(wr(k as u64, op, src, m.len, lk), &a.mrs).unwrap();
            recv(&mut b, 1000 + k as u64, B_BASE + 0x1000 * k as u64, 4096);
        }
        let mut link = Link::new(seed, loss, dup, jitter);
        let mut hosts = [a, b];
        let n = ms.len();
        run(&mut hosts, &mut link, 0, 50_000_000, |h| h[0].cq.len() == n && link_quiet_probe(h));
        // Drain what is still on the link.
        let end = run(&mut hosts, &mut link, 50_000_000, 1_000_000, |_| false);
        prop_assert!(end > 0);
        let [a, b] = &hosts;
        prop_assert_eq!(a.cq.len(), n);
        prop_assert!(a.cq.iter().enumerate().all(|(k, c)| c.wr_id == k as u64 && c.status == WcStatus::Success));
        let mut last: Option<u32> = None;
        for (slot, c) in b.cq.iter().enumerate() {
            prop_assert_eq!(c.status, WcStatus::Success);
            // Receive WQEs are consumed in posting order, one per delivered message.
            prop_assert_eq!(c.wr_id, 1000 + slot as u64);
            let k = c.imm.expect("every message has an immediate");
            prop_assert!(last.is_none_or(|l| k > l), "in order, at most once: {:?} then {}", last, k);
            last = Some(k);
            let m = ms[k as usize];
            prop_assert_eq!(c.byte_len, m.len);
            let at = if m.write {
                prop_assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
                B_BASE + 0x20000 + 0x1000 * u64::from(k)
            } else {
                prop_assert_eq!(c.opcode, WcOpcode::Recv);
                B_BASE + 0x1000 * slot as u64
            };
            prop_assert_eq!(b.mem.read(at, m.len as usize), &expect[k as usize][..]);
        }
        if loss == 0 && jitter == 0 {
            prop_assert_eq!(b.cq.len(), n, "nothing lost or reordered: everything delivered");
        }
        prop_assert!(b.events.iter().all(|e| !matches!(e, QpEvent::Error)));
    }
}

/// The run loop's `done` sees only the hosts: stop once A completed everything (the
/// second run drains the link).
fn link_quiet_probe(_h: &[Host; 2]) -> bool {
    true
}
