//! Selective repeat beside go-back-N (rdma::transport::sack, issue 43), through real
//! frames over the in-memory link in virtual time:
//!
//! - property: under loss, duplication and reordering, mixes of multi-packet WRITE,
//!   WRITE with immediate, READ, SEND and both ATOMICs deliver every byte once, in
//!   the order IBA requires, in both modes (`gbn` and `sr` on both ends); and a model
//!   check at every step that no work request completes early: when the requester
//!   reports one, everything it did is already at the responder (a WRITE's bytes, a
//!   SEND's receive completion) or at the requester (a READ's bytes, an ATOMIC's
//!   original value), and every earlier one completed before it;
//! - property: a QP in `sr` whose peer does go-back-N falls back and loses nothing;
//! - scenarios: one lost packet of a WRITE is resent alone in `sr` (go-back-N resends
//!   the rest of the window), a lost READ response is re-requested alone, a lost
//!   SEND packet is recovered in order, and the selective ACK's bytes on the wire.

mod common;
use common::*;
use proptest::prelude::*;
use rdma::transport::sack::{Sack, SACK_PLACED, SACK_UNPLACED};
use rdma::transport::*;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};
use rdma::wire::{parse_frame, ParseOptions};

const PMTU: u32 = 256;
/// Per-op strides: each op's buffers are its own.
const STRIDE: u64 = 0x2000;
const A_READ: u64 = A_BASE + 0x20000;
const A_ATOMIC: u64 = A_BASE + 0x3F000;
const B_READ: u64 = B_BASE + 0x18000;
const B_RECV: u64 = B_BASE + 0x30000;
const RECV_LEN: u32 = 0x800;
const FAA: u64 = B_BASE + 0x3F000;
const CAS: u64 = B_BASE + 0x3F008;

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
        3 => (0u32..8192).prop_map(Op::Write),
        1 => (0u32..2048).prop_map(Op::WriteImm),
        2 => (0u32..8192).prop_map(Op::Read),
        2 => (0u32..2048).prop_map(Op::Send),
        1 => (1u64..1000).prop_map(Op::FetchAdd),
        1 => Just(Op::CompareSwap),
    ]
}

