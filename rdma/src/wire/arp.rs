//! ARP for IPv4 over Ethernet (RFC 826), what a host stack answers for its
//! NIC and what resolves a peer's MAC before a QP sends (docs/design.md §5: the
//! port's control plane).
//!
//! ```text
//!  0       2       4   5   6       8
//! +-------+-------+---+---+-------+
//! | htype | ptype |hln|pln|  oper |   htype 1 (Ethernet), ptype 0x0800,
//! +-------+-------+---+---+-------+   hln 6, pln 4, oper 1 request / 2 reply
//! |     sender hardware address   |   (6 bytes)
//! +-------------------------------+
//! | sender IPv4   |   target hardware address (6 bytes)   |
//! +---------------+-------------------------------+-------+
//! | target IPv4   |
//! +---------------+                  28 bytes in all
//! ```
//!
//! Only the Ethernet/IPv4 form is accepted ([`WireError::ArpUnsupported`]
//! names what else was found); bytes after the 28 (the Ethernet pad) are
//! ignored.

use super::{need, need_out, EthernetAddress, Ipv4Address, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = 28;
/// Hardware type of Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// Protocol type of IPv4.
pub const PTYPE_IPV4: u16 = 0x0800;

/// The ARP packet as it lies on the wire (Ethernet/IPv4 form).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ArpHeader {
    /// Hardware type (1: Ethernet).
    pub htype: U16,
    /// Protocol type (0x0800: IPv4).
    pub ptype: U16,
    /// Hardware address length (6).
    pub hlen: u8,
    /// Protocol address length (4).
    pub plen: u8,
    /// Operation (1 request, 2 reply).
    pub oper: U16,
    /// Sender hardware address.
    pub sha: [u8; 6],
    /// Sender protocol address.
    pub spa: [u8; 4],
    /// Target hardware address (ignored in a request).
    pub tha: [u8; 6],
    /// Target protocol address.
    pub tpa: [u8; 4],
}

/// ARP operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArpOperation {
    /// Who has the target IP? (1)
    Request,
    /// The sender has the sender IP. (2)
    Reply,
    /// Any other operation (RARP, InARP, ...).
    Other(u16),
}

impl From<u16> for ArpOperation {
    fn from(v: u16) -> Self {
        match v {
            1 => ArpOperation::Request,
            2 => ArpOperation::Reply,
            o => ArpOperation::Other(o),
        }
    }
}

impl From<ArpOperation> for u16 {
    fn from(v: ArpOperation) -> u16 {
        match v {
            ArpOperation::Request => 1,
            ArpOperation::Reply => 2,
            ArpOperation::Other(o) => o,
        }
    }
}

/// A zero-copy view of an Ethernet/IPv4 ARP packet (the Ethernet payload).
#[derive(Debug, Clone)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps `buffer` after checking it holds 28 bytes of the Ethernet/IPv4
    /// form (hardware type 1, protocol 0x0800, lengths 6 and 4).
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        need("ARP packet", PACKET_LEN, b.len())?;
        let p = Self { buffer };
        let h = p.header();
        let (htype, ptype) = (h.htype.get(), h.ptype.get());
        if htype != HTYPE_ETHERNET || ptype != PTYPE_IPV4 || h.hlen != 6 || h.plen != 4 {
            return Err(WireError::ArpUnsupported {
                htype,
                ptype,
                hlen: h.hlen,
                plen: h.plen,
            });
        }
        Ok(p)
    }

    /// The header.
    pub fn header(&self) -> &ArpHeader {
        super::header_at::<ArpHeader>(self.buffer.as_ref())
    }

    /// Operation.
    pub fn operation(&self) -> ArpOperation {
        self.header().oper.get().into()
    }

    /// Sender hardware address.
    pub fn sender_hw(&self) -> EthernetAddress {
        EthernetAddress(self.header().sha)
    }

    /// Sender IPv4 address.
    pub fn sender_ip(&self) -> Ipv4Address {
        Ipv4Address(self.header().spa)
    }

    /// Target hardware address.
    pub fn target_hw(&self) -> EthernetAddress {
        EthernetAddress(self.header().tha)
    }

    /// Target IPv4 address.
    pub fn target_ip(&self) -> Ipv4Address {
        Ipv4Address(self.header().tpa)
    }
}

