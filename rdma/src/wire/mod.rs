//! RoCEv2 wire formats, one module per protocol layer, in the style of smoltcp.
//!
//! Every layer has:
//! - a `#[repr(C)]` header struct made of network-endian `zerocopy` fields, so a header is
//!   read or written by casting bytes (no hand-written shifts on the hot path);
//! - a zero-copy view `Packet<T: AsRef<[u8]>>` whose `new_checked` validates lengths and
//!   fixed fields once, after which the accessors cannot fail;
//! - a parsed, owned `Repr` with `parse` (from a checked view) and `emit` (into a
//!   caller-provided `&mut [u8]`, never allocating).
//!
//! Parsers reject every malformed or truncated input with a [`WireError`]; nothing here
//! panics on input bytes. The byte layouts are documented in `docs/wire.md`.
//!
//! Layering of a RoCEv2 frame (docs/design.md §4):
//! `Ethernet / IPv4 / UDP(4791) / [INT-MD container] / BTH / [CC ext] / [DETH|RETH|AETH|
//! ImmDt|IETH|AtomicETH|AtomicAckETH] / payload / pad / ICRC`; a GSI SEND to QP 1 carries a
//! MAD ([`mad`]), the communication manager's ([`cm`]).

pub mod arp;
pub mod bth;
pub mod ccext;
pub mod cm;
pub mod cma;
pub mod ethernet;
pub mod frame;
pub mod icmp;
pub mod icrc;
pub mod int;
pub mod ipv4;
pub mod mad;
pub mod template;
pub mod transport_hdrs;
pub mod udp;

pub use arp::{ArpOperation, ArpPacket, ArpRepr};
pub use bth::{BthFlags, BthPacket, BthRepr, Opcode, Service};
pub use ccext::{CcExtFlags, CcExtPacket, CcExtRepr};
pub use cm::{CmAttr, CmMad, CmMessage, CmaHdr};
pub use ethernet::{EtherType, EthernetAddress, EthernetPacket, EthernetRepr};
pub use frame::{parse_frame, prepare_rx, FrameBuilder, ParseOptions, RoceFrame, RxPrepared};
pub use icmp::{Icmpv4Packet, Icmpv4Repr};
pub use icrc::{
    fill_icrc, icrc_frame, icrc_frame_in_place, verify_icrc, verify_icrc_in_place, IcrcHasher,
};
pub use int::{HopRecord, IntPacket, IntRepr};
pub use ipv4::{Ecn, Ipv4Address, Ipv4Packet, Ipv4Repr};
pub use mad::{MadPacket, MadRepr};
pub use template::{HeaderTemplate, TemplateLayout};
pub use transport_hdrs::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ImmDtRepr, NakCode, RethRepr,
};
pub use udp::{UdpPacket, UdpRepr, ROCEV2_UDP_PORT};

/// Why a buffer could not be parsed or an emit could not be done.
///
/// Every parser in [`crate::wire`] returns this instead of panicking, so the NIC can
/// count each reason separately (docs/design.md §3, "counters for every drop reason").
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before the named header or field does.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which header or field is cut short.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The output buffer handed to an `emit` is too small.
    #[error("output buffer too small for {what}: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// What was being written.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The Ethernet frame is not IPv4 (we only speak RoCEv2 over IPv4).
    #[error("unsupported ethertype {0:#06x}")]
    UnsupportedEtherType(u16),
    /// IPv4 version field is not 4.
    #[error("IP version {0} is not 4")]
    BadIpVersion(u8),
    /// IPv4 IHL below 5 or beyond the buffer.
    #[error("bad IPv4 header length (IHL {0})")]
    BadIhl(u8),
    /// IPv4 total length is below the header length or beyond the buffer.
    #[error("bad IPv4 total length {0}")]
    BadIpLength(u16),
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// IPv4 packet is a fragment (RoCEv2 never fragments).
    #[error("IPv4 fragment")]
    IpFragment,
    /// IPv4 protocol is not UDP.
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// UDP length field is inconsistent with the IP length or below 8.
    #[error("bad UDP length {0}")]
    BadUdpLength(u16),
    /// UDP destination port is not 4791.
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    NotRoce(u16),
    /// BTH opcode is not one this implementation knows.
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// BTH transport header version is not 0.
    #[error("BTH TVer {0} is not 0")]
    BadTver(u8),
    /// The pad count does not fit the payload.
    #[error("pad count {0} larger than payload")]
    BadPad(u8),
    /// The ICRC does not match.
    #[error("ICRC mismatch: packet {found:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// ICRC carried by the packet.
        found: u32,
        /// ICRC we computed.
        computed: u32,
    },
    /// INT shim Type is not INT-MD (1).
    #[error("INT shim type {0} is not INT-MD (1)")]
    IntBadType(u8),
    /// INT shim length is inconsistent (below 4 words, not shim+MD+k*hop, or beyond buffer).
    #[error("bad INT container length {0} words")]
    IntBadLength(u8),
    /// INT-MD header version is not 2.
    #[error("INT-MD version {0} is not 2")]
    IntBadVersion(u8),
    /// INT-MD HopML is not the 4 words per hop this project uses.
    #[error("INT HopML {0} is not 4")]
    IntBadHopMl(u8),
    /// The frame carries no INT container where one was expected.
    #[error("no INT container in frame")]
    IntAbsent,
    /// CC extension header has an unknown version.
    #[error("CC extension version {0} unknown")]
    CcExtBadVersion(u8),
    /// CC extension carries more echoed hop records than allowed.
    #[error("CC extension hop count {0} above the maximum")]
    CcExtTooManyHops(u8),
    /// An ARP packet that is not the Ethernet/IPv4 form (RFC 826).
    #[error("ARP for hardware type {htype} / protocol {ptype:#06x} ({hlen}/{plen}-byte addresses) is not Ethernet/IPv4")]
    ArpUnsupported {
        /// Hardware type.
        htype: u16,
        /// Protocol type.
        ptype: u16,
        /// Hardware address length.
        hlen: u8,
        /// Protocol address length.
        plen: u8,
    },
    /// The ICMP checksum does not verify.
    #[error("bad ICMP checksum")]
    IcmpBadChecksum,
    /// An ICMP message other than echo request or reply.
    #[error("ICMP type {msg_type} code {code} is not an echo message")]
    IcmpUnsupported {
        /// Type.
        msg_type: u8,
        /// Code.
        code: u8,
    },
    /// A Repr field is out of its wire range (e.g. a QPN above 24 bits).
    #[error("field {0} out of range")]
    FieldRange(&'static str),
}