fn bytes(len: u32, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

/// What must hold once work request `i` completed at the requester.
#[derive(Debug, Clone)]
enum Effect {
    /// These bytes at this address of B.
    AtB(u64, Vec<u8>),
    /// These bytes at this address of A.
    AtA(u64, Vec<u8>),
    /// B completed this many receives (the SEND's or WRITE with immediate's among
    /// them).
    Received(usize),
    /// This original value at this address of A.
    Orig(u64, u64),
}

/// Expected receive completion: (wr_id, opcode, byte_len, imm, SEND data).
type RecvExpect = (u64, WcOpcode, u32, Option<u32>, Option<Vec<u8>>);

struct Model {
    effects: Vec<Vec<Effect>>,
    recv_expect: Vec<RecvExpect>,
    faa_final: u64,
    cas_final: u64,
}

fn setup(ops: &[Op], a: &mut Host, b: &mut Host) -> Model {
    let (ak, bk, blk) = (a.mr.lkey, b.mr.rkey, b.mr.lkey);
    let mut m = Model {
        effects: vec![],
        recv_expect: vec![],
        faa_final: 0,
        cas_final: 0,
    };
    let (mut faa, mut cas) = (1000u64, 5u64);
    b.mem.write_u64(FAA, faa);
    b.mem.write_u64(CAS, cas);
    let mut nrecv = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let k = i as u64;
        let src = A_BASE + k * STRIDE;
        let wr = |op: SendOp, addr: u64, len: u32| SendWr {
            wr_id: k,
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
            let va = B_RECV + nrecv * u64::from(RECV_LEN);
            let r = RecvWr {
                wr_id: 1000 + nrecv,
                sge: Sge {
                    addr: va,
                    len: RECV_LEN,
                    lkey: blk,
                },
            };
            b.qp.post_recv(r, &b.mrs).unwrap();
            nrecv += 1;
            1000 + nrecv - 1
        };
        let (w, fx) = match *op {
            Op::Write(len) | Op::WriteImm(len) => {
                let d = bytes(len, k);
                a.mem.write(src, &d);
                let dst = B_BASE + k * STRIDE;
                let mut fx = vec![Effect::AtB(dst, d)];
                let op = if let Op::WriteImm(_) = op {
                    let rid = post_recv(b);
                    let imm = 0x100 + i as u32;
                    m.recv_expect
                        .push((rid, WcOpcode::RecvRdmaWithImm, len, Some(imm), None));
                    fx.push(Effect::Received(m.recv_expect.len()));
                    SendOp::WriteImm {
                        remote_va: dst,
                        rkey: bk,
                        imm,
                    }
                } else {
                    SendOp::Write {
                        remote_va: dst,
                        rkey: bk,
                    }
                };
                (wr(op, src, len), fx)
            }
            Op::Read(len) => {
                let d = bytes(len, k + 77);
                let from = B_READ + k * STRIDE;
                b.mem.write(from, &d);
                let dst = A_READ + k * STRIDE;
                let w = wr(
                    SendOp::Read {
                        remote_va: from,
                        rkey: bk,
                    },
                    dst,
                    len,
                );
                (w, vec![Effect::AtA(dst, d)])
            }
            Op::Send(len) => {
                let d = bytes(len, k + 5);
                a.mem.write(src, &d);
                let rid = post_recv(b);
                let at = B_RECV + (rid - 1000) * u64::from(RECV_LEN);
                m.recv_expect
                    .push((rid, WcOpcode::Recv, len, None, Some(d.clone())));
                let fx = vec![Effect::Received(m.recv_expect.len()), Effect::AtB(at, d)];
                (wr(SendOp::Send, src, len), fx)
            }
            Op::FetchAdd(add) => {
                let dst = A_ATOMIC + k * 8;
                let fx = vec![Effect::Orig(dst, faa)];
                faa = faa.wrapping_add(add);
                let op = SendOp::FetchAdd {
                    remote_va: FAA,
                    rkey: bk,
                    add,
                };
                (wr(op, dst, 8), fx)
            }
            Op::CompareSwap => {
                let dst = A_ATOMIC + k * 8;
                let fx = vec![Effect::Orig(dst, cas)];
                let new = cas * 3 + k;
                let op = SendOp::CompareSwap {
                    remote_va: CAS,
                    rkey: bk,
                    compare: cas,
                    swap: new,
                };
                cas = new;
                (wr(op, dst, 8), fx)
            }
        };
        a.qp.post_send(w, &a.mrs).unwrap();
        m.effects.push(fx);
    }
    m.faa_final = faa;
    m.cas_final = cas;
    m
}

/// The model check, at a step: the requester's completions are the work requests in
/// posting order, each successful, and each one's effects are all visible. `seen`
/// is how many were checked at earlier steps (each is checked at the step it
/// appeared: an early completion shows then, its data still missing).
fn check_no_early_completion(h: &[Host; 2], m: &Model, seen: &mut usize) -> Result<(), String> {
    let [a, b] = h;
    while *seen < a.cq.len() {
        let c = &a.cq[*seen];
        if c.wr_id != *seen as u64 || c.status != WcStatus::Success {
            return Err(format!("completion {} is {:?}", *seen, c));
        }
        for fx in &m.effects[*seen] {
            let ok = match fx {
                Effect::AtB(va, d) => b.mem.read(*va, d.len()) == &d[..],
                Effect::AtA(va, d) => a.mem.read(*va, d.len()) == &d[..],
                Effect::Received(n) => b.cq.len() >= *n,
                Effect::Orig(va, v) => a.mem.read_u64(*va) == *v,
            };
            if !ok {
                let what = match fx {
                    Effect::AtB(va, d) => format!("{} bytes at B {va:#x}", d.len()),
                    Effect::AtA(va, d) => format!("{} bytes at A {va:#x}", d.len()),
                    o => format!("{o:?}"),
                };
                return Err(format!("WR {} completed before {what} held", *seen));
            }
        }
        *seen += 1;
    }
    Ok(())
}

/// Two QPs, each in `mode_a` / `mode_b`, with the harness's defaults.
fn pair_modes(
    mode_a: LossRecovery,
    mode_b: LossRecovery,
    sq_psn: u32,
    coalesce: u16,
) -> (Host, Host) {
    let base = QpConfig {
        pmtu: PMTU,
        timeout_ns: 40_000,
        ..Default::default()
    };
    let (mut a, mut b) = pair_from(
        QpConfig {
            loss_recovery: mode_a,
            ..base
        },
        sq_psn,
        coalesce,
    );
    if mode_b != mode_a {
        let cfg = QpConfig {
            loss_recovery: mode_b,
            ..*b.qp.config()
        };
        let mut nb = Host::new(2, cfg, B_BASE);
        nb.qp.set_peer_ip(a.fb.net.src_ip.0);
        nb.qp.set_ack_coalesce(coalesce);
        b = nb;
    }
    for h in [&mut a, &mut b] {
        if h.qp.config().loss_recovery == LossRecovery::Sr {
            // IRN's timeouts scaled to the link's 2 us delay and jitter.
            h.qp.set_sr_params(SrParams {
                bdp_pkts: 64,
                rto_low_ns: 20_000,
                rto_high_ns: 30_000,
                low_pkts: 3,
            })
            .unwrap();
        }
    }
    (a, b)
}

