//! Extended transport headers that follow the BTH (IBA volume 1, section 9.3 / 9.4):
//! DETH (9.3.2), RETH (9.3.3), AETH (9.3.4), ImmDt (9.3.5), AtomicETH (9.3.6),
//! AtomicAckETH (9.3.7), IETH (the Invalidate ETH of SEND Last/Only with Invalidate,
//! IBA 1.2.1 9.3.8).
//!
//! ```text
//! DETH (8):          Q_Key u32 | reserved u8 | source QP u24
//! RETH (16):         VA u64 | R_Key u32 | DMA length u32
//! AETH (4):          Syndrome u8 | MSN u24
//! ImmDt (4):         immediate u32 (opaque; carried as big-endian bytes)
//! AtomicETH (28):    VA u64 | R_Key u32 | Swap/Add u64 | Compare u64
//! AtomicAckETH (8):  original remote value u64
//! IETH (4):          R_Key u32 (the key the responder invalidates)
//! ```

use super::{need, need_out, Result};
use zerocopy::network_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// DETH length.
pub const DETH_LEN: usize = 8;
/// RETH length.
pub const RETH_LEN: usize = 16;
/// AETH length.
pub const AETH_LEN: usize = 4;
/// ImmDt length.
pub const IMMDT_LEN: usize = 4;
/// IETH length.
pub const IETH_LEN: usize = 4;
/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// CNP reserved bytes after the BTH (RoCEv2 annex A17.9.3).
pub const CNP_RESERVED_LEN: usize = 16;

/// RETH on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RethHeader {
    /// Remote virtual address.
    pub va: U64,
    /// Remote key.
    pub rkey: U32,
    /// DMA length in bytes.
    pub dma_len: U32,
}

/// AtomicETH on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct AtomicEthHeader {
    /// Remote virtual address (8-byte aligned).
    pub va: U64,
    /// Remote key.
    pub rkey: U32,
    /// Swap value (CmpSwap) or add value (FetchAdd).
    pub swap_add: U64,
    /// Compare value (CmpSwap only).
    pub compare: U64,
}

/// Parsed RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses the first 16 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("RETH", RETH_LEN, b.len())?;
        let h = super::header_at::<RethHeader>(b);
        Ok(Self {
            va: h.va.get(),
            rkey: h.rkey.get(),
            dma_len: h.dma_len.get(),
        })
    }

    /// Writes 16 bytes; returns 16.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("RETH", RETH_LEN, buf.len())?;
        let h = RethHeader {
            va: U64::new(self.va),
            rkey: U32::new(self.rkey),
            dma_len: U32::new(self.dma_len),
        };
        buf[..RETH_LEN].copy_from_slice(h.as_bytes());
        Ok(RETH_LEN)
    }
}

/// Parsed DETH (IBA 9.3.2, the datagram extended transport header of UD packets):
/// the Q_Key the sender used and its QP number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key: the receiving UD QP accepts the packet only if it equals its own
    /// (IBA 10.2.4.4 / 9.6.1.3.1).
    pub qkey: u32,
    /// Source QP number (24 bits): the requester's QP (`ibv_wc.src_qp`).
    pub src_qp: u32,
}

impl DethRepr {
    /// Parses the first 8 bytes (the reserved byte 4 is ignored, IBA 9.3.2).
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("DETH", DETH_LEN, b.len())?;
        Ok(Self {
            qkey: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            src_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
        })
    }

    /// Writes 8 bytes (reserved byte zero); returns 8. A source QP above 24 bits is
    /// an error.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("DETH", DETH_LEN, buf.len())?;
        if self.src_qp > 0xFF_FFFF {
            return Err(super::WireError::FieldRange("DETH source QP"));
        }
        let q = self.qkey.to_be_bytes();
        let s = self.src_qp.to_be_bytes();
        buf[..DETH_LEN].copy_from_slice(&[q[0], q[1], q[2], q[3], 0, s[1], s[2], s[3]]);
        Ok(DETH_LEN)
    }
}

/// NAK codes of the AETH (IBA table 43).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NakCode {
    /// 0: PSN sequence error (the requester goes back to the NAK-ed PSN).
    PsnSequenceError,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error (bad R_Key, range or permission).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// Reserved values, carried through.
    Reserved(u8),
}

