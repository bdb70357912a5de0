//! Typed errors for the safe layer. DPDK reports failures as negative return
//! values or through `rte_errno`; both end up as [`Error::Dpdk`] with the
//! text of `rte_strerror`, so a user sees why, not just a number.

use std::ffi::CStr;

/// Result with the safe layer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the safe layer can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A DPDK call failed; `errno` is positive, `text` from `rte_strerror`.
    #[error("{op} failed: {text} (errno {errno})")]
    Dpdk {
        /// The DPDK function (or our operation) that failed.
        op: &'static str,
        /// The positive errno value.
        errno: i32,
        /// `rte_strerror(errno)`.
        text: String,
    },
    /// `rte_eal_init` runs once per process; a second, different init fails.
    #[error("the EAL is already initialised in this process with other arguments: {0:?}")]
    EalAlreadyInitialised(Vec<String>),
    /// An earlier `rte_eal_init` in this process failed; DPDK cannot retry.
    #[error("EAL initialisation failed earlier in this process: {0}")]
    EalFailed(String),
    /// An argument string contained a NUL byte or was otherwise unusable.
    #[error("invalid argument {0:?}: {1}")]
    InvalidArgument(String, &'static str),
    /// No DPDK port has this name (and it is not a vdev we could create).
    #[error("no such DPDK port: {0:?} (vdevs start with net_, PCI ports need -a <addr> in the EAL args)")]
    NoSuchPort(String),
    /// A `net_af_xdp` port could not be opened on a kernel interface
    /// (crate::af_xdp): the interface, and why.
    #[error("net_af_xdp on {iface:?}: {reason}")]
    AfXdp {
        /// The kernel interface.
        iface: String,
        /// What went wrong.
        reason: String,
    },
    /// The mempool had no free mbuf.
    #[error("mempool {0:?} is exhausted")]
    PoolExhausted(String),
    /// An mbuf operation would go outside the buffer.
    #[error("mbuf {op}: {need} bytes requested, {room} available")]
    MbufRoom {
        /// The operation (append, prepend, adj, trim, read, chain).
        op: &'static str,
        /// Bytes asked for.
        need: usize,
        /// Bytes available for that operation.
        room: usize,
    },
}

impl Error {
    /// An error for `op` from a (positive or negative) errno value.
    pub fn from_errno(op: &'static str, errno: i32) -> Self {
        let errno = errno.abs();
        Error::Dpdk {
            op,
            errno,
            text: strerror(errno),
        }
    }

    /// An error for `op` from the calling thread's current `rte_errno`.
    pub fn last(op: &'static str) -> Self {
        // SAFETY: reads the calling thread's rte_errno; no pointers.
        Self::from_errno(op, unsafe { dpdk_sys::shim_rte_errno() })
    }
}

/// `rte_strerror`, which also knows DPDK's own codes beyond libc's.
pub fn strerror(errno: i32) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local,
    // NUL-terminated string; we copy it out at once.
    unsafe {
        let p = dpdk_sys::rte_strerror(errno);
        if p.is_null() {
            return format!("errno {errno}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Turns a DPDK return code (negative errno on failure) into a Result.
pub(crate) fn check(op: &'static str, rc: i32) -> Result<i32> {
    if rc < 0 {
        Err(Error::from_errno(op, rc))
    } else {
        Ok(rc)
    }
}
