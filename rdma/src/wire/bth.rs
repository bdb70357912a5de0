//! Base Transport Header (IBA volume 1, section 9.2) and the opcodes (IBA 9.2.1 table 38)
//! of the three transport services this project speaks: reliable connected (RC),
//! unreliable connected (UC: SEND and RDMA WRITE only) and unreliable datagram (UD: SEND
//! Only, with or without immediate), plus CNP (RoCEv2 annex A17.9.3) and this project's
//! manufacturer-specific opcodes (0xC0-0xFF, IBA 9.2.1) for HPCC++ probes.
//!
//! The transport service is the opcode's top three bits (IBA table 38: RC `000`, UC
//! `001`, RD `010`, UD `011`, CNP `100`, XRC `101`, manufacturer `11x`) and the
//! operation the low five. Each (service, operation) pair this project accepts is its
//! own [`Opcode`] variant whose discriminant is the wire byte, rather than a service
//! field beside an RC-only opcode in [`BthRepr`]: every emitter keeps writing
//! `opcode as u8` (the builder, the header template and its ICRC tables, the golden
//! tests) and the parser keeps one table lookup ([`Opcode::from_u8`]), so the RC paths
//! are byte for byte and instruction for instruction what they were, and `BthRepr`
//! stays 16 bytes. The classifiers ([`Opcode::is_send`], [`Opcode::is_first`], ...)
//! answer for every service, so the transport's checks are shared;
//! [`Opcode::service`] names the service and [`Opcode::in_service`] maps an RC opcode
//! to its UC/UD twin (same low five bits, IBA table 38).
//!
//! ```text
//!  byte 0      1                 2-3      4           5-7      8          9-11
//! +--------+------------------+--------+-----------+--------+----------+--------+
//! | opcode |SE|M|Pad(2)|TVer(4)| P_Key  |F|B|resv6  | DestQP |A| resv7  |  PSN   |
//! +--------+------------------+--------+-----------+--------+----------+--------+
//! ```
//! Byte 4 (FECN/BECN/reserved) is masked in the ICRC (IBA A17.4.5).

use super::{need, need_out, Result, WireError};
use zerocopy::network_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Length of the BTH.
pub const HEADER_LEN: usize = 12;
/// The default partition key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

bitflags::bitflags! {
    /// Flag bits of BTH byte 1 (the pad count and TVer live in the same byte).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct BthFlags: u8 {
        /// Solicited event.
        const SE = 0x80;
        /// Migration state.
        const MIG = 0x40;
    }
}

/// The BTH as it lies on the wire.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct BthHeader {
    /// Opcode.
    pub opcode: u8,
    /// SE | M | PadCnt(2) | TVer(4).
    pub flags: u8,
    /// Partition key.
    pub pkey: U16,
    /// FECN | BECN | reserved (RoCEv2: reserved).
    pub fecn_becn: u8,
    /// Destination QP number (24 bits).
    pub dest_qp: [u8; 3],
    /// AckReq | reserved.
    pub ack_req: u8,
    /// Packet sequence number (24 bits).
    pub psn: [u8; 3],
}

/// The transport service of an opcode (IBA 9.2.1 table 38, the opcode's top three
/// bits; `ibv_qp_type` `IBV_QPT_RC`, `IBV_QPT_UC`, `IBV_QPT_UD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Service {
    /// Reliable connected (`000`).
    #[default]
    Rc = 0x00,
    /// Unreliable connected (`001`, IBA 9.8 / 9.7 rules for UC).
    Uc = 0x20,
    /// Unreliable datagram (`011`, IBA 9.8).
    Ud = 0x60,
}