/// Runs `ops` from A to B over a link losing, duplicating and reordering (per
/// mille, jitter in ns) and checks everything: exactly once, in order, byte-exact,
/// nothing completed early. Returns the hosts and the link.
#[allow(clippy::too_many_arguments)]
fn run_case(
    ops: &[Op],
    mode_a: LossRecovery,
    mode_b: LossRecovery,
    seed: u64,
    loss: u64,
    dup: u64,
    jitter: u64,
    wrap: bool,
    coalesce: u16,
) -> Result<([Host; 2], Link), TestCaseError> {
    let sq_psn = if wrap { 0xFF_FFF0 } else { 17 };
    let (mut a, mut b) = pair_modes(mode_a, mode_b, sq_psn, coalesce);
    let m = setup(ops, &mut a, &mut b);
    let mut hosts = [a, b];
    let mut link = Link::new(seed, loss, dup, jitter);
    let n = m.effects.len();
    let nr = m.recv_expect.len();
    let mut seen = 0;
    let mut early = Ok(());
    let t = run(&mut hosts, &mut link, 0, 400_000_000, |h| {
        if early.is_ok() {
            early = check_no_early_completion(h, &m, &mut seen);
        }
        early.is_err() || (h[0].cq.len() >= n && h[1].cq.len() >= nr)
    });
    if let Err(e) = early {
        return Err(TestCaseError::fail(e));
    }
    // Stragglers and duplicates drain: nothing may complete twice.
    run(&mut hosts, &mut link, t, 300_000, |_| false);
    let [a, b] = &hosts;
    let got: Vec<(u64, WcStatus)> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
    let want: Vec<(u64, WcStatus)> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
    prop_assert_eq!(
        got,
        want,
        "requester completions (state {:?}, counters {:?}, sr {:?})",
        a.qp.state(),
        a.qp.counters(),
        a.qp.sr_counters()
    );
    prop_assert_eq!(b.cq.len(), nr, "responder completions {:?}", b.cq);
    for (c, (rid, op, len, imm, data)) in b.cq.iter().zip(&m.recv_expect) {
        prop_assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len, c.imm),
            (*rid, WcStatus::Success, *op, *len, *imm)
        );
        if let Some(d) = data {
            let at = B_RECV + (rid - 1000) * u64::from(RECV_LEN);
            prop_assert_eq!(b.mem.read(at, d.len()), &d[..]);
        }
    }
    for fx in m.effects.iter().flatten() {
        if let Effect::AtB(va, d) = fx {
            prop_assert_eq!(b.mem.read(*va, d.len()), &d[..]);
        }
    }
    prop_assert_eq!(b.mem.read_u64(FAA), m.faa_final, "each FetchAdd once");
    prop_assert_eq!(b.mem.read_u64(CAS), m.cas_final);
    prop_assert_eq!(a.qp.state(), QpState::Rts);
    prop_assert_eq!(b.qp.state(), QpState::Rts);
    for h in [a, b] {
        let c = h.qp.counters();
        prop_assert_eq!(c.error_events, c.error_sum(), "{:?}", c);
    }
    if std::env::var_os("RDMA_STATS").is_some() {
        eprintln!(
            "{mode_a}/{mode_b} loss {loss} dup {dup} jitter {jitter}: sent {} A {:?} {:?} B {:?} {:?}",
            link.sent,
            a.qp.counters(),
            a.qp.sr_counters(),
            b.qp.counters(),
            b.qp.sr_counters()
        );
    }
    Ok((hosts, link))
}

