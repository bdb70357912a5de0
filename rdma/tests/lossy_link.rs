//! Property tests: two QPs over an in-memory link that loses, duplicates and reorders
//! frames deliver every message exactly once, in order, byte-exact, for mixes of WRITE,
//! READ, SEND and ATOMIC (also with a responder that acknowledges only what asks for an
//! ACK, as rxe does); SENDs that find no receive WQE are RNR-NAKed and retried until the
//! receives are posted, or fail with RNR_RETRY_EXC_ERR when the RNR retries run out;
//! and a QP whose peer vanished reaches ERR with RETRY_EXC_ERR.
//! Virtual time throughout.

mod common;
use common::*;
use proptest::prelude::*;
use rdma::transport::*;
use rdma::wire::transport_hdrs::AethSyndrome;

#[derive(Debug, Clone, Copy)]
enum Op {
    Write(u32),
    WriteImm(u32),
    Read(u32),
    Send(u32),
    FetchAdd(u64),
    CompareSwap,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..900).prop_map(Op::Write),
        (0u32..600).prop_map(Op::WriteImm),
        (0u32..900).prop_map(Op::Read),
        (0u32..900).prop_map(Op::Send),
        (1u64..1000).prop_map(Op::FetchAdd),
        Just(Op::CompareSwap),
    ]
}

const FAA: u64 = B_BASE + 0x30000;
const CAS: u64 = B_BASE + 0x30008;

