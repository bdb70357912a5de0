//! P4.org INT-MD v2.0 container over UDP, carried between the UDP header and the BTH.
//!
//! This layout is a contract between the NIC (which inserts an empty container and strips
//! it on receive) and the switch (which pushes one hop record per egress). It follows the
//! INT v2.0 dataplane specification, section 5.6 (INT over UDP, "INT-MD" mode: shim,
//! metadata header, metadata stack), with a domain-specific instruction for the HPCC hop
//! record (HPCC++ draft section 4, the per-link `ts`, `txBytes`, `qlen`, `B`).
//!
//! Presence of the container is signalled by the IPv4 DSCP equal to a configured value
//! ([`DEFAULT_INT_DSCP`] = 0x18 unless configured otherwise; every function takes it as a
//! parameter). The UDP destination port stays 4791.
//!
//! ```text
//! shim (4 bytes)
//!  byte 0: Type(4)=1 INT-MD | NPT(2)=0 | reserved(2)
//!  byte 1: Length = container length in 4-byte words, shim included = 4 + 4*hops
//!  byte 2: reserved 0
//!  byte 3: original DSCP << 2 (informational; restored on strip)
//! MD header (12 bytes)
//!  word 0: Ver(4)=2 | D(1) | E(1) | M(1) | reserved(12) | HopML(5)=4 | RemainingHopCnt(8)
//!  bytes 4-5: Instruction bitmap = 0      bytes 6-7: Domain Specific ID = 0x4850
//!  bytes 8-9: DS Instruction = 0x8000     bytes 10-11: DS Flags = 0
//! hop records (16 bytes each, newest first, right after the MD header)
//!  [0..2] switch_id  [2..4] egress port  [4..8] egress ts ns mod 2^32
//!  [8..12] tx_bytes before this packet mod 2^32  [12..14] qlen after dequeue, 64 B units,
//!  saturating  [14..16] link capacity, 100 Mbit/s units
//! ```
//!
//! The ICRC is computed as if the container were absent (IP total length and UDP length
//! without it); see [`crate::wire::icrc`].

use super::ipv4::{self, Ipv4Packet};
use super::{need, need_out, Result, WireError};
use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Default DSCP that marks a packet as carrying the INT container (a parameter
/// everywhere; this is only the default of configuration structs).
pub const DEFAULT_INT_DSCP: u8 = 0x18;
/// Shim length in bytes.
pub const SHIM_LEN: usize = 4;
/// MD header length in bytes.
pub const MD_LEN: usize = 12;
/// Shim + MD header.
pub const HEADER_LEN: usize = SHIM_LEN + MD_LEN;
/// One hop record in bytes.
pub const HOP_LEN: usize = 16;
/// HopML: words per hop record.
pub const HOP_ML_WORDS: u8 = 4;
/// Shim Type for INT-MD.
pub const TYPE_INT_MD: u8 = 1;
/// INT-MD version.
pub const MD_VERSION: u8 = 2;
/// Domain Specific ID of this project's hop record ("HP").
pub const DOMAIN_ID_HPCC: u16 = 0x4850;
/// DS Instruction bit 0 (MSB): "HPCC hop record" present.
pub const DS_INSTR_HPCC_HOP: u16 = 0x8000;
/// The largest number of hop records the 8-bit shim length can describe ((255-4)/4).
pub const MAX_HOPS_WIRE: usize = 62;

bitflags::bitflags! {
    /// Flag bits of MD header word 0 (INT v2.0 section 5.7).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct MdFlags: u32 {
        /// D: the source asked the sink to discard (unused here, carried as-is).
        const D = 1 << 27;
        /// E: max hop count exceeded; some hop could not push its record.
        const E = 1 << 26;
        /// M: MTU exceeded (unused here, carried as-is).
        const M = 1 << 25;
    }
}

