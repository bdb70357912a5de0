//! UDP header (RFC 768) carrying RoCEv2 (IBA annex A17: destination port 4791, source
//! port chosen per QP for ECMP entropy, checksum 0).
//!
//! ```text
//!  0       2       4       6       8
//! +-------+-------+-------+-------+
//! | sport | dport | length| csum  |
//! +-------+-------+-------+-------+
//! ```

use super::{need, need_out, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;
/// The IANA port of RoCEv2 (IBA annex A17.2.1).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// The UDP header as it lies on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct UdpHeader {
    /// Source port.
    pub src_port: U16,
    /// Destination port.
    pub dst_port: U16,
    /// Length of header plus payload.
    pub length: U16,
    /// Checksum (0 = none; RoCEv2 senders use 0).
    pub checksum: U16,
}

/// A zero-copy view of a UDP datagram.
#[derive(Debug, Clone)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps `buffer` (the UDP header and everything after it that belongs to the IP
    /// payload) after checking the length field lies within 8..=buffer length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        need("UDP header", HEADER_LEN, b.len())?;
        let len = u16::from_be_bytes([b[4], b[5]]);
        if (len as usize) < HEADER_LEN || len as usize > b.len() {
            return Err(WireError::BadUdpLength(len));
        }
        Ok(Self { buffer })
    }

    /// The header.
    pub fn header(&self) -> &UdpHeader {
        super::header_at::<UdpHeader>(self.buffer.as_ref())
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        self.header().src_port.get()
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        self.header().dst_port.get()
    }

    /// Length field (header + payload).
    pub fn len_field(&self) -> u16 {
        self.header().length.get()
    }

    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        self.header().checksum.get()
    }

    /// The payload as delimited by the length field.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.len_field() as usize]
    }
}

/// Parsed UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    /// Source port (entropy per QP).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Payload length (length field minus 8).
    pub payload_len: u16,
}

impl UdpRepr {
    /// Parses a checked view.
    // Always inlined into `frame::parse_frame`: its docs say why.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Result<Self> {
        Ok(Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: p.len_field() - HEADER_LEN as u16,
        })
    }

    /// Writes the 8-byte header with checksum 0 (RoCEv2 practice, IBA A17.2.2); returns 8.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("UDP header", HEADER_LEN, buf.len())?;
        let total = (self.payload_len as usize) + HEADER_LEN;
        if total > u16::MAX as usize {
            return Err(WireError::FieldRange("UDP length"));
        }
        let h = UdpHeader {
            src_port: U16::new(self.src_port),
            dst_port: U16::new(self.dst_port),
            length: U16::new(total as u16),
            checksum: U16::new(0),
        };
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        Ok(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_bad_length() {
        let r = UdpRepr {
            src_port: 0xC000,
            dst_port: ROCEV2_UDP_PORT,
            payload_len: 4,
        };
        let mut b = [0u8; 12];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..8], &[0xC0, 0x00, 0x12, 0xB7, 0x00, 0x0C, 0, 0]);
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p).unwrap(), r);
        assert_eq!(p.payload().len(), 4);
        assert_eq!(
            UdpPacket::new_checked(&b[..11]).err(),
            Some(WireError::BadUdpLength(12))
        );
        b[5] = 7;
        assert_eq!(
            UdpPacket::new_checked(&b[..]).err(),
            Some(WireError::BadUdpLength(7))
        );
    }
}
