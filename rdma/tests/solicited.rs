//! The Solicited Event bit end to end (IBA 9.2.2, 11.4.2.2): a send work
//! request marked solicited sets BTH SE on its last packet, and the
//! responder's receive completion of that message says so
//! (`WorkCompletion::solicited`), which is what a CQ armed with
//! `ibv_req_notify_cq(cq, 1)` waits for. Every other completion is not
//! solicited.

mod common;
use common::*;
use rdma::transport::*;

#[test]
fn the_se_bit_reaches_the_receive_completion() {
    // 256-byte MTU: the 700-byte SENDs are FIRST/MIDDLE/LAST, so SE must
    // ride on the last packet, not the first.
    let (mut a, mut b) = pair(256, false, 0x10);
    fill(&mut a, A_BASE, 700, 3);
    let (ak, bk) = (a.mr.lkey, b.mr.rkey);
    for id in 0..5u64 {
        b.qp.post_recv(
            RecvWr {
                wr_id: 900 + id,
                sge: Sge {
                    addr: B_BASE + 0x1000 * id,
                    len: 1024,
                    lkey: b.mr.lkey,
                },
            },
            &b.mrs,
        )
        .unwrap();
    }
    let solicited = |mut w: SendWr| {
        w.solicited = true;
        w
    };
    let posts = [
        wr(1, SendOp::Send, A_BASE, 700, ak),
        solicited(wr(2, SendOp::Send, A_BASE, 700, ak)),
        solicited(wr(3, SendOp::SendImm(9), A_BASE, 64, ak)),
        solicited(wr(
            4,
            SendOp::WriteImm {
                remote_va: B_BASE + 0x8000,
                rkey: bk,
                imm: 7,
            },
            A_BASE,
            700,
            ak,
        )),
        wr(
            5,
            SendOp::WriteImm {
                remote_va: B_BASE + 0x9000,
                rkey: bk,
                imm: 8,
            },
            A_BASE,
            64,
            ak,
        ),
    ];
    for w in posts {
        a.qp.post_send(w, &a.mrs).unwrap();
    }
    let mut hosts = [a, b];
    let mut link = Link::new(1, 0, 0, 0);
    run(&mut hosts, &mut link, 0, 10_000_000, |h: &[Host; 2]| {
        h[0].cq.len() >= 5 && h[1].cq.len() >= 5
    });
    let [a, b] = &hosts;
    // The requester's own completions are never solicited.
    assert_eq!(a.cq.len(), 5);
    assert!(a.cq.iter().all(|c| !c.solicited), "{:?}", a.cq);
    let got: Vec<(u64, WcOpcode, bool)> =
        b.cq.iter()
            .map(|c| (c.wr_id, c.opcode, c.solicited))
            .collect();
    assert_eq!(
        got,
        vec![
            (900, WcOpcode::Recv, false),
            (901, WcOpcode::Recv, true),
            (902, WcOpcode::Recv, true),
            (903, WcOpcode::RecvRdmaWithImm, true),
            (904, WcOpcode::RecvRdmaWithImm, false),
        ]
    );
}
