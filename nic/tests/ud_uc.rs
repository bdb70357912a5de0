//! UD and UC queue pairs through the engine (issue 40 item 4): datagrams to
//! address handles with the 40-byte GRH in front of the data (IBA 11.4.1.2:
//! 20 bytes of zeros, then the IPv4 header, as rxe writes it), Q_Keys,
//! `src_qp`, immediate data, loopback to a UD QP of the same port; UC SEND
//! and WRITE of several packets without acknowledgements, READ refused.

mod support;

use std::time::Duration;

use nic::verbs::{CompletionQueue, QpOptions, UdWr, VerbsError};
use rdma::transport::{
    RecvWr, SendOp, SendWr, Service, UdDest, WcOpcode, WcStatus, WorkCompletion,
};
use support::{IP_A, IP_B};

const GRH: usize = 40;
const MTU: u32 = 1024;
const QKEY: u32 = 0x1111_2222;

fn ud_opts() -> QpOptions {
    QpOptions {
        service: Service::Ud,
        qkey: QKEY,
        mtu: MTU,
        ..QpOptions::default()
    }
}

fn wait(cq: &mut CompletionQueue, what: &str) -> WorkCompletion {
    cq.wait(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: no completion"))
}

#[test]
fn ud_datagrams_carry_the_grh_qkey_and_source_qp() {
    let (a, b) = support::device_pair("ud_pair", 1024, |c| c);
    let (mut ca, mut cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let mut qa = a.create_qp(&ca, &ca, ud_opts()).unwrap();
    let mut qb = b.create_qp(&cb, &cb, ud_opts()).unwrap();
    let me = qa.ud_self();
    qa.connect(&me).unwrap();
    let me = qb.ud_self();
    qb.connect(&me).unwrap();
    let (la, lb) = (
        a.reg_mr(64 << 10, support::ALL).unwrap(),
        b.reg_mr(64 << 10, support::ALL).unwrap(),
    );
    let slot = |i: usize| (i * 2048) as u64;
    let sizes = [0usize, 1, 100, MTU as usize];
    for (i, _) in sizes.iter().enumerate() {
        qb.post_recv(RecvWr {
            wr_id: 100 + i as u64,
            sge: lb.sge(slot(i), MTU + GRH as u32),
        })
        .unwrap();
    }
    let ah = a.create_ah(IP_B).expect("address handle by ARP");
    let dest = UdDest {
        ah: ah.id(),
        remote_qpn: qb.qpn(),
        remote_qkey: QKEY,
    };
    for (i, &len) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|k| (k * 7 + i) as u8).collect();
        la.write(slot(i) as usize, &data);
        let wr = UdWr {
            wr_id: i as u64,
            sge: la.sge(slot(i), len as u32),
            imm: (i % 2 == 1).then_some(0xA0 + i as u32),
            dest,
            signaled: true,
            solicited: false,
        };
        qa.post_send_ud(wr, &[]).unwrap();
        let s = wait(&mut ca, "UD send");
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i as u64, WcStatus::Success, WcOpcode::Send)
        );
        let r = wait(&mut cb, "UD receive");
        assert_eq!(r.status, WcStatus::Success, "{r:?}");
        assert_eq!(r.wr_id, 100 + i as u64);
        assert_eq!(r.byte_len as usize, GRH + len, "GRH + payload");
        assert!(r.grh, "IBV_WC_GRH");
        assert_eq!(r.src_qp, qa.qpn());
        assert_eq!(r.imm, wr.imm);
        let mut got = vec![0u8; GRH + len];
        lb.read(slot(i) as usize, &mut got);
        assert_eq!(&got[..20], &[0u8; 20], "the GRH's first 20 bytes are zero");
        assert_eq!(got[20] >> 4, 4, "an IPv4 header in the GRH's last 20 bytes");
        assert_eq!(&got[20 + 12..20 + 16], &IP_A, "its source");
        assert_eq!(&got[20 + 16..20 + 20], &IP_B, "its destination");
        assert!(got[GRH..] == data[..], "datagram {i}: other bytes");
    }
    // A wrong Q_Key: dropped by the receiver, no completion; the send
    // completes (UD is unreliable).
    qb.post_recv(RecvWr {
        wr_id: 200,
        sge: lb.sge(0, MTU + GRH as u32),
    })
    .unwrap();
    let wrong = UdWr {
        wr_id: 9,
        sge: la.sge(0, 8),
        imm: None,
        dest: UdDest {
            remote_qkey: QKEY ^ 1,
            ..dest
        },
        signaled: true,
        solicited: false,
    };
    qa.post_send_ud(wrong, &[]).unwrap();
    assert_eq!(wait(&mut ca, "wrong Q_Key send").status, WcStatus::Success);
    assert!(
        cb.wait(Duration::from_millis(300)).is_none(),
        "a wrong Q_Key was received"
    );
    // The Q_Key's high bit: the sender's own (IBA 10.2.4.4), which matches.
    let own = UdWr {
        wr_id: 10,
        dest: UdDest {
            remote_qkey: 0x8000_0000,
            ..dest
        },
        ..wrong
    };
    qa.post_send_ud(own, &[]).unwrap();
    assert_eq!(wait(&mut ca, "own Q_Key send").status, WcStatus::Success);
    let r = wait(&mut cb, "own Q_Key receive");
    assert_eq!((r.wr_id, r.byte_len), (200, GRH as u32 + 8));
    // Refused at post: longer than the path MTU; a UD send on a connected QP.
    let long = UdWr {
        sge: la.sge(0, MTU + 1),
        ..own
    };
    assert!(matches!(
        qa.post_send_ud(long, &[]),
        Err(VerbsError::DatagramTooLong { .. })
    ));
    let mut rc = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    assert!(matches!(
        rc.post_send_ud(own, &[]),
        Err(VerbsError::WrongService(_))
    ));
    let c = b.counters();
    assert_eq!(c.rx_drop_icrc, 0, "{c}");
    drop(ah);
    drop(rc);
}

