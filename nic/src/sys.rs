//! The one module of `nic` with `unsafe` code (the crate denies it
//! everywhere else): access to registered memory, the caller's memory a
//! region is registered over, and the eventfd system calls of completion
//! notification.
//!
//! # Registered memory
//! Registered bytes are shared like a NIC's DMA memory: the program, the
//! engine's RX path (placing a peer's WRITE, SEND or READ response) and the
//! engine's TX path (reading what it sends, copying or zero-copy through an
//! attached mbuf) all reach them, from different threads. The rules here:
//! - No reference is ever formed over a whole region: the program's
//!   [`MemoryRegion::write`]/[`MemoryRegion::read`], its copies between
//!   regions and the engine's RX placement ([`RawMemory`]) copy through raw
//!   pointers.
//! - The TX path forms a shared reference over exactly the bytes of one
//!   operation in flight ([`in_flight`], and an attached mbuf's data), for
//!   as long as it hashes or copies them. The verbs contract (IBA 10.7.2.2;
//!   `ibv_post_send(3)`: the buffer must not change until the work
//!   completes) says nobody writes those bytes meanwhile. A program or a
//!   peer that does races with the NIC, as it would with hardware, and the
//!   bytes sent are unspecified; Rust has no atomic `memcpy` (RFC 3301) to
//!   make such a race defined without losing vectorised copies.
//! - Every access is range-checked first (by [`MrTable`] for the engine,
//!   by the handle's length for the program), and the memory lives as long
//!   as any handle, engine table entry or attached mbuf refers to it
//!   ([`ExtBuf`]'s reference count).
//!
//! [`MrTable`]: rdma::transport::MrTable

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use dpdk::ExtBuf;
use rdma::transport::{Access, MemorySpace};

use crate::verbs::{Device, MemoryRegion, VerbsError};

/// Registered memory seen as the process's address space: a region's
/// virtual address is its pointer (DESIGN.md §5). The transport calls it only
/// for a range an [`rdma::transport::MrTable`] check accepted, and the engine
/// keeps every registered region alive while it is in the table, so each
/// access lies in live memory (the contract a NIC's DMA engine has).
pub(crate) struct RawMemory;

impl MemorySpace for RawMemory {
    fn copy_out(&self, va: u64, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        // SAFETY: `va..va + dst.len()` was accepted by the MR table, so it
        // lies in a live registered region (see the type's docs); `dst` is
        // the engine's own buffer and cannot overlap a region.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, dst.as_mut_ptr(), dst.len()) }
    }

    fn copy_in(&mut self, va: u64, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        // SAFETY: as in `copy_out`: a live registered range, and `src` (a
        // received frame's payload, in an mbuf) is not region memory.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), va as *mut u8, src.len()) }
    }
}

/// `len` bytes at `offset` of `mem`, the payload of one operation in flight,
/// for the TX path to copy into a frame and hash; None when out of range.
#[inline]
pub(crate) fn in_flight(mem: &ExtBuf, offset: usize, len: usize) -> Option<&[u8]> {
    // SAFETY: the bytes belong to a posted work request; the verbs contract
    // (module docs) keeps every writer off them until it completes, and the
    // reference does not outlive the frame being built.
    unsafe { mem.window(offset, len) }
}

