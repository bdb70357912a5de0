//! The CC extension header: this project's per-QP option that sits right after the BTH
//! (before RETH/AETH/...) on QPs whose two ends negotiated a CC that needs it (HPCC++,
//! Rx-HPCC, LDCP). QPs with CC `none` or `dcqcn` never carry it and stay plain RoCEv2.
//!
//! It carries the LDCP sequence number (LSN; LDCP draft section 3.1: a byte sequence shared
//! by SEND/WRITE/READ requests, with READ responses in their own LSN space), flags, and on
//! ACKs the acknowledged LSN, the number of CE marks seen (ECN echo), the receiver window
//! (Rx-HPCC, HPCC++ draft section 6.2) and echoed INT hop records (HPCC++ section 3).
//!
//! ```text
//!  byte 0        1        2        3        4..8          [8..12]        [..+16*n]
//! +--------+--------+--------+--------+---------------+--------------+-------------+
//! |Ver=1|r |  flags | n_hops |ce_count| LSN (u32, BE) | window (u32) | hop records |
//! +--------+--------+--------+--------+---------------+--------------+-------------+
//! ```
//! - `LSN`: on data packets, the LSN of the packet's first byte; on ACKs (flag ACK) the
//!   cumulative LSN acknowledged (the next LSN the receiver expects). Wraps mod 2^32.
//! - `window` is present iff flag WINDOW; bytes, saturating at u32::MAX.
//! - `n_hops` hop records (16 bytes each, the INT format of [`crate::wire::int`], newest
//!   first) follow iff flag TELEMETRY; at most [`MAX_ECHO_HOPS`].

use super::int::{HopRecord, HOP_LEN};
use super::{need, need_out, Result, WireError};

/// Fixed part of the CC extension.
pub const BASE_LEN: usize = 8;
/// Version carried in the high nibble of byte 0.
pub const VERSION: u8 = 1;
/// Most hop records an ACK echoes (datacenter paths have at most 5 switch hops, HPCC++
/// section 7.1; 8 leaves room and keeps an ACK under 160 bytes).
pub const MAX_ECHO_HOPS: usize = 8;

bitflags::bitflags! {
    /// CC extension flags (byte 1).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct CcExtFlags: u8 {
        /// LDCP fast-start packet (first RTT; sent Not-ECT except the last one).
        const FAST_START = 0x01;
        /// HPCC++ probe (telemetry request/response).
        const PROBE = 0x02;
        /// The extension is on an ACK: LSN is the acknowledged LSN.
        const ACK = 0x04;
        /// A 4-byte receiver-computed window follows (Rx-HPCC).
        const WINDOW = 0x08;
        /// `n_hops` echoed hop records follow.
        const TELEMETRY = 0x10;
        /// The LSN is in the READ-response space (responder-to-requester data, or an ACK
        /// of READ responses sent by the requester, LDCP section 3.1).
        const RESP_SPACE = 0x20;
    }
}

/// A zero-copy view of a CC extension header.
#[derive(Debug, Clone)]
pub struct CcExtPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> CcExtPacket<T> {
    /// Validates version, hop count and that the buffer holds the whole extension.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        need("CC extension", BASE_LEN, b.len())?;
        let v = b[0] >> 4;
        if v != VERSION {
            return Err(WireError::CcExtBadVersion(v));
        }
        let flags = CcExtFlags::from_bits_truncate(b[1]);
        let n = if flags.contains(CcExtFlags::TELEMETRY) {
            b[2] as usize
        } else {
            0
        };
        if n > MAX_ECHO_HOPS {
            return Err(WireError::CcExtTooManyHops(b[2]));
        }
        let len = BASE_LEN
            + if flags.contains(CcExtFlags::WINDOW) {
                4
            } else {
                0
            }
            + n * HOP_LEN;
        need("CC extension", len, b.len())?;
        Ok(Self { buffer })
    }

    /// Flags.
    pub fn flags(&self) -> CcExtFlags {
        CcExtFlags::from_bits_truncate(self.buffer.as_ref()[1])
    }

    /// Echoed hop count.
    pub fn hop_count(&self) -> usize {
        if self.flags().contains(CcExtFlags::TELEMETRY) {
            self.buffer.as_ref()[2] as usize
        } else {
            0
        }
    }

    /// Extension length in bytes.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        BASE_LEN
            + if self.flags().contains(CcExtFlags::WINDOW) {
                4
            } else {
                0
            }
            + self.hop_count() * HOP_LEN
    }

    fn hops_off(&self) -> usize {
        BASE_LEN
            + if self.flags().contains(CcExtFlags::WINDOW) {
                4
            } else {
                0
            }
    }

    /// Echoed hop record `i` (newest first).
    pub fn hop(&self, i: usize) -> Option<HopRecord> {
        if i >= self.hop_count() {
            return None;
        }
        let o = self.hops_off() + i * HOP_LEN;
        HopRecord::parse(&self.buffer.as_ref()[o..o + HOP_LEN]).ok()
    }
}