fn bytes(len: u32, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

/// Expected receive completion: (wr_id, opcode, byte_len, imm, SEND data).
type RecvExpect = (u64, WcOpcode, u32, Option<u32>, Option<Vec<u8>>);

struct Model {
    expect_wc: Vec<u64>,
    recv_expect: Vec<RecvExpect>,
    checks_b: Vec<(u64, Vec<u8>)>,
    checks_a: Vec<(u64, Vec<u8>)>,
    atomic_orig: Vec<(u64, u64)>,
    faa_final: u64,
    cas_final: u64,
}

fn setup(ops: &[Op], a: &mut Host, b: &mut Host) -> Model {
    let (ak, bk, blk) = (a.mr.lkey, b.mr.rkey, b.mr.lkey);
    let mut m = Model {
        expect_wc: vec![],
        recv_expect: vec![],
        checks_b: vec![],
        checks_a: vec![],
        atomic_orig: vec![],
        faa_final: 0,
        cas_final: 0,
    };
    let mut faa = 1000u64;
    let mut cas = 5u64;
    b.mem.write_u64(FAA, faa);
    b.mem.write_u64(CAS, cas);
    let mut nrecv = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let i64_ = i as u64;
        let src = A_BASE + i64_ * 0x1000;
        let wr = |op: SendOp, addr: u64, len: u32| SendWr {
            wr_id: i64_,
            op,
            sge: Sge {
                addr,
                len,
                lkey: ak,
            },
            signaled: true,
            solicited: false,
        };
        let mut post_recv = |b: &mut Host| {
            let va = B_BASE + 0x20000 + nrecv * 0x1000;
            b.qp.post_recv(
                RecvWr {
                    wr_id: 1000 + nrecv,
                    sge: Sge {
                        addr: va,
                        len: 0x1000,
                        lkey: blk,
                    },
                },
                &b.mrs,
            )
            .unwrap();
            nrecv += 1;
            (1000 + nrecv - 1, va)
        };
        let w = match *op {
            Op::Write(len) => {
                let d = bytes(len, i64_);
                a.mem.write(src, &d);
                m.checks_b.push((B_BASE + i64_ * 0x1000, d));
                wr(
                    SendOp::Write {
                        remote_va: B_BASE + i64_ * 0x1000,
                        rkey: bk,
                    },
                    src,
                    len,
                )
            }
            Op::WriteImm(len) => {
                let d = bytes(len, i64_);
                a.mem.write(src, &d);
                m.checks_b.push((B_BASE + i64_ * 0x1000, d));
                let (rid, _) = post_recv(b);
                m.recv_expect
                    .push((rid, WcOpcode::RecvRdmaWithImm, len, Some(i as u32), None));
                wr(
                    SendOp::WriteImm {
                        remote_va: B_BASE + i64_ * 0x1000,
                        rkey: bk,
                        imm: i as u32,
                    },
                    src,
                    len,
                )
            }
            Op::Read(len) => {
                let d = bytes(len, i64_ + 77);
                b.mem.write(B_BASE + 0x10000 + i64_ * 0x1000, &d);
                let dst = A_BASE + 0x20000 + i64_ * 0x1000;
                m.checks_a.push((dst, d));
                wr(
                    SendOp::Read {
                        remote_va: B_BASE + 0x10000 + i64_ * 0x1000,
                        rkey: bk,
                    },
                    dst,
                    len,
                )
            }
            Op::Send(len) => {
                let d = bytes(len, i64_ + 5);
                a.mem.write(src, &d);
                let (rid, _) = post_recv(b);
                m.recv_expect
                    .push((rid, WcOpcode::Recv, len, None, Some(d)));
                wr(SendOp::Send, src, len)
            }
            Op::FetchAdd(add) => {
                let dst = A_BASE + 0x30000 + i64_ * 8;
                m.atomic_orig.push((dst, faa));
                faa = faa.wrapping_add(add);
                wr(
                    SendOp::FetchAdd {
                        remote_va: FAA,
                        rkey: bk,
                        add,
                    },
                    dst,
                    8,
                )
            }
            Op::CompareSwap => {
                let dst = A_BASE + 0x30000 + i64_ * 8;
                m.atomic_orig.push((dst, cas));
                let new = cas * 3 + i64_;
                let w = wr(
                    SendOp::CompareSwap {
                        remote_va: CAS,
                        rkey: bk,
                        compare: cas,
                        swap: new,
                    },
                    dst,
                    8,
                );
                cas = new;
                w
            }
        };
        a.qp.post_send(w, &a.mrs).unwrap();
        m.expect_wc.push(i64_);
    }
    m.faa_final = faa;
    m.cas_final = cas;
    m
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn lossy_link_delivers_exactly_once_in_order(
        ops in proptest::collection::vec(op_strategy(), 1..12),
        seed in any::<u64>(),
        loss in 0u64..120,
        dup in 0u64..120,
        jitter in prop_oneof![Just(0u64), 1u64..6000],
        cc in any::<bool>(),
        wrap in any::<bool>(),
        window in prop_oneof![Just(u32::MAX), 300u32..3000],
        coalesce in prop_oneof![Just(1u16), 2u16..5, Just(u16::MAX)],
    ) {
        let sq_psn = if wrap { 0xFF_FFFA } else { 17 };
        let (mut a, mut b) = pair_with(256, cc, sq_psn, coalesce);
        a.qp.set_window(window);
        let m = setup(&ops, &mut a, &mut b);
        let mut hosts = [a, b];
        let mut link = Link::new(seed, loss, dup, jitter);
        let n = m.expect_wc.len();
        let nr = m.recv_expect.len();
        let t = run(&mut hosts, &mut link, 0, 400_000_000, |h| h[0].cq.len() >= n && h[1].cq.len() >= nr);
        // Let stragglers and duplicates drain: nothing may complete twice.
        run(&mut hosts, &mut link, t, 300_000, |_| false);
        let [a, b] = &hosts;
        let got: Vec<(u64, WcStatus)> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<(u64, WcStatus)> = m.expect_wc.iter().map(|i| (*i, WcStatus::Success)).collect();
        prop_assert_eq!(got, want, "requester completions (state {:?}, counters {:?})", a.qp.state(), a.qp.counters());
        prop_assert_eq!(b.cq.len(), nr, "responder completions {:?}", b.cq);
        for (c, (rid, op, len, imm, data)) in b.cq.iter().zip(&m.recv_expect) {
            prop_assert_eq!((c.wr_id, c.status, c.opcode, c.byte_len, c.imm), (*rid, WcStatus::Success, *op, *len, *imm));
            if let Some(d) = data {
                prop_assert_eq!(b.mem.read(B_BASE + 0x20000 + (rid - 1000) * 0x1000, d.len()), &d[..]);
            }
        }
        for (va, d) in &m.checks_b {
            prop_assert_eq!(b.mem.read(*va, d.len()), &d[..]);
        }
        for (va, d) in &m.checks_a {
            prop_assert_eq!(a.mem.read(*va, d.len()), &d[..]);
        }
        for (va, orig) in &m.atomic_orig {
            prop_assert_eq!(a.mem.read_u64(*va), *orig);
        }
        prop_assert_eq!(b.mem.read_u64(FAA), m.faa_final, "FetchAdd executed exactly once each");
        prop_assert_eq!(b.mem.read_u64(CAS), m.cas_final);
        prop_assert_eq!(a.qp.state(), QpState::Rts);
        prop_assert_eq!(b.qp.state(), QpState::Rts);
        // Every move of an error counter moved the marker the NIC's counter
        // sync skips QPs by: under loss, duplication and reordering both ends
        // count retransmits, duplicates, out-of-sequence drops, NAKs, timeouts.
        for h in [a, b] {
            let c = h.qp.counters();
            prop_assert_eq!(c.error_events, c.error_sum(), "{:?}", c);
        }
        if std::env::var_os("RDMA_STATS").is_some() {
            eprintln!("loss {loss} dup {dup} jitter {jitter} sent {} A {:?} B {:?}", link.sent, a.qp.counters(), b.qp.counters());
        }
    }

    #[test]
    fn vanished_peer_ends_in_error_with_retry_exceeded(
        ops in proptest::collection::vec(op_strategy(), 1..8),
        seed in any::<u64>(),
        cut_at in 0u64..20_000,
    ) {
        let (mut a, mut b) = pair(256, false, 0);
        let m = setup(&ops, &mut a, &mut b);
        let mut hosts = [a, b];
        let mut link = Link::new(seed, 0, 0, 0);
        let t = run(&mut hosts, &mut link, 0, cut_at, |_| false);
        link.up = false;
        link.q.clear();
        run(&mut hosts, &mut link, t, 1_000_000_000, |h| h[0].qp.state() == QpState::Err || h[0].cq.len() == m.expect_wc.len());
        let a = &hosts[0];
        let ids: Vec<u64> = a.cq.iter().map(|c| c.wr_id).collect();
        prop_assert_eq!(&ids, &m.expect_wc, "every WR completes exactly once, in order");
        if a.qp.state() == QpState::Err {
            let k = a.cq.iter().position(|c| c.status != WcStatus::Success).unwrap();
            prop_assert_eq!(a.cq[k].status, WcStatus::RetryExcErr);
            prop_assert!(a.cq[k + 1..].iter().all(|c| c.status == WcStatus::WrFlushErr));
            prop_assert_eq!(a.qp.counters().timeouts, 8);
        } else {
            // Everything finished before the cut.
            prop_assert!(a.cq.iter().all(|c| c.status == WcStatus::Success));
        }
    }

    #[test]
    fn sends_before_their_receives_are_rnr_naked_and_complete_once(
        lens in proptest::collection::vec(0u32..900, 1..8),
        seed in any::<u64>(),
        loss in 0u64..100,
        dup in 0u64..100,
        jitter in prop_oneof![Just(0u64), 1u64..6000],
        post_after in 0u64..300_000,
    ) {
        let (mut a, b) = pair(256, false, 17);
        let ak = a.mr.lkey;
        let mut data = vec![];
        for (i, len) in lens.iter().enumerate() {
            let d = bytes(*len, i as u64);
            a.mem.write(A_BASE + i as u64 * 0x1000, &d);
            a.qp.post_send(wr(i as u64, SendOp::Send, A_BASE + i as u64 * 0x1000, *len, ak), &a.mrs).unwrap();
            data.push(d);
        }
        let mut hosts = [a, b];
        let mut link = Link::new(seed, loss, dup, jitter);
        let t = run(&mut hosts, &mut link, 0, post_after, |_| false);
        prop_assert!(hosts[0].cq.is_empty(), "nothing completes without a receive WQE");
        let Host { qp, mrs, mr, .. } = &mut hosts[1];
        for i in 0..lens.len() as u64 {
            let r = RecvWr { wr_id: 1000 + i, sge: Sge { addr: B_BASE + 0x20000 + i * 0x1000, len: 0x1000, lkey: mr.lkey } };
            qp.post_recv(r, mrs).unwrap();
        }
        let n = lens.len();
        let t = run(&mut hosts, &mut link, t, 400_000_000, |h| h[0].cq.len() >= n && h[1].cq.len() >= n);
        run(&mut hosts, &mut link, t, 300_000, |_| false);
        let [a, b] = &hosts;
        let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<_> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
        prop_assert_eq!(got, want, "counters {:?}", a.qp.counters());
        prop_assert_eq!(b.cq.len(), n);
        for (i, (c, d)) in b.cq.iter().zip(&data).enumerate() {
            prop_assert_eq!((c.wr_id, c.status, c.byte_len), (1000 + i as u64, WcStatus::Success, d.len() as u32));
            prop_assert_eq!(b.mem.read(B_BASE + 0x20000 + i as u64 * 0x1000, d.len()), &d[..]);
        }
        if post_after > 50_000 && loss == 0 {
            prop_assert!(b.qp.counters().rnr_nak_sent > 0);
        }
    }

    #[test]
    fn rnr_retries_run_out_with_rnr_retry_exc_err(
        rnr_retry in 0u8..7,
        seed in any::<u64>(),
        dup in 0u64..300,
        jitter in prop_oneof![Just(0u64), 1u64..6000],
    ) {
        let (mut a, b) = pair(256, false, 0);
        let mut cfg = *a.qp.config();
        cfg.rnr_retry = rnr_retry;
        a = Host::new(1, cfg, A_BASE);
        let ak = a.mr.lkey;
        a.qp.post_send(wr(1, SendOp::Send, A_BASE, 100, ak), &a.mrs).unwrap();
        a.qp.post_send(wr(2, SendOp::Send, A_BASE, 100, ak), &a.mrs).unwrap();
        let mut hosts = [a, b];
        let mut link = Link::new(seed, 0, dup, jitter);
        run(&mut hosts, &mut link, 0, 1_000_000_000, |h| h[0].qp.state() == QpState::Err);
        let a = &hosts[0];
        let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        prop_assert_eq!(got, vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]);
        let rnr_naks = a.events.iter().filter(|e| matches!(e, QpEvent::Nak { syndrome: AethSyndrome::RnrNak { .. }, .. })).count();
        prop_assert!(rnr_naks > usize::from(rnr_retry), "{} RNR NAKs for rnr_retry {}", rnr_naks, rnr_retry);
        prop_assert_eq!(a.qp.counters().timeouts, 0);
    }
}

