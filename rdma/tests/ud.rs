//! Unreliable datagram QPs (IBA 9.8, 11.4.1.2; rxe `rxe_req.c`, `rxe_resp.c`
//! `execute`/`do_complete`, `rxe_recv.c` `check_keys`): one-packet SENDs to a
//! destination per work request, Q_Keys, the 40-byte GRH before the data.

mod common;
use common::*;
use proptest::prelude::*;
use rdma::transport::*;
use rdma::wire::frame::RoceRepr;
use rdma::wire::*;

const PMTU: u32 = 1024;
const QKEY: u32 = 0x1111_0000;

fn ud_pair() -> (Host, Host) {
    let base = QpConfig {
        pmtu: PMTU,
        service: Service::Ud,
        qkey: QKEY,
        ..Default::default()
    };
    let (a, b) = pair_from(base, 0x10, 1);
    (a, b)
}

fn dest(to: &Host, qkey: u32) -> UdDest {
    UdDest {
        ah: AhId(7.try_into().unwrap()),
        remote_qpn: to.qp.config().qpn,
        remote_qkey: qkey,
    }
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

/// RFC 791 header built here by hand, with an RFC 1071 checksum computed here: what
/// the GRH slot must hold after 20 zero bytes.
fn ipv4_by_hand(src: [u8; 4], dst: [u8; 4], dscp: u8, ecn: u8, total: u16, ttl: u8) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[1] = dscp << 2 | ecn;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = ttl;
    h[9] = 17;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let mut sum: u32 = h
        .chunks(2)
        .map(|w| u32::from(w[0]) << 8 | u32::from(w[1]))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    h
}

#[test]
fn a_datagram_lands_after_the_grh_and_completes_with_src_qp() {
    let (mut a, mut b) = ud_pair();
    let lk = a.mr.lkey;
    let m = fill(&mut a, A_BASE, 333, 5);
    recv(&mut b, 9, B_BASE, 40 + 333);
    let mut w = wr(1, SendOp::SendImm(0xFEED), A_BASE, 333, lk);
    w.solicited = true;
    a.qp.post_send_ud(w, dest(&b, QKEY), None, &a.mrs).unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    assert!(a.qp.poll_tx(0).is_none(), "one packet per message");
    assert_eq!(p.repr.bth.opcode, Opcode::UdSendOnlyImm);
    assert!(!p.repr.bth.ack_req);
    assert_eq!(p.repr.bth.dest_qp, 0x22);
    assert_eq!(p.repr.bth.psn, 0x10);
    assert_eq!(
        p.repr.deth,
        Some(DethRepr {
            qkey: QKEY,
            src_qp: 0x11
        })
    );
    assert_eq!(p.ah, Some(AhId(7.try_into().unwrap())));
    a.drain();
    assert_eq!(a.cq.len(), 1, "completes when handed out");
    assert_eq!((a.cq[0].wr_id, a.cq[0].status), (1, WcStatus::Success));
    deliver(&a, &p, &mut b);
    assert!(b.qp.poll_tx(0).is_none(), "nothing answers a datagram");
    let c = b.cq[0];
    assert_eq!(
        (
            c.wr_id,
            c.status,
            c.opcode,
            c.byte_len,
            c.imm,
            c.src_qp,
            c.grh,
            c.solicited
        ),
        (
            9,
            WcStatus::Success,
            WcOpcode::Recv,
            373,
            Some(0xFEED),
            0x11,
            true,
            true
        )
    );
    let total = (20 + 8 + 12 + 8 + 4 + 333 + 3 + 4) as u16;
    let ip = ipv4_by_hand([10, 0, 0, 1], [10, 0, 0, 2], 26, 0b10, total, 64);
    let g = b.mem.read(B_BASE, 40);
    assert_eq!(&g[..20], &[0u8; 20]);
    assert_eq!(&g[20..], &ip);
    assert_eq!(b.mem.read(B_BASE + 40, 333), &m[..]);
}