/// Result of a wire operation.
pub type Result<T> = core::result::Result<T, WireError>;

/// Checks `have >= need`, naming the header for the error.
#[inline]
pub(crate) fn need(what: &'static str, need: usize, have: usize) -> Result<()> {
    if have < need {
        Err(WireError::Truncated { what, need, have })
    } else {
        Ok(())
    }
}

/// The header `H` at the front of `b`. Every header type is `Unaligned`, so only
/// the length can fail, and the caller (a view's `new_checked`, a `parse`) has
/// checked it with [`need`].
#[inline]
pub(crate) fn header_at<H>(b: &[u8]) -> &H
where
    H: zerocopy::FromBytes + zerocopy::KnownLayout + zerocopy::Immutable,
{
    H::ref_from_prefix(b)
        .map(|(h, _)| h)
        .unwrap_or_else(|_| unreachable!("header length checked before"))
}

/// Checks an output buffer is large enough.
#[inline]
pub(crate) fn need_out(what: &'static str, need: usize, have: usize) -> Result<()> {
    if have < need {
        Err(WireError::BufferTooSmall { what, need, have })
    } else {
        Ok(())
    }
}

/// The Internet checksum (RFC 1071): one's complement of the one's complement sum of
/// the 16-bit big-endian words of `data` (an odd trailing byte is padded with zero).
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// 24-bit serial-number arithmetic used by PSNs and MSNs (IBA 9.7.1: PSNs wrap mod 2^24).
pub mod psn {
    /// Mask of a 24-bit sequence number.
    pub const MASK: u32 = 0x00FF_FFFF;
    /// Half the PSN space: a PSN more than this ahead is considered behind (IBA 9.7.1).
    pub const HALF: u32 = 0x0080_0000;

    /// `a + n` modulo 2^24.
    #[inline]
    pub fn add(a: u32, n: u32) -> u32 {
        a.wrapping_add(n) & MASK
    }

    /// `a - b` modulo 2^24 (distance from b forward to a).
    #[inline]
    pub fn sub(a: u32, b: u32) -> u32 {
        a.wrapping_sub(b) & MASK
    }

    /// Signed distance from `b` to `a` in the 24-bit circle, in `-2^23 .. 2^23`.
    #[inline]
    pub fn diff(a: u32, b: u32) -> i32 {
        let d = sub(a, b);
        if d >= HALF {
            d as i32 - (1 << 24)
        } else {
            d as i32
        }
    }

    /// `a` is strictly before `b` in serial order.
    #[inline]
    pub fn lt(a: u32, b: u32) -> bool {
        diff(a, b) < 0
    }

    /// `a` is before or equal to `b` in serial order.
    #[inline]
    pub fn le(a: u32, b: u32) -> bool {
        diff(a, b) <= 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_rfc1071_example() {
        // RFC 1071 section 3 example words 0001 f203 f4f5 f6f7 -> sum ddf2, checksum 220d.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&d), 0x220d);
    }

    #[test]
    fn psn_wraps() {
        assert_eq!(psn::add(0xFF_FFFF, 1), 0);
        assert_eq!(psn::sub(0, 1), 0xFF_FFFF);
        assert_eq!(psn::diff(0, 0xFF_FFFF), 1);
        assert_eq!(psn::diff(0xFF_FFFF, 0), -1);
        assert!(psn::lt(0xFF_FFF0, 3));
        assert!(!psn::lt(3, 0xFF_FFF0));
        assert!(psn::le(5, 5));
    }
}
