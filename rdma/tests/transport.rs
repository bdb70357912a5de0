//! Scenario tests of the RC transport over the in-memory link (virtual time).

mod common;
use common::*;
use rdma::transport::*;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};

fn all_done(n: usize) -> impl FnMut(&[Host; 2]) -> bool {
    move |h: &[Host; 2]| h[0].cq.len() >= n
}

#[test]
fn write_read_send_atomic_lossless() {
    let (mut a, mut b) = pair(256, false, 0xFF_FFF0);
    let data = fill(&mut a, A_BASE, 1000, 7);
    let rsrc = fill(&mut b, B_BASE + 0x8000, 700, 9);
    b.mem.write_u64(B_BASE + 0x100, 40);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    b.qp.post_recv(
        RecvWr {
            wr_id: 900,
            sge: Sge {
                addr: B_BASE + 0x4000,
                len: 2048,
                lkey: b.mr.lkey,
            },
        },
        &b.mrs,
    )
    .unwrap();
    b.qp.post_recv(
        RecvWr {
            wr_id: 901,
            sge: Sge {
                addr: B_BASE + 0x5000,
                len: 2048,
                lkey: b.mr.lkey,
            },
        },
        &b.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            1,
            SendOp::Write {
                remote_va: B_BASE + 0x1000,
                rkey: bk,
            },
            A_BASE,
            1000,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            2,
            SendOp::Read {
                remote_va: B_BASE + 0x8000,
                rkey: bk,
            },
            A_BASE + 0x2000,
            700,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(wr(3, SendOp::SendImm(0xABCD), A_BASE, 513, ak), &a.mrs)
        .unwrap();
    a.qp.post_send(
        wr(
            4,
            SendOp::FetchAdd {
                remote_va: B_BASE + 0x100,
                rkey: bk,
                add: 2,
            },
            A_BASE + 0x3000,
            8,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            5,
            SendOp::CompareSwap {
                remote_va: B_BASE + 0x100,
                rkey: bk,
                compare: 42,
                swap: 7,
            },
            A_BASE + 0x3008,
            8,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            6,
            SendOp::WriteImm {
                remote_va: B_BASE + 0x9000,
                rkey: bk,
                imm: 5,
            },
            A_BASE,
            0,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    run(&mut hosts, &mut link, 0, 10_000_000, all_done(6));
    let [a, b] = &hosts;
    let ids: Vec<u64> = a.cq.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);
    assert!(
        a.cq.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        a.cq
    );
    assert_eq!(a.cq[1].opcode, WcOpcode::RdmaRead);
    assert_eq!(b.mem.read(B_BASE + 0x1000, 1000), &data[..]);
    assert_eq!(a.mem.read(A_BASE + 0x2000, 700), &rsrc[..]);
    assert_eq!(b.mem.read(B_BASE + 0x4000, 513), &data[..513]);
    assert_eq!(a.mem.read_u64(A_BASE + 0x3000), 40);
    assert_eq!(a.mem.read_u64(A_BASE + 0x3008), 42);
    assert_eq!(b.mem.read_u64(B_BASE + 0x100), 7);
    assert_eq!(b.cq.len(), 2);
    assert_eq!(
        (b.cq[0].wr_id, b.cq[0].opcode, b.cq[0].byte_len, b.cq[0].imm),
        (900, WcOpcode::Recv, 513, Some(0xABCD))
    );
    assert_eq!(
        (b.cq[1].wr_id, b.cq[1].opcode, b.cq[1].imm),
        (901, WcOpcode::RecvRdmaWithImm, Some(5))
    );
    // PSNs wrapped past 0xFFFFFF and nothing was retransmitted.
    assert_eq!(a.qp.counters().tx_retransmits, 0);
    assert_eq!(b.qp.counters().nak_seq_sent, 0);
}

#[test]
fn lost_packet_gives_one_nak_and_go_back_n() {
    let (mut a, b) = pair(256, false, 0);
    let data = fill(&mut a, A_BASE, 256 * 8, 3);
    let bk = b.mr.rkey;
    let ak = a.mr.lkey;
    a.qp.post_send(
        wr(
            1,
            SendOp::Write {
                remote_va: B_BASE,
                rkey: bk,
            },
            A_BASE,
            256 * 8,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    let mut hosts = [a, b];
    // Send all 8 packets, drop the third (PSN 2), deliver the rest.
    let mut pkts = vec![];
    while let Some(p) = hosts[0].qp.poll_tx(0) {
        pkts.push(p);
    }
    assert_eq!(pkts.len(), 8);
    let mut buf = vec![0u8; 4096];
    for (i, p) in pkts.iter().enumerate() {
        if i == 2 {
            continue;
        }
        let n = p
            .build_frame(&hosts[0].fb, &hosts[0].mem, &mut buf)
            .unwrap();
        let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| false).unwrap();
        let Host { qp, mrs, mem, .. } = &mut hosts[1];
        qp.on_rx(&f, 1000, mrs, mem);
    }
    // B answers: ACK for PSN 1 then exactly one NAK(PSN 2), no more for the later drops.
    let mut acks = vec![];
    while let Some(p) = hosts[1].qp.poll_tx(2000) {
        acks.push(p);
    }
    let syn: Vec<_> = acks
        .iter()
        .map(|p| (p.repr.bth.psn, p.repr.aeth.unwrap().syndrome))
        .collect();
    assert_eq!(
        syn,
        vec![
            (1, AethSyndrome::ACK),
            (2, AethSyndrome::Nak(NakCode::PsnSequenceError))
        ]
    );
    assert_eq!(hosts[1].qp.counters().nak_seq_sent, 1);
    assert_eq!(hosts[1].qp.counters().rx_out_of_sequence, 5);
    // Deliver them to A: it goes back to PSN 2.
    for p in &acks {
        let n = p
            .build_frame(&hosts[1].fb, &hosts[1].mem, &mut buf)
            .unwrap();
        let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| false).unwrap();
        let Host { qp, mrs, mem, .. } = &mut hosts[0];
        qp.on_rx(&f, 3000, mrs, mem);
    }
    let r = hosts[0].qp.poll_tx(3000).unwrap();
    assert_eq!(r.repr.bth.psn, 2);
    assert!(r.retransmit);
    let mut link = Link::new(5, 0, 0, 0);
    // Put the retransmitted packet back on the link and run to completion.
    let n = r
        .build_frame(&hosts[0].fb, &hosts[0].mem, &mut buf)
        .unwrap();
    link.send(3000, 1, buf[..n].to_vec());
    run(&mut hosts, &mut link, 3000, 5_000_000, all_done(1));
    assert_eq!(hosts[0].cq[0].status, WcStatus::Success);
    assert_eq!(hosts[1].mem.read(B_BASE, 256 * 8), &data[..]);
    assert_eq!(hosts[1].qp.counters().nak_seq_sent, 1);
}

#[test]
fn peer_vanished_retry_exceeded_and_flush() {
    let (mut a, b) = pair(1024, false, 0);
    let ak = a.mr.lkey;
    let bk = b.mr.rkey;
    for i in 0..4 {
        a.qp.post_send(
            wr(
                i,
                SendOp::Write {
                    remote_va: B_BASE,
                    rkey: bk,
                },
                A_BASE,
                3000,
                ak,
            ),
            &a.mrs,
        )
        .unwrap();
    }
    let mut hosts = [a, b];
    let mut link = Link::new(3, 0, 0, 0);
    link.up = false;
    run(&mut hosts, &mut link, 0, 100_000_000, |h| {
        h[0].qp.state() == QpState::Err
    });
    let a = &hosts[0];
    assert_eq!(a.qp.state(), QpState::Err);
    let st: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    // retry_cnt = 7 retries, then the 8th timeout is fatal.
    assert_eq!(a.qp.counters().timeouts, 8);
    let timeouts = a
        .events
        .iter()
        .filter(|e| matches!(e, QpEvent::Timeout { .. }))
        .count();
    assert_eq!(timeouts, 8);
    // Posting now completes immediately with a flush error.
    let mut a = hosts.into_iter().next().unwrap();
    a.qp.post_send(wr(9, SendOp::Send, A_BASE, 1, ak), &a.mrs)
        .unwrap();
    assert_eq!(
        a.qp.poll_cq().map(|c| (c.wr_id, c.status)),
        Some((9, WcStatus::WrFlushErr))
    );
}

#[test]
fn bad_rkey_range_permission_and_pd_are_nak_0x62_and_write_nothing() {
    // Cases: unknown rkey, out of range, no REMOTE_WRITE, and an rkey of a
    // region with every right but in another protection domain than B's QP.
    for case in 0..4 {
        let (mut a, mut b) = pair(256, false, 0);
        fill(&mut a, A_BASE, 300, 1);
        let ro = b
            .mrs
            .register(B_BASE + 0x1000, 0x1000, Access::REMOTE_READ)
            .unwrap();
        let other_pd = b
            .mrs
            .register_in(5, B_BASE, MEM_LEN as u64, Access::all())
            .unwrap();
        let (va, rkey) = match case {
            0 => (B_BASE, b.mr.rkey ^ 0x100),
            1 => (B_BASE + MEM_LEN as u64 - 100, b.mr.rkey),
            2 => (B_BASE + 0x1000, ro.rkey),
            _ => (B_BASE, other_pd.rkey),
        };
        let ak = a.mr.lkey;
        a.qp.post_send(
            wr(
                1,
                SendOp::Write {
                    remote_va: va,
                    rkey,
                },
                A_BASE,
                300,
                ak,
            ),
            &a.mrs,
        )
        .unwrap();
        a.qp.post_send(wr(2, SendOp::Send, A_BASE, 1, ak), &a.mrs)
            .unwrap();
        let before = b.mem.bytes.clone();
        let mut hosts = [a, b];
        let mut link = Link::new(9, 0, 0, 0);
        run(&mut hosts, &mut link, 0, 5_000_000, all_done(2));
        let [a, b] = &hosts;
        assert_eq!(a.cq[0].status, WcStatus::RemAccessErr, "case {case}");
        assert_eq!(a.cq[1].status, WcStatus::WrFlushErr);
        assert_eq!(a.qp.state(), QpState::Err);
        assert!(a.events.iter().any(|e| matches!(
            e,
            QpEvent::Nak {
                syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
                ..
            }
        )));
        assert!(
            b.mem.bytes == before,
            "case {case}: responder memory changed"
        );
        assert_eq!(b.qp.state(), QpState::Err);
    }
}

#[test]
fn rnr_nak_then_recv_posted_completes() {
    let (mut a, b) = pair(256, false, 0);
    let data = fill(&mut a, A_BASE, 100, 4);
    let ak = a.mr.lkey;
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 100, ak), &a.mrs)
        .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(2, 0, 0, 0);
    let t = run(&mut hosts, &mut link, 0, 200_000, |h| {
        h[1].qp.counters().rnr_nak_sent >= 2
    });
    assert!(hosts[1].qp.counters().rnr_nak_sent >= 2);
    assert!(hosts[0].cq.is_empty());
    let lk = hosts[1].mr.lkey;
    let Host { qp, mrs, .. } = &mut hosts[1];
    qp.post_recv(
        RecvWr {
            wr_id: 77,
            sge: Sge {
                addr: B_BASE,
                len: 128,
                lkey: lk,
            },
        },
        mrs,
    )
    .unwrap();
    run(&mut hosts, &mut link, t, 5_000_000, all_done(1));
    assert_eq!(hosts[0].cq[0].status, WcStatus::Success);
    assert_eq!((hosts[1].cq[0].wr_id, hosts[1].cq[0].byte_len), (77, 100));
    assert_eq!(hosts[1].mem.read(B_BASE, 100), &data[..]);
}