macro_rules! opcodes {
    ($( $(#[$m:meta])* $name:ident = $v:expr ),* $(,)?) => {
        /// BTH opcodes this implementation emits and accepts (RC, UC, UD: IBA table 38;
        /// CNP; probe opcodes in the manufacturer-specific range).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode { $( $(#[$m])* $name = $v ),* }

        impl Opcode {
            /// Decodes a byte; unknown values are an error.
            pub fn from_u8(v: u8) -> Result<Opcode> {
                match v { $( $v => Ok(Opcode::$name), )* o => Err(WireError::UnknownOpcode(o)) }
            }
        }
    };
}

opcodes! {
    /// RC SEND First.
    SendFirst = 0x00,
    /// RC SEND Middle.
    SendMiddle = 0x01,
    /// RC SEND Last.
    SendLast = 0x02,
    /// RC SEND Last with Immediate.
    SendLastImm = 0x03,
    /// RC SEND Only.
    SendOnly = 0x04,
    /// RC SEND Only with Immediate.
    SendOnlyImm = 0x05,
    /// RC RDMA WRITE First.
    WriteFirst = 0x06,
    /// RC RDMA WRITE Middle.
    WriteMiddle = 0x07,
    /// RC RDMA WRITE Last.
    WriteLast = 0x08,
    /// RC RDMA WRITE Last with Immediate.
    WriteLastImm = 0x09,
    /// RC RDMA WRITE Only.
    WriteOnly = 0x0A,
    /// RC RDMA WRITE Only with Immediate.
    WriteOnlyImm = 0x0B,
    /// RC RDMA READ Request.
    ReadRequest = 0x0C,
    /// RC RDMA READ Response First.
    ReadResponseFirst = 0x0D,
    /// RC RDMA READ Response Middle.
    ReadResponseMiddle = 0x0E,
    /// RC RDMA READ Response Last.
    ReadResponseLast = 0x0F,
    /// RC RDMA READ Response Only.
    ReadResponseOnly = 0x10,
    /// RC Acknowledge.
    Acknowledge = 0x11,
    /// RC ATOMIC Acknowledge.
    AtomicAcknowledge = 0x12,
    /// RC CmpSwap.
    CompareSwap = 0x13,
    /// RC FetchAdd.
    FetchAdd = 0x14,
    /// RC SEND Last with Invalidate (IETH after the BTH).
    SendLastInv = 0x16,
    /// RC SEND Only with Invalidate (IETH after the BTH).
    SendOnlyInv = 0x17,
    /// UC SEND First.
    UcSendFirst = 0x20,
    /// UC SEND Middle.
    UcSendMiddle = 0x21,
    /// UC SEND Last.
    UcSendLast = 0x22,
    /// UC SEND Last with Immediate.
    UcSendLastImm = 0x23,
    /// UC SEND Only.
    UcSendOnly = 0x24,
    /// UC SEND Only with Immediate.
    UcSendOnlyImm = 0x25,
    /// UC RDMA WRITE First.
    UcWriteFirst = 0x26,
    /// UC RDMA WRITE Middle.
    UcWriteMiddle = 0x27,
    /// UC RDMA WRITE Last.
    UcWriteLast = 0x28,
    /// UC RDMA WRITE Last with Immediate.
    UcWriteLastImm = 0x29,
    /// UC RDMA WRITE Only.
    UcWriteOnly = 0x2A,
    /// UC RDMA WRITE Only with Immediate.
    UcWriteOnlyImm = 0x2B,
    /// UD SEND Only (DETH after the BTH).
    UdSendOnly = 0x64,
    /// UD SEND Only with Immediate (DETH, then ImmDt).
    UdSendOnlyImm = 0x65,
    /// RoCEv2 Congestion Notification Packet (annex A17.9.3).
    Cnp = 0x81,
    /// HPCC++ probe request (manufacturer-specific, this project).
    Probe = 0xC0,
    /// HPCC++ probe response carrying echoed telemetry (manufacturer-specific).
    ProbeResponse = 0xC1,
}

impl Opcode {
    /// The transport service (the top three bits; CNP and the manufacturer-specific
    /// probe opcodes count as RC: they travel on connected QPs).
    #[inline]
    pub fn service(self) -> Service {
        match (self as u8) >> 5 {
            1 => Service::Uc,
            3 => Service::Ud,
            _ => Service::Rc,
        }
    }

    /// The opcode of the same operation in service `s` (IBA table 38: the low five
    /// bits name the operation), if that service has it: UC has SEND and RDMA WRITE,
    /// UD only SEND Only (with or without immediate).
    #[inline]
    pub fn in_service(self, s: Service) -> Option<Opcode> {
        if self.service() != Service::Rc || !(self.is_send() || self.is_write()) {
            return None;
        }
        Opcode::from_u8((self as u8) | s as u8).ok()
    }

    /// Carries a RETH (WRITE First/Only, READ Request; UC WRITE First/Only).
    #[inline]
    pub fn has_reth(self) -> bool {
        self.info(RETH)
    }

    /// Carries a DETH (UD, IBA 9.3.2).
    #[inline]
    pub fn has_deth(self) -> bool {
        self.info(DETH)
    }

    /// Carries an AETH (READ Response First/Last/Only, Acknowledge, Atomic Acknowledge).
    #[inline]
    pub fn has_aeth(self) -> bool {
        self.info(AETH)
    }

    /// Carries an ImmDt.
    #[inline]
    pub fn has_immdt(self) -> bool {
        self.info(IMMDT)
    }

    /// Carries an IETH (RC SEND Last/Only with Invalidate).
    #[inline]
    pub fn has_ieth(self) -> bool {
        self.info(IETH)
    }

    /// Carries an AtomicETH.
    #[inline]
    pub fn has_atomic_eth(self) -> bool {
        self.info(ATOMIC_ETH)
    }

    /// Carries an AtomicAckETH.
    #[inline]
    pub fn has_atomic_ack_eth(self) -> bool {
        self.info(ATOMIC_ACK_ETH)
    }

    /// May carry a payload.
    #[inline]
    pub fn has_payload(self) -> bool {
        self.info(SEND | WRITE | READ_RESPONSE)
    }

    /// Any SEND opcode (RC, UC or UD).
    #[inline]
    pub fn is_send(self) -> bool {
        self.info(SEND)
    }

    /// Any RDMA WRITE opcode (RC or UC).
    #[inline]
    pub fn is_write(self) -> bool {
        self.info(WRITE)
    }

    /// Any READ response opcode.
    #[inline]
    pub fn is_read_response(self) -> bool {
        self.info(READ_RESPONSE)
    }

    /// A request the responder processes (SEND, WRITE, READ Request, ATOMIC; UC and
    /// UD requests too).
    #[inline]
    pub fn is_request(self) -> bool {
        self.info(REQUEST)
    }

    /// A response the requester processes (READ responses, ACK, ATOMIC ACK).
    #[inline]
    pub fn is_response(self) -> bool {
        self.info(RESPONSE)
    }

    /// First packet of a multi-packet message.
    #[inline]
    pub fn is_first(self) -> bool {
        self.info(FIRST)
    }

    /// Middle packet of a multi-packet message.
    #[inline]
    pub fn is_middle(self) -> bool {
        self.info(MIDDLE)
    }

    /// Last packet of a multi-packet message.
    #[inline]
    pub fn is_last(self) -> bool {
        self.info(LAST)
    }

    /// Single-packet message.
    #[inline]
    pub fn is_only(self) -> bool {
        self.info(ONLY)
    }

    /// Length of the extension headers after the BTH that the opcode implies (DETH,
    /// RETH, AETH, ImmDt, AtomicETH, AtomicAckETH; CNP's 16 reserved bytes), CC ext
    /// excluded.
    #[inline]
    pub fn ext_len(self) -> usize {
        usize::from(EXT_LEN[self as usize])
    }

    /// Whether any of the `bits` of [`OPCODE_INFO`] is set for this opcode: one load
    /// from a 1 KiB table, whatever the service (the RC receive path asks several
    /// of these per packet, and a `matches!` over opcodes spread across 0x00-0x65
    /// compiled to compare chains).
    #[inline(always)]
    fn info(self, bits: u32) -> bool {
        OPCODE_INFO[self as usize] & bits != 0
    }
}

// What each opcode carries and is ([`OPCODE_INFO`] bits).
const RETH: u32 = 1 << 0;
const DETH: u32 = 1 << 1;
const AETH: u32 = 1 << 2;
const IMMDT: u32 = 1 << 3;
const ATOMIC_ETH: u32 = 1 << 4;
const ATOMIC_ACK_ETH: u32 = 1 << 5;
const SEND: u32 = 1 << 6;
const WRITE: u32 = 1 << 7;
const READ_RESPONSE: u32 = 1 << 8;
const REQUEST: u32 = 1 << 9;
const RESPONSE: u32 = 1 << 10;
const FIRST: u32 = 1 << 11;
const MIDDLE: u32 = 1 << 12;
const LAST: u32 = 1 << 13;
const ONLY: u32 = 1 << 14;
const CNP_RESERVED: u32 = 1 << 15;
const IETH: u32 = 1 << 16;

/// The properties of an RC opcode by its low five bits (IBA 9.2.1 table 38; the
/// UC and UD twins share them, the service bits aside).
const fn rc_info(op: u8) -> u32 {
    match op {
        0x00 => SEND | REQUEST | FIRST,
        0x01 => SEND | REQUEST | MIDDLE,
        0x02 => SEND | REQUEST | LAST,
        0x03 => SEND | REQUEST | LAST | IMMDT,
        0x04 => SEND | REQUEST | ONLY,
        0x05 => SEND | REQUEST | ONLY | IMMDT,
        0x06 => WRITE | REQUEST | FIRST | RETH,
        0x07 => WRITE | REQUEST | MIDDLE,
        0x08 => WRITE | REQUEST | LAST,
        0x09 => WRITE | REQUEST | LAST | IMMDT,
        0x0A => WRITE | REQUEST | ONLY | RETH,
        0x0B => WRITE | REQUEST | ONLY | RETH | IMMDT,
        0x0C => REQUEST | RETH,
        0x0D => READ_RESPONSE | RESPONSE | FIRST | AETH,
        0x0E => READ_RESPONSE | RESPONSE | MIDDLE,
        0x0F => READ_RESPONSE | RESPONSE | LAST | AETH,
        0x10 => READ_RESPONSE | RESPONSE | ONLY | AETH,
        0x11 => RESPONSE | AETH,
        0x12 => RESPONSE | AETH | ATOMIC_ACK_ETH,
        0x13 | 0x14 => REQUEST | ATOMIC_ETH,
        0x16 => SEND | REQUEST | LAST | IETH,
        0x17 => SEND | REQUEST | ONLY | IETH,
        _ => 0,
    }
}

/// [`Opcode`]'s classifiers as one table indexed by the opcode byte (0 for bytes
/// that are no opcode of ours).
const OPCODE_INFO: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut v = 0usize;
    while v < 256 {
        let b = v as u8;
        t[v] = match b >> 5 {
            // RC, and the RC-like CNP below.
            0 => rc_info(b),
            // UC: SEND and RDMA WRITE (0x20-0x2B).
            1 if b & 0x1F <= 0x0B => rc_info(b & 0x1F),
            // UD: SEND Only, with or without immediate (0x64, 0x65).
            3 if b == 0x64 || b == 0x65 => rc_info(b & 0x1F) | DETH,
            _ => 0,
        };
        v += 1;
    }
    t[Opcode::Cnp as usize] = CNP_RESERVED;
    t
};

/// [`Opcode::ext_len`] by opcode byte.
const EXT_LEN: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut v = 0usize;
    while v < 256 {
        let f = OPCODE_INFO[v];
        let mut n = 0u8;
        if f & DETH != 0 {
            n += 8;
        }
        if f & RETH != 0 {
            n += 16;
        }
        if f & AETH != 0 {
            n += 4;
        }
        if f & (IMMDT | IETH) != 0 {
            n += 4;
        }
        if f & ATOMIC_ETH != 0 {
            n += 28;
        }
        if f & ATOMIC_ACK_ETH != 0 {
            n += 8;
        }
        if f & CNP_RESERVED != 0 {
            n += 16;
        }
        t[v] = n;
        v += 1;
    }
    t
};

