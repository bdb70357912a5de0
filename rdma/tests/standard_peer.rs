//! What a standard peer (Linux rxe, a hardware RNIC) needs from the transport: plain
//! RoCEv2 when no extension was negotiated, coalesced and implied acknowledgements,
//! AckReq asked and honoured, RNR NAKs, duplicate READs re-executed from memory.
//! Lockstep exchanges through real frames here; the same behaviours under loss,
//! duplication and reordering are proptests in `lossy_link.rs`.

mod common;
use common::*;
use rdma::transport::*;
use rdma::wire::frame::RoceRepr;
use rdma::wire::transport_hdrs::{AethSyndrome, RethRepr};
use rdma::wire::{BthRepr, Ecn, Opcode};

#[test]
fn without_the_extension_every_packet_is_plain_rocev2() {
    let (mut a, mut b) = pair(256, false, 0);
    fill(&mut a, A_BASE, 700, 1);
    let (ak, bk, bl) = (a.mr.lkey, b.mr.rkey, b.mr.lkey);
    b.qp.post_recv(
        RecvWr {
            wr_id: 900,
            sge: Sge {
                addr: B_BASE + 0x4000,
                len: 1024,
                lkey: bl,
            },
        },
        &b.mrs,
    )
    .unwrap();
    let ops = [
        (
            SendOp::Write {
                remote_va: B_BASE,
                rkey: bk,
            },
            700,
        ),
        (
            SendOp::Read {
                remote_va: B_BASE,
                rkey: bk,
            },
            600,
        ),
        (SendOp::Send, 300),
        (
            SendOp::FetchAdd {
                remote_va: B_BASE + 0x8000,
                rkey: bk,
                add: 3,
            },
            8,
        ),
    ];
    for (i, (op, len)) in ops.into_iter().enumerate() {
        a.qp.post_send(
            wr(i as u64, op, A_BASE + 0x1000 * i as u64, len, ak),
            &a.mrs,
        )
        .unwrap();
    }
    // What would put extension bytes on the wire if the QP did not check `cc_ext`.
    a.qp.send_probe();
    b.qp.set_ack_window(5000);
    let mut sent = vec![];
    let answers = exchange(&mut a, &mut b, |p| {
        p.ecn = Ecn::Ce;
        sent.push(*p);
    });
    assert_eq!(a.cq.len(), 4, "{:?}", a.cq);
    assert!(a.cq.iter().all(|c| c.status == WcStatus::Success));
    for p in sent.iter().chain(&answers) {
        assert!(p.repr.ccext.is_none(), "{:?}", p.repr);
        assert!(
            (p.repr.bth.opcode as u8) <= Opcode::FetchAdd as u8,
            "{:?}",
            p.repr.bth.opcode
        );
    }
    assert!(b
        .events
        .iter()
        .any(|e| matches!(e, QpEvent::CeMarked { .. })));
}

#[test]
fn read_response_and_atomic_ack_implicitly_acknowledge_earlier_writes() {
    for atomic in [false, true] {
        let (mut a, mut b) = pair(256, false, 0);
        fill(&mut a, A_BASE, 600, 2);
        let (ak, bk) = (a.mr.lkey, b.mr.rkey);
        let w = SendOp::Write {
            remote_va: B_BASE,
            rkey: bk,
        };
        a.qp.post_send(wr(1, w, A_BASE, 600, ak), &a.mrs).unwrap();
        a.qp.post_send(wr(2, SendOp::Send, A_BASE, 0, ak), &a.mrs)
            .unwrap();
        let op = if atomic {
            SendOp::FetchAdd {
                remote_va: B_BASE + 0x8000,
                rkey: bk,
                add: 1,
            }
        } else {
            SendOp::Read {
                remote_va: B_BASE + 0x100,
                rkey: bk,
            }
        };
        a.qp.post_send(wr(3, op, A_BASE + 0x2000, 8, ak), &a.mrs)
            .unwrap();
        b.qp.post_recv(
            RecvWr {
                wr_id: 900,
                sge: Sge {
                    addr: B_BASE + 0x4000,
                    len: 64,
                    lkey: b.mr.lkey,
                },
            },
            &b.mrs,
        )
        .unwrap();
        // Every plain ACK is lost: only the response reaches A.
        let answers = exchange_filtered(
            &mut a,
            &mut b,
            |_| {},
            |p| p.repr.bth.opcode != Opcode::Acknowledge,
        );
        assert!(answers
            .iter()
            .any(|p| p.repr.bth.opcode == Opcode::Acknowledge));
        let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            vec![
                (1, WcStatus::Success),
                (2, WcStatus::Success),
                (3, WcStatus::Success)
            ],
            "atomic {atomic}"
        );
        let c = a.qp.counters();
        assert_eq!(
            (c.tx_retransmits, c.rx_bad_response, c.rewinds),
            (0, 0, 0),
            "atomic {atomic}"
        );
        assert_eq!(a.qp.una_psn(), a.qp.next_psn());
    }
}

