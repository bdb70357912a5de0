//! IPv4 header (RFC 791) with DSCP/ECN (RFC 2474, RFC 3168) and the header checksum.
//!
//! ```text
//!  0       4       8              16      19             31
//! +-------+-------+------+-------+---------------------+
//! |Ver=4  | IHL   | DSCP | ECN   |   total length      |
//! +-------+-------+------+-------+---+-----------------+
//! |   identification             |Flg| fragment offset |
//! +---------------+--------------+---+-----------------+
//! |   TTL         | protocol=17  |  header checksum    |
//! +---------------+--------------+---------------------+
//! |                 source address                      |
//! |               destination address                   |
//! +-----------------------------------------------------+
//! ```
//! We emit IHL = 5 (no options) and DF set; we accept options on receive. Fragments are
//! rejected (RoCEv2 never fragments).

use super::{internet_checksum, need, need_out, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of the option-less IPv4 header that we emit.
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// An IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ipv4Address(pub [u8; 4]);

/// The two ECN bits (RFC 3168 section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ecn {
    /// 00: not ECN-capable (LDCP fast-start packets, so WRED drops them).
    #[default]
    NotEct,
    /// 10: ECT(0), what data packets carry.
    Ect0,
    /// 01: ECT(1).
    Ect1,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// From the two low bits of the TOS byte.
    pub fn from_bits(b: u8) -> Ecn {
        match b & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The two bits.
    pub fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }
}

/// The option-less IPv4 header as it lies on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Ipv4Header {
    /// Version (4 bits) and IHL (4 bits, in 32-bit words).
    pub ver_ihl: u8,
    /// DSCP (6 bits) and ECN (2 bits).
    pub tos: u8,
    /// Total length of header and payload in bytes.
    pub total_len: U16,
    /// Identification.
    pub ident: U16,
    /// Flags (3 bits: reserved, DF, MF) and fragment offset (13 bits, 8-byte units).
    pub flags_frag: U16,
    /// Time to live.
    pub ttl: u8,
    /// Protocol (17 = UDP).
    pub protocol: u8,
    /// Header checksum (RFC 791, RFC 1071).
    pub checksum: U16,
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
}

/// A zero-copy view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps `buffer` after checking version, IHL and total length against its length.
    /// Does not verify the checksum (see [`Ipv4Packet::verify_checksum`]).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        need("IPv4 header", HEADER_LEN, b.len())?;
        let ver = b[0] >> 4;
        if ver != 4 {
            return Err(WireError::BadIpVersion(ver));
        }
        let ihl = b[0] & 0xF;
        if ihl < 5 || (ihl as usize) * 4 > b.len() {
            return Err(WireError::BadIhl(ihl));
        }
        let tl = u16::from_be_bytes([b[2], b[3]]);
        if (tl as usize) < (ihl as usize) * 4 || tl as usize > b.len() {
            return Err(WireError::BadIpLength(tl));
        }
        Ok(Self { buffer })
    }

    /// The fixed part of the header.
    pub fn header(&self) -> &Ipv4Header {
        super::header_at::<Ipv4Header>(self.buffer.as_ref())
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        ((self.header().ver_ihl & 0xF) as usize) * 4
    }

    /// Total length field.
    pub fn total_len(&self) -> u16 {
        self.header().total_len.get()
    }

    /// DSCP (6 bits).
    pub fn dscp(&self) -> u8 {
        self.header().tos >> 2
    }

    /// ECN bits.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.header().tos)
    }

    /// True if the header checksum verifies (sum over the header is 0xFFFF).
    pub fn verify_checksum(&self) -> bool {
        internet_checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }

    /// The header bytes, options included.
    pub fn header_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header_len()]
    }

    /// The payload as delimited by the total length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Recomputes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        b[10] = 0;
        b[11] = 0;
        let c = internet_checksum(&b[..hl]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
    }

    /// Sets the total length (does not refresh the checksum).
    pub fn set_total_len(&mut self, v: u16) {
        self.buffer.as_mut()[2..4].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the DSCP keeping ECN (does not refresh the checksum).
    pub fn set_dscp(&mut self, dscp: u8) {
        let b = self.buffer.as_mut();
        b[1] = (dscp << 2) | (b[1] & 3);
    }

    /// Sets the ECN bits keeping DSCP (does not refresh the checksum).
    pub fn set_ecn(&mut self, ecn: Ecn) {
        let b = self.buffer.as_mut();
        b[1] = (b[1] & !3) | ecn.bits();
    }
}