/// The 4-byte INT shim over UDP.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ShimHeader {
    /// Type (4 bits) | NPT (2 bits) | reserved (2 bits).
    pub type_npt: u8,
    /// Container length in 4-byte words, shim included.
    pub length: u8,
    /// Reserved, 0.
    pub reserved: u8,
    /// Original DSCP << 2.
    pub dscp: u8,
}

/// The 12-byte INT-MD metadata header.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MdHeader {
    /// Ver | D | E | M | reserved | HopML | RemainingHopCnt.
    pub word0: U32,
    /// Instruction bitmap (standard metadata; 0 = none, we use the DS instruction).
    pub instructions: U16,
    /// Domain specific ID.
    pub domain_id: U16,
    /// Domain specific instruction.
    pub ds_instruction: U16,
    /// Domain specific flags.
    pub ds_flags: U16,
}

/// A hop record as it lies on the wire (16 bytes, network byte order).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct HopRecordWire {
    /// Switch ID.
    pub switch_id: U16,
    /// Egress port ID.
    pub port_id: U16,
    /// Egress timestamp, ns mod 2^32.
    pub ts_ns: U32,
    /// Bytes sent on the egress port before this packet, mod 2^32.
    pub tx_bytes: U32,
    /// Queue length after dequeue, in 64-byte units, saturating.
    pub qlen_64b: U16,
    /// Link capacity, in 100 Mbit/s units.
    pub link_100m: U16,
}

/// One switch hop's telemetry (what HPCC++ MeasureInflight needs: ts, txBytes, qlen, B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HopRecord {
    /// Switch ID.
    pub switch_id: u16,
    /// Egress port ID.
    pub port_id: u16,
    /// Egress timestamp in ns, wrapping mod 2^32 (differences are taken with
    /// `wrapping_sub`; 4.29 s of range is far above any RTT).
    pub ts_ns: u32,
    /// Cumulative bytes transmitted on the egress port before this packet, wrapping
    /// mod 2^32 (4 GiB: at 400 Gbit/s that is 85 ms, above any RTT).
    pub tx_bytes: u32,
    /// Queue length after dequeue in 64-byte units, saturating at 0xFFFF (4 MiB).
    pub qlen_64b: u16,
    /// Link capacity in 100 Mbit/s units (0xFFFF = 6.5 Tbit/s).
    pub link_100m: u16,
}

impl HopRecord {
    /// Builds a record from natural units, applying the wrap, saturation and unit rules.
    pub fn from_units(
        switch_id: u16,
        port_id: u16,
        ts_ns: u64,
        tx_bytes: u64,
        qlen_bytes: u64,
        link_bps: u64,
    ) -> Self {
        Self {
            switch_id,
            port_id,
            ts_ns: ts_ns as u32,
            tx_bytes: tx_bytes as u32,
            qlen_64b: (qlen_bytes / 64).min(0xFFFF) as u16,
            link_100m: (link_bps / 100_000_000).min(0xFFFF) as u16,
        }
    }

    /// Queue length in bytes (lower bound: 64-byte units).
    pub fn qlen_bytes(&self) -> u64 {
        u64::from(self.qlen_64b) * 64
    }

    /// Link capacity in bit/s.
    pub fn link_bps(&self) -> u64 {
        u64::from(self.link_100m) * 100_000_000
    }

    /// Parses 16 bytes.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let (w, _) = HopRecordWire::ref_from_prefix(b).map_err(|_| WireError::Truncated {
            what: "INT hop record",
            need: HOP_LEN,
            have: b.len(),
        })?;
        Ok(Self {
            switch_id: w.switch_id.get(),
            port_id: w.port_id.get(),
            ts_ns: w.ts_ns.get(),
            tx_bytes: w.tx_bytes.get(),
            qlen_64b: w.qlen_64b.get(),
            link_100m: w.link_100m.get(),
        })
    }

    /// Writes 16 bytes; returns 16.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("INT hop record", HOP_LEN, buf.len())?;
        let w = HopRecordWire {
            switch_id: U16::new(self.switch_id),
            port_id: U16::new(self.port_id),
            ts_ns: U32::new(self.ts_ns),
            tx_bytes: U32::new(self.tx_bytes),
            qlen_64b: U16::new(self.qlen_64b),
            link_100m: U16::new(self.link_100m),
        };
        buf[..HOP_LEN].copy_from_slice(w.as_bytes());
        Ok(HOP_LEN)
    }
}

