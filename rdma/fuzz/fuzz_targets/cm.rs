//! The CM MAD parser (IBA 12.6, `rdma::wire::cm`) and rdma_cm's `cma_hdr`: any bytes
//! give a message or a typed error, never a panic; a parsed message emits and parses
//! back to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::cm::{CmMad, CmaHdr};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = CmMad::parse(data) {
        let mut out = [0u8; 256];
        m.emit(&mut out).expect("a parsed MAD emits");
        assert_eq!(CmMad::parse(&out).expect("and parses back"), m);
    }
    if let Ok(h) = CmaHdr::parse(data) {
        let mut out = [0u8; CmaHdr::LEN];
        h.emit(&mut out).expect("emits");
        assert_eq!(CmaHdr::parse(&out), Ok(h));
    }
});
