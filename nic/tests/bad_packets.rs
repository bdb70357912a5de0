//! Bad packets injected at a NIC are counted, answered as the IBA says, never
//! crash it and never touch memory outside the registered region.
//!
//! The test holds one end of a ring pair and plays a requester by hand
//! (frames built with `rdma::wire`); the NIC under test owns the other end.

mod support;

use std::time::{Duration, Instant};

use rdma::transport::Access;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};
use support::FakePeer;

#[test]
fn bad_packets_are_counted_and_answered_and_never_touch_memory() {
    let mut peer = FakePeer::new("bad", 100);
    let dut_qpn = peer.dut_qpn;
    // The region under test sits between two guard regions; none may change
    // except where a valid WRITE lands.
    let guard_lo = peer
        .dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mr = peer
        .dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let read_only = peer
        .dut
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    for m in [&guard_lo, &mr, &read_only] {
        m.write(0, &[0x5A; 4096]);
    }
    let fb = peer.fb;
    let write = |qpn: u32, psn: u32, va: u64, rkey: u32, payload: &[u8]| {
        support::write_only_frame(&fb, qpn, psn, va, rkey, payload)
    };
    let payload = [0xC3u8; 64];

    // 1. Bad ICRC: dropped and counted, no answer.
    let mut bad = write(dut_qpn, 100, mr.va(), mr.rkey(), &payload);
    let last = bad.len() - 1;
    bad[last] ^= 0xFF;
    peer.send(&bad, &[]);
    // 2. Truncated (cut inside the RETH).
    let good = write(dut_qpn, 100, mr.va(), mr.rkey(), &payload);
    peer.send(&good[..14 + 20 + 8 + 12 + 6], &[]);
    // 3. Unknown destination QP.
    peer.send(&write(0x7777, 100, mr.va(), mr.rkey(), &payload), &[]);
    // 4. Not RoCEv2 at all (ARP-sized junk).
    peer.send(&[0xEEu8; 60], &[]);
    // 5. A valid WRITE to the connected QP, but from another source IPv4
    // address than its peer's (ICRC recomputed over it).
    let mut stranger = fb;
    stranger.net.src_ip = rdma::wire::Ipv4Address([10, 9, 9, 9]);
    let spoofed = support::write_only_frame(&stranger, dut_qpn, 100, mr.va(), mr.rkey(), &payload);
    peer.send(&spoofed, &[]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = peer.dut.counters();
        if c.rx_drop_icrc == 1
            && c.rx_drop_malformed == 1
            && c.rx_drop_unknown_qp == 1
            && c.rx_drop_not_roce == 1
            && c.rx_drop_wrong_source == 1
        {
            break;
        }
        assert!(Instant::now() < deadline, "drops not counted: {c}");
        std::thread::sleep(Duration::from_millis(5));
    }

    // 6-9. Access violations, each on a fresh QP: the responder answers
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
        let q = FakePeer::connect_qp(&peer.dut, &peer.cq, 100);
        let frame = write(q.remote_info().qpn, 100, va, rkey, &payload);
        peer.send(&frame, &[]);
        assert_eq!(
            peer.next_aeth(),
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

    // 10. The NIC still works: a valid WRITE on the first QP lands exactly
    // and is ACKed.
    let frame = write(dut_qpn, 100, mr.va() + 100, mr.rkey(), &payload);
    peer.send(&frame, &[]);
    assert!(matches!(peer.next_aeth(), AethSyndrome::Ack { .. }));
    mr.read(0, &mut snapshot);
    assert!(snapshot[..100].iter().all(|&b| b == 0x5A));
    assert!(snapshot[100..164].iter().all(|&b| b == 0xC3));
    assert!(snapshot[164..].iter().all(|&b| b == 0x5A));
    let deadline = Instant::now() + Duration::from_secs(2);
    while peer.dut.counters().tx_access_naks < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let c = peer.dut.counters();
    assert_eq!(c.tx_access_naks, 4, "{c}");
}