#[test]
fn rnr_retry_exhausted_is_rnr_retry_exc_err() {
    let mut cfg_a = QpConfig {
        qpn: 0x11,
        dest_qpn: 0x22,
        pmtu: 256,
        rnr_retry: 2,
        ..Default::default()
    };
    cfg_a.timeout_ns = 1_000_000;
    let cfg_b = QpConfig {
        qpn: 0x22,
        dest_qpn: 0x11,
        pmtu: 256,
        ..Default::default()
    };
    let a = Host::new(1, cfg_a, A_BASE);
    let b = Host::new(2, cfg_b, B_BASE);
    let ak = a.mr.lkey;
    let mut hosts = [a, b];
    let Host { qp, mrs, .. } = &mut hosts[0];
    qp.post_send(wr(1, SendOp::Send, A_BASE, 10, ak), mrs)
        .unwrap();
    let mut link = Link::new(2, 0, 0, 0);
    run(&mut hosts, &mut link, 0, 50_000_000, all_done(1));
    assert_eq!(hosts[0].cq[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(hosts[1].qp.counters().rnr_nak_sent, 3);
}

/// Posts one WRITE of `len` bytes from the start of A's region to the
/// start of B's.
fn write_a_to_b(a: &mut Host, b: &Host, len: u32) {
    let op = SendOp::Write {
        remote_va: B_BASE,
        rkey: b.mr.rkey,
    };
    a.qp.post_send(wr(1, op, A_BASE, len, a.mr.lkey), &a.mrs)
        .unwrap();
}

#[test]
fn window_gates_bytes_in_flight() {
    let (mut a, b) = pair(256, true, 0);
    fill(&mut a, A_BASE, 256 * 10, 1);
    write_a_to_b(&mut a, &b, 256 * 10);
    a.qp.set_window(600);
    let mut n = 0;
    while let Some(p) = a.qp.poll_tx(0) {
        assert_eq!(p.repr.ccext.unwrap().lsn, 256 * n);
        n += 1;
    }
    assert_eq!(n, 2, "600-byte window allows two 256-byte packets");
    assert_eq!(a.qp.in_flight(), 512);
    assert_eq!(
        (a.qp.next_lsn(), a.qp.acked_lsn()),
        (2560, 0),
        "the whole WQE's LSN range is assigned"
    );
    assert_eq!(
        (a.qp.next_psn(), a.qp.una_psn(), a.qp.sq_outstanding()),
        (10, 0, 1)
    );
    a.qp.set_window(u32::MAX);
    assert!(a.qp.poll_tx(0).is_some());
    // A window below one packet (LDCP cw < 1): one packet at a time, never zero.
    let (mut a, b) = pair(256, true, 0);
    fill(&mut a, A_BASE, 256 * 4, 1);
    write_a_to_b(&mut a, &b, 256 * 4);
    a.qp.set_window(100);
    assert!(a.qp.poll_tx(0).is_some());
    assert!(
        a.qp.poll_tx(0).is_none(),
        "only one packet while one is in flight"
    );
}

#[test]
fn ce_marks_are_reported_and_echoed_and_read_responses_acked() {
    let (mut a, mut b) = pair(256, true, 0);
    fill(&mut a, A_BASE, 2000, 1);
    let src = fill(&mut b, B_BASE + 0x4000, 1000, 2);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    for i in 0..5 {
        a.qp.post_send(
            wr(
                i,
                SendOp::Write {
                    remote_va: B_BASE,
                    rkey: bk,
                },
                A_BASE,
                2000,
                ak,
            ),
            &a.mrs,
        )
        .unwrap();
    }
    a.qp.post_send(
        wr(
            9,
            SendOp::Read {
                remote_va: B_BASE + 0x4000,
                rkey: bk,
            },
            A_BASE + 0x8000,
            1000,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(11, 0, 0, 0);
    link.mark_ce = 500;
    run(&mut hosts, &mut link, 0, 10_000_000, |h| {
        h[0].cq.len() >= 6
            && h[1]
                .events
                .iter()
                .any(|e| matches!(e, QpEvent::ReadRespAck { lsn: 1000, .. }))
    });
    let [a, b] = &hosts;
    assert!(a.cq.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(a.mem.read(A_BASE + 0x8000, 1000), &src[..]);
    let marked = b
        .events
        .iter()
        .filter(|e| matches!(e, QpEvent::CeMarked { .. }))
        .count();
    assert!(marked > 0);
    let echoed: u32 = a
        .events
        .iter()
        .map(|e| {
            if let QpEvent::Ack { ce_count, .. } = e {
                u32::from(*ce_count)
            } else {
                0
            }
        })
        .sum();
    assert_eq!(
        echoed as usize, marked,
        "every CE mark on a request is echoed once"
    );
    // LDCP 3.1: the READ responses were acknowledged back to the responder.
    let rr: Vec<u32> = b
        .events
        .iter()
        .filter_map(|e| {
            if let QpEvent::ReadRespAck { lsn, .. } = e {
                Some(*lsn)
            } else {
                None
            }
        })
        .collect();
    // Requester ACKs of READ responses are cumulative and coalesced when several
    // responses arrive in one burst (as the LDCP uNIC does under load).
    assert!(!rr.is_empty() && rr.len() <= 4, "{rr:?}");
    assert!(rr.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(*rr.last().unwrap(), 1000);
    // The ACK LSNs advance to the total of the requester LSN space.
    let last_acked = a.events.iter().rev().find_map(|e| {
        if let QpEvent::Ack { acked_lsn, .. } = e {
            Some(*acked_lsn)
        } else {
            None
        }
    });
    assert_eq!(last_acked, Some(5 * 2000 + 64));
}

#[test]
fn qp_state_transitions() {
    let mut q = Qp::new(QpConfig::default()).unwrap();
    assert!(q.modify(QpState::Rts).is_err());
    q.modify(QpState::Init).unwrap();
    assert!(q.modify(QpState::Rts).is_err());
    q.modify(QpState::Rtr).unwrap();
    q.modify(QpState::Rts).unwrap();
    q.modify(QpState::Sqd).unwrap();
    q.modify(QpState::Rts).unwrap();
    q.modify(QpState::Err).unwrap();
    assert!(q.modify(QpState::Rts).is_err());
    q.modify(QpState::Reset).unwrap();
    assert_eq!(q.state(), QpState::Reset);
    assert!(Qp::new(QpConfig {
        pmtu: 1500,
        ..Default::default()
    })
    .is_err());
    let mrs = MrTable::new();
    q.modify(QpState::Init).unwrap();
    let w = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sge: Sge {
            addr: 0,
            len: 1,
            lkey: 5,
        },
        signaled: true,
        solicited: false,
    };
    assert_eq!(q.post_send(w, &mrs), Err(QpError::BadState(QpState::Init)));
    q.modify(QpState::Rtr).unwrap();
    q.modify(QpState::Rts).unwrap();
    assert!(matches!(
        q.post_send(w, &mrs),
        Err(QpError::LocalProtection(_))
    ));
}

#[test]
fn probe_roundtrip_echoes_int_hops() {
    use rdma::wire::frame::IntInsert;
    use rdma::wire::int::{push_hop, HopRecord, PushOutcome};
    let (mut a, mut b) = pair(1024, true, 0);
    a.fb.int = Some(IntInsert {
        int_dscp: 0x18,
        max_hops: 4,
    });
    a.qp.send_probe();
    let p = a.qp.poll_tx(0).unwrap();
    assert_eq!(p.repr.bth.opcode, rdma::wire::Opcode::Probe);
    let mut buf = vec![0u8; 512];
    let n = p.build_frame(&a.fb, &a.mem, &mut buf).unwrap();
    // Two switches push records.
    let h1 = HopRecord::from_units(1, 7, 1000, 5000, 640, 100_000_000_000);
    let h2 = HopRecord::from_units(2, 3, 1500, 9000, 0, 25_000_000_000);
    let PushOutcome::Pushed { len, .. } = push_hop(&mut buf, n, 14, 0x18, &h1).unwrap() else {
        panic!()
    };
    let PushOutcome::Pushed { len, .. } = push_hop(&mut buf, len, 14, 0x18, &h2).unwrap() else {
        panic!()
    };
    let f = rdma::wire::parse_frame(&buf[..len], &Default::default(), |_| true).unwrap();
    b.qp.on_rx(&f, 10, &mut b.mrs, &mut b.mem);
    let r = b.qp.poll_tx(20).unwrap();
    assert_eq!(r.repr.bth.opcode, rdma::wire::Opcode::ProbeResponse);
    let n = r.build_frame(&b.fb, &b.mem, &mut buf).unwrap();
    let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| true).unwrap();
    a.qp.on_rx(&f, 30, &mut a.mrs, &mut a.mem);
    match a.qp.poll_event() {
        Some((QpEvent::ProbeResponse { n_hops }, Some(hops))) => {
            assert_eq!(n_hops, 2);
            assert_eq!(hops.records(), &[h2, h1], "newest first");
        }
        e => panic!("expected probe response, got {e:?}"),
    }
}

#[test]
fn ack_echoes_int_hops_of_the_data_packet() {
    use rdma::wire::ccext::CcExtFlags;
    use rdma::wire::frame::IntInsert;
    use rdma::wire::int::{push_hop, HopRecord, PushOutcome};
    let (mut a, mut b) = pair(1024, true, 0);
    a.fb.int = Some(IntInsert {
        int_dscp: 0x18,
        max_hops: 4,
    });
    fill(&mut a, A_BASE, 100, 1);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    a.qp.post_send(
        wr(
            1,
            SendOp::Write {
                remote_va: B_BASE,
                rkey: bk,
            },
            A_BASE,
            100,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    assert_eq!(p.repr.ccext.unwrap().lsn, 0);
    let mut buf = vec![0u8; 512];
    let n = p.build_frame(&a.fb, &a.mem, &mut buf).unwrap();
    let h = HopRecord::from_units(4, 9, 123_456, 7_000_000, 64 * 50, 100_000_000_000);
    let PushOutcome::Pushed { len, .. } = push_hop(&mut buf, n, 14, 0x18, &h).unwrap() else {
        panic!()
    };
    let f = rdma::wire::parse_frame(&buf[..len], &Default::default(), |_| true).unwrap();
    b.qp.on_rx(&f, 100, &mut b.mrs, &mut b.mem);
    assert_eq!(b.mem.read(B_BASE, 100), a.mem.read(A_BASE, 100));
    let ack = b.qp.poll_tx(200).unwrap();
    let e = ack.repr.ccext.unwrap();
    assert!(e.flags.contains(CcExtFlags::ACK));
    assert_eq!((e.n_hops, e.hops[0]), (1, h));
    assert_eq!(e.lsn, 100, "ACK carries the next expected LSN");
    let n = ack.build_frame(&b.fb, &b.mem, &mut buf).unwrap();
    let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| true).unwrap();
    a.qp.on_rx(&f, 300, &mut a.mrs, &mut a.mem);
    match a.qp.poll_event() {
        Some((
            QpEvent::Ack {
                n_hops: 1,
                newly_acked: 100,
                acked_lsn: 100,
                ..
            },
            Some(hops),
        )) => assert_eq!(hops.records(), &[h]),
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(a.qp.poll_cq().map(|c| c.status), Some(WcStatus::Success));
}

#[test]
fn responder_replays_duplicate_read_from_requested_psn_and_atomic_from_cache() {
    use rdma::wire::frame::RoceRepr;
    use rdma::wire::transport_hdrs::{AtomicEthRepr, RethRepr};
    use rdma::wire::{BthRepr, Opcode};
    let (_a, mut b) = pair(256, false, 0);
    let src = fill(&mut b, B_BASE, 700, 3);
    b.mem.write_u64(B_BASE + 0x1000, 10);
    let rkey = b.mr.rkey;
    let read = |psn, off: u32| {
        let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, 0x22, psn));
        r.reth = Some(RethRepr {
            va: B_BASE + u64::from(off),
            rkey,
            dma_len: 700 - off,
        });
        r
    };
    let out = feed(&mut b, read(0, 0), &[]);
    let ops: Vec<_> = out
        .iter()
        .map(|p| (p.repr.bth.opcode, p.repr.bth.psn, p.payload.len()))
        .collect();
    assert_eq!(
        ops,
        vec![
            (Opcode::ReadResponseFirst, 0, 256),
            (Opcode::ReadResponseMiddle, 1, 256),
            (Opcode::ReadResponseLast, 2, 188)
        ]
    );
    // Duplicate READ re-issued from PSN 1 (VA + 256): replayed from PSN 1 with that
    // range, continuing the original response's opcode sequence.
    let out = feed(&mut b, read(1, 256), &[]);
    let ops: Vec<_> = out
        .iter()
        .map(|p| (p.repr.bth.opcode, p.repr.bth.psn, p.payload.len()))
        .collect();
    assert_eq!(
        ops,
        vec![
            (Opcode::ReadResponseMiddle, 1, 256),
            (Opcode::ReadResponseLast, 2, 188)
        ]
    );
    let Payload::Remote { va, .. } = out[0].payload else {
        panic!()
    };
    assert_eq!(b.mem.read(va, 256), &src[256..512]);
    // ATOMIC at PSN 3, then its duplicate: same original value, executed once.
    let mut fa = RoceRepr::new(BthRepr::new(Opcode::FetchAdd, 0x22, 3));
    fa.atomic = Some(AtomicEthRepr {
        va: B_BASE + 0x1000,
        rkey,
        swap_add: 5,
        compare: 0,
    });
    let o1 = feed(&mut b, fa, &[]);
    let o2 = feed(&mut b, fa, &[]);
    assert_eq!(o1[0].repr.atomic_ack.unwrap().orig, 10);
    assert_eq!(o2[0].repr.atomic_ack.unwrap().orig, 10);
    assert_eq!(
        b.mem.read_u64(B_BASE + 0x1000),
        15,
        "duplicate atomic not re-executed"
    );
    // Duplicate WRITE: re-ACKed with the newest in-order PSN, nothing NAK-ed.
    let mut w = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x22, 4));
    w.reth = Some(RethRepr {
        va: B_BASE + 0x2000,
        rkey,
        dma_len: 4,
    });
    let o1 = feed(&mut b, w, b"abcd");
    let o2 = feed(&mut b, w, b"abcd");
    assert_eq!((o1[0].repr.bth.psn, o2[0].repr.bth.psn), (4, 4));
    assert_eq!(o2[0].repr.aeth.unwrap().syndrome, AethSyndrome::ACK);
    assert_eq!(b.qp.counters().rx_duplicates, 3);
    assert_eq!(b.qp.counters().nak_seq_sent, 0);
    // A READ to a region without REMOTE_READ is NAK 0x62.
    let ro = b
        .mrs
        .register(B_BASE + 0x3000, 64, Access::REMOTE_WRITE)
        .unwrap();
    let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, 0x22, 5));
    r.reth = Some(RethRepr {
        va: B_BASE + 0x3000,
        rkey: ro.rkey,
        dma_len: 8,
    });
    let o = feed(&mut b, r, &[]);
    assert_eq!(
        o[0].repr.aeth.unwrap().syndrome,
        AethSyndrome::Nak(NakCode::RemoteAccessError)
    );
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn delayed_ack_every_n_packets_and_at_message_end() {
    let (mut a, mut b) = pair_with(256, false, 0, 4);
    fill(&mut a, A_BASE, 256 * 10, 1);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    a.qp.post_send(
        wr(
            1,
            SendOp::Write {
                remote_va: B_BASE,
                rkey: bk,
            },
            A_BASE,
            256 * 10 - 6,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            2,
            SendOp::Write {
                remote_va: B_BASE,
                rkey: bk,
            },
            A_BASE,
            256 * 2,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        wr(
            3,
            SendOp::Read {
                remote_va: B_BASE,
                rkey: bk,
            },
            A_BASE + 0x8000,
            10,
            ak,
        ),
        &a.mrs,
    )
    .unwrap();
    // Deliver one packet at a time and let B answer after each.
    let mut buf = vec![0u8; 4096];
    let mut answers = vec![];
    while let Some(p) = a.qp.poll_tx(0) {
        let n = p.build_frame(&a.fb, &a.mem, &mut buf).unwrap();
        let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| false).unwrap();
        b.qp.on_rx(&f, 0, &mut b.mrs, &mut b.mem);
        while let Some(r) = b.qp.poll_tx(0) {
            answers.push((r.repr.bth.opcode, r.repr.bth.psn));
        }
    }
    use rdma::wire::Opcode::*;
    // WRITE 1: PSNs 0..=9 -> ACK after 4 and 8 packets and at the last (AckReq).
    // WRITE 2: PSNs 10, 11 -> ACK at its last packet only.
    // READ (PSN 12): its response.
    assert_eq!(
        answers,
        vec![
            (Acknowledge, 3),
            (Acknowledge, 7),
            (Acknowledge, 9),
            (Acknowledge, 11),
            (ReadResponseOnly, 12)
        ]
    );
}

#[test]
fn delayed_ack_is_flushed_before_a_read_response() {
    use rdma::wire::frame::RoceRepr;
    use rdma::wire::transport_hdrs::RethRepr;
    use rdma::wire::{BthRepr, Opcode};
    let (_a, mut b) = pair_with(256, false, 0, 8);
    let (lk, rk) = (b.mr.lkey, b.mr.rkey);
    let Host { qp, mrs, .. } = &mut b;
    qp.post_recv(
        RecvWr {
            wr_id: 1,
            sge: Sge {
                addr: B_BASE,
                len: 64,
                lkey: lk,
            },
        },
        mrs,
    )
    .unwrap();
    // A SEND ONLY without AckReq (a hardware requester may do that): no ACK yet.
    let s = RoceRepr::new(BthRepr::new(Opcode::SendOnly, 0x22, 0));
    assert!(feed(&mut b, s, b"hi").is_empty());
    let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, 0x22, 1));
    r.reth = Some(RethRepr {
        va: B_BASE,
        rkey: rk,
        dma_len: 2,
    });
    let out: Vec<_> = feed(&mut b, r, &[])
        .iter()
        .map(|p| (p.repr.bth.opcode, p.repr.bth.psn))
        .collect();
    assert_eq!(
        out,
        vec![(Opcode::Acknowledge, 0), (Opcode::ReadResponseOnly, 1)]
    );
}