#[test]
fn qkey_rules() {
    let (mut a, mut b) = ud_pair();
    let lk = a.mr.lkey;
    fill(&mut a, A_BASE, 16, 1);
    recv(&mut b, 9, B_BASE, 100);
    // A wrong Q_Key: dropped, counted, the WQE stays.
    a.qp.post_send_ud(
        wr(1, SendOp::Send, A_BASE, 16, lk),
        dest(&b, QKEY + 1),
        None,
        &a.mrs,
    )
    .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    assert_eq!(p.repr.deth.unwrap().qkey, QKEY + 1);
    deliver(&a, &p, &mut b);
    assert!(b.cq.is_empty());
    assert_eq!(b.qp.unreliable_counters().rx_qkey_mismatch, 1);
    // High bit set: the sender's own Q_Key goes out (IBA 10.2.4.4), and matches.
    a.qp.post_send_ud(
        wr(2, SendOp::Send, A_BASE, 16, lk),
        dest(&b, 0x8000_0000),
        None,
        &a.mrs,
    )
    .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    assert_eq!(p.repr.deth.unwrap().qkey, QKEY);
    assert_eq!(p.repr.bth.psn, 0x11, "one PSN per packet");
    deliver(&a, &p, &mut b);
    assert_eq!(b.cq.len(), 1);
    // set_qkey changes what the receiver accepts.
    b.qp.set_qkey(5).unwrap();
    recv(&mut b, 10, B_BASE, 100);
    deliver(&a, &p, &mut b);
    assert_eq!(b.cq.len(), 1);
    assert_eq!(b.qp.unreliable_counters().rx_qkey_mismatch, 2);
}

#[test]
fn too_small_buffer_and_no_wqe() {
    let (mut a, mut b) = ud_pair();
    let lk = a.mr.lkey;
    fill(&mut a, A_BASE, 100, 1);
    // No WQE: dropped, counted.
    a.qp.post_send_ud(
        wr(1, SendOp::Send, A_BASE, 100, lk),
        dest(&b, QKEY),
        None,
        &a.mrs,
    )
    .unwrap();
    let p = a.qp.poll_tx(0).unwrap();
    deliver(&a, &p, &mut b);
    assert_eq!(b.qp.unreliable_counters().rx_no_recv_wqe, 1);
    // 139 bytes: the payload fits, the payload and the GRH do not.
    recv(&mut b, 9, B_BASE, 139);
    recv(&mut b, 10, B_BASE + 0x1000, 140);
    deliver(&a, &p, &mut b);
    deliver(&a, &p, &mut b);
    let got: Vec<_> =
        b.cq.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect();
    assert_eq!(
        got,
        [(9, WcStatus::LocLenErr, 0), (10, WcStatus::Success, 140)]
    );
    assert_eq!(b.qp.state(), QpState::Rts);
}

#[test]
fn post_refusals_and_sizes() {
    let (mut a, b) = ud_pair();
    let lk = a.mr.lkey;
    let d = dest(&b, QKEY);
    let too_long =
        a.qp.post_send_ud(wr(1, SendOp::Send, A_BASE, PMTU + 1, lk), d, None, &a.mrs);
    assert!(matches!(too_long, Err(QpError::InvalidWr(_))));
    a.qp.post_send_ud(wr(1, SendOp::Send, A_BASE, PMTU, lk), d, None, &a.mrs)
        .unwrap();
    let write = SendOp::Write {
        remote_va: 0,
        rkey: 1,
    };
    assert!(matches!(
        a.qp.post_send_ud(wr(2, write, A_BASE, 8, lk), d, None, &a.mrs),
        Err(QpError::InvalidWr(_))
    ));
    assert!(matches!(
        a.qp.post_send(wr(3, SendOp::Send, A_BASE, 8, lk), &a.mrs),
        Err(QpError::InvalidWr(_))
    ));
    // The AH id costs nothing (tail padding); RoceRepr's DETH slot costs 16 bytes
    // and its IETH slot 8 (RoceRepr 256 -> 280, TxPacket 296 -> 320); a
    // WorkCompletion stays 32.
    assert_eq!(core::mem::size_of::<RoceRepr>(), 280);
    assert_eq!(core::mem::size_of::<TxPacket>(), 320);
    assert_eq!(core::mem::size_of::<WorkCompletion>(), 32);
}

