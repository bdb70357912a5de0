//! RoCEv2 frames in and out of mbufs: the TX pipeline's last step and the RX
//! pipeline's first (docs/design.md §3, §5).
//!
//! TX: headers are written into a fresh mbuf; a payload is either copied
//! behind them (small payloads, where a copy is cheaper than a second
//! descriptor) or attached zero-copy from registered memory
//! ([`dpdk::ExtBuf`]), and the ICRC is computed incrementally over the
//! segments and written with the pad into the last one (or a small trailer
//! mbuf after an external segment, which has no tailroom).
//!
//! RX: a frame is parsed in place when it is one segment (the common case);
//! a chained frame is first copied into a scratch buffer. Parsing checks
//! every length, skips an INT container (handing back its hop records) and
//! verifies the ICRC as if the container were absent.

use std::sync::Arc;

use dpdk::{ExtBuf, Mbuf, MbufStash, Mempool};
use rdma::wire::{
    frame::{FrameBuilder, HeaderLayout, RoceRepr},
    int, parse_frame, Ecn, HeaderTemplate, ParseOptions, RoceFrame, WireError,
};

/// Payloads up to this many bytes are copied into the header mbuf by
/// default (a copy is cheaper than a second descriptor); see
/// [`TxPools::copy_threshold`].
pub const COPY_THRESHOLD: usize = 256;

/// Largest frame the RX path linearises (a 4 KiB MTU frame with headers,
/// INT and extension headers fits).
pub const MAX_FRAME: usize = 9216;

/// Where a packet's payload comes from.
#[derive(Clone, Copy)]
pub enum Payload<'a> {
    /// Header-only packet (ACK, READ request, CNP, ...).
    None,
    /// Bytes to copy.
    Copy(&'a [u8]),
    /// A window of registered memory, attached without copying when long.
    Ext {
        /// The registered memory.
        mem: &'a ExtBuf,
        /// Offset into it.
        offset: usize,
        /// Length (at most 65535).
        len: usize,
    },
    /// Windows of registered memory one after the other: a packet of a
    /// send WQE with several SGEs (rdma::transport::sgl). Each part is
    /// attached without copying when long, copied when short: one pass
    /// over the bytes (the ICRC's), as for [`Payload::Ext`].
    Gather {
        /// The windows, in order.
        parts: &'a [ExtPart<'a>],
        /// Their total length.
        len: usize,
    },
}

/// One window of a [`Payload::Gather`].
#[derive(Clone, Copy)]
pub struct ExtPart<'a> {
    /// The registered memory.
    pub mem: &'a ExtBuf,
    /// Offset into it.
    pub offset: usize,
    /// Length (at most 65535).
    pub len: usize,
}

impl Payload<'_> {
    /// Payload length in bytes.
    pub fn len(&self) -> usize {
        match *self {
            Payload::None => 0,
            Payload::Copy(p) => p.len(),
            Payload::Ext { len, .. } | Payload::Gather { len, .. } => len,
        }
    }

    /// Whether there is no payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a frame could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    /// Out of mbufs or mbuf room.
    #[error(transparent)]
    Dpdk(#[from] dpdk::Error),
    /// The headers were inconsistent (a bug upstream, counted, never sent).
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A window outside the registered memory.
    #[error("payload window {offset}+{len} outside registered memory of {size} bytes")]
    OutOfRange {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Size of the memory.
        size: usize,
    },
}

/// Where the TX path takes its mbufs: the engine's two pools, each through
/// its own [`MbufStash`] (mbufs taken in bulk ahead of use and prefetched,
/// since the peer that frees them may be another core). One per engine.
pub struct TxPools {
    /// Mbufs with data room, for headers and copied payloads.
    pub hdr: MbufStash,
    /// Mbufs without data room, to attach external memory to.
    pub bare: MbufStash,
    /// Registered-memory payloads up to this many bytes are copied (the
    /// frame stays one segment when it fits the data room); longer ones are
    /// attached zero-copy. Like a driver's copy-break: a peer that needs
    /// single-segment frames (some PMDs, a switch that parses only the first
    /// segment) gets them up to this size.
    pub copy_threshold: usize,
}

impl TxPools {
    /// The TX mbufs of `hdr` (with data room) and `bare` (without).
    pub fn new(
        hdr: Arc<Mempool>,
        bare: Arc<Mempool>,
        copy_threshold: usize,
    ) -> dpdk::Result<TxPools> {
        Ok(TxPools {
            hdr: MbufStash::new(hdr)?,
            bare: MbufStash::new(bare)?,
            copy_threshold,
        })
    }

    /// Returns the mbufs the stashes hold to their pools
    /// ([`MbufStash::release`]): what an engine does before it parks.
    pub fn release(&mut self) {
        self.hdr.release();
        self.bare.release();
    }