impl NakCode {
    fn from_bits(v: u8) -> Self {
        match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            o => NakCode::Reserved(o),
        }
    }

    fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(o) => o & 0x1F,
        }
    }
}

/// The AETH syndrome (IBA 9.3.4, table 42): bits 6-5 select ACK / RNR NAK / NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AethSyndrome {
    /// 0b00xxxxx: ACK with a credit count (0x1F = "invalid/unlimited", what rxe sends).
    Ack {
        /// Credit count code (5 bits).
        credits: u8,
    },
    /// 0b01xxxxx: RNR NAK with an RNR timer code (IBA table 45).
    RnrNak {
        /// Timer code (5 bits).
        timer: u8,
    },
    /// 0b11xxxxx: NAK.
    Nak(NakCode),
    /// 0b10xxxxx: reserved.
    Reserved(u8),
}

impl AethSyndrome {
    /// ACK with credit code 0x1F (credits not used), as Linux rxe sends it.
    pub const ACK: AethSyndrome = AethSyndrome::Ack { credits: 0x1F };

    /// Decodes the syndrome byte.
    pub fn from_u8(v: u8) -> Self {
        let low = v & 0x1F;
        match (v >> 5) & 3 {
            0 => AethSyndrome::Ack { credits: low },
            1 => AethSyndrome::RnrNak { timer: low },
            3 => AethSyndrome::Nak(NakCode::from_bits(low)),
            _ => AethSyndrome::Reserved(v),
        }
    }

    /// Encodes the syndrome byte (bit 7 reserved = 0).
    pub fn to_u8(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1F,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            AethSyndrome::Nak(c) => 0x60 | c.bits(),
            AethSyndrome::Reserved(v) => v,
        }
    }
}

/// The RNR timer in nanoseconds for a 5-bit code (IBA table 45; code 0 = 655.36 ms).
pub fn rnr_timer_ns(code: u8) -> u64 {
    const US_X100: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    // Table values are in units of 0.01 ms = 10 us.
    US_X100[(code & 0x1F) as usize] * 10_000
}

/// Parsed AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses 4 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AETH", AETH_LEN, b.len())?;
        Ok(Self {
            syndrome: AethSyndrome::from_u8(b[0]),
            msn: u32::from_be_bytes([0, b[1], b[2], b[3]]),
        })
    }

    /// Writes 4 bytes; returns 4.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("AETH", AETH_LEN, buf.len())?;
        let m = (self.msn & 0xFF_FFFF).to_be_bytes();
        buf[..4].copy_from_slice(&[self.syndrome.to_u8(), m[1], m[2], m[3]]);
        Ok(AETH_LEN)
    }
}

/// Parsed ImmDt (the 4 bytes are opaque to the transport; we keep them as a
/// big-endian u32, as `ibv_wc.imm_data` does in network order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDtRepr(pub u32);

impl ImmDtRepr {
    /// Parses 4 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("ImmDt", IMMDT_LEN, b.len())?;
        Ok(Self(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    }

    /// Writes 4 bytes; returns 4.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("ImmDt", IMMDT_LEN, buf.len())?;
        buf[..4].copy_from_slice(&self.0.to_be_bytes());
        Ok(IMMDT_LEN)
    }
}

/// Parsed IETH (IBA 9.3.8): the R_Key a SEND Last/Only with Invalidate asks the
/// responder to invalidate once the message is placed (IBA 10.6.7.2.4 Remote
/// Invalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IethRepr(pub u32);

impl IethRepr {
    /// Parses 4 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("IETH", IETH_LEN, b.len())?;
        Ok(Self(u32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    }

    /// Writes 4 bytes; returns 4.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("IETH", IETH_LEN, buf.len())?;
        buf[..4].copy_from_slice(&self.0.to_be_bytes());
        Ok(IETH_LEN)
    }
}