#[test]
fn ud_datagrams_to_the_own_port_loop_back() {
    let (a, _b) = support::device_pair("ud_self", 1024, |c| c);
    let mut cq = a.create_cq(64).unwrap();
    let mut q1 = a.create_qp(&cq, &cq, ud_opts()).unwrap();
    let mut q2 = a.create_qp(&cq, &cq, ud_opts()).unwrap();
    let (r1, r2) = (q1.ud_self(), q2.ud_self());
    q1.connect(&r1).unwrap();
    q2.connect(&r2).unwrap();
    let mr = a.reg_mr(8192, support::ALL).unwrap();
    mr.write(0, b"hello, myself");
    q2.post_recv(RecvWr {
        wr_id: 7,
        sge: mr.sge(4096, 1024 + GRH as u32),
    })
    .unwrap();
    let ah = a.create_ah(IP_A).unwrap();
    assert_eq!(ah.mac(), a.mac());
    let wr = UdWr {
        wr_id: 1,
        sge: mr.sge(0, 13),
        imm: None,
        dest: UdDest {
            ah: ah.id(),
            remote_qpn: q2.qpn(),
            remote_qkey: QKEY,
        },
        signaled: true,
        solicited: false,
    };
    q1.post_send_ud(wr, &[]).unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(wait(&mut cq, "loopback"));
    }
    let r = seen.iter().find(|w| w.wr_id == 7).expect("the receive");
    assert_eq!(
        (r.status, r.byte_len, r.src_qp),
        (WcStatus::Success, 13 + GRH as u32, q1.qpn())
    );
    let mut got = [0u8; 13];
    mr.read(4096 + GRH, &mut got);
    assert_eq!(&got, b"hello, myself");
    support::counters_until(&a, "a looped-back frame counted", |c| c.tx_loopback >= 1);
}

