//! INT container view, locate, hop push (back and front) and strip on arbitrary frames:
//! typed errors only, and a successful push/strip keeps the IPv4 checksum valid.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::int::{self, HopRecord, IntPacket, PushOutcome};
use rdma::wire::Ipv4Packet;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let dscp = data[0] & 0x3F;
    let frame = &data[1..];
    if let Ok(c) = IntPacket::new_checked(frame) {
        let _ = c.hops().count();
        let _ = int::IntRepr::parse(&c);
    }
    let hop = HopRecord::from_units(1, 2, 3, 4, 5, 6);
    let mut buf = vec![0u8; frame.len() + 64];
    buf[..frame.len()].copy_from_slice(frame);
    if let Ok(PushOutcome::Pushed { len, .. }) = int::push_hop(&mut buf, frame.len(), 14, dscp, &hop) {
        assert!(Ipv4Packet::new_checked(&buf[14..len]).unwrap().verify_checksum());
    }
    let mut f = vec![0u8; 16];
    f.extend_from_slice(frame);
    let _ = int::push_hop_front(&mut f, 16, frame.len(), 14, dscp, &hop);
    let mut p = frame.to_vec();
    let n = p.len();
    if let Ok(r) = rdma::wire::prepare_rx(&mut p, n, Some(dscp)) {
        assert!(r.start + r.len <= n);
    }
    let mut g = frame.to_vec();
    if let Ok(s) = int::strip_in_place(&mut g, 0, frame.len(), 14, dscp) {
        assert!(Ipv4Packet::new_checked(&g[s.start + 14..s.start + s.len]).unwrap().verify_checksum());
    }
});
