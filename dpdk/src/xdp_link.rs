//! The XDP program attached to a kernel interface, over rtnetlink, and the
//! guard that detaches rsnic's at process exit.
//!
//! The `net_af_xdp` PMD attaches the program with netlink (`bpf_xdp_attach`),
//! not with a BPF link, so the attachment outlives the process: the PMD
//! removes it when the port is closed (`rte_vdev_uninit`), but a process
//! that exits without closing its port (every program under the ibverbs
//! library, whose device lives until exit; any tool that calls `exit()`
//! with the port open) would leave it on the interface, and the next rsnic
//! on that interface is refused ("XDP program already attached"). The
//! kernel's traffic is not disturbed by such a leftover (rsnic's program
//! passes frames to the kernel when its queue has no socket), but the
//! interface is blocked until `ip link set dev IF xdp off`.
//!
//! So a port that attached a program records it ([`guard`]): the interface,
//! the program's id and its mode. At exit (`atexit`) every program still
//! recorded is detached, if it is still the one attached (same id): a
//! program that someone else attached since is never touched. A port
//! closed normally removes its record ([`unguard`]). A process killed by a
//! signal runs no exit handler: a tool that owns its signals calls
//! [`detach_on_signals`] first (SIGINT, SIGTERM, SIGHUP); otherwise, and on
//! SIGKILL, the program stays (the clear error above, with the command
//! that removes it).

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

/// `RTM_NEWLINK`, `RTM_GETLINK`, `RTM_SETLINK` (`linux/rtnetlink.h`).
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
/// `IFLA_XDP` and its nested attributes (`linux/if_link.h`).
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_SKB_PROG_ID: u16 = 5;
const IFLA_XDP_DRV_PROG_ID: u16 = 6;
const NLA_F_NESTED: u16 = 1 << 15;
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));
/// `XDP_ATTACHED_*` and the matching `XDP_FLAGS_*_MODE` (`linux/if_link.h`).
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// A program attached to an interface: its id and the mode flag that
/// detaches it (`XDP_FLAGS_DRV_MODE` or `XDP_FLAGS_SKB_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attached {
    /// The BPF program id.
    pub id: u32,
    /// The `XDP_FLAGS_*_MODE` it is attached in.
    pub mode: u32,
}

/// The XDP programs attached to interface `ifindex` (none, one, or a
/// driver-mode and a generic one), from `RTM_GETLINK`.
pub fn attached(ifindex: u32) -> io::Result<Vec<Attached>> {
    let mut req = header(RTM_GETLINK, NLM_F_REQUEST, ifindex);
    finish(&mut req);
    let reply = transact(&req)?;
    Ok(parse_link(&reply))
}

/// Detaches `prog` from `ifindex` (`RTM_SETLINK`, `IFLA_XDP_FD` -1 in its mode).
pub fn detach(ifindex: u32, prog: Attached) -> io::Result<()> {
    let mut req = header(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, ifindex);
    let nest = req.len();
    push_attr(&mut req, IFLA_XDP | NLA_F_NESTED, &[]);
    push_attr(&mut req, IFLA_XDP_FD, &(-1i32).to_ne_bytes());
    push_attr(&mut req, IFLA_XDP_FLAGS, &prog.mode.to_ne_bytes());
    let nest_len = (req.len() - nest) as u16;
    req[nest..nest + 2].copy_from_slice(&nest_len.to_ne_bytes());
    finish(&mut req);
    transact(&req).map(|_| ())
}

/// What [`guard`] recorded: interface index and program.
static GUARDED: Mutex<Vec<(u32, Attached)>> = Mutex::new(Vec::new());
/// The process that recorded them: a child of `fork()` inherits the exit
/// handler and the list but not the port (its `exit()` must leave the
/// parent's program attached).
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Records the program(s) now attached to `ifindex`, so that they are
/// detached at exit unless [`unguard`] is called first. Called by a
/// `net_af_xdp` port once its RX queue (where the PMD attaches) is set up.
pub fn guard(ifindex: u32) {
    let progs = match attached(ifindex) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(ifindex, error = %e, "cannot read the interface's XDP program; it is not detached at exit");
            return;
        }
    };
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain extern "C" function without arguments.
        if unsafe { libc::atexit(detach_at_exit) } != 0 {
            tracing::warn!("atexit failed: XDP programs are not detached at exit");
        }
    });
    OWNER.store(std::process::id(), Ordering::Relaxed);
    let mut g = GUARDED.lock().unwrap_or_else(|e| e.into_inner());
    g.retain(|(i, _)| *i != ifindex);
    g.extend(progs.into_iter().map(|p| (ifindex, p)));
}

