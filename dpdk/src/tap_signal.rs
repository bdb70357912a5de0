//! The TAP PMD's RX signal, routed to the thread that polls the port.
//!
//! What DPDK 22.11's `net_tap` does (drivers/net/tap/rte_eth_tap.c,
//! `tun_alloc`, for each queue's `/dev/net/tun` descriptor and the
//! keep-alive one): it takes the first real-time signal from `SIGRTMIN + 1`
//! whose handler is `SIG_DFL` and installs `tap_trigger_cb` on it
//! (`SA_RESTART`), then `F_SETSIG` that signal, `O_ASYNC`, and
//! `F_SETOWN getpid()` on the descriptor. The kernel then signals the
//! *process* for every frame the TAP queues (`kill_fasync` in tun.c), and
//! `pmd_rx_burst` reads the descriptor only once the handler has moved
//! `tap_trigger` since its last empty read.
//!
//! A signal sent to the process goes to its main thread first (Linux
//! `complete_signal`): in a program that runs rsnic inside its own process
//! (`librsnic_verbs.so`), that is the program's thread, and a `poll`,
//! `epoll_wait` or `nanosleep` there returns EINTR once per frame whatever
//! `SA_RESTART` says (signal(7): those calls are never restarted). Routing
//! the signal to the thread that polls the port (`F_SETOWN_EX` with
//! `F_OWNER_TID`, fcntl(2)) keeps the trigger working and the program's
//! threads undisturbed; turning the trigger off is not possible from
//! outside the PMD (it is off only when no real-time signal is free).

use std::os::fd::RawFd;

/// fcntl(2) `F_SETOWN_EX` (glibc's `bits/fcntl-linux.h`; not in `libc`).
const F_SETOWN_EX: libc::c_int = 15;
/// fcntl(2) `F_GETSIG` (not in `libc` for this target).
const F_GETSIG: libc::c_int = 11;
/// fcntl(2) `F_GETOWN_EX`.
const F_GETOWN_EX: libc::c_int = 16;
/// `f_owner_ex.type`: one thread.
const F_OWNER_TID: libc::c_int = 0;
/// `f_owner_ex.type`: the process (what `F_SETOWN` with a pid sets).
const F_OWNER_PID: libc::c_int = 1;

/// fcntl(2)'s `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}

/// The TAP descriptors whose signal goes to the thread that made this,
/// until it is dropped: they go back to the process then (a thread that
/// ends would otherwise take the signal, and with it the PMD's RX, along).
#[derive(Debug)]
pub struct TapSignalRoute {
    tid: libc::pid_t,
    /// How many descriptors were routed here.
    pub routed: usize,
}

impl TapSignalRoute {
    /// Routes the signal of every `/dev/net/tun` descriptor of this process
    /// that has `O_ASYNC` and is owned by the process (the TAP PMD's, as
    /// above) to the calling thread. Call it on the thread that polls the
    /// port, after the port's queues were set up (they are opened then).
    /// Descriptors of the program's own, or already routed to a thread,
    /// are left alone.
    pub fn here() -> TapSignalRoute {
        // SAFETY: getpid and gettid take no arguments and cannot fail.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let mut routed = 0;
        for fd in tun_fds() {
            if owner(fd).is_some_and(|o| o.kind == F_OWNER_PID && o.pid == pid)
                && set_owner(fd, F_OWNER_TID, tid)
            {
                routed += 1;
                // This thread may block every other signal (a library's
                // threads must never run the program's handlers): the
                // PMD's own must still reach it.
                unblock_here(fd_signal(fd));
            }
        }
        tracing::debug!(routed, tid, "TAP RX signals routed to this thread");
        TapSignalRoute { tid, routed }
    }
}

impl Drop for TapSignalRoute {
    fn drop(&mut self) {
        // SAFETY: getpid takes no arguments and cannot fail.
        let pid = unsafe { libc::getpid() };
        for fd in tun_fds() {
            if owner(fd).is_some_and(|o| o.kind == F_OWNER_TID && o.pid == self.tid) {
                set_owner(fd, F_OWNER_PID, pid);
            }
        }
    }
}

/// This process's open `/dev/net/tun` descriptors that have `O_ASYNC`.
fn tun_fds() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
        let target = std::fs::read_link(e.path()).ok()?;
        if target.as_os_str() != "/dev/net/tun" {
            return None;
        }
        // SAFETY: F_GETFL takes no pointer; a closed descriptor gives -1.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        (fl >= 0 && fl & libc::O_ASYNC != 0).then_some(fd)
    })
    .collect()
}

/// The signal a descriptor raises (`F_GETSIG`; 0 means SIGIO).
fn fd_signal(fd: RawFd) -> libc::c_int {
    // SAFETY: F_GETSIG takes no argument.
    match unsafe { libc::fcntl(fd, F_GETSIG) } {
        s if s > 0 => s,
        _ => libc::SIGIO,
    }
}

/// Unblocks one signal on the calling thread.
fn unblock_here(sig: libc::c_int) {
    // SAFETY: a local sigset, filled by sigemptyset/sigaddset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// The descriptor's signal owner (`F_GETOWN_EX`).
fn owner(fd: RawFd) -> Option<FOwnerEx> {
    let mut o = FOwnerEx { kind: 0, pid: 0 };
    // SAFETY: F_GETOWN_EX writes one `struct f_owner_ex` into `o`.
    let rc = unsafe { libc::fcntl(fd, F_GETOWN_EX, &mut o as *mut FOwnerEx) };
    (rc == 0).then_some(o)
}

/// Sets the descriptor's signal owner (`F_SETOWN_EX`); whether it took.
fn set_owner(fd: RawFd, kind: libc::c_int, pid: libc::pid_t) -> bool {
    let o = FOwnerEx { kind, pid };
    // SAFETY: F_SETOWN_EX reads one `struct f_owner_ex` from `o`.
    unsafe { libc::fcntl(fd, F_SETOWN_EX, &o as *const FOwnerEx) == 0 }
}
