//! A completion queue smaller than the work in flight: completions that
//! find the CQ full wait in the engine and reach the program as it polls
//! room free, in order, none lost, also once the link has gone quiet.

use std::time::Duration;

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

#[test]
fn completions_held_for_a_full_cq_arrive_when_the_program_polls() {
    const N: u64 = 64;
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "cq_full", 1024).unwrap();
    let a = Device::open(eal, pa, DeviceConfig::new([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let src = a.reg_mr(4096, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut cq = a.create_cq(4).unwrap();
    let cq_b = b.create_cq(4).unwrap();
    let mut qa = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cq_b, &cq_b, QpOptions::default()).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    for i in 0..N {
        qa.post_send(SendWr {
            wr_id: i,
            op: SendOp::Write {
                remote_va: dst.va() + i * 8,
                rkey: dst.rkey(),
            },
            sge: Sge {
                addr: src.va() + i * 8,
                len: 8,
                lkey: src.lkey(),
            },
            signaled: true,
            solicited: false,
        })
        .unwrap();
    }
    // Let everything be sent and acknowledged: the CQ fills with 4, the
    // rest wait in the engine, and no packet will come to move them.
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..N {
        let wc = cq
            .wait(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("completion {i} of {N} never came"));
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    assert!(cq.poll_one().is_none());
}
