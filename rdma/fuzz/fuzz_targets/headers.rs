//! Every per-header parser, and parse -> emit -> parse round trips where they succeed.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::wire::transport_hdrs::*;
use rdma::wire::*;

fuzz_target!(|data: &[u8]| {
    let _ = EthernetPacket::new_checked(data).map(|p| EthernetRepr::parse(&p));
    if let Ok(p) = Ipv4Packet::new_checked(data) {
        let _ = Ipv4Repr::parse(&p);
        let _ = p.payload();
    }
    if let Ok(p) = UdpPacket::new_checked(data) {
        let _ = UdpRepr::parse(&p);
    }
    if let Ok(p) = BthPacket::new_checked(data) {
        if let Ok(r) = BthRepr::parse(&p) {
            let mut b = [0u8; 12];
            r.emit(&mut b).unwrap();
            assert_eq!(BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()).unwrap(), r);
        }
    }
    if let Ok(p) = CcExtPacket::new_checked(data) {
        let r = CcExtRepr::parse(&p).unwrap();
        let mut b = [0u8; 256];
        let n = r.emit(&mut b).unwrap();
        assert_eq!(CcExtRepr::parse(&CcExtPacket::new_checked(&b[..n]).unwrap()).unwrap(), r);
    }
    if let Ok(d) = DethRepr::parse(data) {
        let mut b = [0u8; 8];
        d.emit(&mut b).unwrap();
        assert_eq!(DethRepr::parse(&b).unwrap(), d);
    }
    let _ = RethRepr::parse(data);
    let _ = AethRepr::parse(data);
    let _ = ImmDtRepr::parse(data);
    let _ = AtomicEthRepr::parse(data);
    let _ = AtomicAckEthRepr::parse(data);
    let _ = HopRecord::parse(data);
});
