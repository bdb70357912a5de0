//! Connections made by the IB communication manager on QP 1 (issue 41): two devices on
//! a ring pair, B listening on a service ID of rdma_cm's TCP port space; A's REQ, B's
//! REP, A's RTU carry the QPNs and first PSNs, both QPs connect from what the CM
//! exchanged and move data; the release (DREQ/DREP) reaches both sides; a REQ for a
//! service nobody listens on is rejected.

mod support;

use std::time::Duration;

use nic::verbs::{Device, QpOptions};
use rdma::cm::CmEvent;
use rdma::transport::WcStatus;
use rdma::wire::cm::{rej_reason, service_id, RDMA_PS_TCP};
use support::{IP_A, IP_B};

fn one_event(dev: &Device, what: &str) -> CmEvent {
    let mut v = dev.cm_wait(Duration::from_secs(10)).unwrap();
    assert_eq!(v.len(), 1, "{what}: {v:?}");
    v.remove(0)
}

#[test]
fn cm_connects_qps_that_move_data_and_releases_them() {
    let (a, b) = support::device_pair("cm_pair", 1024, |c| c);
    let svc = service_id(RDMA_PS_TCP, 18515);
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cb, &cb, QpOptions::default()).unwrap();

    // Nobody listens yet: the REQ is rejected (invalid service ID).
    let id = a.cm_connect(IP_B, svc, qa.cm_params(), b"x").unwrap();
    match one_event(&a, "no listener") {
        CmEvent::Rejected { id: i, reason, .. } => {
            assert_eq!((i, reason), (id, rej_reason::INVALID_SERVICE_ID))
        }
        e => panic!("{e:?}"),
    }

    b.cm_listen(svc).unwrap();
    let ia = a.cm_connect(IP_B, svc, qa.cm_params(), b"hello").unwrap();
    let (ib, req) = match one_event(&b, "the request") {
        CmEvent::ConnectRequest { id, peer_ip, req } => {
            assert_eq!(peer_ip, IP_A);
            assert_eq!(&req.private_data[..5], b"hello");
            (id, req)
        }
        e => panic!("{e:?}"),
    };
    assert_eq!(req.local_qpn, qa.qpn());
    // The passive side readies its QP from the REQ, then replies.
    let params_b = qb.cm_params();
    let to_a = qb
        .cm_remote(IP_A, req.local_qpn, req.starting_psn, req.path_mtu)
        .unwrap();
    // Each side receives from the PSN it announced and sends from the peer's
    // (Linux's ib_cm).
    assert_eq!(to_a.psn, params_b.starting_psn);
    assert_eq!(qb.remote_info().psn, req.starting_psn);
    qb.connect(&to_a).unwrap();
    b.cm_accept(ib, params_b, b"welcome").unwrap();
    let rep = match one_event(&a, "the reply") {
        CmEvent::ConnectReply { id, rep } => {
            assert_eq!(id, ia);
            rep
        }
        e => panic!("{e:?}"),
    };
    assert_eq!(
        (rep.local_qpn, &rep.private_data[..7]),
        (qb.qpn(), &b"welcome"[..])
    );
    let to_b = qa
        .cm_remote(IP_B, rep.local_qpn, rep.starting_psn, req.path_mtu)
        .unwrap();
    qa.connect(&to_b).unwrap();
    a.cm_ready(ia).unwrap();
    assert_eq!(
        one_event(&a, "A established"),
        CmEvent::Established { id: ia }
    );
    assert_eq!(
        one_event(&b, "B established"),
        CmEvent::Established { id: ib }
    );

    // The QPs work: a WRITE from A, a SEND from B.
    let (la, lb) = (
        a.reg_mr(64 << 10, support::ALL).unwrap(),
        b.reg_mr(64 << 10, support::ALL).unwrap(),
    );
    let data: Vec<u8> = (0..20_000).map(|i| (i * 7) as u8).collect();
    la.write(0, &data);
    qa.post_send(support::write_wr(1, &la, 0, &lb, 0, 20_000))
        .unwrap();
    let w = ca.wait(Duration::from_secs(10)).expect("WRITE completion");
    assert_eq!(w.status, WcStatus::Success);
    let mut got = vec![0u8; 20_000];
    lb.read(0, &mut got);
    assert!(got == data);
    qa.post_recv(support::recv_wr(2, &la, 100)).unwrap();
    qb.post_send(rdma::transport::SendWr::signaled(
        3,
        rdma::transport::SendOp::Send,
        lb.sge(0, 100),
    ))
    .unwrap();
    assert_eq!(
        cb.wait(Duration::from_secs(10)).unwrap().status,
        WcStatus::Success
    );
    assert_eq!(ca.wait(Duration::from_secs(10)).unwrap().byte_len, 100);

    // The release.
    a.cm_disconnect(ia, &[]).unwrap();
    assert_eq!(
        one_event(&b, "B's DREQ"),
        CmEvent::DisconnectRequest { id: ib }
    );
    assert_eq!(one_event(&a, "A's DREP"), CmEvent::Disconnected { id: ia });
    // A: REQ, REQ, RTU, DREQ out; REJ, REP, DREP in.
    support::counters_until(&a, "A's CM MADs counted", |c| {
        c.tx_cm_mads == 4 && c.rx_cm_mads == 3 && c.rx_drop_gsi == 0
    });
    support::counters_until(&b, "B's CM MADs counted", |c| {
        c.rx_cm_mads == 4 && c.tx_cm_mads == 3
    });
}

