//! The ARP parser (rdma::wire::arp): never panics; what parses emits the
//! same 28 bytes and parses back equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::arp::PACKET_LEN;
use rdma::wire::{ArpPacket, ArpRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = ArpPacket::new_checked(data) {
        let r = ArpRepr::parse(&p).unwrap();
        let mut b = [0u8; PACKET_LEN];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..], &data[..PACKET_LEN]);
        assert_eq!(ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).unwrap(), r);
    }
});
