//! Per-QP header templates: the TX fast path of a RoCEv2 NIC (docs/design.md §3, §5, §9).
//!
//! A hardware NIC does not emit a data packet's Ethernet/IPv4/UDP/BTH headers field by
//! field: it keeps them per QP and patches the few fields that change. A
//! [`HeaderTemplate`] does the same. It holds the headers of one QP (one
//! [`FrameBuilder`] plus the destination QP and P_Key) prebuilt once; per packet it
//! copies them with one fixed-size copy and patches
//!
//! - IPv4 TOS (the ECN codepoint), total length and header checksum (recomputed from a
//!   cached partial sum of the invariant words, RFC 1071 / RFC 1624: two additions and a
//!   fold instead of a pass over the header),
//! - UDP length,
//! - BTH opcode, SE/M/pad byte, FECN/BECN byte, AckReq and PSN,
//! - the opcode's extension headers (DETH, RETH, AETH, ImmDt written directly; anything else
//!   through [`RoceRepr::emit_transport`]).
//!
//! The ICRC (IBA A17.4.5, computed exactly as [`super::icrc`] does) is not recomputed
//! over the whole frame. CRC-32 is affine over GF(2): the CRC register after a message
//! is `R(m) = R(t) ^ L(m ^ t)` for two messages `m`, `t` of equal length, where `L` is
//! the pure (zero-initialised) CRC register of the difference. The masked ICRC prefix
//! `8 x 0xFF || IPv4 || UDP || BTH bytes 0..8` is 44 bytes for every frame of every QP
//! (option-less IPv4; an INT container is not part of it, A17.4.5 as docs/design.md §4 says).
//! Within it only six bytes vary per packet: the IPv4 total length (2), the UDP length
//! (2), the opcode and the SE/M/pad byte (TOS, TTL, checksums and BTH byte 4 are masked
//! to ones). So the template keeps the CRC register after its own prefix (variable bytes
//! zero) and each packet adds the contribution of its six bytes from six 256-entry tables
//! (one per byte position, each entry "this byte followed by k zero bytes", built at
//! compile time). From there the CRC continues over the bytes that really are new: AckReq
//! and PSN, the extension headers, the payload and the pad (one independent table lookup
//! per byte for the header words and a short payload, in groups of up to 32 bytes;
//! slicing-by-16 for other short runs, `crc32fast`'s carry-less-multiply path for long
//! ones).
//!
//! The result is byte-for-byte what [`FrameBuilder::emit_frame`] writes (tests below
//! check that for random packets); a packet the template cannot express (another
//! destination QP or P_Key) falls back to the
//! [`FrameBuilder`] path, so [`HeaderTemplate::write_frame`] accepts every packet
//! `emit_frame` accepts.

use super::bth::{self, BthRepr, Opcode};
use super::frame::{FrameBuilder, RoceRepr};
use super::icrc::IcrcHasher;
use super::ipv4::{self, Ecn};
use super::{ethernet, int, need_out, udp, Result, WireError};

/// Offset of the IPv4 header in a frame.
const L3: usize = ethernet::HEADER_LEN;
/// Offset of the UDP header.
const L4: usize = L3 + ipv4::HEADER_LEN;
/// Offset of the BTH when there is no INT container.
const BTH: usize = L4 + udp::HEADER_LEN;
/// Longest template: Ethernet, IPv4, UDP, INT container, BTH.
const MAX_TPL: usize = BTH + int::HEADER_LEN + bth::HEADER_LEN;
/// Bytes of the masked ICRC prefix covered by the template's precomputed register:
/// `8 x 0xFF`, IPv4 (20), UDP (8), BTH bytes 0..8.
const PREFIX: usize = 8 + ipv4::HEADER_LEN + udp::HEADER_LEN + 8;
/// Positions (in the masked ICRC message) of the prefix bytes that vary per packet:
/// IPv4 total length (hi, lo), UDP length (hi, lo), BTH opcode, BTH SE/M/pad/TVer.
const VAR_POS: [usize; 6] = [8 + 2, 8 + 3, 8 + 20 + 4, 8 + 20 + 5, 8 + 28, 8 + 28 + 1];
/// Suffixes at least this long go to `crc32fast` (folding with carry-less multiplies
/// beats table lookups once there are a few 16-byte blocks; below that its per-call
/// dispatch costs more than the tables).
const CRC32FAST_MIN: usize = 64;

/// Reflected CRC-32 (IEEE 802.3) polynomial.
const POLY: u32 = 0xEDB8_8320;

