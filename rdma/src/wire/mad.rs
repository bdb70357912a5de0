//! Management datagrams (IBA vol. 1 13.4): the 256-byte MADs that QP1 (the GSI)
//! carries as the payload of a UD SEND Only, behind a 24-byte common header. The
//! communication manager's messages ([`super::cm`]) are MADs of class 0x07.
//!
//! ```text
//! MAD header (24 bytes, IBA 13.4.3, table 145):
//!  0 BaseVersion u8 (1) | 1 MgmtClass u8 | 2 ClassVersion u8 | 3 R(1)·Method(7)
//!  4 Status u16 | 6 ClassSpecific u16
//!  8 TransactionID u64
//! 16 AttributeID u16 | 18 reserved u16 | 20 AttributeModifier u32
//! 24 class data (232 bytes)
//! ```
//!
//! On RoCE v2 a GSI MAD travels as a UD SEND Only to QP 1 with P_Key 0xFFFF and the
//! DETH's Q_Key [`GSI_QKEY`] (IBA annex A17; Linux rxe drops any other Q_Key there).

use super::{need, need_out, Result, WireError};
use zerocopy::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A MAD's length: header and class data (IBA 13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header's length.
pub const HEADER_LEN: usize = 24;
/// Class data after the header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The base version of every MAD this side speaks (IBA 13.4.3).
pub const BASE_VERSION: u8 = 1;
/// The Q_Key of QP 1, the general services interface (IBA 10.2.4.5: `0x80010000`).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// QP 1's number: the GSI.
pub const GSI_QPN: u32 = 1;
/// Method Send (IBA 13.4.5, table 147): what every CM message uses.
pub const METHOD_SEND: u8 = 0x03;

/// The common MAD header on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MadHeader {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Response bit (7) and method (6..0).
    pub method: u8,
    /// Status.
    pub status: U16,
    /// Class-specific.
    pub class_specific: U16,
    /// Transaction ID.
    pub tid: U64,
    /// Attribute ID.
    pub attr_id: U16,
    /// Reserved.
    pub reserved: U16,
    /// Attribute modifier.
    pub attr_mod: U32,
}

/// A zero-copy view of a MAD: at least [`MAD_LEN`] bytes (a GSI SEND may carry
/// trailing padding), base version 1.
#[derive(Debug, Clone)]
pub struct MadPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> MadPacket<T> {
    /// Checks the length and the base version.
    pub fn new_checked(buf: T) -> Result<Self> {
        need("MAD", MAD_LEN, buf.as_ref().len())?;
        let p = Self { buf };
        if p.header().base_version != BASE_VERSION {
            return Err(WireError::FieldRange("MAD base version is not 1"));
        }
        Ok(p)
    }

    /// The header.
    pub fn header(&self) -> &MadHeader {
        MadHeader::ref_from_prefix(self.buf.as_ref())
            .map(|(h, _)| h)
            .expect("length checked")
    }

    /// The class data (232 bytes).
    pub fn data(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..MAD_LEN]
    }
}

/// A parsed MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadRepr {
    /// Management class (the CM's is 0x07).
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method (7 bits) with the response bit (0x80).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadRepr {
    /// Parses the header of a checked MAD.
    pub fn parse<T: AsRef<[u8]>>(p: &MadPacket<T>) -> Self {
        let h = p.header();
        Self {
            mgmt_class: h.mgmt_class,
            class_version: h.class_version,
            method: h.method,
            status: h.status.get(),
            class_specific: h.class_specific.get(),
            tid: h.tid.get(),
            attr_id: h.attr_id.get(),
            attr_mod: h.attr_mod.get(),
        }
    }

    /// Writes the 24-byte header; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("MAD header", HEADER_LEN, buf.len())?;
        let h = MadHeader {
            base_version: BASE_VERSION,
            mgmt_class: self.mgmt_class,
            class_version: self.class_version,
            method: self.method,
            status: self.status.into(),
            class_specific: self.class_specific.into(),
            tid: self.tid.into(),
            attr_id: self.attr_id.into(),
            reserved: 0.into(),
            attr_mod: self.attr_mod.into(),
        };
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        Ok(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_checks() {
        let r = MadRepr {
            mgmt_class: 0x07,
            class_version: 2,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid: 0x1122_3344_5566_7788,
            attr_id: 0x10,
            attr_mod: 0,
        };
        let mut b = [0u8; MAD_LEN];
        assert_eq!(r.emit(&mut b).unwrap(), HEADER_LEN);
        assert_eq!(&b[..4], &[1, 7, 2, 3]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..18], &[0, 0x10]);
        let p = MadPacket::new_checked(&b[..]).unwrap();
        assert_eq!(MadRepr::parse(&p), r);
        assert_eq!(p.data().len(), DATA_LEN);
        assert!(MadPacket::new_checked(&b[..255]).is_err());
        b[0] = 2;
        assert!(MadPacket::new_checked(&b[..]).is_err());
        assert!(r.emit(&mut [0u8; 23]).is_err());
    }
}
