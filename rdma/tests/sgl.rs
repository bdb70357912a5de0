//! Scatter/gather lists (IBA 10.7.2.1): SEND and WRITE gathered from several
//! SGEs, READ responses and received SENDs scattered over several, through
//! an in-memory link that loses, duplicates and reorders frames (go-back-N
//! resends gathered packets from the same list). Every byte lands where its
//! SGE says, nothing between the SGEs is touched; bad lists are refused.

mod common;
use common::*;
use proptest::prelude::*;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::*;

#[derive(Debug, Clone)]
enum Op {
    Write {
        len: u32,
        split: Vec<u8>,
    },
    Read {
        len: u32,
        split: Vec<u8>,
    },
    Send {
        len: u32,
        split: Vec<u8>,
        recv_split: Vec<u8>,
        slack: u32,
    },
}

/// Cut points for an SGE list: each byte a relative weight of one SGE.
fn split_strategy() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0u8..8, 1..=8)
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..1500, split_strategy()).prop_map(|(len, split)| Op::Write { len, split }),
        (0u32..1500, split_strategy()).prop_map(|(len, split)| Op::Read { len, split }),
        (0u32..1500, split_strategy(), split_strategy(), 0u32..64).prop_map(
            |(len, split, recv_split, slack)| Op::Send {
                len,
                split,
                recv_split,
                slack
            }
        ),
    ]
}

/// `len` bytes cut into `weights.len()` SGEs (some may be empty) laid out
/// from `base` with a gap of 8 bytes after each, in region `lkey`.
fn lay(base: u64, len: u32, weights: &[u8], lkey: u32) -> Vec<Sge> {
    let sum: u32 = weights.iter().map(|&w| u32::from(w)).sum::<u32>().max(1);
    let mut left = len;
    let mut at = base;
    let mut out = Vec::new();
    for (k, &w) in weights.iter().enumerate() {
        let n = if k + 1 == weights.len() {
            left
        } else {
            (len * u32::from(w) / sum).min(left)
        };
        left -= n;
        out.push(Sge {
            addr: at,
            len: n,
            lkey,
        });
        at += u64::from(n) + 8;
    }
    out
}

fn bytes(len: u32, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    (0..len).map(|_| (r.next() as u8) | 1).collect()
}

/// Writes `data` over the SGEs of `sgl` in `mem`.
fn scatter(mem: &mut VecMemory, sgl: &[Sge], data: &[u8]) {
    let mut at = 0;
    for s in sgl {
        mem.write(s.addr, &data[at..at + s.len as usize]);
        at += s.len as usize;
    }
}

/// The bytes of `sgl` in `mem`, one after the other.
fn gather(mem: &VecMemory, sgl: &[Sge]) -> Vec<u8> {
    sgl.iter()
        .flat_map(|s| mem.read(s.addr, s.len as usize).to_vec())
        .collect()
}

/// Every byte of `[from, to)` outside `sgl` is still zero (the gaps and the
/// tail of a receive list).
fn untouched_outside(mem: &VecMemory, sgl: &[Sge], from: u64, to: u64) -> bool {
    (from..to).all(|va| {
        sgl.iter()
            .any(|s| va >= s.addr && va < s.addr + u64::from(s.len))
            || mem.read(va, 1)[0] == 0
    })
}

