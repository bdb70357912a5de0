//! Scatter/gather lists and inline sends on real engines (a DPDK ring
//! pair): a WRITE and a SEND gathered from three SGEs in two regions (zero
//! copy), the SEND scattered over a two-SGE receive, a READ scattered over
//! three SGEs, and an inline SEND from a stack buffer, deliver exactly those
//! bytes; limits are refused with typed errors.

use std::time::Duration;

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions, SgRef, VerbsError};
use rdma::transport::{Access, RecvWr, SendOp, Sge, WcOpcode, WcStatus};

#[test]
fn sgl_write_and_send_and_inline_send_deliver_the_bytes() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "sgl", 1024).unwrap();
    let cfg = |ip| DeviceConfig {
        pool_size: 4095,
        ..DeviceConfig::new(ip)
    };
    let a = Device::open(eal, pa, cfg([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, cfg([10, 0, 0, 2])).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (r1, r2) = (a.reg_mr(8192, all).unwrap(), a.reg_mr(8192, all).unwrap());
    let dst = b.reg_mr(16384, all).unwrap();
    let p1: Vec<u8> = (0..8192u32).map(|i| (i * 3 + 1) as u8).collect();
    let p2: Vec<u8> = (0..8192u32).map(|i| (i * 5 + 2) as u8).collect();
    r1.write(0, &p1);
    r2.write(0, &p2);
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let opts = QpOptions {
        max_send_sge: 3,
        max_recv_sge: 2,
        max_inline_data: 64,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&ca, &ca, opts).unwrap();
    let mut qb = b.create_qp(&cb, &cb, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();

    // Three pieces: r1[100..1100], r2[0..3000], r1[5000..5500].
    let sgl = [
        SgRef {
            mr: &r1,
            offset: 100,
            len: 1000,
        },
        SgRef {
            mr: &r2,
            offset: 0,
            len: 3000,
        },
        SgRef {
            mr: &r1,
            offset: 5000,
            len: 500,
        },
    ];
    let want: Vec<u8> = [&p1[100..1100], &p2[..3000], &p1[5000..5500]].concat();
    let write = SendOp::Write {
        remote_va: dst.va(),
        rkey: dst.rkey(),
    };
    qa.post_send_sgl(1, write, &sgl, true).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("WRITE completion");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    let mut got = vec![0u8; want.len()];
    dst.read(0, &mut got);
    assert!(got == want, "gathered WRITE delivered other bytes");

    // The same list as a SEND into a receive of two SGEs: 3000 bytes at
    // dst[8192..], the rest at dst[12288..].
    let scatter = [
        Sge {
            addr: dst.va() + 8192,
            len: 3000,
            lkey: dst.lkey(),
        },
        Sge {
            addr: dst.va() + 12288,
            len: 4096,
            lkey: dst.lkey(),
        },
    ];
    let rwr = RecvWr {
        wr_id: 10,
        sge: Sge::default(),
    };
    qb.post_recv_sges(rwr, &scatter).unwrap();
    qa.post_send_sgl(2, SendOp::Send, &sgl, true).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("SEND completion");
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success), "{wc:?}");
    let wc = cb.wait(Duration::from_secs(5)).expect("RECV completion");
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len),
        (10, WcOpcode::Recv, want.len() as u32)
    );
    let mut got = vec![0u8; want.len()];
    dst.read(8192, &mut got[..3000]);
    dst.read(12288, &mut got[3000..]);
    assert!(got == want, "gathered SEND delivered other bytes");
    let mut gap = vec![0u8; 12288 - 11192];
    dst.read(11192, &mut gap);
    assert!(
        gap.iter().all(|&b| b == 0),
        "bytes between the SGEs written"
    );

    // A READ of dst[0..4500] scattered over three SGEs of A's regions.
    let into = [
        SgRef {
            mr: &r2,
            offset: 10,
            len: 500,
        },
        SgRef {
            mr: &r1,
            offset: 7000,
            len: 1000,
        },
        SgRef {
            mr: &r2,
            offset: 4000,
            len: 3000,
        },
    ];
    let read = SendOp::Read {
        remote_va: dst.va(),
        rkey: dst.rkey(),
    };
    qa.post_send_sgl(4, read, &into, true).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("READ completion");
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (4, WcStatus::Success, 4500)
    );
    let mut remote = vec![0u8; 4500];
    dst.read(0, &mut remote);
    let mut got = vec![0u8; 4500];
    r2.read(10, &mut got[..500]);
    r1.read(7000, &mut got[500..1500]);
    r2.read(4000, &mut got[1500..]);
    assert!(got == remote, "scattered READ placed other bytes");

    // Inline: bytes from the stack, no region, no lkey.
    let msg = *b"inline: copied into the work request at post time";
    qb.post_recv(RecvWr {
        wr_id: 11,
        sge: Sge {
            addr: dst.va(),
            len: 256,
            lkey: dst.lkey(),
        },
    })
    .unwrap();
    qa.post_send_inline(3, SendOp::Send, &msg, true).unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("inline completion");
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success), "{wc:?}");
    let wc = cb.wait(Duration::from_secs(5)).expect("RECV completion");
    assert_eq!((wc.wr_id, wc.byte_len), (11, msg.len() as u32));
    let mut got = [0u8; 49];
    dst.read(0, &mut got);
    assert_eq!(got, msg);

    // Limits: a fourth SGE, an inline payload over 64 bytes, an ATOMIC
    // with several SGEs, a third receive SGE, an SGE outside its region.
    let four = [sgl[0], sgl[1], sgl[2], sgl[0]];
    assert!(matches!(
        qa.post_send_sgl(4, SendOp::Send, &four, true),
        Err(VerbsError::TooManySges { given: 4, max: 3 })
    ));
    assert!(matches!(
        qa.post_send_inline(5, SendOp::Send, &[0u8; 65], true),
        Err(VerbsError::TooLong { len: 65, max: 64 })
    ));
    let faa = SendOp::FetchAdd {
        remote_va: dst.va(),
        rkey: dst.rkey(),
        add: 1,
    };
    assert!(matches!(
        qa.post_send_sgl(6, faa, &sgl[..2], true),
        Err(VerbsError::NotGatherable)
    ));
    assert!(matches!(
        qb.post_recv_sges(rwr, &[scatter[0]; 3]),
        Err(VerbsError::TooManySges { given: 3, max: 2 })
    ));
    let outside = [SgRef {
        mr: &r1,
        offset: 8000,
        len: 500,
    }];
    assert!(matches!(
        qa.post_send_sgl(7, SendOp::Send, &outside, true),
        Err(VerbsError::OutsideRegion)
    ));
    assert!(ca.poll_one().is_none(), "refused requests post nothing");
}
