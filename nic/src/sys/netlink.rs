//! The rtnetlink socket of host mode (crate::host), the slow path only.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

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