/// A zero-copy view of an INT container (shim first). The buffer may extend past the
/// container (e.g. the BTH follows); [`IntPacket::len`] says where it ends.
#[derive(Debug, Clone)]
pub struct IntPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> IntPacket<T> {
    /// Validates Type, Length (>= 4 words, 4 + 4k words, within the buffer), Ver and HopML.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let b = buffer.as_ref();
        need("INT shim+MD header", HEADER_LEN, b.len())?;
        let ty = b[0] >> 4;
        if ty != TYPE_INT_MD {
            return Err(WireError::IntBadType(ty));
        }
        let words = b[1];
        if words < 4 || (words - 4) % HOP_ML_WORDS != 0 {
            return Err(WireError::IntBadLength(words));
        }
        need("INT container", words as usize * 4, b.len())?;
        let ver = b[4] >> 4;
        if ver != MD_VERSION {
            return Err(WireError::IntBadVersion(ver));
        }
        let hop_ml = b[6] & 0x1F;
        if hop_ml != HOP_ML_WORDS {
            return Err(WireError::IntBadHopMl(hop_ml));
        }
        Ok(Self { buffer })
    }

    fn shim(&self) -> &ShimHeader {
        super::header_at::<ShimHeader>(self.buffer.as_ref())
    }

    fn md(&self) -> &MdHeader {
        super::header_at::<MdHeader>(&self.buffer.as_ref()[SHIM_LEN..])
    }

    /// Container length in bytes (shim included).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.shim().length as usize * 4
    }

    /// Number of hop records present.
    pub fn hop_count(&self) -> usize {
        (self.len() - HEADER_LEN) / HOP_LEN
    }

    /// Original DSCP from the shim.
    pub fn orig_dscp(&self) -> u8 {
        self.shim().dscp >> 2
    }

    /// MD flags.
    pub fn flags(&self) -> MdFlags {
        MdFlags::from_bits_truncate(self.md().word0.get())
    }

    /// RemainingHopCnt.
    pub fn remaining_hop_cnt(&self) -> u8 {
        self.md().word0.get() as u8
    }

    /// Domain specific ID.
    pub fn domain_id(&self) -> u16 {
        self.md().domain_id.get()
    }

    /// DS instruction.
    pub fn ds_instruction(&self) -> u16 {
        self.md().ds_instruction.get()
    }

    /// Hop record `i` (0 = newest, i.e. the last switch), or `None` past the end.
    pub fn hop(&self, i: usize) -> Option<HopRecord> {
        if i >= self.hop_count() {
            return None;
        }
        let off = HEADER_LEN + i * HOP_LEN;
        HopRecord::parse(&self.buffer.as_ref()[off..off + HOP_LEN]).ok()
    }

    /// Iterates over hop records, newest first.
    pub fn hops(&self) -> impl Iterator<Item = HopRecord> + '_ {
        (0..self.hop_count()).filter_map(move |i| self.hop(i))
    }

    /// Copies up to `out.len()` hop records (newest first) into `out`; returns how many.
    pub fn copy_hops(&self, out: &mut [HopRecord]) -> usize {
        let n = self.hop_count().min(out.len());
        for (i, o) in out.iter_mut().enumerate().take(n) {
            *o = self.hop(i).unwrap_or_default();
        }
        n
    }

    /// The container bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.len()]
    }
}

