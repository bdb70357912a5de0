//! The ICMPv4 echo parser (rdma::wire::icmp): never panics; what parses
//! (checksum verified) emits the same bytes and parses back equal.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::{Icmpv4Packet, Icmpv4Repr};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = Icmpv4Packet::new_checked(data) else {
        return;
    };
    let _ = (p.msg_type(), p.code(), p.ident(), p.seq_no(), p.data().len());
    if let Ok(r) = Icmpv4Repr::parse(&p) {
        let mut b = vec![0u8; r.buffer_len()];
        assert_eq!(r.emit(&mut b), Ok(data.len()));
        // The checksum may be written as 0x0000 or 0xFFFF: both verify.
        assert!(Icmpv4Packet::new_checked(&b[..]).unwrap().verify_checksum());
        assert_eq!(Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&b[..]).unwrap()), Ok(r));
        if let Some(reply) = r.reply() {
            let mut c = vec![0u8; reply.buffer_len()];
            reply.emit(&mut c).unwrap();
            assert!(Icmpv4Packet::new_checked(&c[..]).unwrap().verify_checksum());
        }
    }
});