/// Slicing-by-32 tables: `SLICE[k][b]` is the register contribution of byte `b`
/// followed by `k` zero bytes.
static SLICE: [[u32; 256]; 32] = slice_tables();

/// `POS[i][b]`: contribution of byte `b` at masked position `VAR_POS[i]` to the CRC
/// register at the end of the prefix (byte `b` followed by `PREFIX - 1 - VAR_POS[i]`
/// zero bytes).
static POS: [[u32; 256]; 6] = pos_tables();

const fn slice_tables() -> [[u32; 256]; 32] {
    let mut t = [[0u32; 256]; 32];
    let mut b = 0;
    while b < 256 {
        let mut r = b as u32;
        let mut k = 0;
        while k < 8 {
            r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
            k += 1;
        }
        t[0][b] = r;
        b += 1;
    }
    let mut s = 1;
    while s < 32 {
        let mut b = 0;
        while b < 256 {
            let r = t[s - 1][b];
            t[s][b] = t[0][(r & 0xFF) as usize] ^ (r >> 8);
            b += 1;
        }
        s += 1;
    }
    t
}

const fn pos_tables() -> [[u32; 256]; 6] {
    let t0 = slice_tables();
    let mut t = [[0u32; 256]; 6];
    let mut i = 0;
    while i < 6 {
        let zeros = PREFIX - 1 - VAR_POS[i];
        let mut b = 0;
        while b < 256 {
            let mut r = t0[0][b];
            let mut k = 0;
            while k < zeros {
                r = t0[0][(r & 0xFF) as usize] ^ (r >> 8);
                k += 1;
            }
            t[i][b] = r;
            b += 1;
        }
        i += 1;
    }
    t
}

/// Advances the CRC register `reg` (not complemented) over `data`.
#[inline]
fn crc_update(mut reg: u32, data: &[u8]) -> u32 {
    if data.len() >= CRC32FAST_MIN {
        let mut h = crc32fast::Hasher::new_with_initial(!reg);
        h.update(data);
        return !h.finalize();
    }
    let mut blocks = data.chunks_exact(16);
    for c in &mut blocks {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ reg;
        reg = SLICE[15][(w & 0xFF) as usize]
            ^ SLICE[14][((w >> 8) & 0xFF) as usize]
            ^ SLICE[13][((w >> 16) & 0xFF) as usize]
            ^ SLICE[12][(w >> 24) as usize]
            ^ SLICE[11][c[4] as usize]
            ^ SLICE[10][c[5] as usize]
            ^ SLICE[9][c[6] as usize]
            ^ SLICE[8][c[7] as usize]
            ^ SLICE[7][c[8] as usize]
            ^ SLICE[6][c[9] as usize]
            ^ SLICE[5][c[10] as usize]
            ^ SLICE[4][c[11] as usize]
            ^ SLICE[3][c[12] as usize]
            ^ SLICE[2][c[13] as usize]
            ^ SLICE[1][c[14] as usize]
            ^ SLICE[0][c[15] as usize];
    }
    let mut words = blocks.remainder().chunks_exact(4);
    for c in &mut words {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ reg;
        reg = SLICE[3][(w & 0xFF) as usize]
            ^ SLICE[2][((w >> 8) & 0xFF) as usize]
            ^ SLICE[1][((w >> 16) & 0xFF) as usize]
            ^ SLICE[0][(w >> 24) as usize];
    }
    for &b in words.remainder() {
        reg = SLICE[0][((reg ^ u32::from(b)) & 0xFF) as usize] ^ (reg >> 8);
    }
    reg
}

/// Folds the words after the template's prefix (BTH AckReq/PSN, extension headers, a
/// short payload with its pad, in frame order; each the little-endian reading of 4
/// frame bytes) into the CRC register, from the values being written, not by reading
/// the frame back: a load spanning several just-written smaller stores cannot be
/// store-forwarded and stalls (perf showed it as half of the CRC time).
///
/// CRC-32 is linear (module docs), so the register after a group of `n` words is
/// the XOR of one table lookup per byte, `SLICE[k][b]` for a byte `b` followed by `k`
/// more bytes of the group, with the incoming register XORed into the group's first
/// word. Groups are up to 8 words (32 bytes, the tables' reach) and aligned to the
/// end of the message: the first group takes the remainder. A TX frame up to a
/// 12-byte payload after a RETH (the common small WRITE) is one group: every lookup
/// is independent of the others, and the register's dependency chain is one load
/// deep. (Groups of 4 with the register carried from one to the next made that chain
/// two loads deep, and perf showed the frame's last ICRC lookups waiting on it once
/// the mbufs stopped missing L1.)
///
/// The pending state is named scalar fields, never an array, so that once inlined
/// they live in registers.
struct Folder {
    /// Register before the current group (XORed into its first word).
    reg: u32,
    /// XOR of the current group's lookups so far.
    acc: u32,
    /// Words of the current group still to come.
    k: usize,
    /// Whether the next word is the first of its group.
    fresh: bool,
}

