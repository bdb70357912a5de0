//! Shared receive queues on real engines (a DPDK ring pair; IBA 10.2.9):
//! three QPs of B receive from one SRQ, which A's three QPs fill with SENDs
//! of 1 B to 8 KiB; every WQE is used once, in posting order
//! across the QPs, and every byte lands where its WQE says (one WQE with a
//! scatter list of two SGEs). The armed limit raises
//! `SrqLimitReached` once; the SRQ cannot be destroyed while a QP receives
//! from it; a QP on an SRQ refuses receives of its own.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use nic::verbs::{AsyncEvent, QpOptions, SrqAttr, VerbsError};
use rdma::transport::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

#[test]
fn three_qps_receive_from_one_srq_in_posting_order() {
    let (a, b) = support::device_pair("srq", 4096, |c| c);
    let (mut ca, mut cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let mut srq = b.create_srq(64, 2).unwrap();
    assert_eq!(
        srq.query().unwrap(),
        SrqAttr {
            max_wr: 64,
            max_sge: 2,
            limit: 0
        }
    );
    let on_srq = QpOptions {
        srq: Some(srq.id()),
        ..QpOptions::default()
    };
    let mut pairs: Vec<_> = (0..3)
        .map(|_| {
            let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
            let mut qb = b.create_qp(&cb, &cb, on_srq).unwrap();
            qa.connect(&qb.remote_info()).unwrap();
            qb.connect(&qa.remote_info()).unwrap();
            (qa, qb)
        })
        .collect();
    assert!(matches!(
        pairs[0].1.post_recv(support::recv_wr(
            1,
            &b.reg_mr(64, support::ALL).unwrap(),
            64
        )),
        Err(VerbsError::ReceivesFromSrq)
    ));

    let src = a.reg_mr(1 << 20, support::ALL).unwrap();
    let dst = b.reg_mr(2 << 20, support::ALL).unwrap();
    // 24 WQEs of 64 KiB each; WQE 5 scatters over two SGEs of 32 KiB.
    const N: u64 = 24;
    for k in 0..N {
        let at = k * 65536;
        let wr = RecvWr {
            wr_id: 100 + k,
            sge: dst.sge(at, 65536),
        };
        let sgl = [dst.sge(at, 32768), dst.sge(at + 40000, 32768)];
        srq.post_recv(wr, (k == 5).then_some(&sgl[..])).unwrap();
    }
    srq.arm(5).unwrap();
    assert_eq!(srq.query().unwrap().limit, 5);

    // Each of A's QPs sends 7 messages of its own sizes (up to 8 KiB, in
    // two 4 KiB packets), all in flight at once: 21 WQEs taken, 3 left
    // (below the limit of 5: one event).
    let mut sent = vec![];
    for (q, (qa, _)) in pairs.iter_mut().enumerate() {
        for m in 0..7u64 {
            let len = [1u32, 100, 4096, 5000, 8192, 2000, 3][(q + m as usize) % 7];
            let off = (q as u64 * 7 + m) * 8192;
            let data: Vec<u8> = (0..u64::from(len))
                .map(|i| (i * 13 + q as u64 * 7 + m) as u8)
                .collect();
            src.write(off as usize, &data);
            let wr = SendWr::signaled(m, SendOp::Send, src.sge(off, len));
            qa.post_send(wr).unwrap();
            sent.push((q, data));
        }
    }
    let mut got = vec![];
    while got.len() < sent.len() {
        let wc = cb
            .wait(Duration::from_secs(10))
            .expect("a receive completion");
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::Success, WcOpcode::Recv),
            "{wc:?}"
        );
        got.push(wc);
    }
    for _ in 0..sent.len() {
        let wc = ca.wait(Duration::from_secs(10)).expect("a send completion");
        assert_eq!(wc.status, WcStatus::Success);
    }
    // Every WQE of the first 21 used once, in posting order.
    let ids: BTreeSet<u64> = got.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (100..121).collect::<BTreeSet<_>>(), "each WQE once");
    // Each QP's messages in its own order, each in the WQE it took.
    for (q, (_, qb)) in pairs.iter().enumerate() {
        let mine: Vec<_> = got.iter().filter(|w| w.qp_num == qb.qpn()).collect();
        assert_eq!(mine.len(), 7, "QP {q}");
        assert!(
            mine.windows(2).all(|p| p[0].wr_id < p[1].wr_id),
            "QP {q} out of order"
        );
        let expect: Vec<_> = sent.iter().filter(|(s, _)| *s == q).collect();
        for (wc, (_, data)) in mine.iter().zip(expect) {
            assert_eq!(wc.byte_len as usize, data.len());
            let at = ((wc.wr_id - 100) * 65536) as usize;
            let mut buf = vec![0u8; data.len()];
            if wc.wr_id == 105 {
                let n = data.len().min(32768);
                dst.read(at, &mut buf[..n]);
                dst.read(at + 40000, &mut buf[n..]);
            } else {
                dst.read(at, &mut buf);
            }
            assert!(buf == *data, "WQE {} holds other bytes", wc.wr_id);
        }
    }
    let ev = b.events().next_timeout(Duration::from_secs(2));
    assert_eq!(ev, Some(AsyncEvent::SrqLimitReached { srq: srq.id() }));
    assert_eq!(b.events().try_next(), None, "once");
    assert_eq!(srq.query().unwrap().limit, 0, "disarmed");

    // Not destroyed while QPs receive from it; destroyed once they are gone.
    let srq = match srq.destroy() {
        Err(busy) => busy.handle,
        Ok(()) => panic!("an SRQ in use was destroyed"),
    };
    drop(pairs);
    std::thread::sleep(Duration::from_millis(50));
    assert!(srq.destroy().is_ok());
}

#[test]
fn srq_limits_are_refused() {
    let (_a, b) = support::device_pair("srq_bad", 1024, |c| c);
    assert!(b.create_srq(16, 33).is_err(), "33 SGEs");
    assert!(b.create_srq(0, 1).is_err(), "0 WQEs");
    let mut srq = b.create_srq(4, 1).unwrap();
    assert!(srq.arm(5).is_err(), "a limit above max_wr");
    let dst = b.reg_mr(4096, support::ALL).unwrap();
    let two = [dst.sge(0, 8), dst.sge(8, 8)];
    let wr = RecvWr {
        wr_id: 1,
        sge: Sge::default(),
    };
    assert!(matches!(
        srq.post_recv(wr, Some(&two)),
        Err(VerbsError::TooManySges { given: 2, max: 1 })
    ));
}
