//! Whole-frame parser: any bytes give Ok or a typed error, never a panic; an Ok frame's
//! slices lie inside the input.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::{parse_frame, ParseOptions};

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let flags = data[0];
    let opts = ParseOptions {
        int_dscp: if flags & 1 != 0 { Some(flags >> 2) } else { None },
        verify_icrc: flags & 2 != 0,
    };
    // Repair the IPv4 header checksum (flag bit 6) so the fuzzer gets past it.
    let mut v = data[1..].to_vec();
    if flags & 0x40 != 0 && v.len() >= 34 {
        if let Ok(mut ip) = rdma::wire::Ipv4Packet::new_checked(&mut v[14..]) {
            ip.fill_checksum();
        }
    }
    let body = &v[..];
    if let Ok(f) = parse_frame(body, &opts, |_| flags & 0x80 != 0) {
        assert!(f.payload_offset + f.payload.len() <= body.len());
        assert!(f.bth_offset < body.len());
    }
});