/// Parsed INT shim + MD header (hop records are read through [`IntPacket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntRepr {
    /// DSCP the packet had before the INT DSCP replaced it.
    pub orig_dscp: u8,
    /// D / E / M flags.
    pub flags: MdFlags,
    /// How many more hops may push a record.
    pub remaining_hop_cnt: u8,
    /// Hop records present (emit writes a length that includes them; the caller writes
    /// the records themselves, or uses 0 for a fresh container).
    pub hop_count: u8,
}

impl IntRepr {
    /// A fresh container as the sending NIC inserts it: no records, room for `max_hops`.
    pub fn new_empty(max_hops: u8, orig_dscp: u8) -> Self {
        Self {
            orig_dscp,
            flags: MdFlags::empty(),
            remaining_hop_cnt: max_hops,
            hop_count: 0,
        }
    }

    /// Parses a checked view.
    pub fn parse<T: AsRef<[u8]>>(p: &IntPacket<T>) -> Result<Self> {
        Ok(Self {
            orig_dscp: p.orig_dscp(),
            flags: p.flags(),
            remaining_hop_cnt: p.remaining_hop_cnt(),
            hop_count: p.hop_count() as u8,
        })
    }

    /// Bytes of the whole container (header plus `hop_count` records).
    pub fn container_len(&self) -> usize {
        HEADER_LEN + self.hop_count as usize * HOP_LEN
    }

    /// Writes shim + MD header (16 bytes); returns 16.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("INT shim+MD header", HEADER_LEN, buf.len())?;
        if self.hop_count as usize > MAX_HOPS_WIRE || self.orig_dscp > 0x3F {
            return Err(WireError::FieldRange("INT hop count / DSCP"));
        }
        let shim = ShimHeader {
            type_npt: TYPE_INT_MD << 4,
            length: (4 + self.hop_count * HOP_ML_WORDS),
            reserved: 0,
            dscp: self.orig_dscp << 2,
        };
        let word0 = (u32::from(MD_VERSION) << 28)
            | (self.flags.bits() & MdFlags::all().bits())
            | (u32::from(HOP_ML_WORDS) << 8)
            | u32::from(self.remaining_hop_cnt);
        let md = MdHeader {
            word0: U32::new(word0),
            instructions: U16::new(0),
            domain_id: U16::new(DOMAIN_ID_HPCC),
            ds_instruction: U16::new(DS_INSTR_HPCC_HOP),
            ds_flags: U16::new(0),
        };
        buf[..SHIM_LEN].copy_from_slice(shim.as_bytes());
        buf[SHIM_LEN..HEADER_LEN].copy_from_slice(md.as_bytes());
        Ok(HEADER_LEN)
    }
}

/// Where the INT container lies in a frame (offsets from the start of the frame slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntLocation {
    /// Offset of the IPv4 header.
    pub ip_off: usize,
    /// IPv4 header length.
    pub ip_hlen: usize,
    /// Offset of the UDP header.
    pub udp_off: usize,
    /// Offset of the INT shim.
    pub int_off: usize,
    /// Container length in bytes.
    pub int_len: usize,
}

/// Finds and validates the INT container in `frame` (IPv4 at `l3_off`, normally 14).
/// Requires the IPv4 DSCP to equal `int_dscp`, protocol UDP and a valid container.
pub fn locate(frame: &[u8], l3_off: usize, int_dscp: u8) -> Result<IntLocation> {
    need("frame up to IPv4", l3_off, frame.len())?;
    let ip = Ipv4Packet::new_checked(&frame[l3_off..])?;
    if ip.dscp() != int_dscp {
        return Err(WireError::IntAbsent);
    }
    if ip.header().protocol != ipv4::PROTO_UDP {
        return Err(WireError::NotUdp(ip.header().protocol));
    }
    let ip_hlen = ip.header_len();
    let ip_end = l3_off + ip.total_len() as usize;
    let udp_off = l3_off + ip_hlen;
    let udp = super::udp::UdpPacket::new_checked(&frame[udp_off..ip_end])?;
    let int_off = udp_off + super::udp::HEADER_LEN;
    let udp_end = udp_off + udp.len_field() as usize;
    let c = IntPacket::new_checked(&frame[int_off..udp_end])?;
    Ok(IntLocation {
        ip_off: l3_off,
        ip_hlen,
        udp_off,
        int_off,
        int_len: c.len(),
    })
}