/// A zero-copy view of a BTH.
#[derive(Debug, Clone)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps `buffer` after checking it holds 12 bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("BTH", HEADER_LEN, buffer.as_ref().len())?;
        Ok(Self { buffer })
    }

    /// The header.
    pub fn header(&self) -> &BthHeader {
        super::header_at::<BthHeader>(self.buffer.as_ref())
    }

    /// Raw opcode byte.
    pub fn opcode_raw(&self) -> u8 {
        self.header().opcode
    }

    /// Destination QP (24 bits).
    pub fn dest_qp(&self) -> u32 {
        let d = self.header().dest_qp;
        u32::from_be_bytes([0, d[0], d[1], d[2]])
    }

    /// PSN (24 bits).
    pub fn psn(&self) -> u32 {
        let d = self.header().psn;
        u32::from_be_bytes([0, d[0], d[1], d[2]])
    }

    /// Bytes after the BTH.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

/// Parsed BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// SE / M flags.
    pub flags: BthFlags,
    /// Pad count (0..=3): bytes of zero padding before the ICRC (IBA 9.2.3).
    pub pad: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN/BECN byte as received (not part of the ICRC).
    pub fecn_becn: u8,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// AckReq: the responder should acknowledge this packet (IBA 9.2.6).
    pub ack_req: bool,
    /// PSN (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// A BTH with defaults (pkey 0xFFFF, no flags, no pad).
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        Self {
            opcode,
            flags: BthFlags::empty(),
            pad: 0,
            pkey: DEFAULT_PKEY,
            fecn_becn: 0,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parses a checked view; rejects unknown opcodes and TVer != 0.
    // Always inlined into `frame::parse_frame`: its docs say why.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<Self> {
        let h = p.header();
        let opcode = Opcode::from_u8(h.opcode)?;
        let tver = h.flags & 0xF;
        if tver != 0 {
            return Err(WireError::BadTver(tver));
        }
        Ok(Self {
            opcode,
            flags: BthFlags::from_bits_truncate(h.flags),
            pad: (h.flags >> 4) & 3,
            pkey: h.pkey.get(),
            fecn_becn: h.fecn_becn,
            dest_qp: p.dest_qp(),
            ack_req: h.ack_req & 0x80 != 0,
            psn: p.psn(),
        })
    }

    /// Writes the 12-byte BTH; returns 12.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("BTH", HEADER_LEN, buf.len())?;
        if self.dest_qp > 0xFF_FFFF || self.psn > 0xFF_FFFF || self.pad > 3 {
            return Err(WireError::FieldRange("BTH QPN/PSN/pad"));
        }
        let q = self.dest_qp.to_be_bytes();
        let s = self.psn.to_be_bytes();
        let h = BthHeader {
            opcode: self.opcode as u8,
            flags: self.flags.bits() | (self.pad << 4),
            pkey: U16::new(self.pkey),
            fecn_becn: self.fecn_becn,
            dest_qp: [q[1], q[2], q[3]],
            ack_req: if self.ack_req { 0x80 } else { 0 },
            psn: [s[1], s[2], s[3]],
        };
        buf[..HEADER_LEN].copy_from_slice(h.as_bytes());
        Ok(HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_bytes() {
        let mut r = BthRepr::new(Opcode::WriteOnlyImm, 0x12_3456, 0xAB_CDEF);
        r.ack_req = true;
        r.pad = 2;
        r.flags = BthFlags::SE;
        let mut b = [0u8; 12];
        r.emit(&mut b).unwrap();
        assert_eq!(
            b,
            [0x0B, 0xA0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF]
        );
        assert_eq!(
            BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        b[0] = 0x15;
        assert_eq!(
            BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()),
            Err(WireError::UnknownOpcode(0x15))
        );
        // Table 38's holes: RD (010), UC READ (0x2C), UD SEND First (0x60), XRC.
        for v in [0x40, 0x2C, 0x60, 0x66, 0xA0] {
            b[0] = v;
            assert_eq!(
                BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()),
                Err(WireError::UnknownOpcode(v))
            );
        }
        b[0] = 0x0B;
        b[1] = 0x01;
        assert_eq!(
            BthRepr::parse(&BthPacket::new_checked(&b[..]).unwrap()),
            Err(WireError::BadTver(1))
        );
        assert!(BthPacket::new_checked(&b[..11]).is_err());
        r.psn = 1 << 24;
        assert!(r.emit(&mut b).is_err());
    }

    #[test]
    fn opcode_classes() {
        for v in 0u8..=0xFF {
            let Ok(o) = Opcode::from_u8(v) else { continue };
            assert_eq!(o as u8, v);
            // Exactly one of first/middle/last/only for payload-carrying opcodes.
            if o.has_payload() {
                let n = [o.is_first(), o.is_middle(), o.is_last(), o.is_only()]
                    .iter()
                    .filter(|x| **x)
                    .count();
                assert_eq!(n, 1, "{o:?}");
            }
            assert!(!(o.is_request() && o.is_response()));
            // The service is the top three bits, and an RC SEND/WRITE maps to its
            // UC/UD twin with the same low five bits (IBA table 38).
            let svc = match v >> 5 {
                1 => Service::Uc,
                3 => Service::Ud,
                _ => Service::Rc,
            };
            assert_eq!(o.service(), svc, "{o:?}");
            if svc != Service::Rc {
                let rc = Opcode::from_u8(v & 0x1F).unwrap();
                assert_eq!(rc.in_service(svc), Some(o));
                for f in [
                    Opcode::has_reth,
                    Opcode::has_immdt,
                    Opcode::has_payload,
                    Opcode::is_send,
                    Opcode::is_write,
                    Opcode::is_first,
                    Opcode::is_middle,
                    Opcode::is_last,
                    Opcode::is_only,
                    Opcode::is_request,
                ] {
                    assert_eq!(f(o), f(rc), "{o:?} vs {rc:?}");
                }
                assert!(!o.is_response() && !o.has_aeth() && !o.has_atomic_eth());
            }
            assert_eq!(o.has_deth(), svc == Service::Ud);
        }
        // Exactly the opcodes of table 38 each service has here.
        let count = |s| {
            (0u8..=0xFF)
                .filter(|&v| Opcode::from_u8(v).is_ok_and(|o| o.service() == s && o.is_request()))
                .count()
        };
        assert_eq!(
            (count(Service::Rc), count(Service::Uc), count(Service::Ud)),
            (17, 12, 2)
        );
        assert_eq!(Opcode::ReadRequest.in_service(Service::Uc), None);
        // SEND with Invalidate is RC's alone (IBA table 38: no UC/UD twin).
        assert_eq!(Opcode::SendOnlyInv.in_service(Service::Uc), None);
        assert_eq!(Opcode::SendLastInv.in_service(Service::Ud), None);
        assert!(Opcode::SendOnlyInv.has_ieth() && Opcode::SendOnlyInv.is_only());
        assert!(Opcode::SendLastInv.has_ieth() && Opcode::SendLastInv.is_last());
        assert_eq!(Opcode::SendOnlyInv.ext_len(), 4);
        assert!(!Opcode::SendOnlyImm.has_ieth());
        assert_eq!(Opcode::WriteOnly.in_service(Service::Ud), None);
        assert_eq!(Opcode::SendFirst.in_service(Service::Ud), None);
        assert_eq!(
            Opcode::SendOnlyImm.in_service(Service::Ud),
            Some(Opcode::UdSendOnlyImm)
        );
        assert_eq!(
            Opcode::SendOnly.in_service(Service::Rc),
            Some(Opcode::SendOnly)
        );
        assert_eq!(Opcode::WriteOnlyImm.ext_len(), 20);
        assert_eq!(Opcode::UcWriteOnlyImm.ext_len(), 20);
        assert_eq!(Opcode::UdSendOnly.ext_len(), 8);
        assert_eq!(Opcode::UdSendOnlyImm.ext_len(), 12);
        assert_eq!(Opcode::ReadResponseMiddle.ext_len(), 0);
        assert_eq!(Opcode::CompareSwap.ext_len(), 28);
        assert_eq!(Opcode::AtomicAcknowledge.ext_len(), 12);
    }
}