#[test]
fn one_coalesced_ack_completes_many_messages() {
    let (mut a, mut b) = pair(256, false, 0);
    fill(&mut a, A_BASE, 1000, 3);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    for i in 0..4u64 {
        let w = SendOp::Write {
            remote_va: B_BASE + 0x1000 * i,
            rkey: bk,
        };
        a.qp.post_send(wr(i, w, A_BASE, 1000, ak), &a.mrs).unwrap();
    }
    // Only the last ACK (PSN 15) arrives: it acknowledges all 16 PSNs.
    let answers = exchange_filtered(&mut a, &mut b, |_| {}, |p| p.repr.bth.psn == 15);
    assert_eq!(answers.len(), 16, "one ACK per packet from B");
    assert_eq!(
        a.cq.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(a.qp.counters().tx_retransmits, 0);
    assert_eq!(a.qp.acked_lsn(), 4000);
}

#[test]
fn ack_req_every_64_packets_and_at_message_end_and_responder_honours_it() {
    let (mut a, mut b) = pair(256, false, 0);
    b.qp.set_ack_coalesce(u16::MAX);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let w = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    a.qp.post_send(wr(1, w, A_BASE, 150 * 256, ak), &a.mrs)
        .unwrap();
    a.qp.post_send(wr(2, w, A_BASE, 256, ak), &a.mrs).unwrap();
    let mut asked = vec![];
    let answers = exchange(&mut a, &mut b, |p| {
        if p.repr.bth.ack_req {
            asked.push(p.repr.bth.psn);
        }
    });
    assert_eq!(asked, vec![63, 127, 149, 150]);
    let acked: Vec<_> = answers.iter().map(|p| p.repr.bth.psn).collect();
    assert_eq!(
        acked,
        vec![63, 127, 149, 150],
        "B acknowledges exactly what was asked"
    );
    assert_eq!(a.cq.len(), 2);
}

/// A send window of ten 256 B packets and a responder that acknowledges
/// only on request: the packet that fills the window asks, so the transfer
/// moves by ACKs, never by the retransmit timer.
#[test]
fn the_packet_that_fills_the_window_asks_for_an_ack() {
    let (mut a, mut b) = pair(256, false, 0);
    b.qp.set_ack_coalesce(u16::MAX);
    a.qp.set_window(10 * 256);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let w = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    a.qp.post_send(wr(1, w, A_BASE, 30 * 256, ak), &a.mrs)
        .unwrap();
    let mut asked = vec![];
    exchange(&mut a, &mut b, |p| {
        if p.repr.bth.ack_req {
            asked.push(p.repr.bth.psn);
        }
    });
    assert_eq!(asked, vec![9, 19, 29]);
    assert_eq!(a.cq.len(), 1);
    assert_eq!(a.qp.counters().tx_retransmits, 0);
    assert_eq!(a.qp.counters().timeouts, 0);
}

#[test]
fn duplicate_read_is_replayed_only_for_the_rest_of_an_earlier_read() {
    let (_a, mut b) = pair(256, false, 0);
    fill(&mut b, B_BASE, 700, 3);
    let rkey = b.mr.rkey;
    let read = |psn, va: u64, len| {
        let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, 0x22, psn));
        r.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: len,
        });
        r
    };
    let psns = |out: &[TxPacket]| out.iter().map(|p| p.repr.bth.psn).collect::<Vec<_>>();
    // READ 700 bytes at PSN 0..=2 (responses not yet sent), then a WRITE at PSN 3.
    let first = feed(&mut b, read(0, B_BASE, 700), &[]);
    assert_eq!(psns(&first), vec![0, 1, 2]);
    let mut w = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x22, 3));
    w.reth = Some(RethRepr {
        va: B_BASE + 0x4000,
        rkey,
        dma_len: 4,
    });
    assert_eq!(psns(&feed(&mut b, w, &[1, 2, 3, 4])), vec![3]);
    // The tail from PSN 2 (VA + 512, 188 bytes): a new, shorter PSN range, answered as
    // the rest of the original response (LAST: rxe's completer wants MIDDLE/LAST once it
    // has the FIRST).
    let out = feed(&mut b, read(2, B_BASE + 512, 188), &[]);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].repr.bth.opcode, out[0].repr.bth.psn),
        (Opcode::ReadResponseLast, 2)
    );
    assert_eq!(
        out[0].payload,
        rdma::transport::Payload::Remote {
            rkey,
            va: B_BASE + 512,
            len: 188
        }
    );
    // Not the rest of that READ from its PSN, or not a READ's PSN: dropped.
    for (p, va, len) in [
        (2, B_BASE + 256, 188),
        (2, B_BASE + 512, 100),
        (1, B_BASE + 512, 188),
        (3, B_BASE, 8),
    ] {
        assert!(
            feed(&mut b, read(p, va, len), &[]).is_empty(),
            "PSN {p} VA {va:#x} len {len}"
        );
    }
    // Region gone: a duplicate is not answered from memory no region covers.
    let before = b.qp.counters().rx_duplicates;
    b.mrs.deregister(rkey).unwrap();
    assert!(feed(&mut b, read(0, B_BASE, 700), &[]).is_empty());
    assert_eq!(b.qp.counters().rx_duplicates, before + 1);
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn duplicate_read_supersedes_its_queued_replay() {
    let (_a, mut b) = pair(256, false, 0);
    let rkey = b.mr.rkey;
    let read = |psn, off: u64| {
        let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, 0x22, psn));
        r.reth = Some(RethRepr {
            va: B_BASE + off,
            rkey,
            dma_len: 2048 - off as u32,
        });
        r
    };
    b.qp.set_resp_window(0);
    // Window 0: one response packet goes, the rest waits in the queue.
    let out = feed(&mut b, read(0, 0), &[]);
    assert_eq!(out.len(), 1);
    let out = feed(&mut b, read(4, 1024), &[]);
    assert_eq!(out.len(), 1, "the duplicate's first packet");
    b.qp.set_resp_window(u32::MAX);
    let mut rest = vec![];
    while let Some(p) = b.qp.poll_tx(0) {
        rest.push(p.repr.bth.psn);
    }
    assert_eq!(
        rest,
        vec![5, 6, 7],
        "only the replay from PSN 4 is left, once"
    );
}