/// Words per group of [`Folder`]: the reach of the 32 tables.
const GROUP: usize = 8;

impl Folder {
    /// A folder starting from register `reg` that will be given exactly `words`
    /// words.
    #[inline(always)]
    fn new(reg: u32, words: usize) -> Self {
        Folder {
            reg,
            acc: 0,
            k: (words + GROUP - 1) % GROUP + 1,
            fresh: true,
        }
    }

    #[inline(always)]
    fn push(&mut self, v: u32) {
        let v = if self.fresh { v ^ self.reg } else { v };
        self.fresh = false;
        self.k -= 1;
        let t = 4 * (self.k % GROUP);
        let b = v.to_le_bytes();
        self.acc ^= SLICE[t + 3][usize::from(b[0])]
            ^ SLICE[t + 2][usize::from(b[1])]
            ^ SLICE[t + 1][usize::from(b[2])]
            ^ SLICE[t][usize::from(b[3])];
        if self.k == 0 {
            self.reg = self.acc;
            self.acc = 0;
            self.k = GROUP;
            self.fresh = true;
        }
    }

    /// The register after all the words announced.
    #[inline(always)]
    fn finish(&self) -> u32 {
        debug_assert!(self.fresh, "Folder: fewer words than announced");
        self.reg
    }
}

/// Payloads up to this many bytes are written and hashed as words with their pad.
const SMALL_PAYLOAD: usize = 36;

/// Advances the register over `k` (0..=3) zero bytes: the pad.
#[inline(always)]
fn fold_zeros(reg: u32, k: usize) -> u32 {
    match k {
        0 => reg,
        1 => SLICE[0][(reg & 0xFF) as usize] ^ (reg >> 8),
        2 => SLICE[1][(reg & 0xFF) as usize] ^ SLICE[0][((reg >> 8) & 0xFF) as usize] ^ (reg >> 16),
        _ => {
            SLICE[2][(reg & 0xFF) as usize]
                ^ SLICE[1][((reg >> 8) & 0xFF) as usize]
                ^ SLICE[0][((reg >> 16) & 0xFF) as usize]
                ^ (reg >> 24)
        }
    }
}

/// A big-endian field as [`Folder::push`] wants it.
#[inline(always)]
fn be(v: u32) -> u32 {
    u32::from_le_bytes(v.to_be_bytes())
}

/// Where [`HeaderTemplate::write_headers`] left a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLayout {
    /// Bytes of headers written (Ethernet through the last transport header).
    pub len: usize,
    /// Pad bytes the payload needs before the ICRC.
    pub pad: usize,
    /// Total frame length once payload, pad and ICRC are added.
    pub frame_len: usize,
    /// ICRC in `crc32fast`'s convention (the complemented register) over the masked
    /// headers; continue it over the payload with [`IcrcHasher::resume`].
    pub icrc_so_far: u32,
}

/// One QP's prebuilt headers (see the module docs).
#[derive(Debug, Clone)]
pub struct HeaderTemplate {
    fb: FrameBuilder,
    dest_qp: u32,
    pkey: u16,
    /// Ethernet/IPv4/UDP/(INT)/BTH with IPv4 ECN, total length and checksum, UDP length,
    /// BTH opcode, flags, byte 4, AckReq and PSN all zero.
    hdr: [u8; MAX_TPL],
    /// INT container length (0 or [`int::HEADER_LEN`]).
    int_len: usize,
    /// One's complement sum (unfolded) of the template's IPv4 header words.
    ip_sum: u32,
    /// CRC register after the template's masked 44-byte prefix.
    crc_pre: u32,
}

