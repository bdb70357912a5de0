//! The Unix socket calls both sides make: a `SOCK_SEQPACKET` listener and
//! connection (close-on-exec, so no descriptor leaks into a program's
//! children), one [`Message`] per datagram, and the peer's credentials.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use crate::proto::{Message, ProtoError, MAX_MESSAGE};

/// Why a request did not get its answer.
#[derive(Debug, thiserror::Error)]
pub enum SockError {
    /// A socket call failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer's datagram is not a message.
    #[error("malformed message: {0}")]
    Proto(#[from] ProtoError),
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
}

/// The kernel's word on who is at the other end (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process ID.
    pub pid: u32,
    /// User ID.
    pub uid: u32,
    /// Group ID.
    pub gid: u32,
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = path.as_os_str().as_bytes();
    if p.is_empty() || p.len() >= a.sun_path.len() || p.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is empty or too long", path.display()),
        ));
    }
    for (d, b) in a.sun_path.iter_mut().zip(p) {
        *d = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + p.len() + 1;
    Ok((a, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: no pointers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to the daemon at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (a, len) = sockaddr(path)?;
    // SAFETY: a valid sockaddr_un of `len` bytes.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Binds and listens at `path`, the socket file made with `mode`.
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (a, len) = sockaddr(path)?;
    // SAFETY: a valid sockaddr_un of `len` bytes.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // SAFETY: our listening socket.
    if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Takes the next connection (close-on-exec), retrying EINTR.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: null address out-pointers are allowed.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor just made, owned by no one else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Who is at the other end of `fd`.
pub fn peer_cred(fd: &OwnedFd) -> io::Result<PeerCred> {
    // SAFETY: ucred is plain data.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: out pointers to a ucred and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: c.pid as u32,
        uid: c.uid,
        gid: c.gid,
    })
}

/// Sends one datagram.
pub fn send_raw(fd: &OwnedFd, b: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: `b` is valid for its length; MSG_NOSIGNAL: no SIGPIPE.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                b.as_ptr().cast(),
                b.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Sends `m` with sequence number `seq`.
pub fn send(fd: &OwnedFd, m: &Message, seq: u32) -> Result<(), SockError> {
    send_raw(fd, &m.encode(seq)?)?;
    Ok(())
}

/// Receives one datagram into `buf` (at least [`MAX_MESSAGE`] + 1 bytes, so
/// an oversized one shows as such): its length, 0 when the peer closed.
pub fn recv_raw(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Receives one message and its sequence number.
pub fn recv(fd: &OwnedFd, buf: &mut Vec<u8>) -> Result<(Message, u32), SockError> {
    buf.resize(MAX_MESSAGE + 1, 0);
    match recv_raw(fd, buf)? {
        0 => Err(SockError::Closed),
        n => Ok(Message::decode(&buf[..n])?),
    }
}

/// A client's connection: requests answered in order.
pub struct Client {
    fd: OwnedFd,
    seq: u32,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to the daemon at `path` and says hello as `name`: the
    /// daemon's [`crate::proto::Welcome`], or its refusal as an error.
    pub fn connect(
        path: &Path,
        name: &str,
        timeout: Duration,
    ) -> Result<(Client, crate::proto::Welcome), SockError> {
        let fd = connect(path)?;
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: a timeval of its size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        let mut c = Client {
            fd,
            seq: 0,
            buf: Vec::new(),
        };
        match c.request(&Message::Hello {
            version: crate::proto::VERSION,
            name: name.into(),
        })? {
            Message::Welcome(w) => Ok((c, w)),
            other => Err(refused(other)),
        }
    }

    /// Sends `m` and waits for its answer.
    pub fn request(&mut self, m: &Message) -> Result<Message, SockError> {
        self.seq = self.seq.wrapping_add(1);
        send(&self.fd, m, self.seq)?;
        let (r, _) = recv(&self.fd, &mut self.buf)?;
        Ok(r)
    }
}

/// An answer that was not the one asked for, as an error.
pub fn refused(m: Message) -> SockError {
    let msg = match m {
        Message::Error { errno, message } => format!("refused (errno {errno}): {message}"),
        other => format!("unexpected answer {other:?}"),
    };
    SockError::Io(io::Error::other(msg))
}

/// Sends `m` with a descriptor attached (`SCM_RIGHTS`): the other side gets
/// its own copy of `pass` (a memfd of shared memory, an eventfd).
pub fn send_with_fd(fd: &OwnedFd, m: &Message, seq: u32, pass: &OwnedFd) -> Result<(), SockError> {
    let bytes = m.encode(seq)?;
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for one descriptor's control message, u64-aligned.
    let mut cbuf = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    // SAFETY: the control buffer holds one cmsghdr and an int (CMSG_SPACE above).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, pass.as_raw_fd());
    }
    loop {
        // SAFETY: a valid msghdr; MSG_NOSIGNAL: no SIGPIPE.
        if unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e.into());
        }
    }
}

/// Receives one message and the descriptor attached to it, if any (taken
/// close-on-exec; any beyond the first are closed, never leaked).
pub fn recv_with_fd(
    fd: &OwnedFd,
    buf: &mut Vec<u8>,
) -> Result<(Message, u32, Option<OwnedFd>), SockError> {
    buf.resize(MAX_MESSAGE + 1, 0);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: a valid msghdr over our buffers.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e.into());
        }
    };
    let mut got: Option<OwnedFd> = None;
    // SAFETY: walks the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const i32;
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<i32>();
                for i in 0..count {
                    let f = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if got.is_none() {
                        got = Some(f);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n == 0 {
        return Err(SockError::Closed);
    }
    let (m, seq) = Message::decode(&buf[..n])?;
    Ok((m, seq, got))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::{Region, Ring};

    fn pair() -> (OwnedFd, OwnedFd) {
        let mut fds = [0i32; 2];
        // SAFETY: an out array of two ints.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: two descriptors just made.
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
    }

    #[test]
    fn a_memfd_passed_with_a_message_maps_the_same_memory() {
        let (a, b) = pair();
        let reg = Region::create("rsnic-pass-test", Ring::bytes(8, 64)).unwrap();
        let mut p = Ring::create(&reg, 0, 8, 64).unwrap();
        send_with_fd(&a, &Message::GetCounters, 7, reg.fd()).unwrap();
        let mut buf = Vec::new();
        let (m, seq, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((m, seq), (Message::GetCounters, 7));
        let fd = fd.expect("a descriptor came");
        // SAFETY: a descriptor we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert!(flags & libc::FD_CLOEXEC != 0, "taken close-on-exec");
        let theirs = Region::map(fd).unwrap();
        let mut c = Ring::open(&theirs, 0, 8, 64, false).unwrap();
        assert!(p.push(b"through the memfd").unwrap());
        let mut out = [0u8; 60];
        let n = c.pop(&mut out).unwrap().unwrap();
        assert_eq!(&out[..n], b"through the memfd");
        // A message without a descriptor: none.
        send(&a, &Message::GetPrograms, 8).unwrap();
        let (m, _, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(m, Message::GetPrograms);
        assert!(fd.is_none());
    }
}
