//! The receive-side parse: just enough of Ethernet, IPv4, UDP, the INT-MD container
//! and the BTH to forward and classify a frame, at fixed offsets, into one word.
//!
//! What is checked (docs/design.md §6): Ethernet II with EtherType IPv4 (no VLAN tag),
//! IPv4 version, IHL, total length and header checksum (RFC 791), UDP length, and for
//! RoCEv2 (UDP port 4791) the INT-MD over UDP container when the DSCP is the INT DSCP
//! (P4.org INT v2.0 section 5.6, the container HPCC++ 000 section 3 carries its hop
//! records in: shim type and length, MD version, HopML) and the BTH opcode that selects
//! the control class (ACK/NAK/CNP, docs/design.md §4 and §6).

use rdma::wire::int;
use rdma::wire::ROCEV2_UDP_PORT;

use crate::drop_reason::DropReason;

/// Ethernet header length (no VLAN tag: tagged frames are not IPv4 to this core).
pub(crate) const L3_OFF: usize = 14;
/// EtherType IPv4.
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
/// BTH length.
pub(crate) const BTH_LEN: usize = 12;

/// BTH opcodes that go to the strict high-priority class: RC ACKNOWLEDGE (ACK and
/// every NAK), ATOMIC ACKNOWLEDGE, and the RoCEv2 CNP (docs/design.md §4 and §6).
pub const CTRL_OPCODES: [u8; 3] = [0x11, 0x12, 0x81];

/// What the classifier learned about a frame, packed in one word (destination address,
/// ECN, TTL, control class, INT container): built with shifts, so it travels in a
/// register. A struct of bytes was assembled on the stack and read back wider, a
/// store-forwarding stall on every frame (perf: the hottest instruction of `receive`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Classified(pub(crate) u64);

