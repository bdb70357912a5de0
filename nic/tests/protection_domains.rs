//! Protection domains on real engines: a QP may only use regions of its own
//! PD, locally (lkey) and remotely (rkey); a key of another PD is refused as
//! the IBA says and nothing is read or written.

use std::time::Duration;

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

fn write(lkey: u32, addr: u64, remote_va: u64, rkey: u32) -> SendWr {
    SendWr {
        wr_id: 1,
        op: SendOp::Write { remote_va, rkey },
        sge: Sge {
            addr,
            len: 64,
            lkey,
        },
        signaled: true,
        solicited: false,
    }
}

#[test]
fn keys_of_another_pd_are_refused_locally_and_remotely() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "pd", 1024).unwrap();
    let a = Device::open(eal, pa, DeviceConfig::new([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    assert_ne!(pd_a.id(), 0, "the default PD is 0; allocated ones differ");
    assert_ne!(a.alloc_pd().id(), pd_a.id());

    // Regions: in A's PD, in A's default PD, in B's PD.
    let src = pd_a.reg_mr(4096, all).unwrap();
    let src_default = a.reg_mr(4096, all).unwrap();
    let dst = pd_b.reg_mr(4096, all).unwrap();
    src.write(0, &[0xAB; 64]);
    src_default.write(0, &[0xCD; 64]);

    let (mut ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa = pd_a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    let mut qb = pd_b.create_qp(&cb, &cb, QpOptions::default()).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();

    // Same PDs on both sides: works.
    qa.post_send(write(src.lkey(), src.va(), dst.va(), dst.rkey()))
        .unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let mut got = [0u8; 64];
    dst.read(0, &mut got);
    assert_eq!(got, [0xAB; 64]);

    // A local key of the default PD on a QP of pd_a: a local protection
    // error, nothing sent.
    let sent = a.counters().tx_data_packets;
    qa.post_send(write(
        src_default.lkey(),
        src_default.va(),
        dst.va(),
        dst.rkey(),
    ))
    .unwrap();
    let wc = ca.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::LocProtErr, "{wc:?}");
    assert_eq!(a.counters().tx_data_packets, sent);

    // A QP of B's default PD sent an rkey of pd_b: a remote access error
    // (NAK), nothing written (the memory pool of the test EAL holds two
    // devices, so the same devices host a second pair of QPs).
    let (mut ca2, cb2) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa2 = a.create_qp(&ca2, &ca2, QpOptions::default()).unwrap();
    let mut qb2 = b.create_qp(&cb2, &cb2, QpOptions::default()).unwrap();
    qa2.connect(&qb2.remote_info()).unwrap();
    qb2.connect(&qa2.remote_info()).unwrap();
    let naks = b.counters().tx_access_naks;
    qa2.post_send(write(
        src_default.lkey(),
        src_default.va(),
        dst.va(),
        dst.rkey(),
    ))
    .unwrap();
    let wc = ca2.wait(Duration::from_secs(5)).expect("completion");
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    dst.read(0, &mut got);
    assert_eq!(got, [0xAB; 64], "nothing written into another PD's region");
    let end = std::time::Instant::now() + Duration::from_secs(2);
    while b.counters().tx_access_naks == naks && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.counters().tx_access_naks, naks + 1);
}