/// rdma_cm's UDP port space: A resolves B's UD service by SIDR (B's consumer answers
/// with its UD QP's number and Q_Key), then sends it a datagram with what it learned.
#[test]
fn sidr_resolves_a_ud_qp_that_takes_a_datagram() {
    use nic::verbs::UdWr;
    use rdma::cm::sidr_status;
    use rdma::transport::{RecvWr, Service, UdDest};
    use rdma::wire::cm::{RDMA_PS_UDP, RDMA_UDP_QKEY};
    let (a, b) = support::device_pair("cm_sidr", 1024, |c| c);
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let ud = QpOptions {
        service: Service::Ud,
        qkey: RDMA_UDP_QKEY,
        mtu: 1024,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&ca, &ca, ud).unwrap();
    let mut qb = b.create_qp(&cb, &cb, ud).unwrap();
    let me = qa.ud_self();
    qa.connect(&me).unwrap();
    let me = qb.ud_self();
    qb.connect(&me).unwrap();
    let svc = service_id(RDMA_PS_UDP, 7174);
    b.cm_listen(svc).unwrap();
    let id = a.cm_sidr_request(IP_B, svc, b"ud?").unwrap();
    match one_event(&b, "SIDR request") {
        CmEvent::SidrRequest { peer_ip, tid, req } => {
            assert_eq!(&req.private_data[..3], b"ud?");
            b.cm_sidr_reply(
                peer_ip,
                tid,
                req,
                sidr_status::VALID,
                (qb.qpn(), RDMA_UDP_QKEY),
            )
            .unwrap();
        }
        e => panic!("{e:?}"),
    }
    let (qpn, qkey) = match one_event(&a, "SIDR reply") {
        CmEvent::SidrReply { id: i, rep } => {
            assert_eq!((i, rep.status), (id, sidr_status::VALID));
            (rep.qpn, rep.qkey)
        }
        e => panic!("{e:?}"),
    };
    assert_eq!((qpn, qkey), (qb.qpn(), RDMA_UDP_QKEY));
    let (la, lb) = (
        a.reg_mr(8192, support::ALL).unwrap(),
        b.reg_mr(8192, support::ALL).unwrap(),
    );
    la.write(0, b"datagram via SIDR");
    qb.post_recv(RecvWr {
        wr_id: 9,
        sge: lb.sge(0, 1024 + 40),
    })
    .unwrap();
    let ah = a.create_ah(IP_B).unwrap();
    let wr = UdWr {
        wr_id: 1,
        sge: la.sge(0, 17),
        imm: None,
        dest: UdDest {
            ah: ah.id(),
            remote_qpn: qpn,
            remote_qkey: qkey,
        },
        signaled: true,
        solicited: false,
    };
    qa.post_send_ud(wr, &[]).unwrap();
    assert_eq!(
        ca.wait(Duration::from_secs(10)).unwrap().status,
        WcStatus::Success
    );
    let r = cb.wait(Duration::from_secs(10)).expect("the datagram");
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 17 + 40));
    let mut got = [0u8; 17];
    lb.read(40, &mut got);
    assert_eq!(&got, b"datagram via SIDR");
}

/// The QP's loss recovery as the engine runs it (its describe line).
fn mode_of(qp: &nic::verbs::QueuePair) -> String {
    let d = qp.describe().unwrap();
    let at = d.find("loss_recovery ").expect("a connected QP") + "loss_recovery ".len();
    d[at..].split_whitespace().next().unwrap().to_string()
}