    /// The two pools (what a holder keeps alive while frames from them are
    /// out).
    pub fn pools(&self) -> [Arc<Mempool>; 2] {
        [self.hdr.pool().clone(), self.bare.pool().clone()]
    }
}

/// Builds one complete frame: headers by `fb` and `pkt`, IP ECN `ecn`, the
/// payload, pad and ICRC.
///
/// This is the general path (every header emitted field by field, the ICRC
/// over the whole frame). A QP's data packets go faster through
/// [`build_frame_tpl`].
pub fn build_frame(
    fb: &FrameBuilder,
    pkt: &RoceRepr,
    ecn: Ecn,
    payload: Payload<'_>,
    pools: &mut TxPools,
) -> Result<Mbuf, TxError> {
    let mut m = pools.hdr.alloc()?;
    let hl = fb.headers_len(pkt);
    let layout = fb.emit_headers(pkt, payload.len(), ecn, m.append(hl)?)?;
    // Fast path: a copied payload that fits the header mbuf makes one
    // contiguous frame, whose ICRC is one in-place CRC pass (raw CRC speed).
    if let Some(p) = copy_source(payload, &*pools)? {
        if p.len() + layout.pad + 4 <= m.tailroom() {
            m.extend_from_slice(p)?;
            m.append(layout.pad + 4)?.fill(0);
            rdma::wire::fill_icrc(
                m.data_mut(),
                rdma::wire::ethernet::HEADER_LEN,
                layout.int_len,
            )?;
            return Ok(m);
        }
    }
    let h = fb.icrc_start(m.data(), &layout)?;
    finish_segments(&mut m, h, &layout, payload, pools)?;
    Ok(m)
}

/// [`build_frame`] through the QP's [`HeaderTemplate`]: the headers are one
/// copy of the template with the per-packet fields patched, and the ICRC
/// starts from the template's precomputed state (rdma::wire::template,
/// docs/design.md §3 and §9). Same bytes on the wire as [`build_frame`] with the
/// template's frame builder; packets the template does not cover (another
/// destination QP) take that path inside the template.
pub fn build_frame_tpl(
    tpl: &HeaderTemplate,
    pkt: &RoceRepr,
    ecn: Ecn,
    payload: Payload<'_>,
    pools: &mut TxPools,
) -> Result<Mbuf, TxError> {
    let mut m = pools.hdr.alloc()?;
    fill_frame_tpl(&mut m, tpl, pkt, ecn, payload, pools)?;
    Ok(m)
}

/// Fills `m`, a fresh empty mbuf (from [`Mempool::alloc`] or
/// [`Mempool::alloc_bulk`]: a burst's mbufs are allocated in one call, then
/// filled), with one frame as [`build_frame_tpl`] does. On error `m` holds a
/// partial frame: drop it.
#[inline]
pub fn fill_frame_tpl(
    m: &mut Mbuf,
    tpl: &HeaderTemplate,
    pkt: &RoceRepr,
    ecn: Ecn,
    payload: Payload<'_>,
    pools: &mut TxPools,
) -> Result<(), TxError> {
    let hl = tpl.frame_builder().headers_len(pkt);
    if let Some(p) = copy_source(payload, &*pools)? {
        // One contiguous frame: headers, payload, pad and ICRC in one pass.
        let n = hl + p.len() + (p.len().wrapping_neg() & 3) + 4;
        // `append` checks the room itself (and changes nothing when short).
        if let Ok(buf) = m.append(n) {
            tpl.write_frame(buf, pkt, ecn, p)?;
            return Ok(());
        }
    }
    let l = tpl.write_headers(m.append(hl)?, pkt, ecn, payload.len())?;
    let layout = HeaderLayout {
        len: l.len,
        pad: l.pad,
        int_len: tpl.frame_builder().int.map_or(0, |_| int::HEADER_LEN),
        frame_len: l.frame_len,
    };
    finish_segments(m, HeaderTemplate::hasher(&l), &layout, payload, pools)
}

/// The bytes of a payload that is copied rather than attached: all of
/// `Copy`, and registered memory up to the copy threshold. Checks the window.
#[inline]
fn copy_source<'a>(payload: Payload<'a>, pools: &TxPools) -> Result<Option<&'a [u8]>, TxError> {
    Ok(match payload {
        Payload::None => Some(&[]),
        Payload::Copy(p) => Some(p),
        Payload::Ext { mem, offset, len } if len <= pools.copy_threshold => {
            let size = mem.len();
            let p = crate::sys::in_flight(mem, offset, len);
            Some(p.ok_or(TxError::OutOfRange { offset, len, size })?)
        }
        Payload::Ext { .. } | Payload::Gather { .. } => None,
    })
}

