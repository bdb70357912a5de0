//! The port's control plane between two NICs on a ring pair (docs/design.md §5):
//! a QP connected with the peer's IP only resolves its MAC by ARP before it
//! sends, and the transfer completes; a second QP to the same peer finds
//! the MAC in the cache; a peer that never answers ends the connect with a
//! clear error instead of a hang.

mod support;

use std::time::{Duration, Instant};

use dpdk::{Eal, Port};
use nic::contract::EngineError;
use nic::control::ArpConfig;
use nic::verbs::{Device, DeviceConfig, QpOptions, RemoteQp, VerbsError};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

const LEN: usize = 1 << 20;

fn config(ip: [u8; 4]) -> DeviceConfig {
    let mut c = DeviceConfig::new(ip);
    c.arp = ArpConfig {
        tries: 3,
        retry_interval_ns: 20_000_000,
        ..ArpConfig::default()
    };
    c
}

#[test]
fn a_qp_given_only_the_peers_ip_resolves_its_mac_by_arp_and_transfers() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "ctl_arp", 1024).unwrap();
    let a = Device::open(eal, pa, config([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, config([10, 0, 0, 2])).unwrap();
    // Each NIC announced itself with a gratuitous ARP, which the other
    // counted but did not learn (it was not addressed to it).
    support::counters_until(&a, "no gratuitous ARP from b", |c| c.rx_arp_requests >= 1);
    support::counters_until(&b, "no gratuitous ARP from a", |c| c.rx_arp_requests >= 1);

    let src = a.reg_mr(LEN, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    src.write(0, &pattern);
    let mut cq = a.create_cq(64).unwrap();
    let cq_b = b.create_cq(64).unwrap();
    let mut qa = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cq_b, &cq_b, QpOptions::default()).unwrap();
    // As perftest's exchange gives it: no MAC.
    let ip_only = |r: RemoteQp| RemoteQp { mac: None, ..r };
    qa.connect(&ip_only(qb.remote_info())).unwrap();
    qb.connect(&ip_only(qa.remote_info())).unwrap();
    qa.post_send(SendWr {
        wr_id: 1,
        op: SendOp::Write {
            remote_va: dst.va(),
            rkey: dst.rkey(),
        },
        sge: Sge {
            addr: src.va(),
            len: LEN as u32,
            lkey: src.lkey(),
        },
        signaled: true,
        solicited: false,
    })
    .unwrap();
    let wc = cq
        .wait(Duration::from_secs(10))
        .expect("the WRITE completes");
    assert_eq!(wc.status, WcStatus::Success);
    let mut got = vec![0u8; LEN];
    dst.read(0, &mut got);
    assert!(got == pattern, "the WRITE landed intact");

    // The resolution went over the wire: a asked, b answered (and learnt
    // a from the request addressed to it, so b's own connect hit the cache).
    support::counters_until(&a, "a's ARP exchange not counted", |c| {
        c.tx_arp_requests >= 2 && c.rx_arp_replies >= 1 && c.arp_cache_misses == 1
    });
    support::counters_until(&b, "b's ARP exchange not counted", |c| {
        c.tx_arp_replies >= 1 && c.arp_cache_hits == 1 && c.arp_cache_misses == 0
    });
    // A second QP to the same peer finds the MAC in the cache.
    let cq2 = a.create_cq(4).unwrap();
    let mut qa2 = a.create_qp(&cq2, &cq2, QpOptions::default()).unwrap();
    qa2.connect(&ip_only(qb.remote_info())).unwrap();
    support::counters_until(&a, "second resolution missed the cache", |c| {
        c.arp_cache_hits == 1 && c.arp_cache_misses == 1 && c.arp_resolve_failures == 0
    });
    assert_eq!(a.resolve_mac([10, 0, 0, 2]).unwrap(), b.mac());
}

#[test]
fn a_peer_that_never_answers_arp_fails_the_connect() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "ctl_silent", 1024).unwrap();
    let a = Device::open(eal, pa, config([10, 0, 0, 1])).unwrap();
    let _b = Device::open(eal, pb, config([10, 0, 0, 2])).unwrap();
    let cq = a.create_cq(4).unwrap();
    let mut qa = a.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let nobody = RemoteQp {
        qpn: 0x11,
        psn: 0,
        ip: [10, 0, 0, 99],
        mac: None,
        mtu: 4096,
        cc: cc::CcKind::None,
    };
    let t0 = Instant::now();
    let err = qa.connect(&nobody).expect_err("nobody has 10.0.0.99");
    assert!(
        matches!(err, VerbsError::Engine(EngineError::ArpFailed(ip)) if ip.octets() == [10, 0, 0, 99]),
        "{err}"
    );
    // Three requests 20 ms apart, then the failure: well under a second.
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        err.to_string().contains("no ARP reply from 10.0.0.99"),
        "{err}"
    );
    support::counters_until(&a, "failure not counted", |c| {
        // The gratuitous ARP and three requests.
        c.arp_resolve_failures == 1 && c.tx_arp_requests == 4
    });
    // The QP never left INIT: nothing can be posted to it.
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sge: Sge {
            addr: 0,
            len: 0,
            lkey: 0,
        },
        signaled: true,
        solicited: false,
    };
    assert!(matches!(qa.post_send(wr), Err(VerbsError::NotReady { .. })));
}