/// A UD QP takes datagrams from any source address (no connected peer), as rxe
/// checks addresses on RC and UC only.
#[test]
fn any_source() {
    let (_a, mut b) = ud_pair();
    recv(&mut b, 9, B_BASE, 100);
    let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnly, 0x22, 0x77_7777));
    r.deth = Some(DethRepr {
        qkey: QKEY,
        src_qp: 0x99,
    });
    // `feed` sends from the peer's address: pretend another host.
    b.fb.net.dst_ip = Ipv4Address([10, 9, 9, 9]);
    b.qp.set_peer_ip([10, 0, 0, 1]);
    feed(&mut b, r, &[1, 2, 3]);
    b.drain();
    assert_eq!((b.cq[0].src_qp, b.cq[0].byte_len), (0x99, 43));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over a link that loses, duplicates and reorders: every datagram B completes is
    /// one A sent, exact (GRH and payload), and B delivers each as many times as the
    /// link delivered it (UD does not deduplicate), never more.
    #[test]
    fn datagrams_are_exact_and_delivered_as_often_as_they_arrive(
        lens in proptest::collection::vec(0u32..=PMTU, 1..24),
        seed in any::<u64>(),
        loss in 0u64..300,
        dup in 0u64..300,
        jitter in 0u64..20_000,
    ) {
        let (mut a, mut b) = ud_pair();
        let lk = a.mr.lkey;
        let n = lens.len();
        let mut expect = vec![];
        for (k, &len) in lens.iter().enumerate() {
            let src = A_BASE + 0x1000 * k as u64;
            expect.push(fill(&mut a, src, len as usize, k as u8 * 13 + 1));
            a.qp.post_send_ud(wr(k as u64, SendOp::SendImm(k as u32), src, len, lk), dest(&b, QKEY), None, &a.mrs).unwrap();
        }
        for k in 0..2 * n {
            recv(&mut b, 100 + k as u64, B_BASE + 0x1000 * k as u64, 40 + PMTU);
        }
        let mut link = Link::new(seed, loss, dup, jitter);
        let mut arrived = vec![0usize; n];
        let mut buf = vec![0u8; 4096];
        let mut now = 0;
        while let Some(p) = a.qp.poll_tx(now) {
            let pl = match p.payload { Payload::Local { va, len, .. } => a.mem.read(va, len as usize).to_vec(), _ => vec![] };
            let m = a.fb.emit_frame(&p.repr, &pl, p.ecn, &mut buf).unwrap();
            link.send(now, 1, buf[..m].to_vec());
            now += 100;
        }
        a.drain();
        prop_assert_eq!(a.cq.len(), n);
        while link.next_time().is_some() {
            now = now.max(link.next_time().unwrap());
            for (_, f) in link.due(now) {
                let fr = parse_frame(&f, &ParseOptions::default(), |_| false).unwrap();
                arrived[fr.immdt.unwrap().0 as usize] += 1;
                let want_ip = fr.ipv4_header.to_vec();
                let Host { qp, mrs, mem, .. } = &mut b;
                let before = qp.pending_completions();
                qp.on_rx(&fr, now, mrs, mem);
                prop_assert_eq!(qp.pending_completions(), before + 1);
                let c = qp.poll_cq().unwrap();
                let k = c.imm.unwrap() as usize;
                let slot = c.wr_id - 100;
                let at = B_BASE + 0x1000 * slot;
                prop_assert_eq!((c.status, c.byte_len, c.src_qp, c.grh), (WcStatus::Success, 40 + lens[k], 0x11, true));
                prop_assert_eq!(b.mem.read(at, 20), &[0u8; 20][..]);
                prop_assert_eq!(b.mem.read(at + 20, 20), &want_ip[..]);
                prop_assert_eq!(b.mem.read(at + 40, lens[k] as usize), &expect[k][..]);
                b.cq.push(c);
            }
        }
        let mut delivered = vec![0usize; n];
        for c in &b.cq {
            delivered[c.imm.unwrap() as usize] += 1;
        }
        prop_assert_eq!(delivered, arrived);
    }
}