impl Classified {
    #[inline(always)]
    pub(crate) fn new(
        dst: u32,
        ecn: u8,
        ttl: u8,
        ctrl: bool,
        int: bool,
        ihl: u8,
        sport: u16,
    ) -> Self {
        Self(
            u64::from(dst)
                | u64::from(ecn & 3) << 32
                | u64::from(ttl) << 34
                | u64::from(ctrl) << 42
                | u64::from(int) << 43
                | u64::from(ihl & 0xF) << 44
                | u64::from(sport) << 48,
        )
    }
    #[inline(always)]
    pub(crate) fn dst(self) -> u32 {
        self.0 as u32
    }
    #[inline(always)]
    pub(crate) fn ecn(self) -> u8 {
        (self.0 >> 32) as u8 & 3
    }
    #[inline(always)]
    pub(crate) fn ttl(self) -> u8 {
        (self.0 >> 34) as u8
    }
    #[inline(always)]
    pub(crate) fn ctrl(self) -> bool {
        self.0 >> 42 & 1 != 0
    }
    #[inline(always)]
    pub(crate) fn int(self) -> bool {
        self.0 >> 43 & 1 != 0
    }
    /// IPv4 header length in 32-bit words (IHL).
    #[inline(always)]
    pub(crate) fn ihl(self) -> u8 {
        (self.0 >> 44) as u8 & 0xF
    }
    /// UDP source port (0 for non-UDP): the ECMP flow key.
    #[inline(always)]
    pub(crate) fn sport(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

/// Parses just enough of the frame to forward and classify it: Ethernet, IPv4 (version,
/// IHL, total length, header checksum), UDP length, and for RoCEv2 the INT container
/// (INT v2.0 section 5.6: type, length, version, HopML, as `int::IntPacket::new_checked`)
/// and the BTH opcode. The same checks as the `rdma::wire` views (a test compares the
/// two on random and mutated frames), written on the bytes at fixed offsets so the
/// whole parse inlines into [`crate::Switch::receive`] without a call or a view per layer;
/// every read is inside a slice whose length was checked first.
///
/// The result is built once at the end from locals into one word (see [`Classified`]).
///
/// Frames of the common shape (a 20-byte IPv4 header, at least [`COMMON_LEN`] bytes)
/// that pass take [`classify_common`], which reads one fixed-size array; anything
/// else, and every frame that fails a check there, takes the general parse, which
/// finds the reason.
#[inline(always)]
pub(crate) fn classify(b: &[u8], int_dscp: u8) -> Result<Classified, DropReason> {
    if let Some(h) = b.first_chunk::<COMMON_LEN>() {
        if let Some(c) = classify_common(h, b, int_dscp) {
            return Ok(c);
        }
    }
    classify_general(b, int_dscp)
}

/// Bytes the common-shape parse reads at fixed offsets: Ethernet, a 20-byte IPv4
/// header, UDP, and the INT shim + MD header (or a BTH and more).
pub(crate) const COMMON_LEN: usize =
    L3_OFF + rdma::wire::ipv4::HEADER_LEN + rdma::wire::udp::HEADER_LEN + int::HEADER_LEN;

/// The parse of [`classify`] for an accepted IPv4 frame with a 20-byte header: the
/// same checks on `h` (the frame's first [`COMMON_LEN`] bytes, so the reads need no
/// bounds checks) plus one read of the BTH opcode in `b`. `None` means "not this
/// shape or not accepted": [`classify_general`] then decides, so both give the same
/// result for every frame (a test compares them on mutated frames).
#[inline(always)]
fn classify_common(h: &[u8; COMMON_LEN], b: &[u8], int_dscp: u8) -> Option<Classified> {
    const IP: usize = L3_OFF;
    const UDP: usize = L3_OFF + rdma::wire::ipv4::HEADER_LEN;
    const C: usize = UDP + rdma::wire::udp::HEADER_LEN;
    if u16::from_be_bytes([h[12], h[13]]) != ETHERTYPE_IPV4 || h[IP] != 0x45 {
        return None;
    }
    let tl = usize::from(u16::from_be_bytes([h[IP + 2], h[IP + 3]]));
    let ip_hdr: &[u8; rdma::wire::ipv4::HEADER_LEN] = h[IP..UDP].try_into().ok()?;
    if tl < rdma::wire::ipv4::HEADER_LEN
        || tl > b.len() - L3_OFF
        || !ipv4_header_valid(ip_hdr)
        || h[IP + 9] != rdma::wire::ipv4::PROTO_UDP
        || u16::from_be_bytes([h[IP + 6], h[IP + 7]]) & 0x3FFF != 0
    {
        return None;
    }
    let ul = usize::from(u16::from_be_bytes([h[UDP + 4], h[UDP + 5]]));
    if ul < rdma::wire::udp::HEADER_LEN || ul > tl - rdma::wire::ipv4::HEADER_LEN {
        return None;
    }
    let dst = u32::from_be_bytes([h[IP + 16], h[IP + 17], h[IP + 18], h[IP + 19]]);
    let (tos, ttl) = (h[IP + 1], h[IP + 8]);
    let sport = u16::from_be_bytes([h[UDP], h[UDP + 1]]);
    if u16::from_be_bytes([h[UDP + 2], h[UDP + 3]]) != ROCEV2_UDP_PORT {
        return Some(Classified::new(dst, tos & 3, ttl, false, false, 5, sport));
    }
    let int = tos >> 2 == int_dscp;
    let mut bth_off = rdma::wire::udp::HEADER_LEN;
    if int {
        let words = h[C + 1];
        if ul < rdma::wire::udp::HEADER_LEN + int::HEADER_LEN
            || h[C] >> 4 != int::TYPE_INT_MD
            || h[C + 4] >> 4 != int::MD_VERSION
            || h[C + 6] & 0x1F != int::HOP_ML_WORDS
            || words < 4
            || (words - 4) % int::HOP_ML_WORDS != 0
            || usize::from(words) * 4 > ul - rdma::wire::udp::HEADER_LEN
        {
            return None;
        }
        bth_off += usize::from(words) * 4;
    }
    if bth_off + BTH_LEN > ul {
        return None;
    }
    let opcode = *b.get(UDP + bth_off)?;
    Some(Classified::new(
        dst,
        tos & 3,
        ttl,
        CTRL_OPCODES.contains(&opcode),
        int,
        5,
        sport,
    ))
}

/// The general parse of [`classify`]: any IHL, any length, and the drop reason.
#[inline(never)]
fn classify_general(b: &[u8], int_dscp: u8) -> Result<Classified, DropReason> {
    use DropReason::Malformed;
    if b.len() < L3_OFF {
        return Err(Malformed);
    }
    if u16::from_be_bytes([b[12], b[13]]) != ETHERTYPE_IPV4 {
        return Err(DropReason::NotIpv4);
    }
    let ip = &b[L3_OFF..];
    if ip.len() < rdma::wire::ipv4::HEADER_LEN || ip[0] >> 4 != 4 {
        return Err(Malformed);
    }
    let hl = usize::from(ip[0] & 0xF) * 4;
    let tl = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if hl < rdma::wire::ipv4::HEADER_LEN || hl > ip.len() || tl < hl || tl > ip.len() {
        return Err(Malformed);
    }
    // The common 20-byte header as a constant length: the sum unrolls to five loads.
    let sum = if hl == rdma::wire::ipv4::HEADER_LEN {
        ipv4_header_checksum(&ip[..rdma::wire::ipv4::HEADER_LEN])
    } else {
        ipv4_header_checksum(&ip[..hl])
    };
    if sum != 0 {
        return Err(Malformed);
    }
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let (tos, ttl, proto) = (ip[1], ip[8], ip[9]);
    let ff = u16::from_be_bytes([ip[6], ip[7]]);
    let ihl = (hl / 4) as u8;
    let done = |ctrl: bool, int: bool, sport: u16| {
        Ok(Classified::new(dst, tos & 3, ttl, ctrl, int, ihl, sport))
    };
    // Only unfragmented UDP can be RoCEv2 (RoCEv2 never fragments); other IPv4 is
    // forwarded without looking further.
    if proto != rdma::wire::ipv4::PROTO_UDP || ff & 0x3FFF != 0 {
        return done(false, false, 0);
    }
    let l4 = &ip[hl..tl];
    if l4.len() < rdma::wire::udp::HEADER_LEN {
        return Err(Malformed);
    }
    let ul = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
    if ul < rdma::wire::udp::HEADER_LEN || ul > l4.len() {
        return Err(Malformed);
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    if u16::from_be_bytes([l4[2], l4[3]]) != ROCEV2_UDP_PORT {
        return done(false, false, sport);
    }
    let udp = &l4[..ul];
    let mut bth_off = rdma::wire::udp::HEADER_LEN;
    let int = tos >> 2 == int_dscp;
    if int {
        // INT-MD over UDP: shim + MD header + hop stack before BTH.
        let c = &udp[bth_off..];
        if c.len() < int::HEADER_LEN
            || c[0] >> 4 != int::TYPE_INT_MD
            || c[4] >> 4 != int::MD_VERSION
            || c[6] & 0x1F != int::HOP_ML_WORDS
        {
            return Err(Malformed);
        }
        let words = c[1];
        if words < 4 || (words - 4) % int::HOP_ML_WORDS != 0 || usize::from(words) * 4 > c.len() {
            return Err(Malformed);
        }
        bth_off += usize::from(words) * 4;
    }
    if bth_off + BTH_LEN > udp.len() {
        return Err(Malformed);
    }
    done(CTRL_OPCODES.contains(&udp[bth_off]), int, sport)
}

/// The IPv4 header checksum over `h` (a whole header, a multiple of 4 bytes): the
/// ones' complement sum taken over 32-bit words and folded, which is the same value as
/// `rdma::wire::internet_checksum` (2^16 = 1 modulo 2^16 - 1) in a third of the steps.
/// Verifying a header: the result over the header including its checksum is 0.
#[inline(always)]
pub(crate) fn ipv4_header_checksum(h: &[u8]) -> u16 {
    let mut s: u64 = 0;
    for w in h.chunks_exact(4) {
        s += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    s = (s & 0xFFFF_FFFF) + (s >> 32);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    !(s as u16)
}

/// True if the 20-byte IPv4 header `h` has a correct checksum: its ones' complement
/// sum is 0xFFFF. Summed in the machine's byte order, which RFC 1071 section 2(B)
/// allows (the ones' complement sum commutes with swapping the bytes of every word,
/// and 0xFFFF is its own swap): five plain loads, no byte swaps.
#[inline(always)]
pub(crate) fn ipv4_header_valid(h: &[u8; 20]) -> bool {
    let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let mut s = w(0) + w(4) + w(8) + w(12) + w(16);
    s = (s & 0xFFFF_FFFF) + (s >> 32);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    s == 0xFFFF
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rdma::wire::int::{HopRecord, PushOutcome};
    use rdma::wire::{EthernetPacket, Ipv4Packet, UdpPacket};

    /// A RoCEv2 WRITE frame with an INT container that allows `max_hops` and already
    /// holds `have` records (pushed with rdma's reference implementation).
    pub(crate) fn int_frame(max_hops: u8, have: u8, payload: usize) -> Vec<u8> {
        use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
        use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode};
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
                dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
                src_ip: Ipv4Address([10, 0, 0, 1]),
                dst_ip: Ipv4Address([10, 0, 1, 2]),
                udp_src_port: 0xC001,
                dscp: 3,
                ttl: 64,
            },
            int: Some(IntInsert {
                int_dscp: 0x18,
                max_hops,
            }),
        };
        let p = RoceRepr::new(BthRepr::new(Opcode::SendOnly, 0x11, 7));
        // Room in front for up to 62 records.
        let mut buf = vec![0u8; 4096];
        let n = fb
            .emit_frame(&p, &vec![0x5A; payload], Ecn::Ect0, &mut buf[1200..])
            .unwrap();
        let (mut start, mut len) = (1200, n);
        for i in 0..have {
            let hop =
                HopRecord::from_units(9, u16::from(i), 1000 * u64::from(i), 7, 640, 1e11 as u64);
            match int::push_hop_front(&mut buf, start, len, L3_OFF, 0x18, &hop).unwrap() {
                PushOutcome::Pushed { start: s, len: l } => (start, len) = (s, l),
                PushOutcome::Full => {}
            }
        }
        buf[start..start + len].to_vec()
    }

    /// The classifier written with the `rdma::wire` views: the reference [`classify`]
    /// must agree with.
    fn classify_views(b: &[u8], int_dscp: u8) -> Result<Classified, DropReason> {
        let eth = EthernetPacket::new_checked(b).map_err(|_| DropReason::Malformed)?;
        if eth.header().ethertype.get() != ETHERTYPE_IPV4 {
            return Err(DropReason::NotIpv4);
        }
        let ip = Ipv4Packet::new_checked(&b[L3_OFF..]).map_err(|_| DropReason::Malformed)?;
        if ipv4_header_checksum(&b[L3_OFF..L3_OFF + ip.header_len()]) != 0 {
            return Err(DropReason::Malformed);
        }
        let h = ip.header();
        let dst = u32::from_be_bytes(h.dst);
        let (ecn, ttl) = (h.tos & 3, h.ttl);
        let ihl = (ip.header_len() / 4) as u8;
        let done = |ctrl: bool, int: bool, sport: u16| {
            Ok(Classified::new(dst, ecn, ttl, ctrl, int, ihl, sport))
        };
        // Only unfragmented UDP can be RoCEv2 (RoCEv2 never fragments); other IPv4 is
        // forwarded without looking further.
        let ff = h.flags_frag.get();
        if h.protocol != rdma::wire::ipv4::PROTO_UDP || ff & 0x3FFF != 0 {
            return done(false, false, 0);
        }
        let udp_off = L3_OFF + ip.header_len();
        let ip_end = L3_OFF + ip.total_len() as usize;
        let udp = UdpPacket::new_checked(&b[udp_off..ip_end]).map_err(|_| DropReason::Malformed)?;
        let sport = udp.src_port();
        if udp.dst_port() != ROCEV2_UDP_PORT {
            return done(false, false, sport);
        }
        let udp_end = udp_off + udp.len_field() as usize;
        let mut bth_off = udp_off + rdma::wire::udp::HEADER_LEN;
        let int = ip.dscp() == int_dscp;
        if int {
            // INT-MD over UDP (INT v2.0 section 5.6): shim + MD header + hop stack before BTH.
            // (The same checks as `int::locate`, without parsing IPv4 and UDP again.)
            let c_int = int::IntPacket::new_checked(&b[bth_off..udp_end])
                .map_err(|_| DropReason::Malformed)?;
            bth_off += c_int.len();
        }
        if bth_off + BTH_LEN > udp_end {
            return Err(DropReason::Malformed);
        }
        done(CTRL_OPCODES.contains(&b[bth_off]), int, sport)
    }

    #[test]
    fn classify_agrees_with_the_wire_views() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut kinds = std::collections::HashSet::new();
        let mut common = 0;
        for (max_hops, have, payload) in [(8, 0, 0), (8, 3, 64), (8, 8, 16), (1, 0, 1024)] {
            let frame = int_frame(max_hops, have, payload);
            for i in 0..3000 {
                let mut f = frame.clone();
                // Mutate a few bytes of the headers (and sometimes the length).
                for _ in 0..(i % 4) {
                    let at = (rnd() % 80) as usize % f.len();
                    f[at] = rnd() as u8;
                }
                if i % 7 == 0 {
                    f.truncate((rnd() as usize) % (f.len() + 1));
                }
                for dscp in [0x18, 0x03] {
                    let (a, b) = (classify(&f, dscp), classify_views(&f, dscp));
                    assert_eq!(a.map(|c| c.0), b.map(|c| c.0), "frame {f:02x?}");
                    // The fast path, where it answers, agrees with the general one.
                    if let Some(h) = f.first_chunk::<COMMON_LEN>() {
                        if let Some(c) = classify_common(h, &f, dscp) {
                            assert_eq!(Ok(c.0), classify_general(&f, dscp).map(|c| c.0));
                            common += 1;
                        }
                    }
                    kinds.insert(format!("{:?}", a.map(|c| (c.int(), c.ctrl()))));
                }
            }
        }
        // The mutations reached accepted frames with and without INT, and rejections;
        // many were accepted by the fast path.
        assert!(kinds.len() >= 4, "{kinds:?}");
        assert!(common > 5000, "{common}");
    }

    #[test]
    fn fast_ipv4_checksum_equals_internet_checksum() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..2000 {
            let mut h = [0u8; 60];
            for b in h.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Include the all-ones and all-zero corner cases.
            if i == 0 {
                h = [0xFF; 60];
            } else if i == 1 {
                h = [0; 60];
            }
            for words in [5usize, 6, 15] {
                let hh = &h[..words * 4];
                assert_eq!(ipv4_header_checksum(hh), rdma::wire::internet_checksum(hh));
            }
            // The native-order validity check agrees, on random headers and on the
            // same headers with their checksum set.
            let mut h20: [u8; 20] = h[..20].try_into().unwrap();
            assert_eq!(ipv4_header_valid(&h20), ipv4_header_checksum(&h20) == 0);
            h20[10] = 0;
            h20[11] = 0;
            let c = rdma::wire::internet_checksum(&h20);
            h20[10..12].copy_from_slice(&c.to_be_bytes());
            assert!(ipv4_header_valid(&h20), "{h20:02x?}");
            h20[(i % 20) as usize] ^= 0x10;
            assert!(!ipv4_header_valid(&h20), "{h20:02x?}");
        }
    }
}
