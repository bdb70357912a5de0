//! Why the switch core drops a frame: the one type both the classifier
//! ([`crate::classify`]) and the forwarding core ([`crate::switch`]) answer with, kept
//! below both so that neither imports the other for it.

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// `port_in` is not a configured port.
    UnknownPort,
    /// Truncated or inconsistent Ethernet/IPv4/UDP/INT/BTH, bad IPv4 checksum.
    Malformed,
    /// Not an IPv4 frame.
    NotIpv4,
    /// TTL 0 or 1 on arrival.
    TtlExpired,
    /// No route.
    Unroutable,
    /// Not-ECT at queue >= K (LDCP 004 section 2.3).
    WredNotEct,
    /// Data queue would exceed `buf_max`.
    TailDrop,
    /// Control queue would exceed `ctrl_buf_max`.
    CtrlTailDrop,
}