impl HeaderTemplate {
    /// Builds the template for packets of one QP: outer headers from `fb`, BTH
    /// destination QP `dest_qp` and partition key `pkey`.
    pub fn new(fb: FrameBuilder, dest_qp: u32, pkey: u16) -> Result<Self> {
        if dest_qp > 0xFF_FFFF {
            return Err(WireError::FieldRange("BTH QPN/PSN/pad"));
        }
        let int_len = if fb.int.is_some() { int::HEADER_LEN } else { 0 };
        let mut b = BthRepr::new(Opcode::SendMiddle, dest_qp, 0);
        b.pkey = pkey;
        let probe = RoceRepr::new(b);
        let mut hdr = [0u8; MAX_TPL];
        let layout = fb.emit_headers(&probe, 0, Ecn::NotEct, &mut hdr)?;
        let bth_off = BTH + int_len;
        debug_assert_eq!(layout.len, bth_off + bth::HEADER_LEN);
        // Zero what varies per packet.
        hdr[L3 + 1] &= !0b11; // ECN
        hdr[L3 + 2..L3 + 4].fill(0); // total length
        hdr[L3 + 10..L3 + 12].fill(0); // header checksum
        hdr[L4 + 4..L4 + 6].fill(0); // UDP length (checksum stays 0: unused)
        hdr[bth_off] = 0; // opcode
        hdr[bth_off + 1] = 0; // SE/M/pad/TVer
        hdr[bth_off + 4] = 0; // FECN/BECN
        hdr[bth_off + 8..bth_off + 12].fill(0); // AckReq, PSN
        let mut ip_sum = 0u32;
        for w in hdr[L3..L4].chunks_exact(2) {
            ip_sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        // The masked prefix as A17.4.5 hashes it (the INT container is not part of it).
        let mut m = [0xFFu8; PREFIX];
        m[8..28].copy_from_slice(&hdr[L3..L4]);
        m[28..36].copy_from_slice(&hdr[L4..BTH]);
        m[36..44].copy_from_slice(&hdr[bth_off..bth_off + 8]);
        m[8 + 1] = 0xFF; // TOS
        m[8 + 8] = 0xFF; // TTL
        m[8 + 10..8 + 12].fill(0xFF); // IPv4 checksum
        m[28 + 6..28 + 8].fill(0xFF); // UDP checksum
        m[36 + 4] = 0xFF; // BTH byte 4
        let crc_pre = crc_update(!0, &m);
        Ok(Self {
            fb,
            dest_qp,
            pkey,
            hdr,
            int_len,
            ip_sum,
            crc_pre,
        })
    }

    /// The frame builder this template was made from (the engine compares it with the
    /// one a packet needs: a probe adds INT, a CNP removes it).
    pub fn frame_builder(&self) -> &FrameBuilder {
        &self.fb
    }

    /// Destination QP the template's BTH carries.
    pub fn dest_qp(&self) -> u32 {
        self.dest_qp
    }

    /// Whether `pkt` takes the template path (else the [`FrameBuilder`] path).
    #[inline]
    fn fits(&self, pkt: &RoceRepr) -> bool {
        pkt.bth.dest_qp == self.dest_qp && pkt.bth.pkey == self.pkey
    }

    /// Writes the headers of `pkt` (payload of `payload_len` bytes, IP ECN `ecn`) into
    /// `buf` and returns the layout with the ICRC over the headers, to be continued over
    /// the payload and pad.
    #[inline]
    pub fn write_headers(
        &self,
        buf: &mut [u8],
        pkt: &RoceRepr,
        ecn: Ecn,
        payload_len: usize,
    ) -> Result<TemplateLayout> {
        if !self.fits(pkt) {
            let l = self.fb.emit_headers(pkt, payload_len, ecn, buf)?;
            let h = self.fb.icrc_start(buf, &l)?;
            return Ok(TemplateLayout {
                len: l.len,
                pad: l.pad,
                frame_len: l.frame_len,
                icrc_so_far: h.value(),
            });
        }
        let (l, f) = self.headers_fast(buf, pkt, ecn, payload_len, 0)?;
        let reg = f.finish();
        Ok(TemplateLayout {
            icrc_so_far: !reg,
            ..l
        })
    }

    /// The template path of [`Self::write_headers`]; returns the layout (its
    /// `icrc_so_far` unset) and the ICRC folder holding the headers (a short payload is
    /// folded together with their last words: the caller pushes `payload_words` more
    /// words into it).
    #[inline(always)]
    fn headers_fast(
        &self,
        buf: &mut [u8],
        pkt: &RoceRepr,
        ecn: Ecn,
        payload_len: usize,
        payload_words: usize,
    ) -> Result<(TemplateLayout, Folder)> {
        let op = pkt.bth.opcode;
        let bth_off = BTH + self.int_len;
        let tpt = bth::HEADER_LEN + pkt.ccext.map_or(0, |c| c.buffer_len()) + op.ext_len();
        let hl = bth_off + tpt;
        let pad = payload_len.wrapping_neg() & 3;
        let frame_len = hl + payload_len + pad + 4;
        let ip_len = frame_len - L3;
        if ip_len > u16::MAX as usize {
            return Err(WireError::FieldRange("frame length"));
        }
        if pkt.bth.psn > 0xFF_FFFF {
            return Err(WireError::FieldRange("BTH QPN/PSN/pad"));
        }
        need_out("RoCEv2 headers", hl, buf.len())?;
        // Headers up to the BTH: one fixed-size copy (inline moves, no memcpy call;
        // the INT case kept apart so that the two sizes do not merge into one call).
        if self.int_len == 0 {
            buf[..BTH + bth::HEADER_LEN].copy_from_slice(&self.hdr[..BTH + bth::HEADER_LEN]);
        } else {
            copy_int_template(buf, &self.hdr);
        }
        let tl = ip_len as u16;
        let ul = (ip_len - ipv4::HEADER_LEN) as u16;
        let ecn = ecn.bits();
        // Stores only, no read-modify-write of the frame: the mbuf's data lines are
        // usually not in cache yet, and a load would wait for them (perf showed it).
        buf[L3 + 1] = self.hdr[L3 + 1] | ecn;
        buf[L3 + 2..L3 + 4].copy_from_slice(&tl.to_be_bytes());
        let mut s = self.ip_sum + u32::from(tl) + u32::from(ecn);
        s = (s & 0xFFFF) + (s >> 16);
        s = (s & 0xFFFF) + (s >> 16);
        buf[L3 + 10..L3 + 12].copy_from_slice(&(!(s as u16)).to_be_bytes());
        buf[L4 + 4..L4 + 6].copy_from_slice(&ul.to_be_bytes());
        let flags = pkt.bth.flags.bits() | ((pad as u8) << 4);
        let simple = pkt.ccext.is_none()
            && op.has_deth() == pkt.deth.is_some()
            && op.has_reth() == pkt.reth.is_some()
            && op.has_aeth() == pkt.aeth.is_some()
            && op.has_immdt() == pkt.immdt.is_some()
            && !op.has_ieth()
            && pkt.ieth.is_none()
            && !op.has_atomic_eth()
            && !op.has_atomic_ack_eth()
            && pkt.atomic.is_none()
            && pkt.atomic_ack.is_none()
            && op != Opcode::Cnp;
        let ml = (ip_len - self.int_len) as u16; // lengths as the ICRC sees them
        let mu = ml - ipv4::HEADER_LEN as u16;
        let reg = self.crc_pre
            ^ POS[0][usize::from(ml >> 8)]
            ^ POS[1][usize::from(ml & 0xFF)]
            ^ POS[2][usize::from(mu >> 8)]
            ^ POS[3][usize::from(mu & 0xFF)]
            ^ POS[4][usize::from(op as u8)]
            ^ POS[5][usize::from(flags)];
        let folder = if simple {
            // BTH bytes 8.. and the extension headers, as 32-bit words: written with
            // word stores and hashed from the same values.
            let b = &mut buf[bth_off..hl];
            b[0] = op as u8;
            b[1] = flags;
            b[4] = pkt.bth.fecn_becn;
            // BTH bytes 8..12 and the extension headers: (tpt - 8) / 4 words.
            let mut f = Folder::new(reg, (tpt - 8) / 4 + payload_words);
            let mut o = 8;
            // A macro, not a closure: the closure was not inlined, which put the
            // folder in memory.
            macro_rules! put {
                ($v:expr) => {{
                    let v: u32 = $v;
                    if let Some(d) = b.get_mut(o..o + 4) {
                        d.copy_from_slice(&v.to_be_bytes());
                    }
                    f.push(be(v));
                    o += 4;
                }};
            }
            put!((u32::from(pkt.bth.ack_req) << 31) | pkt.bth.psn);
            if let Some(d) = &pkt.deth {
                if d.src_qp > 0xFF_FFFF {
                    return Err(WireError::FieldRange("DETH source QP"));
                }
                put!(d.qkey);
                put!(d.src_qp);
            }
            if let Some(r) = &pkt.reth {
                put!((r.va >> 32) as u32);
                put!(r.va as u32);
                put!(r.rkey);
                put!(r.dma_len);
            }
            if let Some(a) = &pkt.aeth {
                put!((u32::from(a.syndrome.to_u8()) << 24) | (a.msn & 0xFF_FFFF));
            }
            if let Some(i) = &pkt.immdt {
                put!(i.0);
            }
            debug_assert_eq!(o, tpt);
            f
        } else {
            // Rare shapes (CC extension, atomics, IETH, CNP): the generic emitter, which also
            // validates the headers against the opcode; hashed by reading them back.
            let mut t = *pkt;
            t.bth.pad = pad as u8;
            t.emit_transport(&mut buf[bth_off..hl])?;
            Folder::new(crc_update(reg, &buf[bth_off + 8..hl]), payload_words)
        };
        Ok((
            TemplateLayout {
                len: hl,
                pad,
                frame_len,
                icrc_so_far: 0,
            },
            folder,
        ))
    }

    /// Writes a complete frame (headers, payload copy, pad, ICRC) into `buf`; returns
    /// its length. Same bytes as [`FrameBuilder::emit_frame`] with this template's
    /// frame builder.
    #[inline]
    pub fn write_frame(
        &self,
        buf: &mut [u8],
        pkt: &RoceRepr,
        ecn: Ecn,
        payload: &[u8],
    ) -> Result<usize> {
        if !self.fits(pkt) {
            return self.fb.emit_frame(pkt, payload, ecn, buf);
        }
        let small = payload.len() <= SMALL_PAYLOAD;
        let pw = if small { payload.len().div_ceil(4) } else { 0 };
        let (l, mut folder) = self.headers_fast(buf, pkt, ecn, payload.len(), pw)?;
        need_out("RoCEv2 frame", l.frame_len, buf.len())?;
        let f = &mut buf[..l.frame_len];
        let p = l.len;
        let t = p + payload.len() + l.pad;
        // The payload is hashed from the source, not read back from the frame (see
        // `fold`).
        let reg = if small {
            // Payload and pad as whole words: written with word stores (no memcpy
            // call) and folded with the headers.
            for (c, d) in payload.chunks(4).zip(f[p..t].chunks_exact_mut(4)) {
                let mut v = 0u32;
                for (k, &b) in c.iter().enumerate() {
                    v |= u32::from(b) << (8 * k);
                }
                d.copy_from_slice(&v.to_le_bytes());
                folder.push(v);
            }
            folder.finish()
        } else {
            f[p..p + payload.len()].copy_from_slice(payload);
            f[p + payload.len()..t].fill(0);
            let reg = crc_update(folder.finish(), payload);
            fold_zeros(reg, l.pad)
        };
        f[t..].copy_from_slice(&(!reg).to_le_bytes());
        Ok(l.frame_len)
    }

    /// ICRC state after the headers written by [`Self::write_headers`], as a hasher to
    /// feed the payload segments and finish with [`FrameBuilder::finish_icrc`].
    pub fn hasher(layout: &TemplateLayout) -> IcrcHasher {
        IcrcHasher::resume(layout.icrc_so_far)
    }
}

/// The INT template copy (70 bytes), out of line: see `headers_fast`.
#[cold]
#[inline(never)]
fn copy_int_template(buf: &mut [u8], hdr: &[u8; MAX_TPL]) {
    buf[..MAX_TPL].copy_from_slice(hdr);
}

/// Continues a CRC-32 value (`crc32fast` convention) over `data`: the short-run table
/// path the template uses, exposed for tests and benchmarks.
pub fn crc32_continue(crc: u32, data: &[u8]) -> u32 {
    !crc_update(!crc, data)
}

#[cfg(test)]
mod tests {
    use super::super::ccext::{CcExtFlags, CcExtRepr};
    use super::super::frame::{HeaderLayout, IntInsert, NetHeaders, ParseOptions};
    use super::super::transport_hdrs::{
        AethRepr, AethSyndrome, AtomicEthRepr, ImmDtRepr, RethRepr,
    };
    use super::super::{parse_frame, BthFlags};
    use super::*;
    use proptest::prelude::*;