/// Forgets `ifindex` (its port was closed, and the PMD detached the program).
pub fn unguard(ifindex: u32) {
    GUARDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|(i, _)| *i != ifindex);
}

/// The exit handler: detaches every recorded program that is still
/// attached, in the process that attached them only (not in a forked
/// child that calls `exit()`, which would take the parent's port off the
/// interface under it).
extern "C" fn detach_at_exit() {
    if OWNER.load(Ordering::Relaxed) == std::process::id() {
        detach_guarded();
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP detach the recorded programs before the
/// process dies of them, for a tool that owns its signals (`roce-perf`; a
/// library such as the ibverbs one must not take the program's). The
/// signals are blocked in the calling thread, so this must run before any
/// other thread is started (they inherit the mask); a thread of its own
/// waits for them (`sigwait`), detaches, and raises the signal again with
/// its default action, so the process ends as it would have.
pub fn detach_on_signals() -> io::Result<()> {
    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
    // SAFETY: sigset_t is plain data, initialised by sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t for these calls.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
    }
    // SAFETY: changes this thread's mask only; `set` is valid.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    struct Set(libc::sigset_t);
    // SAFETY: a sigset_t is plain data, read-only in the waiting thread.
    unsafe impl Send for Set {}
    let set = Set(set);
    std::thread::Builder::new()
        .name("rsnic-signals".into())
        .spawn(move || {
            let set = set;
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` and `sig` are valid; sigwait only writes `sig`.
            if unsafe { libc::sigwait(&set.0, &mut sig) } != 0 {
                return;
            }
            detach_guarded();
            // SAFETY: the default action, unblocked in this thread, then
            // the same signal again: the process ends as it would have.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set.0, std::ptr::null_mut());
                libc::raise(sig);
            }
        })?;
    Ok(())
}

/// Detaches every recorded program that is still the one attached.
fn detach_guarded() {
    let list = std::mem::take(&mut *GUARDED.lock().unwrap_or_else(|e| e.into_inner()));
    for (ifindex, prog) in list {
        if attached(ifindex).is_ok_and(|now| now.contains(&prog)) {
            if let Err(e) = detach(ifindex, prog) {
                eprintln!("rsnic: cannot detach XDP program {} from interface index {ifindex} at exit: {e}", prog.id);
            }
        }
    }
}

/// A request: `nlmsghdr` (length filled by [`finish`]) and `ifinfomsg`.
fn header(kind: u16, flags: u16, ifindex: u32) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    m.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel
    m.push(libc::AF_UNSPEC as u8); // ifi_family
    m.push(0);
    m.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    m.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // ifi_flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // ifi_change
    m
}

fn push_attr(m: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    m.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(payload);
    while !m.len().is_multiple_of(4) {
        m.push(0);
    }
}

fn finish(m: &mut [u8]) {
    let len = m.len() as u32;
    m[..4].copy_from_slice(&len.to_ne_bytes());
}

/// Sends one request on a fresh `NETLINK_ROUTE` socket and returns the
/// first reply message (an `NLMSG_ERROR` with a non-zero code is the error).
fn transact(req: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: plain socket call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed sockaddr_nl is the kernel's address.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: req and the address are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    if buf.len() < 16 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short netlink reply",
        ));
    }
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if kind == NLMSG_ERROR && buf.len() >= 20 {
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if code != 0 {
            return Err(io::Error::from_raw_os_error(-code));
        }
    } else if kind != RTM_NEWLINK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected netlink reply type {kind}"),
        ));
    }
    Ok(buf)
}

/// The attributes of `buf[start..end]`: (type without flags, payload).
fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let h = buf.get(at..at + 4)?;
        let len = usize::from(u16::from_ne_bytes([h[0], h[1]]));
        let kind = u16::from_ne_bytes([h[2], h[3]]) & NLA_TYPE_MASK;
        let payload = buf.get(at + 4..at + len.max(4))?;
        at += (len.max(4) + 3) & !3;
        Some((kind, payload))
    })
}

fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

/// The programs in an `RTM_NEWLINK` message (`nlmsghdr`, `ifinfomsg`, attributes).
fn parse_link(msg: &[u8]) -> Vec<Attached> {
    let len = msg
        .get(..4)
        .and_then(u32_of)
        .map_or(0, |l| l as usize)
        .min(msg.len());
    let Some(body) = msg.get(32..len) else {
        return Vec::new();
    };
    let Some((_, xdp)) = attrs(body).find(|(k, _)| *k == IFLA_XDP) else {
        return Vec::new();
    };
    let (mut mode, mut id, mut skb, mut drv) = (0u8, None, None, None);
    for (k, p) in attrs(xdp) {
        match k {
            IFLA_XDP_ATTACHED => mode = p.first().copied().unwrap_or(0),
            IFLA_XDP_PROG_ID => id = u32_of(p),
            IFLA_XDP_SKB_PROG_ID => skb = u32_of(p),
            IFLA_XDP_DRV_PROG_ID => drv = u32_of(p),
            _ => {}
        }
    }
    let mut out = Vec::new();
    match (mode, id) {
        (XDP_ATTACHED_DRV, Some(id)) => out.push(Attached {
            id,
            mode: XDP_FLAGS_DRV_MODE,
        }),
        (XDP_ATTACHED_SKB, Some(id)) => out.push(Attached {
            id,
            mode: XDP_FLAGS_SKB_MODE,
        }),
        _ => {
            // Several modes at once (XDP_ATTACHED_MULTI): one id per mode.
            out.extend(drv.map(|id| Attached {
                id,
                mode: XDP_FLAGS_DRV_MODE,
            }));
            out.extend(skb.map(|id| Attached {
                id,
                mode: XDP_FLAGS_SKB_MODE,
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTM_NEWLINK message with the given IFLA_XDP payload attributes.
    fn link_msg(xdp: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut m = header(RTM_NEWLINK, 0, 7);
        push_attr(&mut m, 3, b"eth0\0"); // IFLA_IFNAME first, as the kernel sends
        let nest = m.len();
        push_attr(&mut m, IFLA_XDP | NLA_F_NESTED, &[]);
        for (k, p) in xdp {
            push_attr(&mut m, *k, p);
        }
        let l = (m.len() - nest) as u16;
        m[nest..nest + 2].copy_from_slice(&l.to_ne_bytes());
        finish(&mut m);
        m
    }

    #[test]
    fn programs_are_read_per_mode() {
        let none = link_msg(&[(IFLA_XDP_ATTACHED, vec![0, 0, 0, 0])]);
        assert!(parse_link(&none).is_empty());
        let drv = link_msg(&[
            (IFLA_XDP_ATTACHED, vec![XDP_ATTACHED_DRV, 0, 0, 0]),
            (IFLA_XDP_PROG_ID, 42u32.to_ne_bytes().to_vec()),
        ]);
        assert_eq!(
            parse_link(&drv),
            [Attached {
                id: 42,
                mode: XDP_FLAGS_DRV_MODE
            }]
        );
        let multi = link_msg(&[
            (IFLA_XDP_ATTACHED, vec![4, 0, 0, 0]),
            (IFLA_XDP_SKB_PROG_ID, 5u32.to_ne_bytes().to_vec()),
            (IFLA_XDP_DRV_PROG_ID, 6u32.to_ne_bytes().to_vec()),
        ]);
        assert_eq!(
            parse_link(&multi),
            [
                Attached {
                    id: 6,
                    mode: XDP_FLAGS_DRV_MODE
                },
                Attached {
                    id: 5,
                    mode: XDP_FLAGS_SKB_MODE
                }
            ]
        );
        // Truncated or garbage input: nothing, no panic.
        for cut in 0..drv.len() {
            let _ = parse_link(&drv[..cut]);
        }
        assert!(parse_link(&[0xff; 40]).is_empty());
    }

    #[test]
    fn loopback_has_no_program() {
        // The kernel answers for lo (index 1) in any namespace, root or not.
        assert_eq!(attached(1).unwrap(), []);
    }
}
