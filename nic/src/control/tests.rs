//! The control plane on hand-built frames: what it answers, learns,
//! resolves and counts.

use super::*;

const OUR_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const OUR_IP: [u8; 4] = [10, 0, 0, 2];
const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const PEER_IP: [u8; 4] = [10, 0, 0, 1];
const MS: u64 = 1_000_000;

fn plane() -> ControlPlane {
    ControlPlane::new(
        OUR_MAC,
        OUR_IP,
        ArpConfig {
            max_entries: 8,
            reachable_ns: 10_000 * MS,
            tries: 2,
            retry_interval_ns: 10 * MS,
        },
    )
}

fn arp_frame(op: ArpOperation, sender: ([u8; 6], [u8; 4]), target: ([u8; 6], [u8; 4])) -> Vec<u8> {
    let mut f = vec![0u8; MIN_FRAME];
    EthernetRepr {
        src: EthernetAddress(sender.0),
        dst: EthernetAddress([0xFF; 6]),
        ethertype: EtherType::Other(arp::ETHERTYPE_ARP),
    }
    .emit(&mut f)
    .unwrap();
    ArpRepr {
        operation: op,
        sender_hw: EthernetAddress(sender.0),
        sender_ip: Ipv4Address(sender.1),
        target_hw: EthernetAddress(target.0),
        target_ip: Ipv4Address(target.1),
    }
    .emit(&mut f[14..])
    .unwrap();
    f
}

fn parse_arp(f: &[u8]) -> (EthernetRepr, ArpRepr) {
    let eth = EthernetPacket::new_checked(f).unwrap();
    let arp = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    (EthernetRepr::parse(&eth).unwrap(), arp)
}

fn ping(dst_ip: [u8; 4], data: &[u8]) -> Vec<u8> {
    let icmp = Icmpv4Repr::EchoRequest {
        ident: 0x77,
        seq_no: 3,
        data,
    };
    let mut f = vec![0u8; 14 + 20 + icmp.buffer_len()];
    EthernetRepr {
        src: EthernetAddress(PEER_MAC),
        dst: EthernetAddress(OUR_MAC),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut f)
    .unwrap();
    Ipv4Repr {
        src: Ipv4Address(PEER_IP),
        dst: Ipv4Address(dst_ip),
        dscp: 0,
        ecn: Ecn::NotEct,
        ttl: 64,
        ident: 9,
        protocol: icmp::PROTO_ICMP,
        payload_len: icmp.buffer_len() as u16,
    }
    .emit(&mut f[14..])
    .unwrap();
    icmp.emit(&mut f[34..]).unwrap();
    f
}

#[test]
fn answers_arp_requests_for_our_address_only() {
    let mut cp = plane();
    let mut out = [0u8; 128];
    let req = arp_frame(ArpOperation::Request, (PEER_MAC, PEER_IP), ([0; 6], OUR_IP));
    let Handled::Reply(n) = cp.on_frame(&req, 0, &mut out) else {
        panic!("no reply");
    };
    assert_eq!(n, MIN_FRAME);
    let (eth, arp) = parse_arp(&out[..n]);
    assert_eq!(eth.dst, EthernetAddress(PEER_MAC));
    assert_eq!(eth.src, EthernetAddress(OUR_MAC));
    assert_eq!(arp.operation, ArpOperation::Reply);
    assert_eq!(
        (arp.sender_hw.0, arp.sender_ip.0),
        (OUR_MAC, OUR_IP),
        "the reply says where we are"
    );
    assert_eq!((arp.target_hw.0, arp.target_ip.0), (PEER_MAC, PEER_IP));
    // The requester was learnt (the request was for us).
    assert_eq!(cp.lookup(PEER_IP, 1), Some(PEER_MAC));
    // A request for someone else: counted, not answered, not learnt.
    let other = arp_frame(
        ArpOperation::Request,
        ([2, 9, 9, 9, 9, 9], [10, 0, 0, 9]),
        ([0; 6], [10, 0, 0, 3]),
    );
    assert_eq!(cp.on_frame(&other, 2, &mut out), Handled::Taken);
    assert_eq!(cp.lookup([10, 0, 0, 9], 3), None);
    let c = cp.counters();
    assert_eq!((c.rx_arp_requests, c.tx_arp_replies), (2, 1));
}

#[test]
fn resolves_by_request_and_reply_then_hits_the_cache() {
    let mut cp = plane();
    let mut out = [0u8; 128];
    let Resolution::Pending(Some(n)) = cp.resolve(PEER_IP, 0, &mut out) else {
        panic!("a new resolution sends a request");
    };
    let (eth, arp) = parse_arp(&out[..n]);
    assert_eq!(eth.dst, EthernetAddress([0xFF; 6]));
    assert_eq!(
        arp,
        ArpRepr::request(
            EthernetAddress(OUR_MAC),
            Ipv4Address(OUR_IP),
            Ipv4Address(PEER_IP)
        )
    );
    // A second caller while it is under way sends nothing more.
    assert_eq!(cp.resolve(PEER_IP, 1, &mut out), Resolution::Pending(None));
    let reply = arp_frame(ArpOperation::Reply, (PEER_MAC, PEER_IP), (OUR_MAC, OUR_IP));
    assert_eq!(cp.on_frame(&reply, 2, &mut out), Handled::Taken);
    assert_eq!(
        cp.resolve(PEER_IP, 3, &mut out),
        Resolution::Known(PEER_MAC)
    );
    let c = cp.counters();
    assert_eq!(
        (
            c.tx_arp_requests,
            c.rx_arp_replies,
            c.arp_cache_misses,
            c.arp_cache_hits
        ),
        (1, 1, 1, 1)
    );
}

