//! Shared receive queues (IBA 10.2.9, 11.2.3; rxe `rxe_srq.c`): two RC QPs
//! of one host receive from one SRQ. SENDs from two peers take its WQEs in
//! posting order; a multi-packet SEND holds its WQE (and a copy of its
//! scatter list) while the other QP's messages take the next ones; a SEND
//! that finds the SRQ empty is RNR-NAKed and goes through once a WQE is
//! posted; the limit event fires once when fewer WQEs than the limit
//! remain; the QPs' own receive queues refuse posts. Real frames (built,
//! parsed, ICRC checked), in lockstep.

use rdma::transport::*;
use rdma::wire::frame::{FrameBuilder, NetHeaders};
use rdma::wire::*;

const A_BASE: u64 = 0x10_0000;
const B_BASE: u64 = 0x80_0000;
const LEN: usize = 1 << 20;

fn fb(src: u8, dst: u8) -> FrameBuilder {
    FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, src]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, dst]),
            src_ip: Ipv4Address([10, 0, 0, src]),
            dst_ip: Ipv4Address([10, 0, 0, dst]),
            udp_src_port: 0xC000,
            dscp: 26,
            ttl: 64,
        },
        int: None,
    }
}

fn rts(cfg: QpConfig) -> Qp {
    let mut q = Qp::new(cfg).unwrap();
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        q.modify(s).unwrap();
    }
    q
}

/// Host A with two QPs (0x11, 0x12) towards host B's two QPs (0x21, 0x22),
/// which receive from one SRQ.
struct World {
    a: [Qp; 2],
    b: [Qp; 2],
    srq: Srq,
    a_mem: VecMemory,
    b_mem: VecMemory,
    a_mrs: MrTable,
    b_mrs: MrTable,
    a_mr: Mr,
    b_mr: Mr,
    b_wcs: Vec<WorkCompletion>,
    a_wcs: Vec<WorkCompletion>,
}

impl World {
    fn new() -> World {
        let base = QpConfig {
            pmtu: 256,
            timeout_ns: 1_000_000,
            ..QpConfig::default()
        };
        let a = [0, 1].map(|k| {
            rts(QpConfig {
                qpn: 0x11 + k,
                dest_qpn: 0x21 + k,
                ..base
            })
        });
        let b = [0, 1].map(|k| {
            rts(QpConfig {
                qpn: 0x21 + k,
                dest_qpn: 0x11 + k,
                srq: true,
                ..base
            })
        });
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mut a_mrs = MrTable::new();
        let mut b_mrs = MrTable::new();
        let a_mr = a_mrs.register(A_BASE, LEN as u64, all).unwrap();
        let b_mr = b_mrs.register(B_BASE, LEN as u64, all).unwrap();
        World {
            a,
            b,
            srq: Srq::new(16, 4, 0).unwrap(),
            a_mem: VecMemory::new(A_BASE, LEN),
            b_mem: VecMemory::new(B_BASE, LEN),
            a_mrs,
            b_mrs,
            a_mr,
            b_mr,
            b_wcs: vec![],
            a_wcs: vec![],
        }
    }

    /// A receive into `len` bytes at B's `off`, posted to the SRQ.
    fn post_srq(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = Sge {
            addr: B_BASE + off,
            len,
            lkey: self.b_mr.lkey,
        };
        self.srq.post(RecvWr { wr_id, sge }, None).unwrap();
    }

    /// A SEND of `data` from A's QP `k` (staged at A's `off`).
    fn send(&mut self, k: usize, wr_id: u64, off: u64, data: &[u8]) {
        self.a_mem.write(A_BASE + off, data);
        let sge = Sge {
            addr: A_BASE + off,
            len: data.len() as u32,
            lkey: self.a_mr.lkey,
        };
        self.a[k]
            .post_send(SendWr::signaled(wr_id, SendOp::Send, sge), &self.a_mrs)
            .unwrap();
    }

    /// One packet from each of A's QPs that has one (QP 0 first), each
    /// answered at once; `now` advances RNR waits.
    fn step(&mut self, now: u64) -> bool {
        let mut any = false;
        let mut buf = vec![0u8; 2048];
        for k in 0..2 {
            self.a[k].on_timer(now);
            if let Some(p) = self.a[k].poll_tx(now) {
                any = true;
                let n = p.build_frame(&fb(1, 2), &self.a_mem, &mut buf).unwrap();
                let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| false).unwrap();
                self.b[k].on_rx_srq(
                    &f,
                    now,
                    &mut self.b_mrs,
                    &mut self.b_mem,
                    Some(&mut self.srq),
                );
            }
            while let Some(p) = self.b[k].poll_tx(now) {
                any = true;
                let n = p.build_frame(&fb(2, 1), &self.b_mem, &mut buf).unwrap();
                let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| false).unwrap();
                self.a[k].on_rx(&f, now, &mut self.a_mrs, &mut self.a_mem);
            }
            while let Some(c) = self.b[k].poll_cq() {
                self.b_wcs.push(c);
            }
            while let Some(c) = self.a[k].poll_cq() {
                self.a_wcs.push(c);
            }
        }
        any
    }

    fn run(&mut self, until_ns: u64) {
        let mut now = 0;
        while now < until_ns {
            self.step(now);
            now += 1_000;
        }
    }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