/// Outcome of a hop push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// The record was inserted; the frame is now `start..start+len` of the buffer.
    Pushed {
        /// Offset of the frame's first byte in the buffer.
        start: usize,
        /// New frame length (16 bytes more).
        len: usize,
    },
    /// RemainingHopCnt was 0: the E bit is now set and nothing was inserted.
    Full,
}

fn add_lengths(frame: &mut [u8], loc: &IntLocation, delta: i32) -> Result<()> {
    let tl_off = loc.ip_off + 2;
    let ul_off = loc.udp_off + 4;
    let tl = i32::from(u16::from_be_bytes([frame[tl_off], frame[tl_off + 1]])) + delta;
    let ul = i32::from(u16::from_be_bytes([frame[ul_off], frame[ul_off + 1]])) + delta;
    if !(0..=0xFFFF).contains(&tl) || !(0..=0xFFFF).contains(&ul) {
        return Err(WireError::FieldRange("IP/UDP length after INT change"));
    }
    frame[tl_off..tl_off + 2].copy_from_slice(&(tl as u16).to_be_bytes());
    frame[ul_off..ul_off + 2].copy_from_slice(&(ul as u16).to_be_bytes());
    // RoCEv2 sends UDP checksum 0; a non-zero one would now be wrong, so clear it
    // (RFC 768: 0 means "no checksum").
    frame[ul_off + 2] = 0;
    frame[ul_off + 3] = 0;
    let mut ip = Ipv4Packet::new_checked(&mut frame[loc.ip_off..])?;
    ip.fill_checksum();
    Ok(())
}

/// Marks E and decrements nothing: the hop could not push (RemainingHopCnt == 0).
fn set_e(frame: &mut [u8], loc: &IntLocation) {
    let o = loc.int_off + SHIM_LEN;
    frame[o] |= (MdFlags::E.bits() >> 24) as u8;
}

/// Updates shim length and RemainingHopCnt for one pushed record.
fn count_push(frame: &mut [u8], int_off: usize) {
    frame[int_off + 1] += HOP_ML_WORDS;
    frame[int_off + SHIM_LEN + 3] -= 1;
}

/// Pushes `hop` into the frame `buf[..len]` by moving everything after the MD header 16
/// bytes towards the end (the buffer must have 16 spare bytes past `len`). Fixes IPv4
/// total length, UDP length and IPv4 checksum. When RemainingHopCnt is 0, sets E and
/// returns [`PushOutcome::Full`] without inserting (INT v2.0 section 5.7).
///
/// Cost is a move of the payload; with headroom in front, prefer [`push_hop_front`].
pub fn push_hop(
    buf: &mut [u8],
    len: usize,
    l3_off: usize,
    int_dscp: u8,
    hop: &HopRecord,
) -> Result<PushOutcome> {
    need("frame", len, buf.len())?;
    let loc = locate(&buf[..len], l3_off, int_dscp)?;
    if buf[loc.int_off + SHIM_LEN + 3] == 0 {
        set_e(buf, &loc);
        return Ok(PushOutcome::Full);
    }
    if loc.int_len + HOP_LEN > MAX_HOPS_WIRE * HOP_LEN + HEADER_LEN {
        set_e(buf, &loc);
        return Ok(PushOutcome::Full);
    }
    need_out("frame after INT push", len + HOP_LEN, buf.len())?;
    let ins = loc.int_off + HEADER_LEN;
    buf.copy_within(ins..len, ins + HOP_LEN);
    hop.emit(&mut buf[ins..ins + HOP_LEN])?;
    count_push(buf, loc.int_off);
    add_lengths(&mut buf[..len + HOP_LEN], &loc, HOP_LEN as i32)?;
    Ok(PushOutcome::Pushed {
        start: 0,
        len: len + HOP_LEN,
    })
}