/// Retry attributes set before RTS (`ibv_modify_qp` at RTR -> RTS, which
/// this transport otherwise takes at creation) are the ones the requester
/// uses: with retry_cnt 2 and a 1 ms timeout a vanished peer ends the QP
/// after 3 timeouts, at least 3 ms in (the creation values, 7 retries of
/// 40 us, would end it after 8 timeouts within 0.4 ms).
#[test]
fn retry_attributes_set_before_rts_apply() {
    let (mut a, b) = pair(256, false, 0);
    a.qp.modify(QpState::Reset).unwrap();
    a.qp.modify(QpState::Init).unwrap();
    a.qp.modify(QpState::Rtr).unwrap();
    assert!(a.qp.set_retry(1_000_000, 8, 0).is_err(), "3-bit counts");
    assert!(a.qp.set_retry(0, 2, 0).is_err(), "a timeout above 0");
    a.qp.set_retry(1_000_000, 2, 0).unwrap();
    a.qp.modify(QpState::Rts).unwrap();
    assert!(
        a.qp.set_retry(1_000_000, 3, 0).is_err(),
        "not once it may send"
    );
    let ak = a.mr.lkey;
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, 100, ak), &a.mrs)
        .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    link.up = false;
    let t = run(&mut hosts, &mut link, 0, 1_000_000_000, |h| {
        h[0].qp.state() == QpState::Err
    });
    let a = &hosts[0];
    assert_eq!(a.qp.state(), QpState::Err);
    assert_eq!(a.qp.counters().timeouts, 3);
    assert_eq!(a.cq[0].status, WcStatus::RetryExcErr);
    assert!(
        t >= 3_000_000,
        "ended at {t} ns: the new timeout did not apply"
    );
}