fn sgl_pair(pmtu: u32, cc: bool, sq_psn: u32, coalesce: u16) -> (Host, Host) {
    let base = QpConfig {
        pmtu,
        cc_ext: cc,
        ack_read_responses: cc,
        timeout_ns: 40_000,
        max_send_sge: 8,
        max_recv_sge: 8,
        ..Default::default()
    };
    pair_from(base, sq_psn, coalesce)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn gathered_and_scattered_messages_arrive_byte_exact_over_a_lossy_link(
        ops in proptest::collection::vec(op_strategy(), 1..10),
        seed in any::<u64>(),
        loss in 0u64..100,
        dup in 0u64..100,
        jitter in prop_oneof![Just(0u64), 1u64..6000],
        cc in any::<bool>(),
        coalesce in prop_oneof![Just(1u16), Just(u16::MAX)],
    ) {
        let (mut a, mut b) = sgl_pair(256, cc, 0xFF_FFF8, coalesce);
        let (ak, bk, brk) = (a.mr.lkey, b.mr.lkey, b.mr.rkey);
        // (where, the SGE list, the data, the area the list lies in)
        let mut checks_a = vec![];
        let mut checks_b = vec![];
        let mut recvs = vec![];
        for (i, op) in ops.iter().enumerate() {
            let i64_ = i as u64;
            let wr = |op| SendWr::signaled(i64_, op, Sge::default());
            match op {
                Op::Write { len, split } => {
                    let d = bytes(*len, i64_);
                    let src = lay(A_BASE + i64_ * 0x1000, *len, split, ak);
                    scatter(&mut a.mem, &src, &d);
                    let dst = B_BASE + i64_ * 0x1000;
                    checks_b.push((vec![Sge { addr: dst, len: *len, lkey: bk }], d, dst));
                    let op = SendOp::Write { remote_va: dst, rkey: brk };
                    a.qp.post_send_sgl(wr(op), Some(&src), &a.mrs).unwrap();
                }
                Op::Read { len, split } => {
                    let d = bytes(*len, i64_ + 77);
                    let src = B_BASE + 0x10000 + i64_ * 0x1000;
                    b.mem.write(src, &d);
                    let area = A_BASE + 0x20000 + i64_ * 0x1000;
                    let dst = lay(area, *len, split, ak);
                    checks_a.push((dst.clone(), d, area));
                    let op = SendOp::Read { remote_va: src, rkey: brk };
                    a.qp.post_send_sgl(wr(op), Some(&dst), &a.mrs).unwrap();
                }
                Op::Send { len, split, recv_split, slack } => {
                    let d = bytes(*len, i64_ + 5);
                    let src = lay(A_BASE + i64_ * 0x1000, *len, split, ak);
                    scatter(&mut a.mem, &src, &d);
                    let area = B_BASE + 0x20000 + recvs.len() as u64 * 0x1000;
                    let rl = lay(area, len + slack, recv_split, bk);
                    let rwr = RecvWr { wr_id: 1000 + i64_, sge: Sge::default() };
                    b.qp.post_recv_sgl(rwr, Some(&rl), &b.mrs).unwrap();
                    recvs.push((1000 + i64_, *len));
                    // The message fills the list's first `len` bytes.
                    let mut filled = vec![];
                    let mut left = *len;
                    for s in &rl {
                        let n = s.len.min(left);
                        filled.push(Sge { len: n, ..*s });
                        left -= n;
                    }
                    checks_b.push((filled, d, area));
                    a.qp.post_send_sgl(wr(SendOp::Send), Some(&src), &a.mrs).unwrap();
                }
            }
        }
        let n = ops.len();
        let nr = recvs.len();
        let mut hosts = [a, b];
        let mut link = Link::new(seed, loss, dup, jitter);
        let t = run(&mut hosts, &mut link, 0, 400_000_000, |h| h[0].cq.len() >= n && h[1].cq.len() >= nr);
        run(&mut hosts, &mut link, t, 300_000, |_| false);
        let [a, b] = &hosts;
        let got: Vec<(u64, WcStatus)> = a.cq.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<(u64, WcStatus)> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
        prop_assert_eq!(got, want, "requester completions (counters {:?})", a.qp.counters());
        let rgot: Vec<(u64, u32)> = b.cq.iter().map(|c| (c.wr_id, c.byte_len)).collect();
        prop_assert_eq!(rgot, recvs);
        for (sgl, d, area) in &checks_a {
            prop_assert_eq!(&gather(&a.mem, sgl), d);
            prop_assert!(untouched_outside(&a.mem, sgl, *area, area + 0x1000));
        }
        for (sgl, d, area) in &checks_b {
            prop_assert_eq!(&gather(&b.mem, sgl), d);
            prop_assert!(untouched_outside(&b.mem, sgl, *area, area + 0x1000));
        }
        // Byte lengths of the requester's completions are the lists' totals.
        for (c, op) in a.cq.iter().zip(&ops) {
            let len = match op {
                Op::Write { len, .. } | Op::Read { len, .. } | Op::Send { len, .. } => *len,
            };
            prop_assert_eq!(c.byte_len, len);
        }
    }
}