#[test]
fn a_silent_peer_gets_retries_then_a_failure() {
    let mut cp = plane();
    let mut out = [0u8; 128];
    assert!(matches!(
        cp.resolve(PEER_IP, 0, &mut out),
        Resolution::Pending(Some(_))
    ));
    let (mut sent, mut failed) = (Vec::new(), Vec::new());
    for t in [5, 10, 15, 20, 25] {
        cp.poll(
            t * MS,
            &mut out,
            |f| sent.push(parse_arp(f).1.target_ip.0),
            |ip| failed.push((t, ip)),
        );
    }
    assert_eq!(sent, vec![PEER_IP], "one retry (2 tries in all)");
    assert_eq!(failed, vec![(20, PEER_IP)]);
    let c = cp.counters();
    assert_eq!((c.tx_arp_requests, c.arp_resolve_failures), (2, 1));
}

#[test]
fn gratuitous_arp_announces_our_address() {
    let mut cp = plane();
    let mut out = [0u8; 64];
    let n = cp.gratuitous(&mut out).unwrap();
    let (eth, arp) = parse_arp(&out[..n]);
    assert_eq!(eth.dst, EthernetAddress([0xFF; 6]));
    assert_eq!((arp.sender_ip.0, arp.target_ip.0), (OUR_IP, OUR_IP));
    // An output buffer below the shortest frame: nothing written.
    assert_eq!(cp.gratuitous(&mut [0u8; 59]), None);
}

#[test]
fn answers_pings_to_our_address() {
    let mut cp = plane();
    let mut out = [0u8; 256];
    let req = ping(OUR_IP, b"0123456789abcdef0123456789abcdef0123456789abcdef");
    let Handled::Reply(n) = cp.on_frame(&req, 0, &mut out) else {
        panic!("no echo reply");
    };
    let eth = EthernetPacket::new_checked(&out[..n]).unwrap();
    assert_eq!(eth.dst(), EthernetAddress(PEER_MAC));
    let ip = Ipv4Packet::new_checked(eth.payload()).unwrap();
    let ip_repr = Ipv4Repr::parse(&ip).unwrap();
    assert_eq!((ip_repr.src.0, ip_repr.dst.0), (OUR_IP, PEER_IP));
    let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
    assert_eq!(
        Icmpv4Repr::parse(&icmp).unwrap(),
        Icmpv4Repr::EchoReply {
            ident: 0x77,
            seq_no: 3,
            data: b"0123456789abcdef0123456789abcdef0123456789abcdef"
        }
    );
    // A short ping's reply is padded to the shortest Ethernet frame.
    assert_eq!(
        cp.on_frame(&ping(OUR_IP, b""), 0, &mut out),
        Handled::Reply(MIN_FRAME)
    );
    assert_eq!(cp.counters().tx_icmp_echo_replies, 2);
}

#[test]
fn counts_what_it_drops_and_leaves_the_rest() {
    let mut cp = plane();
    let mut out = [0u8; 256];
    // A ping to another address is not ours to answer.
    assert_eq!(
        cp.on_frame(&ping([10, 0, 0, 7], b"x"), 0, &mut out),
        Handled::NotControl
    );
    // A ping with a bad ICMP checksum: counted.
    let mut bad = ping(OUR_IP, b"xyz");
    bad[40] ^= 0xFF;
    assert_eq!(cp.on_frame(&bad, 0, &mut out), Handled::Taken);
    // A truncated ARP packet: counted.
    let arp = arp_frame(ArpOperation::Request, (PEER_MAC, PEER_IP), ([0; 6], OUR_IP));
    assert_eq!(cp.on_frame(&arp[..14 + 27], 0, &mut out), Handled::Taken);
    assert_eq!(cp.counters().rx_drop_control, 2);
    // IPv6, a runt: not control frames.
    let mut v6 = arp.clone();
    v6[12..14].copy_from_slice(&[0x86, 0xDD]);
    assert_eq!(cp.on_frame(&v6, 0, &mut out), Handled::NotControl);
    assert_eq!(cp.on_frame(&arp[..10], 0, &mut out), Handled::NotControl);
    assert_eq!(cp.counters().tx_icmp_echo_replies, 0);
}

#[test]
fn tells_rocev2_from_the_rest() {
    let mut f = ping(OUR_IP, b"0123456789");
    assert!(!is_rocev2(&f));
    f[14 + 9] = 17;
    f[34 + 2..34 + 4].copy_from_slice(&4791u16.to_be_bytes());
    assert!(is_rocev2(&f));
    assert!(!is_rocev2(&f[..40]));
}

#[test]
fn a_cut_ipv4_frame_is_truncated_and_a_whole_or_padded_one_is_not() {
    let f = ping(OUR_IP, b"0123456789");
    assert!(!is_truncated_ipv4(&f));
    let mut padded = f.clone();
    padded.resize(f.len() + 20, 0);
    assert!(!is_truncated_ipv4(&padded));
    assert!(is_truncated_ipv4(&f[..40]));
    assert!(is_truncated_ipv4(&f[..f.len() - 1]));
    assert!(is_truncated_ipv4(&f[..20]));
    let mut v6 = f.clone();
    v6[12..14].copy_from_slice(&[0x86, 0xDD]);
    assert!(!is_truncated_ipv4(&v6[..40]));
    assert!(!is_truncated_ipv4(&f[..10]));
}

#[test]
fn our_own_address_resolves_to_our_mac_without_a_request() {
    let mut cp = plane();
    let mut out = [0u8; 128];
    assert!(matches!(
        cp.resolve(OUR_IP, 0, &mut out),
        Resolution::Known(mac) if mac == OUR_MAC
    ));
    assert_eq!(cp.counters().tx_arp_requests, 0);
    assert!(cp.cache().is_empty(), "nothing cached or pending");
}