/// A parsed Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpRepr {
    /// Operation.
    pub operation: ArpOperation,
    /// Sender hardware address.
    pub sender_hw: EthernetAddress,
    /// Sender IPv4 address.
    pub sender_ip: Ipv4Address,
    /// Target hardware address (zero in a request).
    pub target_hw: EthernetAddress,
    /// Target IPv4 address.
    pub target_ip: Ipv4Address,
}

impl ArpRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<Self> {
        Ok(Self {
            operation: p.operation(),
            sender_hw: p.sender_hw(),
            sender_ip: p.sender_ip(),
            target_hw: p.target_hw(),
            target_ip: p.target_ip(),
        })
    }

    /// A request for `target_ip` from `sender_hw`/`sender_ip` (gratuitous
    /// when `target_ip` is the sender's own, RFC 5227 §3).
    pub fn request(
        sender_hw: EthernetAddress,
        sender_ip: Ipv4Address,
        target_ip: Ipv4Address,
    ) -> Self {
        Self {
            operation: ArpOperation::Request,
            sender_hw,
            sender_ip,
            target_hw: EthernetAddress([0; 6]),
            target_ip,
        }
    }

    /// Writes the 28 bytes; returns 28.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("ARP packet", PACKET_LEN, buf.len())?;
        let h = ArpHeader {
            htype: U16::new(HTYPE_ETHERNET),
            ptype: U16::new(PTYPE_IPV4),
            hlen: 6,
            plen: 4,
            oper: U16::new(self.operation.into()),
            sha: self.sender_hw.0,
            spa: self.sender_ip.0,
            tha: self.target_hw.0,
            tpa: self.target_ip.0,
        };
        buf[..PACKET_LEN].copy_from_slice(h.as_bytes());
        Ok(PACKET_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as Linux sends it (`arping -I eth0 10.0.0.2` from
    /// 02:00:00:00:00:01 / 10.0.0.1), byte by byte.
    const REQUEST: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01, // htype, ptype, hlen, plen, oper
        2, 0, 0, 0, 0, 1, 10, 0, 0, 1, // sender
        0, 0, 0, 0, 0, 0, 10, 0, 0, 2, // target
    ];

    #[test]
    fn parses_a_request_and_emits_the_same_bytes() {
        let p = ArpPacket::new_checked(&REQUEST[..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(
            r,
            ArpRepr::request(
                EthernetAddress([2, 0, 0, 0, 0, 1]),
                Ipv4Address([10, 0, 0, 1]),
                Ipv4Address([10, 0, 0, 2])
            )
        );
        let mut b = [0u8; PACKET_LEN];
        assert_eq!(r.emit(&mut b), Ok(PACKET_LEN));
        assert_eq!(b, REQUEST);
    }

    #[test]
    fn reply_round_trips_and_pad_is_ignored() {
        let r = ArpRepr {
            operation: ArpOperation::Reply,
            sender_hw: EthernetAddress([2, 0, 0, 0, 0, 2]),
            sender_ip: Ipv4Address([10, 0, 0, 2]),
            target_hw: EthernetAddress([2, 0, 0, 0, 0, 1]),
            target_ip: Ipv4Address([10, 0, 0, 1]),
        };
        let mut b = [0xEEu8; 46];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[6..8], &[0, 2]);
        let p = ArpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(ArpRepr::parse(&p).unwrap(), r);
    }

    #[test]
    fn refuses_other_forms_and_short_buffers() {
        assert!(matches!(
            ArpPacket::new_checked(&REQUEST[..27]),
            Err(WireError::Truncated { need: 28, .. })
        ));
        let mut ipv6 = REQUEST;
        ipv6[2] = 0x86;
        ipv6[3] = 0xDD;
        assert_eq!(
            ArpPacket::new_checked(&ipv6[..]).err(),
            Some(WireError::ArpUnsupported {
                htype: 1,
                ptype: 0x86DD,
                hlen: 6,
                plen: 4
            })
        );
        let mut other = REQUEST;
        other[7] = 3;
        let p = ArpPacket::new_checked(&other[..]).unwrap();
        assert_eq!(p.operation(), ArpOperation::Other(3));
        assert_eq!(
            ArpRepr::emit(&ArpRepr::parse(&p).unwrap(), &mut [0u8; 27]),
            Err(WireError::BufferTooSmall {
                what: "ARP packet",
                need: 28,
                have: 27
            })
        );
    }
}
