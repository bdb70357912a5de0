//! rsnicd: one rsnic NIC for the whole host (issue 42, docs/design.md §7).
//!
//! The daemon owns the port and runs the engine; programs and `rsnicctl`
//! talk to it over a Unix `SOCK_SEQPACKET` socket ([`socket_path`]) in the
//! [`proto`] protocol, each connection's credentials taken from the kernel
//! (`SO_PEERCRED`, [`sock::peer_cred`]), never from what the client says.
//!
//! This crate holds what both sides share: the protocol (pure, fuzzed), the
//! socket's path and the socket calls. The daemon and `rsnicctl` are its
//! binaries (feature `daemon`).

pub mod proto;
pub mod shm;
pub mod sock;

use std::path::PathBuf;

/// Where the daemon listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rsnic/rsnicd.sock";

/// The daemon's socket: `RSNIC_SOCKET` if set (and not empty), else
/// [`DEFAULT_SOCKET`]. The one place every side takes it from.
pub fn socket_path() -> PathBuf {
    match std::env::var_os("RSNIC_SOCKET") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_SOCKET),
    }
}