/// After the headers (in `m`, hashed into `h`): appends the payload (copied,
/// chaining mbufs as needed, or attached zero-copy), then pad and ICRC (in
/// the last segment, or a trailer mbuf after an external one).
fn finish_segments(
    m: &mut Mbuf,
    mut h: rdma::wire::IcrcHasher,
    layout: &HeaderLayout,
    payload: Payload<'_>,
    pools: &mut TxPools,
) -> Result<(), TxError> {
    match payload {
        Payload::None => {}
        Payload::Copy(p) => {
            h.update(p);
            append_copy(m, p, &mut pools.hdr)?;
        }
        Payload::Ext { mem, offset, len } => {
            append_ext(m, &mut h, ExtPart { mem, offset, len }, pools)?;
        }
        Payload::Gather { parts, .. } => {
            for &part in parts {
                append_ext(m, &mut h, part, pools)?;
            }
        }
    }
    let n = layout.pad + 4;
    if m.tailroom() >= n {
        FrameBuilder::finish_icrc(h, layout, m.append(n)?)?;
    } else {
        let mut t = pools.hdr.alloc()?;
        FrameBuilder::finish_icrc(h, layout, t.append(n)?)?;
        m.chain(t).map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Appends one window of registered memory to `m` (hashed into `h`): copied
/// up to the copy threshold, attached zero-copy beyond it. Checks the window.
fn append_ext(
    m: &mut Mbuf,
    h: &mut rdma::wire::IcrcHasher,
    ExtPart { mem, offset, len }: ExtPart<'_>,
    pools: &mut TxPools,
) -> Result<(), TxError> {
    let size = mem.len();
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(TxError::OutOfRange { offset, len, size });
    }
    if len <= pools.copy_threshold {
        let p = crate::sys::in_flight(mem, offset, len).ok_or(TxError::OutOfRange {
            offset,
            len,
            size,
        })?;
        h.update(p);
        append_copy(m, p, &mut pools.hdr)?;
    } else {
        let mut seg = pools.bare.alloc()?;
        mem.attach(&mut seg, offset, len)?;
        h.update(seg.data());
        m.chain(seg).map_err(|(e, _)| e)?;
    }
    Ok(())
}

/// Whether `frame` is an IPv4 frame addressed to `mac` and `ip`, the port's
/// own: it loops back inside the NIC instead of going to the wire (engine
/// `loop_back`). Both addresses count: ports of a ring pair share one MAC.
#[inline]
pub(crate) fn is_for_self(frame: &[u8], mac: &[u8; 6], ip: &[u8; 4]) -> bool {
    frame.len() >= 34
        && frame[..6] == mac[..]
        && frame[12..14] == [0x08, 0x00]
        && frame[30..34] == ip[..]
}

/// A frame copied into mbufs from `pool` (chained when longer than one
/// mbuf's data room): how the control plane's replies go out.
pub fn copy_frame(bytes: &[u8], pool: &mut MbufStash) -> Result<Mbuf, TxError> {
    let mut m = pool.alloc()?;
    append_copy(&mut m, bytes, pool)?;
    Ok(m)
}

/// Appends `bytes` to `m`, chaining more mbufs from `pool` when the last
/// segment is full (a 4 KiB payload does not fit a 2 KiB data room).
fn append_copy(m: &mut Mbuf, mut bytes: &[u8], pool: &mut MbufStash) -> Result<(), TxError> {
    while !bytes.is_empty() {
        let room = m.tailroom();
        if room == 0 {
            m.chain(pool.alloc()?).map_err(|(e, _)| e)?;
            continue;
        }
        let k = room.min(bytes.len());
        m.extend_from_slice(&bytes[..k])?;
        bytes = &bytes[k..];
    }
    Ok(())
}

/// Returns the frame's bytes contiguous: the mbuf's own data when it is one
/// segment, otherwise a copy in `scratch`. `None` if it does not fit.
pub fn contiguous<'a>(m: &'a Mbuf, scratch: &'a mut [u8]) -> Option<&'a [u8]> {
    if m.nb_segs() == 1 {
        return Some(m.data());
    }
    let len = m.pkt_len();
    if len > scratch.len() {
        return None;
    }
    m.read(0, &mut scratch[..len]).ok()?;
    Some(&scratch[..len])
}

/// Parses a received frame (see the module docs); `has_ccext` says whether
/// the destination QP negotiated the CC extension header.
pub fn parse_rx<'a>(
    bytes: &'a [u8],
    opts: &ParseOptions,
    has_ccext: impl FnOnce(&rdma::wire::BthRepr) -> bool,
) -> Result<RoceFrame<'a>, WireError> {
    parse_frame(bytes, opts, has_ccext)
}

/// The headers of a frame from 10.0.0.1 to 10.0.0.2 (with `int`'s INT insert),
/// for tests that build frames by hand.
#[cfg(test)]
pub(crate) fn test_frame_builder(
    int: Option<rdma::wire::frame::IntInsert>,
) -> rdma::wire::frame::FrameBuilder {
    rdma::wire::frame::FrameBuilder {
        net: rdma::wire::frame::NetHeaders::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            0xC011,
        ),
        int,
    }
}