    fn fb(int: bool) -> FrameBuilder {
        FrameBuilder {
            net: NetHeaders::new(
                [2, 0, 0, 0, 0, 1],
                [2, 0, 0, 0, 0, 2],
                [10, 0, 0, 1],
                [10, 0, 0, 2],
                0xC123,
            ),
            int: int.then_some(IntInsert {
                int_dscp: 0x18,
                max_hops: 4,
            }),
        }
    }

    fn write_only(qp: u32, psn: u32, va: u64, len: u32) -> RoceRepr {
        let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qp, psn));
        r.reth = Some(RethRepr {
            va,
            rkey: 0x100,
            dma_len: len,
        });
        r
    }

    /// Template output equals `emit_frame` byte for byte, and parses with a good ICRC.
    fn check(t: &HeaderTemplate, pkt: &RoceRepr, ecn: Ecn, payload: &[u8]) {
        let mut a = vec![0u8; payload.len() + 200];
        let mut b = vec![0u8; payload.len() + 200];
        let n = t.write_frame(&mut a, pkt, ecn, payload).unwrap();
        let m = t
            .frame_builder()
            .emit_frame(pkt, payload, ecn, &mut b)
            .unwrap();
        assert_eq!(&a[..n], &b[..m], "{pkt:?} {ecn:?} len {}", payload.len());
        let f = parse_frame(&a[..n], &ParseOptions::default(), |_| pkt.ccext.is_some())
            .expect("template frame parses with a good ICRC");
        assert_eq!(f.bth.psn, pkt.bth.psn);
        assert_eq!(f.payload, payload);
        // Headers + hasher path gives the same ICRC.
        let mut h = vec![0u8; 200];
        let l = t.write_headers(&mut h, pkt, ecn, payload.len()).unwrap();
        assert_eq!(&h[..l.len], &a[..l.len]);
        assert_eq!(l.frame_len, n);
        let mut hs = HeaderTemplate::hasher(&l);
        hs.update(payload);
        let mut tr = [0u8; 7];
        let hl = HeaderLayout {
            len: l.len,
            pad: l.pad,
            int_len: t.int_len,
            frame_len: l.frame_len,
        };
        let k = FrameBuilder::finish_icrc(hs, &hl, &mut tr).unwrap();
        assert_eq!(&tr[..k], &a[n - k..n]);
    }

    #[test]
    fn tables_match_bytewise_crc() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 31 + 5) as u8).collect();
        for len in [0usize, 1, 3, 4, 5, 15, 16, 17, 24, 63, 64, 65, 200, 300] {
            for init in [0u32, 0xFFFF_FFFF, 0x1234_5678] {
                let mut h = crc32fast::Hasher::new_with_initial(init);
                h.update(&data[..len]);
                assert_eq!(
                    crc32_continue(init, &data[..len]),
                    h.finalize(),
                    "len {len}"
                );
            }
        }
    }

    #[test]
    fn write_only_stream_matches_emit_frame() {
        for int in [false, true] {
            let t = HeaderTemplate::new(fb(int), 0x12, bth::DEFAULT_PKEY).unwrap();
            for (psn, va) in [
                (0u32, 0x1000u64),
                (1, 0x1001),
                (0xFF_FFFF, u64::MAX),
                (0x80_0000, 7),
            ] {
                for ecn in [Ecn::NotEct, Ecn::Ect0, Ecn::Ect1, Ecn::Ce] {
                    for len in [0usize, 1, 2, 3, 4, 63, 64, 65, 1024, 4096] {
                        let p: Vec<u8> = (0..len).map(|i| (i as u32 ^ psn) as u8).collect();
                        check(&t, &write_only(0x12, psn, va, len as u32), ecn, &p);
                    }
                }
            }
        }
    }

    #[test]
    fn every_shape_matches_emit_frame() {
        let t = HeaderTemplate::new(fb(false), 0x42, bth::DEFAULT_PKEY).unwrap();
        let mut shapes = Vec::new();
        let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnlyImm, 0x42, 9));
        r.reth = Some(RethRepr {
            va: 5,
            rkey: 6,
            dma_len: 7,
        });
        r.immdt = Some(ImmDtRepr(0xDEAD_BEEF));
        r.bth.flags = BthFlags::SE;
        r.bth.ack_req = true;
        shapes.push(r);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadResponseFirst, 0x42, 10));
        r.aeth = Some(AethRepr {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn: 77,
        });
        shapes.push(r);
        shapes.push(RoceRepr::new(BthRepr::new(Opcode::SendMiddle, 0x42, 11)));
        let mut r = RoceRepr::new(BthRepr::new(Opcode::SendLastImm, 0x42, 12));
        r.immdt = Some(ImmDtRepr(1));
        r.bth.fecn_becn = 0x40;
        shapes.push(r);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteFirst, 0x42, 13));
        r.reth = Some(RethRepr {
            va: 1,
            rkey: 2,
            dma_len: 3,
        });
        r.ccext = Some(CcExtRepr::data(999, CcExtFlags::FAST_START));
        shapes.push(r);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::FetchAdd, 0x42, 14));
        r.atomic = Some(AtomicEthRepr {
            va: 8,
            rkey: 9,
            swap_add: 10,
            compare: 11,
        });
        shapes.push(r);
        shapes.push(RoceRepr::new(BthRepr::new(Opcode::Cnp, 0x42, 0)));
        // UC (the opcode's service bits go through the ICRC tables) and UD (the DETH
        // written and hashed as words, before the ImmDt).
        let mut r = RoceRepr::new(BthRepr::new(Opcode::UcWriteOnlyImm, 0x42, 15));
        r.reth = Some(RethRepr {
            va: 1,
            rkey: 2,
            dma_len: 13,
        });
        r.immdt = Some(ImmDtRepr(3));
        shapes.push(r);
        shapes.push(RoceRepr::new(BthRepr::new(Opcode::UcSendMiddle, 0x42, 16)));
        let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnlyImm, 0x42, 17));
        r.deth = Some(crate::wire::transport_hdrs::DethRepr {
            qkey: 0x8000_0011,
            src_qp: 0xFF_FFFE,
        });
        r.immdt = Some(ImmDtRepr(4));
        shapes.push(r);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnly, 0x42, 18));
        r.deth = Some(crate::wire::transport_hdrs::DethRepr { qkey: 5, src_qp: 6 });
        shapes.push(r);
        // Not the template's QP / P_Key: the FrameBuilder path.
        shapes.push(RoceRepr::new(BthRepr::new(Opcode::SendMiddle, 0x43, 11)));
        let mut r = RoceRepr::new(BthRepr::new(Opcode::SendMiddle, 0x42, 11));
        r.bth.pkey = 0x8001;
        shapes.push(r);
        for s in shapes {
            let len = if s.bth.opcode.has_payload() { 13 } else { 0 };
            check(&t, &s, Ecn::Ect0, &vec![0x5A; len]);
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let t = HeaderTemplate::new(fb(false), 0x42, bth::DEFAULT_PKEY).unwrap();
        let mut buf = [0u8; 100];
        let pkt = write_only(0x42, 1, 2, 3);
        // Buffer too small for headers, then for the frame.
        assert!(t
            .write_frame(&mut buf[..50], &pkt, Ecn::Ect0, &[1; 3])
            .is_err());
        assert!(t.write_frame(&mut buf, &pkt, Ecn::Ect0, &[1; 40]).is_err());
        // PSN out of range.
        let mut p = pkt;
        p.bth.psn = 1 << 24;
        assert!(t.write_frame(&mut buf, &p, Ecn::Ect0, &[]).is_err());
        // Headers that do not match the opcode.
        let mut p = pkt;
        p.reth = None;
        assert!(t.write_frame(&mut buf, &p, Ecn::Ect0, &[]).is_err());
        // A frame longer than IPv4 allows.
        let mut big = vec![0u8; 70_000];
        let payload = vec![0u8; 65_500];
        assert!(t.write_frame(&mut big, &pkt, Ecn::Ect0, &payload).is_err());
        assert!(HeaderTemplate::new(fb(false), 1 << 24, 0xFFFF).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 8 } else { 2048 }))]
        /// The grouped fold equals a plain CRC-32 over the words' bytes for every
        /// word count (group alignment, several groups) and register.
        #[test]
        fn folder_equals_plain_crc(
            reg in any::<u32>(),
            words in proptest::collection::vec(any::<u32>(), 0..40),
        ) {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut f = Folder::new(reg, words.len());
            for &w in &words {
                f.push(w);
            }
            prop_assert_eq!(f.finish(), !crc32_continue(!reg, &bytes));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 8 } else { 512 }))]
        #[test]
        fn random_write_only_equals_rdma_icrc(
            psn in 0u32..=0xFF_FFFF,
            va in any::<u64>(),
            rkey in any::<u32>(),
            qp in 0u32..=0xFF_FFFF,
            ack in any::<bool>(),
            int in any::<bool>(),
            ecn in 0u8..4,
            payload in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let t = HeaderTemplate::new(fb(int), qp, bth::DEFAULT_PKEY).unwrap();
            let mut pkt = write_only(qp, psn, va, payload.len() as u32);
            pkt.reth.as_mut().unwrap().rkey = rkey;
            pkt.bth.ack_req = ack;
            let ecn = Ecn::from_bits(ecn);
            let mut a = vec![0u8; payload.len() + 120];
            let n = t.write_frame(&mut a, &pkt, ecn, &payload).unwrap();
            // The full ICRC of rdma::wire::icrc, and the whole frame of emit_frame.
            super::super::icrc::verify_icrc(&a[..n], L3, t.int_len).unwrap();
            let mut b = vec![0u8; payload.len() + 120];
            let m = t.frame_builder().emit_frame(&pkt, &payload, ecn, &mut b).unwrap();
            prop_assert_eq!(&a[..n], &b[..m]);
            let f = parse_frame(&a[..n], &ParseOptions::default(), |_| false).unwrap();
            prop_assert_eq!(f.reth.unwrap().va, va);
            prop_assert_eq!(f.bth.psn, psn);
            prop_assert_eq!(f.payload, &payload[..]);
        }
    }
}