/// `poll_tx_control` hands out ACKs and only ACKs (what the NIC's scheduler
/// sends ahead of data, uncharged); data and READ responses stay for `poll_tx`.
#[test]
fn control_packets_are_separable_from_data() {
    use rdma::wire::Opcode;
    let (mut a, mut b) = pair(256, true, 0);
    fill(&mut a, A_BASE, 512, 3);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let write = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    a.qp.post_send(wr(1, write, A_BASE, 512, ak), &a.mrs)
        .unwrap();
    assert!(!a.qp.has_control());
    assert!(
        a.qp.poll_tx_control(0).is_none(),
        "requester data is not control"
    );
    let first = a.qp.poll_tx(0).expect("a WRITE First");
    assert!(!b.qp.has_control());
    deliver(&a, &first, &mut b);
    assert!(b.qp.has_control(), "B owes an ACK");
    let ack = b.qp.poll_tx_control(0).expect("the ACK");
    assert_eq!(ack.repr.bth.opcode, Opcode::Acknowledge);
    assert!(ack.priority);
    assert!(!b.qp.has_control() && b.qp.poll_tx_control(0).is_none());
    // A READ request: its response is data, not control.
    let read = SendOp::Read {
        remote_va: B_BASE,
        rkey: bk,
    };
    let second = a.qp.poll_tx(0).expect("the WRITE Last");
    deliver(&a, &second, &mut b);
    while b.qp.poll_tx_control(0).is_some() {}
    a.qp.post_send(wr(2, read, A_BASE + 1024, 256, ak), &a.mrs)
        .unwrap();
    let req = a.qp.poll_tx(0).expect("the READ request");
    assert_eq!(req.repr.bth.opcode, Opcode::ReadRequest);
    deliver(&a, &req, &mut b);
    assert!(!b.qp.has_control(), "a READ response is data");
    assert!(b.qp.poll_tx_control(0).is_none());
    let resp = b.qp.poll_tx(0).expect("the READ response");
    assert_eq!(resp.repr.bth.opcode, Opcode::ReadResponseOnly);
}