/// Parsed AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) operand.
    pub swap_add: u64,
    /// Compare operand (CmpSwap).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Parses 28 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AtomicETH", ATOMIC_ETH_LEN, b.len())?;
        let h = super::header_at::<AtomicEthHeader>(b);
        Ok(Self {
            va: h.va.get(),
            rkey: h.rkey.get(),
            swap_add: h.swap_add.get(),
            compare: h.compare.get(),
        })
    }

    /// Writes 28 bytes; returns 28.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("AtomicETH", ATOMIC_ETH_LEN, buf.len())?;
        let h = AtomicEthHeader {
            va: U64::new(self.va),
            rkey: U32::new(self.rkey),
            swap_add: U64::new(self.swap_add),
            compare: U64::new(self.compare),
        };
        buf[..ATOMIC_ETH_LEN].copy_from_slice(h.as_bytes());
        Ok(ATOMIC_ETH_LEN)
    }
}

/// Parsed AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    /// The remote value before the operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Parses 8 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("AtomicAckETH", ATOMIC_ACK_ETH_LEN, b.len())?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        Ok(Self {
            orig: u64::from_be_bytes(a),
        })
    }

    /// Writes 8 bytes; returns 8.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("AtomicAckETH", ATOMIC_ACK_ETH_LEN, buf.len())?;
        buf[..8].copy_from_slice(&self.orig.to_be_bytes());
        Ok(ATOMIC_ACK_ETH_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_match_iba_codes() {
        assert_eq!(AethSyndrome::Nak(NakCode::PsnSequenceError).to_u8(), 0x60);
        assert_eq!(AethSyndrome::Nak(NakCode::InvalidRequest).to_u8(), 0x61);
        assert_eq!(AethSyndrome::Nak(NakCode::RemoteAccessError).to_u8(), 0x62);
        assert_eq!(
            AethSyndrome::Nak(NakCode::RemoteOperationalError).to_u8(),
            0x63
        );
        assert_eq!(AethSyndrome::RnrNak { timer: 14 }.to_u8(), 0x2E);
        assert_eq!(AethSyndrome::ACK.to_u8(), 0x1F);
        for v in 0u8..=0x7F {
            assert_eq!(AethSyndrome::from_u8(v).to_u8(), v);
        }
        assert_eq!(rnr_timer_ns(13), 960_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(rnr_timer_ns(0), 655_360_000);
    }

    #[test]
    fn roundtrips_and_truncation() {
        let r = RethRepr {
            va: 0x1122_3344_5566_7788,
            rkey: 0xAABB_CCDD,
            dma_len: 4096,
        };
        let mut b = [0u8; 28];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(RethRepr::parse(&b).unwrap(), r);
        assert!(RethRepr::parse(&b[..15]).is_err());
        let a = AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: 0xFF_FFFF,
        };
        a.emit(&mut b).unwrap();
        assert_eq!(AethRepr::parse(&b).unwrap(), a);
        assert!(AethRepr::parse(&b[..3]).is_err());
        let t = AtomicEthRepr {
            va: 8,
            rkey: 9,
            swap_add: 10,
            compare: 11,
        };
        t.emit(&mut b).unwrap();
        assert_eq!(AtomicEthRepr::parse(&b).unwrap(), t);
        assert!(AtomicEthRepr::parse(&b[..27]).is_err());
        let k = AtomicAckEthRepr { orig: u64::MAX - 1 };
        k.emit(&mut b).unwrap();
        assert_eq!(AtomicAckEthRepr::parse(&b).unwrap(), k);
        let d = DethRepr {
            qkey: 0x8001_0203,
            src_qp: 0xAB_CDEF,
        };
        assert_eq!(d.emit(&mut b).unwrap(), 8);
        assert_eq!(&b[..8], &[0x80, 0x01, 0x02, 0x03, 0, 0xAB, 0xCD, 0xEF]);
        assert_eq!(DethRepr::parse(&b).unwrap(), d);
        b[4] = 0x5A; // reserved: ignored
        assert_eq!(DethRepr::parse(&b).unwrap(), d);
        assert!(DethRepr::parse(&b[..7]).is_err());
        assert!(DethRepr {
            src_qp: 1 << 24,
            ..d
        }
        .emit(&mut b)
        .is_err());
        let i = ImmDtRepr(0xDEAD_BEEF);
        i.emit(&mut b).unwrap();
        assert_eq!(ImmDtRepr::parse(&b).unwrap(), i);
        assert!(i.emit(&mut [0u8; 3]).is_err());
    }
}
