//! Frames in the simulator: real RoCEv2 frames (built by `rdma::wire`, parsed by the
//! switch core and the receiving transport) in fixed boxed buffers that are recycled
//! through a free list, so that a run allocates buffers only up to its peak number of
//! frames in flight and never per packet after that.

use rdma::transport::MemorySpace;
use switch::PacketBuf;

/// Bytes in front of a new frame: room for the INT hop records pushed at dequeue
/// (16 bytes a hop, [`crate::nic::INT_MAX_HOPS`] hops).
pub const HEADROOM: usize = 128;
/// Largest RoCE MTU the buffers hold (with every header, an INT container and a CC
/// extension header echoing a full hop stack, in [`BUF_LEN`]). Small buffers keep
/// the frames in flight of a 320-host fabric in cache-friendly memory.
pub const MAX_MTU: u32 = 1024;
/// Buffer size.
pub const BUF_LEN: usize = HEADROOM + MAX_MTU as usize + 384;

/// An owned frame, the switch core's packet handle: the frame is
/// `buf[start..start + len]`, laid out like an mbuf (headroom in front). The offsets
/// live in the handle, not in the buffer, so that a length query (every hop's queue
/// accounting) reads no cache line of the frame.
///
/// A data frame's payload, pad and ICRC are not written (`crate::nic` writes only the
/// headers, whose lengths cover the whole frame): its payload is zeros from
/// [`NullMemory`] that nobody reads, the switch core reads only headers, and the
/// receiver counts payload bytes without reading them and skips the ICRC check. Those
/// bytes hold whatever an earlier frame left in the recycled buffer; since they are
/// never touched, a frame in flight costs the caches its header lines only, not its
/// full 1 KB.
pub struct SimFrame {
    buf: Box<[u8; BUF_LEN]>,
    start: u16,
    len: u16,
    /// End of the bytes written at build (a data frame's headers): what a copy needs.
    written_end: u16,
}

impl SimFrame {
    /// The writable area where a new frame starts (after the headroom).
    pub fn build_area(&mut self) -> &mut [u8] {
        &mut self.buf[HEADROOM..]
    }

    /// Makes this buffer hold a copy of `other`'s frame at the same offsets, its
    /// written bytes only (a frame that crosses to another partition moves into that
    /// partition's pool; the unwritten payload of a data frame is not read).
    pub fn copy_from(&mut self, other: &SimFrame) {
        let s = usize::from(other.start);
        let e = usize::from(other.written_end).clamp(s, s + usize::from(other.len));
        self.buf[s..e].copy_from_slice(&other.buf[s..e]);
        self.start = other.start;
        self.len = other.len;
        self.written_end = other.written_end;
    }

    /// Sets the frame to the `len` bytes starting at [`Self::build_area`], of which
    /// the first `written` were written (all of them but a data frame's payload, pad
    /// and ICRC).
    pub fn set_built(&mut self, len: usize, written: usize) {
        self.start = HEADROOM as u16;
        self.len = len.min(BUF_LEN - HEADROOM) as u16;
        self.written_end = (HEADROOM + written.min(len)).min(BUF_LEN) as u16;
    }
}

impl PacketBuf for SimFrame {
    /// Thousands of simulated ports, most of them nearly idle: rings grow on demand.
    const PREALLOCATED_QUEUES: bool = false;

    #[inline]
    fn len(&self) -> usize {
        usize::from(self.len)
    }
    #[inline]
    fn bytes(&self) -> &[u8] {
        let s = usize::from(self.start);
        &self.buf[s..s + usize::from(self.len)]
    }
    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        let s = usize::from(self.start);
        &mut self.buf[s..s + usize::from(self.len)]
    }
    #[inline]
    fn prepend(&mut self, n: usize) -> bool {
        if n > usize::from(self.start) {
            return false;
        }
        self.start -= n as u16;
        self.len += n as u16;
        true
    }
    #[inline]
    fn trim_front(&mut self, n: usize) {
        let n = n.min(usize::from(self.len)) as u16;
        self.start += n;
        self.len -= n;
    }
}

/// Free frame buffers.
#[derive(Default)]
pub struct FramePool {
    free: Vec<SimFrame>,
    allocated: usize,
}

impl FramePool {
    /// A buffer (recycled when one is free).
    #[inline]
    pub fn get(&mut self) -> SimFrame {
        self.free.pop().unwrap_or_else(|| {
            self.allocated += 1;
            SimFrame {
                buf: Box::new([0; BUF_LEN]),
                start: HEADROOM as u16,
                len: 0,
                written_end: HEADROOM as u16,
            }
        })
    }

    /// Gives a buffer back.
    #[inline]
    pub fn put(&mut self, f: SimFrame) {
        self.free.push(f);
    }

    /// Buffers ever allocated (the run's peak of frames alive).
    pub fn allocated(&self) -> usize {
        self.allocated
    }
}

/// Registered memory that holds nothing: payload reads are zeros, writes are counted
/// and vanish. A simulated flow moves bytes, not content, and 320 hosts cannot each keep
/// the tens of megabytes their flows write. The transport still checks every key and
/// range; the count is what the receivers' transports delivered (bytes conserved).
#[derive(Debug, Default)]
pub struct NullMemory {
    /// Bytes written.
    pub written: u64,
}

impl MemorySpace for NullMemory {
    fn copy_out(&self, _va: u64, dst: &mut [u8]) {
        dst.fill(0);
    }
    fn copy_in(&mut self, _va: u64, src: &[u8]) {
        self.written += src.len() as u64;
    }
}
