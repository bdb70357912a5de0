//! A WRITE ping-pong between two engines (the pattern of write_lat): each
//! side WRITEs a stamp into the other's region and waits to see the peer's.

use std::time::{Duration, Instant};

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

#[test]
fn write_ping_pong_round_trips() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "pp", 1024).unwrap();
    let a = Device::open(eal, pa, DeviceConfig::new([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let (mut ca, mut cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cb, &cb, QpOptions::default()).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (a.reg_mr(128, acc).unwrap(), b.reg_mr(128, acc).unwrap());
    let wait_stamp = |m: &nic::verbs::MemoryRegion, v: u64| {
        let end = Instant::now() + Duration::from_secs(5);
        let mut x = [0u8; 8];
        loop {
            m.read(64, &mut x);
            if u64::from_le_bytes(x) == v {
                return;
            }
            assert!(Instant::now() < end, "stamp {v} never arrived (have {x:?})");
            std::thread::yield_now();
        }
    };
    for i in 1..=200u64 {
        for (m, q, cq, peer) in [(&ma, &mut qa, &mut ca, &mb), (&mb, &mut qb, &mut cb, &ma)] {
            m.write(0, &i.to_le_bytes());
            q.post_send(SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_va: peer.va() + 64,
                    rkey: peer.rkey(),
                },
                sge: Sge {
                    addr: m.va(),
                    len: 8,
                    lkey: m.lkey(),
                },
                signaled: true,
                solicited: false,
            })
            .unwrap();
            wait_stamp(peer, i);
            let wc = cq.wait(Duration::from_secs(5)).expect("completion");
            assert_eq!(wc.status, WcStatus::Success);
        }
    }
}
