//! Ethernet II header (IEEE 802.3 clause 3.1.1), the link layer of RoCEv2.
//!
//! ```text
//!  0                   6                  12      14
//! +-------------------+------------------+-------+
//! | destination MAC   | source MAC       | type  |
//! +-------------------+------------------+-------+
//! ```
//! VLAN tags are not emitted; a tagged frame is rejected with
//! [`WireError::UnsupportedEtherType`] so the NIC counts it.

use super::{need, need_out, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = 14;

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EthernetAddress(pub [u8; 6]);

/// EtherType values we care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtherType {
    /// IPv4, 0x0800 (the only network layer RoCEv2 uses here).
    Ipv4,
    /// Any other value.
    Other(u16),
}

impl From<u16> for EtherType {
    fn from(v: u16) -> Self {
        match v {
            0x0800 => EtherType::Ipv4,
            o => EtherType::Other(o),
        }
    }
}

impl From<EtherType> for u16 {
    fn from(v: EtherType) -> u16 {
        match v {
            EtherType::Ipv4 => 0x0800,
            EtherType::Other(o) => o,
        }
    }
}

/// The Ethernet header as it lies on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct EthernetHeader {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType, big-endian.
    pub ethertype: U16,
}

/// A zero-copy view of an Ethernet frame.
#[derive(Debug, Clone)]
pub struct EthernetPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetPacket<T> {
    /// Wraps `buffer` after checking it holds at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("Ethernet header", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Self { buffer })
    }

    /// The header, by reference into the buffer.
    pub fn header(&self) -> &EthernetHeader {
        // new_checked guaranteed the length; a failure here is impossible.
        super::header_at::<EthernetHeader>(self.buffer.as_ref())
    }

    /// Destination MAC.
    pub fn dst(&self) -> EthernetAddress {
        EthernetAddress(self.header().dst)
    }

    /// Source MAC.
    pub fn src(&self) -> EthernetAddress {
        EthernetAddress(self.header().src)
    }

    /// EtherType.
    pub fn ethertype(&self) -> EtherType {
        self.header().ethertype.get().into()
    }

    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

/// Parsed Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src: EthernetAddress,
    /// Destination MAC.
    pub dst: EthernetAddress,
    /// EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &EthernetPacket<T>) -> Result<Self> {
        Ok(Self {
            src: p.src(),
            dst: p.dst(),
            ethertype: p.ethertype(),
        })
    }

    /// Parses and requires IPv4, the only network layer of RoCEv2 here.
    pub fn parse_ipv4<T: AsRef<[u8]>>(p: &EthernetPacket<T>) -> Result<Self> {
        let r = Self::parse(p)?;
        match r.ethertype {
            EtherType::Ipv4 => Ok(r),
            EtherType::Other(o) => Err(WireError::UnsupportedEtherType(o)),
        }
    }

    /// Header length (always 14).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 14-byte header at the start of `buf`; returns 14.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("Ethernet header", HEADER_LEN, buf.len())?;
        let h = EthernetHeader {
            dst: self.dst.0,
            src: self.src.0,
            ethertype: U16::new(self.ethertype.into()),
        };
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        Ok(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_truncation() {
        let r = EthernetRepr {
            src: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst: EthernetAddress([2, 0, 0, 0, 0, 2]),
            ethertype: EtherType::Ipv4,
        };
        let mut b = [0u8; 14];
        assert_eq!(r.emit(&mut b).unwrap(), 14);
        assert_eq!(&b[12..], &[0x08, 0x00]);
        let p = EthernetPacket::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse_ipv4(&p).unwrap(), r);
        assert!(matches!(
            EthernetPacket::new_checked(&b[..13]),
            Err(WireError::Truncated { .. })
        ));
        b[12] = 0x86;
        b[13] = 0xdd;
        let p = EthernetPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            EthernetRepr::parse_ipv4(&p),
            Err(WireError::UnsupportedEtherType(0x86dd))
        );
        assert!(r.emit(&mut [0u8; 10]).is_err());
    }
}