/// Pushes `hop` into the frame `buf[start..start+len]` by moving the headers (Ethernet,
/// IPv4, UDP, shim, MD) 16 bytes towards the front, into headroom (`start >= 16`), the
/// way `rte_pktmbuf_prepend` works; the payload does not move. Same rules as
/// [`push_hop`].
pub fn push_hop_front(
    buf: &mut [u8],
    start: usize,
    len: usize,
    l3_off: usize,
    int_dscp: u8,
    hop: &HopRecord,
) -> Result<PushOutcome> {
    let end = start
        .checked_add(len)
        .ok_or(WireError::FieldRange("start+len"))?;
    need("frame", end, buf.len())?;
    let loc = locate(&buf[start..end], l3_off, int_dscp)?;
    let mdo = start + loc.int_off + SHIM_LEN;
    if buf[mdo + 3] == 0 || loc.int_len + HOP_LEN > MAX_HOPS_WIRE * HOP_LEN + HEADER_LEN {
        set_e(&mut buf[start..end], &loc);
        return Ok(PushOutcome::Full);
    }
    if start < HOP_LEN {
        return Err(WireError::BufferTooSmall {
            what: "INT push headroom",
            need: HOP_LEN,
            have: start,
        });
    }
    let hdr_end = start + loc.int_off + HEADER_LEN;
    let ns = start - HOP_LEN;
    buf.copy_within(start..hdr_end, ns);
    hop.emit(&mut buf[hdr_end - HOP_LEN..hdr_end])?;
    let nlen = len + HOP_LEN;
    count_push(&mut buf[ns..ns + nlen], loc.int_off);
    add_lengths(&mut buf[ns..ns + nlen], &loc, HOP_LEN as i32)?;
    Ok(PushOutcome::Pushed {
        start: ns,
        len: nlen,
    })
}

/// Result of [`strip_in_place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripped {
    /// Offset of the frame's first byte in the buffer (moved forward by `int_len`).
    pub start: usize,
    /// New frame length.
    pub len: usize,
    /// Bytes removed.
    pub int_len: usize,
}

