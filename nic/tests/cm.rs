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
    let to_a = qb.cm_remote(IP_A, req.local_qpn, req.starting_psn, req.path_mtu);
    qb.connect(&to_a).unwrap();
    b.cm_accept(ib, qb.cm_params(), b"welcome").unwrap();
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
    let to_b = qa.cm_remote(IP_B, rep.local_qpn, rep.starting_psn, req.path_mtu);
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