#[test]
fn two_qps_take_the_srq_s_wqes_in_posting_order_and_interleaved_messages_keep_theirs() {
    let mut w = World::new();
    for k in 0..4u64 {
        w.post_srq(100 + k, k * 0x10000, 0x10000);
    }
    // QP 0 sends a 4-packet message, QP 1 two 1-packet messages; packets
    // alternate (QP 0's first, QP 1's first, QP 0's second...): QP 0's
    // message holds WQE 100 throughout, QP 1's take 101 and 102.
    let (m0, m1, m2) = (bytes(1000, 1), bytes(200, 2), bytes(100, 3));
    w.send(0, 1, 0, &m0);
    w.send(1, 2, 0x1000, &m1);
    w.send(1, 3, 0x2000, &m2);
    w.run(200_000);
    let got: Vec<(u64, u32, u32, WcStatus)> = w
        .b_wcs
        .iter()
        .map(|c| (c.wr_id, c.byte_len, c.qp_num, c.status))
        .collect();
    assert_eq!(
        got,
        vec![
            (101, 200, 0x22, WcStatus::Success),
            (102, 100, 0x22, WcStatus::Success),
            (100, 1000, 0x21, WcStatus::Success),
        ]
    );
    assert_eq!(w.b_mem.read(B_BASE, 1000), &m0[..]);
    assert_eq!(w.b_mem.read(B_BASE + 0x10000, 200), &m1[..]);
    assert_eq!(w.b_mem.read(B_BASE + 0x20000, 100), &m2[..]);
    assert_eq!(w.srq.len(), 1, "WQE 103 left");
    assert_eq!(w.a_wcs.len(), 3);
    assert!(w.a_wcs.iter().all(|c| c.status == WcStatus::Success));
}

#[test]
fn a_scatter_list_in_the_srq_is_copied_with_the_wqe_it_belongs_to() {
    let mut w = World::new();
    let l = w.b_mr.lkey;
    let sgl = [
        Sge {
            addr: B_BASE + 0x100,
            len: 300,
            lkey: l,
        },
        Sge {
            addr: B_BASE + 0x5000,
            len: 700,
            lkey: l,
        },
    ];
    let wr = RecvWr {
        wr_id: 7,
        sge: Sge::default(),
    };
    w.srq.post(wr, Some(&sgl)).unwrap();
    let m = bytes(900, 9);
    w.send(0, 1, 0, &m);
    // Four packets: the WQE is held after the first. Sixteen posts made
    // then fill the SRQ, the last in the list slot WQE 7 had, which the
    // held copy must not see.
    w.step(0);
    let elsewhere = [Sge {
        addr: B_BASE + 0x9000,
        len: 8,
        lkey: l,
    }; 2];
    for k in 0..16 {
        let wr = RecvWr {
            wr_id: 8 + k,
            sge: Sge::default(),
        };
        w.srq.post(wr, Some(&elsewhere)).unwrap();
    }
    w.run(100_000);
    assert_eq!((w.b_wcs[0].wr_id, w.b_wcs[0].byte_len), (7, 900));
    assert_eq!(w.b_mem.read(B_BASE + 0x100, 300), &m[..300]);
    assert_eq!(w.b_mem.read(B_BASE + 0x5000, 600), &m[300..]);
    assert_eq!(w.srq.len(), 16);
}

#[test]
fn an_empty_srq_rnr_naks_and_the_limit_event_fires_once() {
    let mut w = World::new();
    let m = bytes(64, 5);
    w.send(0, 1, 0, &m);
    w.run(50_000);
    assert!(w.b_wcs.is_empty(), "no WQE: nothing received");
    assert!(
        w.a_wcs.is_empty(),
        "the sender waits (RNR), it does not fail"
    );
    for k in 0..5u64 {
        w.post_srq(200 + k, k * 0x100, 0x100);
    }
    w.srq.arm(3).unwrap();
    assert!(!w.srq.take_limit_event(), "5 left, limit 3");
    w.run(2_000_000);
    assert_eq!(w.b_wcs.len(), 1, "{:?}", w.b_wcs);
    assert_eq!(w.b_wcs[0].wr_id, 200);
    assert_eq!(w.b_mem.read(B_BASE, 64), &m[..]);
    assert!(!w.srq.take_limit_event(), "4 left");
    w.send(1, 2, 0x100, &m);
    w.send(1, 3, 0x200, &m);
    w.run(100_000);
    assert_eq!(w.srq.len(), 2);
    assert!(w.srq.take_limit_event(), "2 left, below 3");
    assert!(!w.srq.take_limit_event(), "once");
    assert_eq!(w.srq.limit(), 0, "disarmed");
    assert!(w.srq.arm(17).is_err(), "above the depth");
    // A QP on an SRQ has no receive queue of its own.
    let wr = RecvWr {
        wr_id: 9,
        sge: Sge::default(),
    };
    assert!(w.b[0].post_recv(wr, &w.b_mrs).is_err());
}

#[test]
fn a_wqe_with_a_bad_key_fails_on_the_qp_that_takes_it() {
    let mut w = World::new();
    // The SRQ takes it (it has no CQ to report to); the QP that uses it
    // completes it with LOC_QP_OP_ERR and NAKs the sender, as rxe does.
    let bad = Sge {
        addr: B_BASE,
        len: 64,
        lkey: w.b_mr.lkey ^ 0x100,
    };
    w.srq.post(RecvWr { wr_id: 5, sge: bad }, None).unwrap();
    w.send(0, 1, 0, &bytes(32, 1));
    w.run(100_000);
    assert_eq!(w.b_wcs.len(), 1);
    assert_eq!(
        (w.b_wcs[0].wr_id, w.b_wcs[0].status),
        (5, WcStatus::LocQpOpErr)
    );
    assert_eq!(w.a_wcs[0].status, WcStatus::RemOpErr);
}