#[test]
fn rnr_nak_carries_the_configured_timer_and_the_requester_waits_it() {
    let (mut a, mut b) = pair(256, false, 0);
    let ak = a.mr.lkey;
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 100, ak), &a.mrs)
        .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    deliver(&a, &p, &mut b);
    let nak = b.qp.poll_tx(0).unwrap();
    let timer = b.qp.config().min_rnr_timer;
    assert_eq!(
        nak.repr.aeth.map(|x| x.syndrome),
        Some(AethSyndrome::RnrNak { timer })
    );
    deliver_at(&b, &nak, &mut a, 1000);
    // A duplicate of the same RNR NAK while waiting is not a second retry.
    deliver_at(&b, &nak, &mut a, 1500);
    let wait = rdma::wire::transport_hdrs::rnr_timer_ns(timer);
    assert_eq!(a.qp.next_timer(), Some(1000 + wait));
    assert!(
        a.qp.poll_tx(1000 + wait - 1).is_none(),
        "nothing during the RNR wait"
    );
    a.qp.on_timer(1000 + wait);
    let again = a.qp.poll_tx(1000 + wait).expect("the SEND again");
    assert_eq!((again.repr.bth.psn, again.retransmit), (0, true));
}

#[test]
fn only_the_connected_peers_address_is_accepted_whatever_the_udp_port() {
    let (mut a, mut b) = pair(256, false, 0);
    let data = fill(&mut a, A_BASE, 100, 4);
    let w = SendOp::Write {
        remote_va: B_BASE,
        rkey: b.mr.rkey,
    };
    a.qp.post_send(wr(1, w, A_BASE, 100, a.mr.lkey), &a.mrs)
        .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    let real = a.fb.net;
    // Same packet from another host of the subnet: dropped, counted, not executed.
    a.fb.net.src_ip = rdma::wire::Ipv4Address([10, 0, 0, 9]);
    deliver(&a, &p, &mut b);
    assert_eq!(b.qp.counters().rx_wrong_source, 1);
    assert_eq!(b.qp.expected_psn(), 0);
    assert!(b.mem.read(B_BASE, 100).iter().all(|&x| x == 0));
    assert!(b.qp.poll_tx(0).is_none(), "no answer to a stranger");
    // From the peer, on another UDP source port (ECMP entropy): accepted.
    a.fb.net = rdma::wire::frame::NetHeaders {
        udp_src_port: 0xD123,
        ..real
    };
    deliver(&a, &p, &mut b);
    assert_eq!(b.mem.read(B_BASE, 100), &data[..]);
    let ack = b.qp.poll_tx(0).unwrap();
    // The ACK, forged from another address, does not complete A's WRITE.
    b.fb.net.src_ip = rdma::wire::Ipv4Address([10, 0, 0, 9]);
    deliver(&b, &ack, &mut a);
    assert_eq!((a.qp.counters().rx_wrong_source, a.cq.len()), (1, 0));
    b.fb.net.src_ip = rdma::wire::Ipv4Address([10, 0, 0, 2]);
    deliver(&b, &ack, &mut a);
    assert_eq!(
        a.cq.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
}