#[test]
fn bad_lists_are_refused_at_post() {
    let (mut a, mut b) = sgl_pair(1024, false, 5, 1);
    let k = a.mr.lkey;
    let two = [
        Sge {
            addr: A_BASE,
            len: 4,
            lkey: k,
        },
        Sge {
            addr: A_BASE + 8,
            len: 4,
            lkey: k,
        },
    ];
    let write = SendOp::Write {
        remote_va: B_BASE,
        rkey: b.mr.rkey,
    };
    let wr = |op| SendWr::signaled(1, op, Sge::default());
    // More SGEs than the QP was created for.
    let nine = [two[0]; 9];
    assert_eq!(
        a.qp.post_send_sgl(wr(write), Some(&nine), &a.mrs),
        Err(QpError::LocalLength)
    );
    let rwr = RecvWr {
        wr_id: 2,
        sge: Sge::default(),
    };
    assert_eq!(
        b.qp.post_recv_sgl(rwr, Some(&nine), &b.mrs),
        Err(QpError::LocalLength)
    );
    // An ATOMIC takes one 8-byte SGE.
    let faa = SendOp::FetchAdd {
        remote_va: B_BASE,
        rkey: b.mr.rkey,
        add: 1,
    };
    assert_eq!(
        a.qp.post_send_sgl(wr(faa), Some(&two), &a.mrs),
        Err(QpError::LocalLength)
    );
    // One SGE outside its region, or with another key.
    let mut bad = two;
    bad[1].addr = A_BASE + MEM_LEN as u64 - 2;
    assert!(matches!(
        a.qp.post_send_sgl(wr(write), Some(&bad), &a.mrs),
        Err(QpError::LocalProtection(AccessError::OutOfRange))
    ));
    bad = two;
    bad[0].lkey ^= 0x100;
    assert!(matches!(
        a.qp.post_send_sgl(wr(write), Some(&bad), &a.mrs),
        Err(QpError::LocalProtection(_))
    ));
    // A list longer than IBA's largest message.
    let big = [Sge {
        addr: A_BASE,
        len: 1 << 31,
        lkey: 0,
    }; 2];
    assert_eq!(
        a.qp.post_send_sgl(wr(SendOp::Send), Some(&big), &a.mrs),
        Err(QpError::LocalLength)
    );
    assert_eq!(MAX_SGE, 32);
    // Nothing was queued.
    assert!(a.qp.poll_tx(0).is_none());
}

#[test]
fn a_send_longer_than_the_scatter_list_completes_with_loc_len_err() {
    let (mut a, mut b) = sgl_pair(256, false, 5, 1);
    let (ak, bk) = (a.mr.lkey, b.mr.lkey);
    let rl = lay(B_BASE, 300, &[1, 1, 1], bk);
    let rwr = RecvWr {
        wr_id: 7,
        sge: Sge::default(),
    };
    b.qp.post_recv_sgl(rwr, Some(&rl), &b.mrs).unwrap();
    let src = lay(A_BASE, 301, &[2, 1], ak);
    a.qp.post_send_sgl(
        SendWr::signaled(1, SendOp::Send, Sge::default()),
        Some(&src),
        &a.mrs,
    )
    .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    run(&mut hosts, &mut link, 0, 10_000_000, |h| {
        !h[0].cq.is_empty() && !h[1].cq.is_empty()
    });
    let [a, b] = &hosts;
    assert_eq!(b.cq[0].wr_id, 7);
    assert_eq!(b.cq[0].status, WcStatus::LocLenErr);
    assert_eq!(a.cq[0].status, WcStatus::RemInvReqErr);
}
