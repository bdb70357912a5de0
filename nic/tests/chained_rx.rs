//! Chained (multi-segment) frames at the NIC's receiver, as a zero-copy
//! sender builds them (headers | payload | pad + ICRC) or a NIC scatters
//! them: parsed without linearising where the headers fill the first
//! segment, linearised otherwise; the ICRC is checked over the segments, a
//! corrupted payload byte is a counted drop, and the bytes land exactly.

mod support;

use std::time::{Duration, Instant};

use rdma::transport::Access;
use rdma::wire::transport_hdrs::AethSyndrome;
use support::FakePeer;

#[test]
fn chained_frames_are_parsed_in_place_and_checked() {
    let mut peer = FakePeer::new("chain", 0);
    let qpn = peer.dut_qpn;
    let mr = peer
        .dut
        .reg_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    mr.write(0, &[0x5A; 8192]);
    // Headers of a WRITE Only: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16.
    const HDR: usize = 14 + 20 + 8 + 12 + 16;
    let (va, rkey) = (mr.va(), mr.rkey());
    let write = |peer: &FakePeer, psn: u32, off: u64, payload: &[u8]| {
        peer.write_frame(qpn, psn, va + off, rkey, payload)
    };
    let data: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut expect = vec![0x5Au8; 8192];
    let mut psn = 0;
    // (payload offset in the region, payload length, cuts as a function of
    // the frame length): the sender's shape, two segments, a pad, and a
    // first segment that ends inside the RETH (linearised).
    type Cuts = fn(usize) -> Vec<usize>;
    let cases: [(&str, u64, usize, Cuts); 4] = [
        ("headers|payload|icrc", 0, 1024, |n| vec![HDR, n - 4]),
        ("headers|payload+icrc", 2000, 700, |_| vec![HDR]),
        ("pad: 61 B", 3000, 61, |n| vec![HDR, n - 7]),
        ("cut inside the RETH", 4000, 300, |n| vec![50, n - 4]),
    ];
    for (what, off, len, cuts) in cases {
        let frame = write(&peer, psn, off, &data[..len]);
        peer.send(&frame, &cuts(frame.len()));
        assert!(
            matches!(peer.next_aeth(), AethSyndrome::Ack { .. }),
            "{what}"
        );
        expect[off as usize..off as usize + len].copy_from_slice(&data[..len]);
        psn += 1;
    }
    let mut got = vec![0u8; 8192];
    mr.read(0, &mut got);
    assert!(got == expect, "region differs from what was written");

    // A corrupted payload byte in the payload segment: the ICRC over the
    // segments catches it; counted, not written, not answered.
    let drops = peer.dut.counters().rx_drop_icrc;
    let mut bad = write(&peer, psn, 6000, &data[..512]);
    bad[HDR + 100] ^= 0x01;
    let n = bad.len();
    peer.send(&bad, &[HDR, n - 4]);
    let end = Instant::now() + Duration::from_secs(5);
    while peer.dut.counters().rx_drop_icrc == drops {
        assert!(Instant::now() < end, "bad ICRC not counted");
        std::thread::sleep(Duration::from_millis(2));
    }
    mr.read(0, &mut got);
    assert!(got == expect, "a frame with a bad ICRC changed the region");
    // The same frame, intact, still lands (the PSN was not consumed).
    let good = write(&peer, psn, 6000, &data[..512]);
    peer.send(&good, &[HDR, n - 4]);
    assert!(matches!(peer.next_aeth(), AethSyndrome::Ack { .. }));
    expect[6000..6512].copy_from_slice(&data[..512]);
    mr.read(0, &mut got);
    assert!(got == expect);
}