/// Whether `offset..offset + len` lies inside a region of `size` bytes.
fn inside(offset: usize, len: usize, size: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

impl MemoryRegion {
    /// Copies `data` into the region at `offset`. Panics if out of range.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            inside(offset, data.len(), self.len()),
            "write outside the region"
        );
        // SAFETY: in range of memory the handle keeps alive; a raw copy, so
        // no reference is formed over bytes the engine may be placing.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base_ptr().add(offset), data.len())
        }
    }

    /// Copies bytes at `offset` out of the region. Panics if out of range.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            inside(offset, out.len(), self.len()),
            "read outside the region"
        );
        // SAFETY: as in `write`; `out` is the caller's and not region memory
        // it could alias (it is a `&mut`).
        unsafe {
            std::ptr::copy_nonoverlapping(self.base_ptr().add(offset), out.as_mut_ptr(), out.len())
        }
    }

    /// Copies `len` bytes at `src_offset` of `src` into this region at
    /// `offset` (regions may be the same; ranges are checked).
    pub(crate) fn copy_from(
        &self,
        offset: usize,
        src: &MemoryRegion,
        src_offset: usize,
        len: usize,
    ) -> Result<(), VerbsError> {
        if !inside(offset, len, self.len()) || !inside(src_offset, len, src.len()) {
            return Err(VerbsError::OutsideRegion);
        }
        // SAFETY: both ranges are inside memory the handles keep alive;
        // `copy` allows them to overlap.
        unsafe {
            std::ptr::copy(
                src.base_ptr().add(src_offset),
                self.base_ptr().add(offset),
                len,
            )
        }
        Ok(())
    }
}

impl Device {
    /// Registers the caller's memory, `len` bytes at `addr`, with `access`
    /// in the default PD (`ibv_reg_mr` over a buffer the program owns): the
    /// engine sends from it without copying and places received data into
    /// it, so its virtual address is `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be valid for reads and writes from now until
    /// the region is deregistered: [`Device::dereg_mr`] or the drop of its
    /// last handle, which return only once the engine no longer uses the
    /// memory and no frame in flight refers to it (they wait for such
    /// frames to be freed). While registered, the engine (another thread)
    /// reads and writes these bytes, as a NIC's DMA does: the program must
    /// not hold Rust references over bytes an operation in flight uses.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        if addr.is_null() || len == 0 {
            return Err(VerbsError::EmptyRegion);
        }
        // SAFETY: the caller's contract above is `from_raw`'s: valid until
        // deregistration, which waits until no mbuf refers to it.
        let mem = unsafe { ExtBuf::from_raw(addr, len) };
        self.reg_mr_in(0, mem, len, access, true)
    }
}

/// A non-blocking Linux eventfd (`eventfd(2)`): the descriptor a completion
/// channel's program sleeps on ([`crate::notify::CqNotify`]).
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd with a zero counter.
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new
        // descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a valid descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter, waking a sleeper. A full counter (EAGAIN,
    /// after 2^64-2 unread signals) needs no second one, so errors are
    /// ignored.
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our descriptor.
        let _ = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
    }

    /// Sleeps until the counter is non-zero or `timeout` passed (None:
    /// forever), then resets it; whether it was signalled. An interrupted
    /// sleep counts as not signalled.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> std::io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: one valid pollfd, live for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(false),
                _ => Err(e),
            };
        }
        if n == 0 {
            return Ok(false);
        }
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking
        // descriptor (EAGAIN if another waiter took the count first).
        let _ = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        Ok(true)
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An rtnetlink socket (`netlink(7)`, `NETLINK_ROUTE`) for host mode's
/// slow path (crate::host): never used by the engine.
pub(crate) struct NetlinkSocket(OwnedFd);

impl NetlinkSocket {
    /// Opens a route netlink socket whose receives wait at most `timeout`.
    pub(crate) fn open(timeout: Duration) -> std::io::Result<NetlinkSocket> {
        // SAFETY: plain system call; no pointers.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let s = NetlinkSocket(unsafe { OwnedFd::from_raw_fd(fd) });
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
        };
        // SAFETY: valid socket, pointer to a timeval of the given size.
        let rc = unsafe {
            libc::setsockopt(
                s.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }

    /// Sends one request to the kernel (an unconnected netlink socket's
    /// default destination is the kernel, port id 0).
    pub(crate) fn send(&self, msg: &[u8]) -> std::io::Result<()> {
        // SAFETY: valid socket; `msg` is readable for its length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one datagram into `buf` (a timeout is `WouldBlock`).
    pub(crate) fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            // SAFETY: valid socket; `buf` is writable for its length.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