#[test]
fn uc_sends_and_writes_arrive_without_acknowledgements() {
    let (a, b) = support::device_pair("uc_pair", 4096, |c| c);
    let (mut ca, mut cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let opts = QpOptions {
        service: Service::Uc,
        mtu: MTU,
        ..QpOptions::default()
    };
    let (mut qa, mut qb) = support::connect_qps(&a, &b, &ca, &cb, opts);
    let (la, lb) = (
        a.reg_mr(256 << 10, support::ALL).unwrap(),
        b.reg_mr(256 << 10, support::ALL).unwrap(),
    );
    let len = 16 * MTU as usize + 5;
    let data: Vec<u8> = (0..len).map(|k| (k * 13 + k / 251) as u8).collect();
    la.write(0, &data);
    // SEND of 17 packets into a posted receive.
    qb.post_recv(support::recv_wr(1, &lb, len as u32)).unwrap();
    qa.post_send(SendWr::signaled(
        1,
        SendOp::SendImm(0x55),
        la.sge(0, len as u32),
    ))
    .unwrap();
    assert_eq!(wait(&mut ca, "UC SEND").status, WcStatus::Success);
    let r = wait(&mut cb, "UC receive");
    assert_eq!(
        (r.status, r.byte_len, r.imm),
        (WcStatus::Success, len as u32, Some(0x55))
    );
    let mut got = vec![0u8; len];
    lb.read(0, &mut got);
    assert!(got == data, "UC SEND: other bytes");
    // WRITE of 17 packets to the same place + 128 KiB.
    qa.post_send(support::write_wr(2, &la, 0, &lb, 128 << 10, len as u32))
        .unwrap();
    assert_eq!(wait(&mut ca, "UC WRITE").status, WcStatus::Success);
    // No completion on the responder for a WRITE: poll its bytes.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        lb.read(128 << 10, &mut got);
        if got == data {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "UC WRITE: other bytes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // UC has no READ: its work request completes in error.
    let read = SendWr::signaled(
        3,
        SendOp::Read {
            remote_va: lb.va(),
            rkey: lb.rkey(),
        },
        la.sge(0, 8),
    );
    qa.post_send(read).unwrap();
    let w = wait(&mut ca, "UC READ");
    assert_ne!(w.status, WcStatus::Success, "{w:?}");
    // Nothing acknowledged anything.
    let (ca_, cb_) = (a.counters(), b.counters());
    assert_eq!(
        cb_.tx_acks + ca_.rx_acks,
        0,
        "acknowledgements on UC:\n{cb_}"
    );
}

/// A receive posted before the SEND that needs it is always there when the
/// SEND arrives, however the engine's turn interleaves with the program:
/// UC has no RNR retry, so a receive the engine took after the frame would
/// lose the message. Each of many one-packet SENDs is preceded by its
/// receive and nothing else.
#[test]
fn uc_receive_posted_just_before_the_send_is_never_missed() {
    const ROUNDS: u64 = 3000;
    let (a, b) = support::device_pair("uc_race", 1024, |c| c);
    let (mut ca, mut cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let opts = QpOptions {
        service: Service::Uc,
        mtu: MTU,
        ..QpOptions::default()
    };
    let (mut qa, mut qb) = support::connect_qps(&a, &b, &ca, &cb, opts);
    let (la, lb) = (
        a.reg_mr(4096, support::ALL).unwrap(),
        b.reg_mr(4096, support::ALL).unwrap(),
    );
    for i in 0..ROUNDS {
        qb.post_recv(support::recv_wr(i, &lb, 64)).unwrap();
        qa.post_send(SendWr::signaled(i, SendOp::Send, la.sge(0, 64)))
            .unwrap();
        assert_eq!(wait(&mut ca, "UC SEND").status, WcStatus::Success);
        let r = wait(&mut cb, "UC receive");
        assert_eq!((r.wr_id, r.status), (i, WcStatus::Success), "round {i}");
    }
}