/// Parsed IPv4 header (the fields RoCEv2 uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Address,
    /// Destination address.
    pub dst: Ipv4Address,
    /// DSCP (6 bits); the INT DSCP signals an INT container (docs/design.md §4).
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Time to live.
    pub ttl: u8,
    /// Identification (0 is fine with DF set).
    pub ident: u16,
    /// Protocol number.
    pub protocol: u8,
    /// Payload length in bytes (total length minus header length).
    pub payload_len: u16,
}

impl Ipv4Repr {
    /// Parses a checked view; rejects a bad checksum and fragments.
    // Always inlined into `frame::parse_frame`: its docs say why.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Self> {
        if !p.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        let h = p.header();
        let ff = h.flags_frag.get();
        if ff & 0x2000 != 0 || ff & 0x1FFF != 0 {
            return Err(WireError::IpFragment);
        }
        Ok(Self {
            src: Ipv4Address(h.src),
            dst: Ipv4Address(h.dst),
            dscp: h.tos >> 2,
            ecn: Ecn::from_bits(h.tos),
            ttl: h.ttl,
            ident: h.ident.get(),
            protocol: h.protocol,
            payload_len: p.total_len() - p.header_len() as u16,
        })
    }

    /// Header length we emit (20).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes a 20-byte header with DF set and a valid checksum; returns 20.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("IPv4 header", HEADER_LEN, buf.len())?;
        if self.dscp > 0x3F {
            return Err(WireError::FieldRange("DSCP"));
        }
        let total = self.payload_len as usize + HEADER_LEN;
        if total > u16::MAX as usize {
            return Err(WireError::FieldRange("IPv4 total length"));
        }
        let mut h = Ipv4Header {
            ver_ihl: 0x45,
            tos: (self.dscp << 2) | self.ecn.bits(),
            total_len: U16::new(total as u16),
            ident: U16::new(self.ident),
            flags_frag: U16::new(0x4000),
            ttl: self.ttl,
            protocol: self.protocol,
            checksum: U16::new(0),
            src: self.src.0,
            dst: self.dst.0,
        };
        h.checksum = U16::new(internet_checksum(h.as_bytes()));
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        Ok(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Ipv4Repr {
        Ipv4Repr {
            src: Ipv4Address([10, 0, 0, 1]),
            dst: Ipv4Address([10, 0, 0, 2]),
            dscp: 0x18,
            ecn: Ecn::Ect0,
            ttl: 64,
            ident: 0,
            protocol: PROTO_UDP,
            payload_len: 8,
        }
    }

    #[test]
    fn roundtrip_checksum_and_errors() {
        let mut b = [0u8; 28];
        repr().emit(&mut b).unwrap();
        assert_eq!(b[1], (0x18 << 2) | 2);
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), repr());
        // Corrupt TTL: checksum must fail.
        let mut c = b;
        c[8] = 1;
        assert_eq!(
            Ipv4Repr::parse(&Ipv4Packet::new_checked(&c[..]).unwrap()),
            Err(WireError::BadIpChecksum)
        );
        // fill_checksum repairs it.
        let mut p = Ipv4Packet::new_checked(&mut c[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
        let mut d = b;
        d[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&d[..]).err(),
            Some(WireError::BadIpVersion(6))
        );
        d[0] = 0x44;
        assert_eq!(
            Ipv4Packet::new_checked(&d[..]).err(),
            Some(WireError::BadIhl(4))
        );
        assert_eq!(
            Ipv4Packet::new_checked(&b[..27]).err(),
            Some(WireError::BadIpLength(28))
        );
        assert!(matches!(
            Ipv4Packet::new_checked(&b[..10]),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn ecn_bits_roundtrip() {
        for e in [Ecn::NotEct, Ecn::Ect0, Ecn::Ect1, Ecn::Ce] {
            assert_eq!(Ecn::from_bits(e.bits()), e);
        }
    }
}