/// Removes the INT container from `buf[start..start+len]` by moving the headers in
/// front of it (Ethernet, IPv4, UDP) forward over it (like `rte_pktmbuf_adj`), restores
/// the original DSCP from the shim, and fixes IPv4 total length, UDP length and checksum.
/// Read the hop records (e.g. with [`IntPacket::copy_hops`]) before calling this.
pub fn strip_in_place(
    buf: &mut [u8],
    start: usize,
    len: usize,
    l3_off: usize,
    int_dscp: u8,
) -> Result<Stripped> {
    let end = start
        .checked_add(len)
        .ok_or(WireError::FieldRange("start+len"))?;
    need("frame", end, buf.len())?;
    let loc = locate(&buf[start..end], l3_off, int_dscp)?;
    let orig_dscp = buf[start + loc.int_off + 3] >> 2;
    let ns = start + loc.int_len;
    buf.copy_within(start..start + loc.int_off, ns);
    let nlen = len - loc.int_len;
    let f = &mut buf[ns..ns + nlen];
    // The IPv4 total length still counts the container: patch the raw fields first.
    let tl_off = loc.ip_off + 2;
    let tl = u16::from_be_bytes([f[tl_off], f[tl_off + 1]]) - loc.int_len as u16;
    f[tl_off..tl_off + 2].copy_from_slice(&tl.to_be_bytes());
    let ul_off = loc.udp_off + 4;
    let ul = u16::from_be_bytes([f[ul_off], f[ul_off + 1]]) - loc.int_len as u16;
    f[ul_off..ul_off + 2].copy_from_slice(&ul.to_be_bytes());
    f[ul_off + 2] = 0;
    f[ul_off + 3] = 0;
    let mut ip = Ipv4Packet::new_checked(&mut f[loc.ip_off..])?;
    ip.set_dscp(orig_dscp);
    ip.fill_checksum();
    Ok(Stripped {
        start: ns,
        len: nlen,
        int_len: loc.int_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::{Ecn, Ipv4Address, Ipv4Repr};
    use crate::wire::udp::{UdpRepr, ROCEV2_UDP_PORT};

    /// Ethernet + IPv4 + UDP + empty INT (room for `max`) + 12-byte "BTH" + 8 payload.
    fn frame(max: u8) -> Vec<u8> {
        let mut b = vec![0u8; 14 + 20 + 8 + 16 + 20];
        b[12] = 0x08;
        let udp_payload = 16 + 20;
        Ipv4Repr {
            src: Ipv4Address([10, 0, 0, 1]),
            dst: Ipv4Address([10, 0, 0, 2]),
            dscp: DEFAULT_INT_DSCP,
            ecn: Ecn::Ect0,
            ttl: 64,
            ident: 0,
            protocol: 17,
            payload_len: (8 + udp_payload) as u16,
        }
        .emit(&mut b[14..])
        .unwrap();
        UdpRepr {
            src_port: 1,
            dst_port: ROCEV2_UDP_PORT,
            payload_len: udp_payload as u16,
        }
        .emit(&mut b[34..])
        .unwrap();
        IntRepr::new_empty(max, 3).emit(&mut b[42..]).unwrap();
        for (i, x) in b[58..].iter_mut().enumerate() {
            *x = 0xA0 + i as u8;
        }
        b
    }

    fn hop(n: u16) -> HopRecord {
        HopRecord::from_units(
            n,
            n + 1,
            1_000 + u64::from(n),
            5_000_000_000,
            6400,
            100_000_000_000,
        )
    }

    #[test]
    fn header_bytes_are_the_contract() {
        let mut b = [0u8; 16];
        IntRepr::new_empty(5, 0x0A).emit(&mut b).unwrap();
        assert_eq!(
            b,
            [0x10, 4, 0, 0x28, 0x20, 0x00, 0x04, 5, 0, 0, 0x48, 0x50, 0x80, 0, 0, 0]
        );
        let p = IntPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.len(), 16);
        assert_eq!(p.hop_count(), 0);
        assert_eq!(p.remaining_hop_cnt(), 5);
        assert_eq!(p.orig_dscp(), 0x0A);
        assert_eq!(IntRepr::parse(&p).unwrap(), IntRepr::new_empty(5, 0x0A));
    }

    #[test]
    fn hop_units_wrap_and_saturate() {
        let h = hop(7);
        assert_eq!(h.tx_bytes, (5_000_000_000u64 % (1 << 32)) as u32);
        assert_eq!(h.qlen_64b, 100);
        assert_eq!(h.link_100m, 1000);
        assert_eq!(h.link_bps(), 100_000_000_000);
        let s = HopRecord::from_units(0, 0, 0, 0, u64::MAX, 0);
        assert_eq!(s.qlen_64b, 0xFFFF);
        let mut w = [0u8; 16];
        h.emit(&mut w).unwrap();
        assert_eq!(&w[..4], &[0, 7, 0, 8]);
        assert_eq!(HopRecord::parse(&w).unwrap(), h);
    }

    #[test]
    fn push_back_and_front_agree_and_strip_restores() {
        let orig = frame(2);
        let mut a = orig.clone();
        a.resize(orig.len() + 64, 0);
        let PushOutcome::Pushed { start, len } =
            push_hop(&mut a, orig.len(), 14, 0x18, &hop(1)).unwrap()
        else {
            panic!("expected push")
        };
        assert_eq!((start, len), (0, orig.len() + 16));
        let PushOutcome::Pushed { len, .. } = push_hop(&mut a, len, 14, 0x18, &hop(2)).unwrap()
        else {
            panic!("expected push")
        };
        // Third push: no room left -> E set, no insertion.
        assert_eq!(
            push_hop(&mut a, len, 14, 0x18, &hop(3)).unwrap(),
            PushOutcome::Full
        );
        let a = a[..len].to_vec();
        let ip = Ipv4Packet::new_checked(&a[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.total_len() as usize, len - 14);
        let c = IntPacket::new_checked(&a[42..]).unwrap();
        assert_eq!(c.hop_count(), 2);
        assert_eq!(c.remaining_hop_cnt(), 0);
        assert!(c.flags().contains(MdFlags::E));
        // Newest first.
        assert_eq!(c.hop(0), Some(hop(2)));
        assert_eq!(c.hop(1), Some(hop(1)));
        assert_eq!(c.hop(2), None);
        // Payload intact.
        assert_eq!(&a[len - 20..], &orig[58..]);

        // Front push gives the same bytes.
        let mut f = vec![0u8; 64];
        f.extend_from_slice(&orig);
        let PushOutcome::Pushed { start, len } =
            push_hop_front(&mut f, 64, orig.len(), 14, 0x18, &hop(1)).unwrap()
        else {
            panic!()
        };
        let PushOutcome::Pushed { start, len } =
            push_hop_front(&mut f, start, len, 14, 0x18, &hop(2)).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            push_hop_front(&mut f, start, len, 14, 0x18, &hop(3)).unwrap(),
            PushOutcome::Full
        );
        assert_eq!(&f[start..start + len], &a[..]);

        // Strip gives the frame without INT, DSCP restored, lengths fixed.
        let s = strip_in_place(&mut f, start, len, 14, 0x18).unwrap();
        assert_eq!(s.int_len, 48);
        let g = &f[s.start..s.start + s.len];
        let ip = Ipv4Packet::new_checked(&g[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.dscp(), 3);
        assert_eq!(ip.total_len() as usize, 20 + 8 + 20);
        assert_eq!(&g[42..], &orig[58..]);
        assert_eq!(&g[..14], &orig[..14]);
    }

    #[test]
    fn rejects_bad_containers() {
        let f = frame(1);
        let mut b = f.clone();
        b[42] = 0x20;
        assert_eq!(locate(&b, 14, 0x18), Err(WireError::IntBadType(2)));
        let mut b = f.clone();
        b[43] = 5;
        assert_eq!(locate(&b, 14, 0x18), Err(WireError::IntBadLength(5)));
        let mut b = f.clone();
        b[43] = 200;
        assert!(matches!(
            locate(&b, 14, 0x18),
            Err(WireError::Truncated { .. })
        ));
        let mut b = f.clone();
        b[46] = 0x10;
        assert_eq!(locate(&b, 14, 0x18), Err(WireError::IntBadVersion(1)));
        let mut b = f.clone();
        b[48] = 0x03;
        assert_eq!(locate(&b, 14, 0x18), Err(WireError::IntBadHopMl(3)));
        assert_eq!(locate(&f, 14, 0x19), Err(WireError::IntAbsent));
        // No spare room for a push at the back.
        let mut b = f.clone();
        let n = b.len();
        assert!(matches!(
            push_hop(&mut b, n, 14, 0x18, &hop(1)),
            Err(WireError::BufferTooSmall { .. })
        ));
        // No headroom for a front push.
        let mut b = f.clone();
        assert!(matches!(
            push_hop_front(&mut b, 0, n, 14, 0x18, &hop(1)),
            Err(WireError::BufferTooSmall { .. })
        ));
    }
}