#[test]
fn send_psn_is_set_until_rts() {
    // ibverbs gives the send PSN at RTR -> RTS (IBV_QP_SQ_PSN).
    let mut q = Qp::new(QpConfig::default()).unwrap();
    q.modify(QpState::Init).unwrap();
    q.modify(QpState::Rtr).unwrap();
    q.set_sq_psn(0x12_3456).unwrap();
    assert_eq!((q.next_psn(), q.una_psn()), (0x12_3456, 0x12_3456));
    assert_eq!(q.config().sq_psn, 0x12_3456);
    assert!(q.set_sq_psn(1 << 24).is_err(), "PSNs have 24 bits");
    q.modify(QpState::Rts).unwrap();
    assert!(q.set_sq_psn(5).is_err(), "not once the requester may send");
    assert_eq!(q.next_psn(), 0x12_3456);
}

/// A QP without CC (`ack_events_without_progress: false`) raises one Ack
/// event per READ, at its first response packet (which acknowledges the
/// READ's whole LSN), instead of one per response packet; the data and the
/// completion are the same either way.
#[test]
fn read_without_cc_raises_one_ack_event_per_read() {
    let mut acks = vec![];
    for every in [true, false] {
        let cfg = |qpn, dest_qpn| QpConfig {
            qpn,
            dest_qpn,
            pmtu: 256,
            ack_events_without_progress: every,
            ..Default::default()
        };
        let mut a = Host::new(1, cfg(0x11, 0x22), A_BASE);
        let mut b = Host::new(2, cfg(0x22, 0x11), B_BASE);
        let src = fill(&mut b, B_BASE + 0x8000, 1000, 5);
        let (ak, bk) = (a.mr.lkey, b.mr.rkey);
        for id in 0..2u64 {
            a.qp.post_send(
                wr(
                    id,
                    SendOp::Read {
                        remote_va: B_BASE + 0x8000,
                        rkey: bk,
                    },
                    A_BASE + 0x2000 * (id + 1),
                    1000,
                    ak,
                ),
                &a.mrs,
            )
            .unwrap();
        }
        exchange(&mut a, &mut b, |_| {});
        assert_eq!(a.cq.len(), 2);
        assert!(a.cq.iter().all(|c| c.status == WcStatus::Success));
        for id in 0..2u64 {
            assert_eq!(a.mem.read(A_BASE + 0x2000 * (id + 1), 1000), &src[..]);
        }
        let ack = |e: &&QpEvent| matches!(e, QpEvent::Ack { .. });
        let progress =
            |e: &&QpEvent| matches!(e, QpEvent::Ack { newly_acked, .. } if *newly_acked > 0);
        assert_eq!(a.events.iter().filter(progress).count(), 2, "{every}");
        acks.push(a.events.iter().filter(ack).count());
    }
    // 1000 bytes at a 256-byte MTU: 4 response packets per READ.
    assert_eq!(acks, [8, 2]);
}