/// Selective repeat is negotiated by the CM (issue 43, `rdma::cm::ext`): both QPs
/// configured `sr` run it; where one side is `gbn` both run go-back-N; the consumers
/// never see the tail in the private data. A QP configured `sr` connected without
/// the CM runs go-back-N unless the program says its peer is an `sr` rsnic QP.
#[test]
fn cm_negotiates_selective_repeat_only_between_two_sr_qps() {
    use rdma::transport::LossRecovery::{Gbn, Sr};
    let (a, b) = support::device_pair("cm_sr", 1024, |c| c);
    let (mut ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (la, lb) = (
        a.reg_mr(64 << 10, support::ALL).unwrap(),
        b.reg_mr(64 << 10, support::ALL).unwrap(),
    );
    let mut keep = vec![];
    for (k, (ma, mb)) in [(Sr, Sr), (Sr, Gbn), (Gbn, Sr)].into_iter().enumerate() {
        let svc = service_id(RDMA_PS_TCP, 18600 + k as u16);
        b.cm_listen(svc).unwrap();
        let opts = |m| QpOptions {
            loss_recovery: m,
            ..QpOptions::default()
        };
        let mut qa = a.create_qp(&ca, &ca, opts(ma)).unwrap();
        let mut qb = b.create_qp(&cb, &cb, opts(mb)).unwrap();
        let ia = a.cm_connect(IP_B, svc, qa.cm_params(), b"hi").unwrap();
        let (ib, req) = match one_event(&b, "the request") {
            CmEvent::ConnectRequest { id, req, .. } => (id, req),
            e => panic!("{e:?}"),
        };
        assert_eq!(&req.private_data[..2], b"hi");
        assert!(
            req.private_data[2..].iter().all(|&x| x == 0),
            "tail taken off"
        );
        let params_b = qb.cm_params();
        let to_a = qb
            .cm_remote(IP_A, req.local_qpn, req.starting_psn, req.path_mtu)
            .unwrap();
        qb.connect(&to_a).unwrap();
        b.cm_accept(ib, params_b, b"").unwrap();
        let rep = match one_event(&a, "the reply") {
            CmEvent::ConnectReply { rep, .. } => rep,
            e => panic!("{e:?}"),
        };
        assert!(rep.private_data.iter().all(|&x| x == 0), "tail taken off");
        let to_b = qa
            .cm_remote(IP_B, rep.local_qpn, rep.starting_psn, req.path_mtu)
            .unwrap();
        qa.connect(&to_b).unwrap();
        a.cm_ready(ia).unwrap();
        let _ = one_event(&a, "A established");
        let _ = one_event(&b, "B established");
        let want = if (ma, mb) == (Sr, Sr) { "sr" } else { "gbn" };
        assert_eq!(
            (mode_of(&qa), mode_of(&qb)),
            (want.into(), want.into()),
            "{ma} {mb}"
        );
        let data: Vec<u8> = (0..12_000usize).map(|i| (i * 13 + k) as u8).collect();
        la.write(0, &data);
        qa.post_send(support::write_wr(1, &la, 0, &lb, 0, 12_000))
            .unwrap();
        let w = ca.wait(Duration::from_secs(10)).expect("WRITE completion");
        assert_eq!(w.status, WcStatus::Success);
        let mut got = vec![0u8; 12_000];
        lb.read(0, &mut got);
        assert!(got == data);
        // Kept: a QPN freed while its connection lives would be reused, and the
        // next REQ from it rejected as stale (IBA 12.9.8.3.3).
        keep.push((qa, qb));
    }

    // Without the CM: an `sr` QP gets go-back-N, unless its peer is vouched for.
    for told in [false, true] {
        let o = QpOptions {
            loss_recovery: Sr,
            ..QpOptions::default()
        };
        let mut qa = a.create_qp(&ca, &ca, o).unwrap();
        let mut qb = b.create_qp(&cb, &cb, o).unwrap();
        if told {
            qa.set_peer_loss_recovery(Sr);
            qb.set_peer_loss_recovery(Sr);
        }
        qa.connect(&qb.remote_info()).unwrap();
        qb.connect(&qa.remote_info()).unwrap();
        let want = if told { "sr" } else { "gbn" };
        assert_eq!((mode_of(&qa), mode_of(&qb)), (want.into(), want.into()));
    }
}
