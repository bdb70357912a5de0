//! The port's control plane (nic::control) on arbitrary frames: never
//! panics, and every reply it writes is a frame its own parsers accept
//! (an ARP reply or an ICMP echo reply with a valid checksum).
#![no_main]
use libfuzzer_sys::fuzz_target;
use nic::control::{ArpConfig, ControlPlane, Handled};

fuzz_target!(|data: &[u8]| {
    let mut cp = ControlPlane::new([2, 0, 0, 0, 0, 2], [10, 0, 0, 2], ArpConfig::default());
    let mut out = vec![0u8; 9216];
    // Twice: the second time with what the first may have learnt.
    for now in [0, 1] {
        if let Handled::Reply(n) = cp.on_frame(data, now, &mut out) {
            assert!(n >= 60 && n <= out.len());
            let frame = &out[..n];
            match u16::from_be_bytes([frame[12], frame[13]]) {
                0x0806 => {
                    assert!(rdma::wire::ArpPacket::new_checked(&frame[14..]).is_ok());
                }
                0x0800 => {
                    let ip = rdma::wire::Ipv4Packet::new_checked(&frame[14..]).unwrap();
                    assert!(ip.verify_checksum());
                    let icmp = rdma::wire::Icmpv4Packet::new_checked(ip.payload()).unwrap();
                    assert!(icmp.verify_checksum());
                }
                t => panic!("reply of ethertype {t:#06x}"),
            }
        }
    }
});
