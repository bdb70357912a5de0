//! ICMPv4 echo (RFC 792), so that a NIC's address answers `ping` as a host
//! stack would (docs/design.md §5: the port's control plane).
//!
//! ```text
//!  0       1       2               4
//! +-------+-------+---------------+
//! | type  | code  |   checksum    |   type 8 echo request, 0 echo reply;
//! +-------+-------+---------------+   code 0; checksum: RFC 1071 over the
//! |  identifier   |   sequence    |   whole ICMP message
//! +---------------+---------------+
//! |  data ...                         (echoed back unchanged)
//! ```
//!
//! The view checks the length and, separately, the checksum; the repr
//! knows the two echo messages and refuses every other type with
//! [`WireError::IcmpUnsupported`].

use super::{internet_checksum, need, need_out, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// Length of the ICMP echo header.
pub const HEADER_LEN: usize = 8;
/// Type of an echo reply.
pub const TYPE_ECHO_REPLY: u8 = 0;
/// Type of an echo request.
pub const TYPE_ECHO_REQUEST: u8 = 8;

/// The ICMP echo header as it lies on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct IcmpEchoHeader {
    /// Message type.
    pub msg_type: u8,
    /// Code (0 for echo).
    pub code: u8,
    /// Checksum of the whole message.
    pub checksum: U16,
    /// Identifier (the pinging process's choice).
    pub ident: U16,
    /// Sequence number.
    pub seq_no: U16,
}

/// A zero-copy view of an ICMPv4 message (the IPv4 payload).
#[derive(Debug, Clone)]
pub struct Icmpv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// Wraps `buffer` (exactly the ICMP message: the IPv4 payload) after
    /// checking it holds the 8-byte header. Does not verify the checksum
    /// ([`Self::verify_checksum`]).
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("ICMP header", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Self { buffer })
    }

    /// The header.
    pub fn header(&self) -> &IcmpEchoHeader {
        super::header_at::<IcmpEchoHeader>(self.buffer.as_ref())
    }

    /// Message type.
    pub fn msg_type(&self) -> u8 {
        self.header().msg_type
    }

    /// Code.
    pub fn code(&self) -> u8 {
        self.header().code
    }

    /// Identifier (echo messages).
    pub fn ident(&self) -> u16 {
        self.header().ident.get()
    }

    /// Sequence number (echo messages).
    pub fn seq_no(&self) -> u16 {
        self.header().seq_no.get()
    }

    /// The bytes after the header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// True if the checksum over the whole message verifies.
    pub fn verify_checksum(&self) -> bool {
        internet_checksum(self.buffer.as_ref()) == 0
    }
}

/// A parsed ICMP echo message; its data borrowed from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    /// Echo request (type 8).
    EchoRequest {
        /// Identifier.
        ident: u16,
        /// Sequence number.
        seq_no: u16,
        /// Data to echo.
        data: &'a [u8],
    },
    /// Echo reply (type 0).
    EchoReply {
        /// Identifier of the request.
        ident: u16,
        /// Sequence number of the request.
        seq_no: u16,
        /// The request's data.
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Parses a checked view: verifies the checksum, accepts the two echo
    /// messages with code 0.
    pub fn parse<T: AsRef<[u8]>>(p: &'a Icmpv4Packet<T>) -> Result<Self> {
        if !p.verify_checksum() {
            return Err(WireError::IcmpBadChecksum);
        }
        let (ident, seq_no, data) = (p.ident(), p.seq_no(), p.data());
        match (p.msg_type(), p.code()) {
            (TYPE_ECHO_REQUEST, 0) => Ok(Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            }),
            (TYPE_ECHO_REPLY, 0) => Ok(Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            }),
            (t, c) => Err(WireError::IcmpUnsupported {
                msg_type: t,
                code: c,
            }),
        }
    }

    /// The reply to an echo request (`None` for anything else).
    pub fn reply(&self) -> Option<Icmpv4Repr<'a>> {
        match *self {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => Some(Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            }),
            Icmpv4Repr::EchoReply { .. } => None,
        }
    }

    /// Length of the message: header and data.
    pub fn buffer_len(&self) -> usize {
        match self {
            Icmpv4Repr::EchoRequest { data, .. } | Icmpv4Repr::EchoReply { data, .. } => {
                HEADER_LEN + data.len()
            }
        }
    }

    /// Writes the message with its checksum; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let n = self.buffer_len();
        need_out("ICMP message", n, buf.len())?;
        let (msg_type, ident, seq_no, data) = match *self {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (TYPE_ECHO_REQUEST, ident, seq_no, data),
            Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => (TYPE_ECHO_REPLY, ident, seq_no, data),
        };
        let h = IcmpEchoHeader {
            msg_type,
            code: 0,
            checksum: U16::new(0),
            ident: U16::new(ident),
            seq_no: U16::new(seq_no),
        };
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        buf[HEADER_LEN..n].copy_from_slice(data);
        let c = internet_checksum(&buf[..n]);
        buf[2..4].copy_from_slice(&c.to_be_bytes());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo request as `ping -c1 -p 41 -s 4` sends it (ident 0x1234,
    /// sequence 1, data "AAAA"); checksum computed by hand:
    /// 0x0800 + 0x1234 + 0x0001 + 0x4141 + 0x4141 = 0x9CB7, complement 0x6348.
    const REQUEST: [u8; 12] = [8, 0, 0x63, 0x48, 0x12, 0x34, 0, 1, 0x41, 0x41, 0x41, 0x41];

    #[test]
    fn parses_a_request_and_builds_its_reply() {
        let p = Icmpv4Packet::new_checked(&REQUEST[..]).unwrap();
        assert!(p.verify_checksum());
        let r = Icmpv4Repr::parse(&p).unwrap();
        assert_eq!(
            r,
            Icmpv4Repr::EchoRequest {
                ident: 0x1234,
                seq_no: 1,
                data: b"AAAA"
            }
        );
        let mut b = [0u8; 12];
        assert_eq!(r.emit(&mut b), Ok(12));
        assert_eq!(b, REQUEST);
        let reply = r.reply().unwrap();
        assert_eq!(reply.emit(&mut b), Ok(12));
        // Type 0: the checksum grows by 0x0800.
        assert_eq!(&b[..4], &[0, 0, 0x6B, 0x48]);
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p).unwrap(), reply);
        assert_eq!(reply.reply(), None);
    }

    #[test]
    fn refuses_bad_checksums_other_types_and_short_buffers() {
        let mut bad = REQUEST;
        bad[9] ^= 1;
        let p = Icmpv4Packet::new_checked(&bad[..]).unwrap();
        assert_eq!(Icmpv4Repr::parse(&p), Err(WireError::IcmpBadChecksum));
        // Destination unreachable (3/1) with a valid checksum.
        let mut unreach = [3u8, 1, 0, 0, 0, 0, 0, 0];
        let c = internet_checksum(&unreach);
        unreach[2..4].copy_from_slice(&c.to_be_bytes());
        let p = Icmpv4Packet::new_checked(&unreach[..]).unwrap();
        assert_eq!(
            Icmpv4Repr::parse(&p),
            Err(WireError::IcmpUnsupported {
                msg_type: 3,
                code: 1
            })
        );
        assert!(Icmpv4Packet::new_checked(&REQUEST[..7]).is_err());
        let r = Icmpv4Repr::EchoReply {
            ident: 1,
            seq_no: 2,
            data: &[0; 10],
        };
        assert!(matches!(
            r.emit(&mut [0u8; 17]),
            Err(WireError::BufferTooSmall { need: 18, .. })
        ));
    }
}