fn mode(sr: bool) -> LossRecovery {
    if sr {
        LossRecovery::Sr
    } else {
        LossRecovery::Gbn
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    /// Both modes, both ends alike.
    #[test]
    fn every_byte_once_in_order_and_nothing_completes_early(
        ops in proptest::collection::vec(op_strategy(), 1..10),
        sr in any::<bool>(),
        seed in any::<u64>(),
        loss in prop_oneof![Just(0u64), 1u64..150],
        dup in prop_oneof![Just(0u64), 1u64..100],
        jitter in prop_oneof![Just(0u64), 1u64..6000],
        wrap in any::<bool>(),
        coalesce in prop_oneof![Just(1u16), 2u16..5, Just(u16::MAX)],
    ) {
        let m = mode(sr);
        let ([a, b], _) = run_case(&ops, m, m, seed, loss, dup, jitter, wrap, coalesce)?;
        prop_assert_eq!(a.qp.loss_recovery(), m, "no fall back between two {} ends", m);
        prop_assert_eq!(b.qp.loss_recovery(), m);
        if sr {
            let c = a.qp.sr_counters().unwrap();
            prop_assert_eq!(c.fallbacks, 0);
            // What the requester resent it resent because of a report or a timer.
            prop_assert!(c.holes_resent <= a.qp.counters().tx_retransmits);
        }
    }

    /// A requester in `sr` against a responder in `gbn` (the peer speaks only
    /// go-back-N): it falls back at the first NAK and loses nothing.
    #[test]
    fn sr_against_a_gbn_peer_falls_back_without_losing_data(
        ops in proptest::collection::vec(op_strategy(), 1..10),
        seed in any::<u64>(),
        loss in 1u64..150,
        dup in prop_oneof![Just(0u64), 1u64..100],
        jitter in prop_oneof![Just(0u64), 1u64..6000],
    ) {
        let ([a, b], _) = run_case(&ops, LossRecovery::Sr, LossRecovery::Gbn, seed, loss, dup, jitter, false, 1)?;
        let c = a.qp.sr_counters().unwrap();
        prop_assert_eq!(c.sacks_received, 0, "a gbn responder sends no selective ACK");
        prop_assert!(c.fallbacks <= 1);
        // It falls back when a NAK reaches it (one may be lost: the timer recovers).
        prop_assert_eq!(c.fallbacks == 1, a.qp.loss_recovery() == LossRecovery::Gbn);
        prop_assert!(c.fallbacks == 0 || b.qp.counters().nak_seq_sent > 0);
    }
}

/// A requester in `sr` whose peer's responder NAKs a gap (it does go-back-N) falls
/// back at that NAK and goes back N from it: the WRITE lands whole, later work
/// requests go out as go-back-N sends them.
#[test]
fn sr_falls_back_at_a_nak_without_a_selective_part() {
    let (mut a, b) = pair_modes(LossRecovery::Sr, LossRecovery::Gbn, 9, 1);
    let d = fill(&mut a, A_BASE, 16 * PMTU as usize, 3);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    for k in 0..2 {
        a.qp.post_send(wr(k, op, A_BASE, 16 * PMTU, ak), &a.mrs)
            .unwrap();
    }
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    link.drop_nth = Some(3);
    run(&mut hosts, &mut link, 0, 50_000_000, |h| h[0].cq.len() == 2);
    let [a, b] = &hosts;
    assert!(a.cq.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(b.mem.read(B_BASE, d.len()), &d[..]);
    assert_eq!(a.qp.sr_counters().unwrap().fallbacks, 1);
    assert_eq!(a.qp.loss_recovery(), LossRecovery::Gbn);
    assert_eq!(b.qp.counters().nak_seq_sent, 1);
    assert_eq!(a.qp.counters().timeouts, 0, "recovered by the NAK");
}

/// A 16-packet WRITE loses its 6th packet: in `sr` that packet alone is resent; in
/// `gbn` everything after it too.
#[test]
fn one_lost_write_packet_is_resent_alone_in_sr() {
    let mut resent = vec![];
    for m in [LossRecovery::Sr, LossRecovery::Gbn] {
        let (mut a, b) = pair_modes(m, m, 100, 1);
        let d = fill(&mut a, A_BASE, 16 * PMTU as usize, 3);
        let (ak, bk) = (a.mr.lkey, b.mr.rkey);
        let op = SendOp::Write {
            remote_va: B_BASE,
            rkey: bk,
        };
        a.qp.post_send(wr(1, op, A_BASE, 16 * PMTU, ak), &a.mrs)
            .unwrap();
        let mut hosts = [a, b];
        let mut link = Link::new(1, 0, 0, 0);
        link.drop_nth = Some(6);
        run(&mut hosts, &mut link, 0, 50_000_000, |h| {
            !h[0].cq.is_empty()
        });
        let [a, b] = &hosts;
        assert_eq!(a.cq.len(), 1);
        assert_eq!(a.cq[0].status, WcStatus::Success);
        assert_eq!(b.mem.read(B_BASE, d.len()), &d[..]);
        assert_eq!(a.qp.counters().timeouts, 0, "{m}: recovered by the NAK");
        resent.push(a.qp.counters().tx_retransmits);
        if m == LossRecovery::Sr {
            let c = a.qp.sr_counters().unwrap();
            assert!(c.sacks_received >= 10, "{c:?}");
            assert_eq!(b.qp.sr_counters().unwrap().rx_placed_ahead, 10);
        }
    }
    assert_eq!(resent[0], 1, "sr resends the hole alone");
    assert!(resent[1] >= 10, "gbn goes back N: {}", resent[1]);
}

/// A 12-response READ loses its 4th response: in `sr` the requester places the rest
/// on arrival and re-requests that one response alone.
#[test]
fn a_lost_read_response_is_re_requested_alone_in_sr() {
    let (mut a, mut b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 5, 1);
    let d = fill(&mut b, B_BASE + 0x8000, 12 * PMTU as usize - 100, 9);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Read {
        remote_va: B_BASE + 0x8000,
        rkey: bk,
    };
    a.qp.post_send(wr(1, op, A_BASE + 0x4000, d.len() as u32, ak), &a.mrs)
        .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    // Frames: 1 the request, 2.. the responses: the 4th response is frame 5.
    link.drop_nth = Some(5);
    link.capture = Some(vec![]);
    run(&mut hosts, &mut link, 0, 50_000_000, |h| {
        !h[0].cq.is_empty()
    });
    let [a, _] = &hosts;
    let responses = link
        .capture
        .as_ref()
        .unwrap()
        .iter()
        .filter(|f| {
            let fr = parse_frame(f, &ParseOptions::default(), |_| false).unwrap();
            fr.bth.opcode.is_read_response()
        })
        .count();
    assert_eq!(a.cq[0].status, WcStatus::Success);
    assert_eq!(a.qp.counters().tx_retransmits, 1);
    let c = a.qp.sr_counters().unwrap();
    assert_eq!((c.read_rerequests, c.rx_read_ahead), (1, 8), "{c:?}");
    assert_eq!(a.mem.read(A_BASE + 0x4000, d.len()), &d[..]);
    assert_eq!(responses, 12 + 1, "one response sent again");
}

/// A SEND of 8 packets loses its first: the rest cannot be placed ahead (its receive
/// WQE and offsets come in order), so each is reported unplaced and the SEND is
/// resent from the hole, landing in order.
#[test]
fn a_send_with_a_hole_lands_in_order() {
    let (mut a, mut b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 5, 1);
    let d = fill(&mut a, A_BASE, 8 * PMTU as usize, 4);
    let (ak, blk) = (a.mr.lkey, b.mr.lkey);
    let r = RecvWr {
        wr_id: 77,
        sge: Sge {
            addr: B_BASE,
            len: 4096,
            lkey: blk,
        },
    };
    b.qp.post_recv(r, &b.mrs).unwrap();
    a.qp.post_send(wr(1, SendOp::Send, A_BASE, d.len() as u32, ak), &a.mrs)
        .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    link.drop_nth = Some(1);
    run(&mut hosts, &mut link, 0, 50_000_000, |h| {
        !h[0].cq.is_empty()
    });
    let [a, b] = &hosts;
    assert_eq!(a.cq[0].status, WcStatus::Success);
    assert_eq!(b.cq.len(), 1);
    assert_eq!((b.cq[0].wr_id, b.cq[0].byte_len), (77, d.len() as u32));
    assert_eq!(b.mem.read(B_BASE, d.len()), &d[..]);
    assert_eq!(b.qp.sr_counters().unwrap().rx_placed_ahead, 0);
    assert!(b.qp.sr_counters().unwrap().sacks_sent > 0);
    assert_eq!(a.qp.counters().tx_retransmits, 8);
}

/// The selective ACK on the wire: an ACKNOWLEDGE whose AETH is a NAK with reserved
/// code 0x1E (placed) or 0x1D (not placed), the expected PSN in the BTH and the PSN
/// that arrived in the MSN field; and a QP in `gbn` never sends one.
#[test]
fn the_selective_ack_on_the_wire() {
    for m in [LossRecovery::Sr, LossRecovery::Gbn] {
        let (mut a, b) = pair_modes(m, m, 0x40, 1);
        let (ak, bk) = (a.mr.lkey, b.mr.rkey);
        fill(&mut a, A_BASE, 4 * PMTU as usize, 1);
        let op = SendOp::Write {
            remote_va: B_BASE,
            rkey: bk,
        };
        a.qp.post_send(wr(1, op, A_BASE, 4 * PMTU, ak), &a.mrs)
            .unwrap();
        let mut hosts = [a, b];
        let mut link = Link::new(1, 0, 0, 0);
        link.drop_nth = Some(2);
        link.capture = Some(vec![]);
        run(&mut hosts, &mut link, 0, 50_000_000, |h| {
            !h[0].cq.is_empty()
        });
        let frames = link.capture.take().unwrap();
        let mut sacks = vec![];
        for f in &frames {
            let fr = parse_frame(f, &ParseOptions::default(), |_| false).unwrap();
            if let Some(aeth) = fr.aeth {
                if let AethSyndrome::Nak(NakCode::Reserved(c)) = aeth.syndrome {
                    assert!(c == SACK_PLACED || c == SACK_UNPLACED);
                    sacks.push((
                        fr.bth.psn,
                        Sack::from_aeth(aeth.syndrome, aeth.msn).unwrap(),
                    ));
                    // Byte 0 of the AETH, after the 12-byte BTH.
                    let at = f.len() - 4 - fr.payload.len() - 4;
                    assert_eq!(f[at], 0x60 | c);
                }
            }
            if m == LossRecovery::Sr {
                // A plain WRITE goes as one WRITE ONLY per packet, each with its RETH.
                if let Some(r) = fr.reth {
                    assert_eq!(r.dma_len as usize, fr.payload.len());
                }
            }
        }
        if m == LossRecovery::Sr {
            let want: Vec<_> = (2..4)
                .map(|k| {
                    (
                        0x41,
                        Sack {
                            psn: 0x40 + k,
                            placed: true,
                        },
                    )
                })
                .collect();
            assert_eq!(sacks, want);
        } else {
            assert!(sacks.is_empty(), "gbn sends no selective ACK");
        }
    }
}

/// A peer that vanished: in `sr` too the IBA timer counts the retries down (the
/// RTO_low / RTO_high resends in between spend none) and the QP ends in ERR with
/// RETRY_EXC_ERR, the rest flushed.
#[test]
fn a_vanished_peer_ends_an_sr_qp_with_retry_exceeded() {
    let (mut a, b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 3, 1);
    fill(&mut a, A_BASE, 8 * PMTU as usize, 2);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    for k in 0..3 {
        a.qp.post_send(wr(k, op, A_BASE, 8 * PMTU, ak), &a.mrs)
            .unwrap();
    }
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    link.up = false;
    run(&mut hosts, &mut link, 0, 1_000_000_000, |h| {
        h[0].qp.state() == QpState::Err
    });
    let a = &hosts[0];
    let got: Vec<_> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::RetryExcErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        a.qp.counters().timeouts,
        8,
        "retry_cnt 7: eight IBA timeouts"
    );
    assert!(a.qp.sr_counters().unwrap().sr_timeouts >= 8);
}

/// The PSN of a packet.
fn psn_of(p: &TxPacket) -> u32 {
    p.repr.bth.psn
}

/// A READ of 12 responses: B has sent 4 when A, which lost the 3rd, re-requests it:
/// the replay goes out before the 8 responses still queued (IRN sends
/// retransmissions first), so A's READ waits for the hole alone, not for the rest of
/// the READ and then a round trip.
#[test]
fn a_re_requested_read_run_goes_before_the_responses_queued_behind_it() {
    let (mut a, mut b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 40, 1);
    let d = fill(&mut b, B_BASE + 0x8000, 12 * PMTU as usize, 7);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Read {
        remote_va: B_BASE + 0x8000,
        rkey: bk,
    };
    a.qp.post_send(wr(1, op, A_BASE + 0x4000, d.len() as u32, ak), &a.mrs)
        .unwrap();
    let req = a.qp.poll_tx(0).unwrap();
    deliver(&a, &req, &mut b);
    let first: Vec<TxPacket> = (0..4).map(|_| b.qp.poll_tx(0).unwrap()).collect();
    for (i, p) in first.iter().enumerate() {
        if i != 2 {
            deliver(&b, p, &mut a);
        }
    }
    let rereq = a.qp.poll_tx(0).expect("the hole re-requested");
    assert_eq!(psn_of(&rereq), 40 + 2);
    assert_eq!(rereq.repr.reth.unwrap().dma_len, PMTU);
    deliver(&a, &rereq, &mut b);
    let next = b.qp.poll_tx(0).unwrap();
    assert_eq!(psn_of(&next), 40 + 2, "the replay first, then the rest");
    deliver(&b, &next, &mut a);
    let mut rest = vec![];
    while let Some(p) = b.qp.poll_tx(0) {
        rest.push(psn_of(&p));
        deliver(&b, &p, &mut a);
    }
    assert_eq!(rest, (4..12).map(|i| 40 + i).collect::<Vec<_>>());
    assert_eq!(a.cq.len(), 1);
    assert_eq!(a.cq[0].status, WcStatus::Success);
    assert_eq!(a.mem.read(A_BASE + 0x4000, d.len()), &d[..]);
}

/// A whole READ asked again (the requester's timer fired before its first response
/// came: a stalled host) while B is sending it: B replays it once from the start,
/// not the rest of the original and then all of it again.
#[test]
fn a_whole_read_asked_again_while_it_is_sent_is_replayed_once() {
    for m in [LossRecovery::Sr, LossRecovery::Gbn] {
        let (mut a, mut b) = pair_modes(m, m, 40, 1);
        let d = fill(&mut b, B_BASE + 0x8000, 12 * PMTU as usize, 8);
        let (ak, bk) = (a.mr.lkey, b.mr.rkey);
        let op = SendOp::Read {
            remote_va: B_BASE + 0x8000,
            rkey: bk,
        };
        a.qp.post_send(wr(1, op, A_BASE + 0x4000, d.len() as u32, ak), &a.mrs)
            .unwrap();
        let req = a.qp.poll_tx(0).unwrap();
        deliver(&a, &req, &mut b);
        let early: Vec<TxPacket> = (0..4).map(|_| b.qp.poll_tx(0).unwrap()).collect();
        deliver(&a, &req, &mut b);
        let mut sent = vec![];
        while let Some(p) = b.qp.poll_tx(0) {
            sent.push(psn_of(&p));
            deliver(&b, &p, &mut a);
        }
        assert_eq!(sent, (0..12).map(|i| 40 + i).collect::<Vec<_>>(), "{m}");
        drop(early);
        assert_eq!(a.cq.len(), 1, "{m}");
        assert_eq!(a.mem.read(A_BASE + 0x4000, d.len()), &d[..]);
    }
}

/// The cap on PSNs in flight (IRN's BDP-FC) counts what is still in the network: a
/// hole at the oldest PSN, with everything after it reported placed, does not stop
/// new packets for the round trip its resend takes.
#[test]
fn a_hole_at_the_oldest_psn_does_not_stop_new_packets_at_the_cap() {
    let (mut a, mut b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 40, 1);
    a.qp.set_sr_params(SrParams {
        bdp_pkts: 8,
        rto_low_ns: 20_000,
        rto_high_ns: 30_000,
        low_pkts: 3,
    })
    .unwrap();
    let d = fill(&mut a, A_BASE, 32 * PMTU as usize, 5);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Write {
        remote_va: B_BASE,
        rkey: bk,
    };
    a.qp.post_send(wr(1, op, A_BASE, d.len() as u32, ak), &a.mrs)
        .unwrap();
    let mut burst = vec![];
    while let Some(p) = a.qp.poll_tx(0) {
        burst.push(p);
    }
    assert_eq!(burst.len(), 8, "the cap");
    for p in &burst[1..] {
        deliver(&a, p, &mut b);
    }
    while let Some(p) = b.qp.poll_tx(0) {
        deliver(&b, &p, &mut a);
    }
    // The hole first, then new packets: 1 PSN of 9 is in the network.
    let mut next = vec![];
    while let Some(p) = a.qp.poll_tx(0) {
        next.push(psn_of(&p));
    }
    assert_eq!(next.first(), Some(&40), "the hole resent");
    assert_eq!(
        next[1..],
        (8..15).map(|i| 40 + i).collect::<Vec<_>>()[..],
        "7 new PSNs while the hole is on its way"
    );
}

/// A READ request counts as one packet against the cap when it goes (its responses
/// follow the earlier ones at the responder): with a cap of 8 and READs of 12
/// responses, the second READ goes once 7 PSNs are still in flight, not only once the
/// first READ has ended.
#[test]
fn a_read_goes_once_what_is_before_it_fits_the_cap() {
    let (mut a, mut b) = pair_modes(LossRecovery::Sr, LossRecovery::Sr, 40, 1);
    a.qp.set_sr_params(SrParams {
        bdp_pkts: 8,
        rto_low_ns: 20_000,
        rto_high_ns: 30_000,
        low_pkts: 3,
    })
    .unwrap();
    let len = 12 * PMTU;
    let d = fill(&mut b, B_BASE + 0x8000, 2 * len as usize, 6);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    for k in 0..2u64 {
        let op = SendOp::Read {
            remote_va: B_BASE + 0x8000 + k * u64::from(len),
            rkey: bk,
        };
        let to = A_BASE + 0x4000 + k * u64::from(len);
        a.qp.post_send(wr(k, op, to, len, ak), &a.mrs).unwrap();
    }
    let r1 = a.qp.poll_tx(0).unwrap();
    assert!(a.qp.poll_tx(0).is_none(), "12 PSNs in flight, cap 8");
    deliver(&a, &r1, &mut b);
    for _ in 0..4 {
        let p = b.qp.poll_tx(0).unwrap();
        deliver(&b, &p, &mut a);
    }
    assert!(a.qp.poll_tx(0).is_none(), "8 in flight and the request");
    let p = b.qp.poll_tx(0).unwrap();
    deliver(&b, &p, &mut a);
    let r2 =
        a.qp.poll_tx(0)
            .expect("7 in flight and the request: the second READ");
    assert_eq!(psn_of(&r2), 40 + 12);
    deliver(&a, &r2, &mut b);
    while let Some(p) = b.qp.poll_tx(0) {
        deliver(&b, &p, &mut a);
    }
    assert_eq!(a.cq.len(), 2);
    assert_eq!(a.mem.read(A_BASE + 0x4000, d.len()), &d[..]);
}

/// A resent hole that is lost again, once everything after it was reported: the hole
/// is all that is in flight, and the timer that sends it again is RTO_low (IRN §3.1),
/// not RTO_high, which counted every PSN from the oldest unacknowledged one.
#[test]
fn a_lost_resend_with_nothing_else_in_flight_waits_rto_low() {
    let base = QpConfig {
        pmtu: PMTU,
        timeout_ns: 50_000_000,
        loss_recovery: LossRecovery::Sr,
        ..Default::default()
    };
    let (mut a, mut b) = pair_from(base, 40, 1);
    a.qp.set_sr_params(SrParams {
        bdp_pkts: 64,
        rto_low_ns: 20_000,
        rto_high_ns: 1_000_000,
        low_pkts: 3,
    })
    .unwrap();
    let d = fill(&mut b, B_BASE + 0x8000, 12 * PMTU as usize, 6);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    let op = SendOp::Read {
        remote_va: B_BASE + 0x8000,
        rkey: bk,
    };
    a.qp.post_send(wr(1, op, A_BASE + 0x4000, d.len() as u32, ak), &a.mrs)
        .unwrap();
    let req = a.qp.poll_tx(1_000).unwrap();
    deliver_at(&a, &req, &mut b, 2_000);
    // Every response but the 3rd arrives; the re-request of the 3rd is lost.
    let mut k = 0;
    while let Some(p) = b.qp.poll_tx(3_000) {
        if k != 2 {
            deliver_at(&b, &p, &mut a, 4_000);
        }
        k += 1;
    }
    let lost = a.qp.poll_tx(5_000).expect("the hole re-requested");
    assert_eq!(psn_of(&lost), 40 + 2);
    assert!(a.qp.poll_tx(5_000).is_none());
    assert_eq!(a.qp.next_timer(), Some(4_000 + 20_000), "RTO_low");
    a.qp.on_timer(24_000);
    let again = a.qp.poll_tx(24_000).expect("asked again");
    assert_eq!(psn_of(&again), 40 + 2);
    deliver_at(&a, &again, &mut b, 25_000);
    while let Some(p) = b.qp.poll_tx(26_000) {
        deliver_at(&b, &p, &mut a, 27_000);
    }
    assert_eq!(a.cq.len(), 1);
    assert_eq!(a.mem.read(A_BASE + 0x4000, d.len()), &d[..]);
}