/// Parsed CC extension (hop records copied into a fixed array: no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CcExtRepr {
    /// Flags (WINDOW and TELEMETRY are derived from `window` and `n_hops` on emit).
    pub flags: CcExtFlags,
    /// CE-marked packets covered by this ACK (saturating).
    pub ce_count: u8,
    /// LSN (data) or acknowledged LSN (ACK).
    pub lsn: u32,
    /// Receiver-computed window in bytes (Rx-HPCC).
    pub window: Option<u32>,
    /// Number of valid entries in `hops`.
    pub n_hops: u8,
    /// Echoed hop records, newest first.
    pub hops: [HopRecord; MAX_ECHO_HOPS],
}

impl CcExtRepr {
    /// A data-packet extension carrying `lsn`.
    pub fn data(lsn: u32, flags: CcExtFlags) -> Self {
        Self {
            flags,
            lsn,
            ..Default::default()
        }
    }

    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &CcExtPacket<T>) -> Result<Self> {
        let b = p.buffer.as_ref();
        let flags = p.flags();
        let window = if flags.contains(CcExtFlags::WINDOW) {
            Some(u32::from_be_bytes([b[8], b[9], b[10], b[11]]))
        } else {
            None
        };
        let mut hops = [HopRecord::default(); MAX_ECHO_HOPS];
        let n = p.hop_count();
        for (i, h) in hops.iter_mut().enumerate().take(n) {
            *h = p.hop(i).unwrap_or_default();
        }
        Ok(Self {
            flags: flags - CcExtFlags::WINDOW - CcExtFlags::TELEMETRY,
            ce_count: b[3],
            lsn: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            window,
            n_hops: n as u8,
            hops,
        })
    }

    /// Bytes this extension occupies.
    pub fn buffer_len(&self) -> usize {
        BASE_LEN + if self.window.is_some() { 4 } else { 0 } + self.n_hops as usize * HOP_LEN
    }

    /// Writes the extension; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if self.n_hops as usize > MAX_ECHO_HOPS {
            return Err(WireError::CcExtTooManyHops(self.n_hops));
        }
        let len = self.buffer_len();
        need_out("CC extension", len, buf.len())?;
        let mut flags = self.flags - CcExtFlags::WINDOW - CcExtFlags::TELEMETRY;
        if self.window.is_some() {
            flags |= CcExtFlags::WINDOW;
        }
        if self.n_hops > 0 {
            flags |= CcExtFlags::TELEMETRY;
        }
        buf[0] = VERSION << 4;
        buf[1] = flags.bits();
        buf[2] = self.n_hops;
        buf[3] = self.ce_count;
        buf[4..8].copy_from_slice(&self.lsn.to_be_bytes());
        let mut o = BASE_LEN;
        if let Some(w) = self.window {
            buf[8..12].copy_from_slice(&w.to_be_bytes());
            o += 4;
        }
        for h in &self.hops[..self.n_hops as usize] {
            o += h.emit(&mut buf[o..])?;
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_with_window_and_hops() {
        let mut r = CcExtRepr::data(0xFFFF_FFF0, CcExtFlags::ACK | CcExtFlags::RESP_SPACE);
        r.ce_count = 3;
        r.window = Some(123_456);
        r.n_hops = 2;
        r.hops[0] = HopRecord::from_units(1, 2, 3, 4, 640, 100_000_000_000);
        r.hops[1] = HopRecord::from_units(5, 6, 7, 8, 64, 25_000_000_000);
        let mut b = [0u8; 64];
        let n = r.emit(&mut b).unwrap();
        assert_eq!(n, 8 + 4 + 32);
        assert_eq!(b[0], 0x10);
        assert_eq!(
            b[1],
            (CcExtFlags::ACK | CcExtFlags::RESP_SPACE | CcExtFlags::WINDOW | CcExtFlags::TELEMETRY)
                .bits()
        );
        let p = CcExtPacket::new_checked(&b[..n]).unwrap();
        assert_eq!(p.len(), n);
        assert_eq!(CcExtRepr::parse(&p).unwrap(), r);
        assert!(CcExtPacket::new_checked(&b[..n - 1]).is_err());
        let mut c = b;
        c[2] = 9;
        assert_eq!(
            CcExtPacket::new_checked(&c[..]).err(),
            Some(WireError::CcExtTooManyHops(9))
        );
        c[0] = 0x20;
        assert_eq!(
            CcExtPacket::new_checked(&c[..]).err(),
            Some(WireError::CcExtBadVersion(2))
        );
        let d = CcExtRepr::data(7, CcExtFlags::FAST_START);
        assert_eq!(d.emit(&mut b).unwrap(), 8);
        assert_eq!(&b[..8], &[0x10, 1, 0, 0, 0, 0, 0, 7]);
    }
}
