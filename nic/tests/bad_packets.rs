//! Bad packets injected at a NIC are counted, answered as the IBA says, never
//! crash it and never touch memory outside the registered region.
//!
//! The test holds one end of a ring pair and plays a requester by hand
//! (frames built with `rdma::wire`); the NIC under test owns the other end.

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Burst, Eal, Mempool, Port, RxQueue, TxQueue};
use nic::verbs::{Device, DeviceConfig, QpOptions, RemoteQp};
use rdma::transport::Access;
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode, RethRepr};
use rdma::wire::{BthRepr, Ecn, EthernetAddress, Ipv4Address, Opcode, ParseOptions};

const PEER_QPN: u32 = 0x99;

fn send(tx: &mut TxQueue, pool: &Mempool, frame: &[u8]) {
    let mut m = pool.alloc().unwrap();
    m.extend_from_slice(frame).unwrap();
    let mut b: Burst = Burst::new();
    b.push(m).unwrap();
    assert_eq!(tx.send(&mut b), 1);
}

/// Waits for the next frame from the NIC and returns its AETH syndrome.
fn next_aeth(rx: &mut RxQueue, dut: &Device) -> AethSyndrome {
    let end = Instant::now() + Duration::from_secs(5);
    let mut b: Burst = Burst::new();
    while Instant::now() < end {
        rx.recv(&mut b);
        // The NIC's gratuitous ARP at start is not what we wait for.
        if let Some(m) = b.drain().find(|m| nic::control::is_rocev2(m.data())) {
            let bytes = m.to_vec();
            let f = rdma::wire::parse_frame(&bytes, &ParseOptions::default(), |_| false).unwrap();
            assert_eq!(f.bth.opcode, Opcode::Acknowledge);
            assert_eq!(f.bth.dest_qp, PEER_QPN);
            return f.aeth.unwrap().syndrome;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no answer from the NIC; its counters:\n{}", dut.counters());
}

#[test]
fn bad_packets_are_counted_and_answered_and_never_touch_memory() {
    let eal = Eal::for_tests();
    let pool = Mempool::new(eal, "bad_pool", 1024, 32, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let (mut me, dut_port) = Port::ring_pair(eal, "bad", 1024).unwrap();
    let (mut rx, mut tx) = me.configure_single(&pool).unwrap();
    let dut = Device::open(eal, dut_port, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let cq = dut.create_cq(64).unwrap();
    let mut qp = dut.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let my_mac = [2, 0, 0, 0, 0, 0x99];
    qp.connect(&RemoteQp {
        qpn: PEER_QPN,
        psn: 100,
        ip: [10, 0, 0, 1],
        mac: Some(my_mac),
        mtu: 4096,
        cc: CcKind::None,
    })
    .unwrap();
    let dut_qpn = qp.remote_info().qpn;
    // The region under test sits between two guard regions; none may change
    // except where a valid WRITE lands.
    let guard_lo = dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mr = dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let read_only = dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    for m in [&guard_lo, &mr, &read_only] {
        m.write(0, &[0x5A; 4096]);
    }
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress(my_mac),
            dst_mac: EthernetAddress(dut.mac()),
            src_ip: Ipv4Address([10, 0, 0, 1]),
            dst_ip: Ipv4Address([10, 0, 0, 2]),
            udp_src_port: 0xC099,
            dscp: 26,
            ttl: 64,
        },
        int: None,
    };
    let write = |qpn: u32, psn: u32, va: u64, rkey: u32, payload: &[u8]| -> Vec<u8> {
        let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qpn, psn));
        pkt.bth.ack_req = true;
        pkt.reth = Some(RethRepr {
            va,
            rkey,
            dma_len: payload.len() as u32,
        });
        let mut buf = vec![0u8; 9000];
        let n = fb.emit_frame(&pkt, payload, Ecn::Ect0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let payload = [0xC3u8; 64];

    // 1. Bad ICRC: dropped and counted, no answer.
    let mut bad = write(dut_qpn, 100, mr.va(), mr.rkey(), &payload);
    let last = bad.len() - 1;
    bad[last] ^= 0xFF;
    send(&mut tx, &pool, &bad);
    // 2. Truncated (cut inside the RETH).
    let good = write(dut_qpn, 100, mr.va(), mr.rkey(), &payload);
    send(&mut tx, &pool, &good[..14 + 20 + 8 + 12 + 6]);
    // 3. Unknown destination QP.
    send(
        &mut tx,
        &pool,
        &write(0x7777, 100, mr.va(), mr.rkey(), &payload),
    );
    // 4. Not RoCEv2 at all (ARP-sized junk).
    send(&mut tx, &pool, &[0xEEu8; 60]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = dut.counters();
        if c.rx_drop_icrc == 1
            && c.rx_drop_malformed == 1
            && c.rx_drop_unknown_qp == 1
            && c.rx_drop_not_roce == 1
        {
            break;
        }
        assert!(Instant::now() < deadline, "drops not counted: {c}");
        std::thread::sleep(Duration::from_millis(5));
    }

    // 5-8. Access violations, each on a fresh QP: the responder answers
    // NAK remote access error and, as a class C error (IBA 10.3.1; rxe does
    // the same), its QP goes to the error state; nothing is written.
    let cases: [(&str, u64, u32); 4] = [
        ("bad rkey", mr.va(), mr.rkey() ^ 0x100),
        ("past the end", mr.va() + 4096 - 32, mr.rkey()),
        ("below the start", mr.va() - 16, mr.rkey()),
        ("no REMOTE_WRITE", read_only.va(), read_only.rkey()),
    ];
    let mut keep = Vec::new();
    for (what, va, rkey) in cases {
        let mut q = dut.create_qp(&cq, &cq, QpOptions::default()).unwrap();
        q.connect(&RemoteQp {
            qpn: PEER_QPN,
            psn: 100,
            ip: [10, 0, 0, 1],
            mac: Some(my_mac),
            mtu: 4096,
            cc: CcKind::None,
        })
        .unwrap();
        send(
            &mut tx,
            &pool,
            &write(q.remote_info().qpn, 100, va, rkey, &payload),
        );
        assert_eq!(
            next_aeth(&mut rx, &dut),
            AethSyndrome::Nak(NakCode::RemoteAccessError),
            "{what}"
        );
        assert_eq!(q.state().unwrap(), rdma::transport::QpState::Err, "{what}");
        keep.push(q);
    }

    let mut snapshot = vec![0u8; 4096];
    for m in [&guard_lo, &mr, &read_only] {
        m.read(0, &mut snapshot);
        assert!(
            snapshot.iter().all(|&b| b == 0x5A),
            "memory changed by a refused packet"
        );
    }

    // 9. The NIC still works: a valid WRITE on the first QP lands exactly
    // and is ACKed.
    send(
        &mut tx,
        &pool,
        &write(dut_qpn, 100, mr.va() + 100, mr.rkey(), &payload),
    );
    assert!(matches!(next_aeth(&mut rx, &dut), AethSyndrome::Ack { .. }));
    mr.read(0, &mut snapshot);
    assert!(snapshot[..100].iter().all(|&b| b == 0x5A));
    assert!(snapshot[100..164].iter().all(|&b| b == 0xC3));
    assert!(snapshot[164..].iter().all(|&b| b == 0x5A));
    let deadline = Instant::now() + Duration::from_secs(2);
    while dut.counters().tx_access_naks < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let c = dut.counters();
    assert_eq!(c.tx_access_naks, 4, "{c}");
}
