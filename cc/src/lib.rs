//! Congestion control for the RoCEv2 soft-NIC: HPCC++ (sender- and receiver-based),
//! LDCP and DCQCN behind one trait, plus a fixed-window "none".
//!
//! Pure, deterministic Rust (docs/design.md §2, §7): the caller passes the current time in
//! nanoseconds; nothing here reads a clock, allocates per event, or depends on DPDK.
//!
//! The NIC keeps one [`AnyCc`] per QP (enum dispatch, no vtable call per event), feeds
//! it events ([`CongestionControl`]) and after each event reads
//! [`CongestionControl::window_bytes`] (bytes of LSN that may be outstanding) and
//! [`CongestionControl::rate_bps`] (pacing rate, **bits per second**), and performs the
//! returned [`Actions`] (Not-ECT fast-start packet, probe, CNP, Rx-HPCC feedback window,
//! timers to arm).
//!
//! Spec map: HPCC++ = `specs/000` §4-§6 (+ `003` §6.1 guidelines), Rx-HPCC = `000`
//! §6.3.2, LDCP = `specs/004` §2-§3, DCQCN = Zhu et al. SIGCOMM'15. See `docs/cc.md`.
//!
//! ```
//! use cc::{AckEvent, AnyCc, CcKind, CongestionControl, IntHop, PathConfig, SendEvent};
//!
//! let path = PathConfig { line_rate_bps: 100_000_000_000, base_rtt_ns: 8_000, mtu_bytes: 1000 };
//! let mut qp_cc: AnyCc = "hpcc".parse::<CcKind>().unwrap().build(path);
//!
//! // TX: the scheduler picked a packet (window and pacing allowed it)
//! let a = qp_cc.on_send(&SendEvent { now_ns: 0, lsn: 0, bytes: 1000, ..Default::default() });
//! let not_ect = a.fast_start; // write the ECN codepoint accordingly
//! assert!(!not_ect);
//! for t in a.timers() { /* arm t.kind at t.deadline_ns on the timing wheel */ let _ = t; }
//!
//! // RX: an ACK echoing one INT hop record
//! let hop = IntHop { switch_id: 1, port_id: 3, ts_ns: 8_000, tx_bytes: 1_000, qlen_bytes: 0,
//!                    link_bps: 100_000_000_000 };
//! let ack = AckEvent { now_ns: 8_080, acked_lsn: 1000, acked_bytes: 1000, acked_pkts: 1,
//!                      rtt_ns: 8_080, telemetry: &[hop], ..Default::default() };
//! let _actions = qp_cc.on_ack(&ack);
//! let window = qp_cc.window_bytes();   // bytes of LSN that may be outstanding
//! let rate = qp_cc.rate_bps();         // pacing rate, bit/s
//! assert!(window > 0 && rate <= path.line_rate_bps);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod dcqcn;
pub mod hpcc;
pub mod ldcp;
pub mod none;
pub mod rx_hpcc;
pub mod types;

use core::fmt;
use core::str::FromStr;

pub use dcqcn::{Dcqcn, DcqcnConfig};
pub use hpcc::{Hpcc, HpccConfig, HpccCore, TelemetryMode, MAX_HOPS};
pub use ldcp::{Ldcp, LdcpConfig, LdcpStage};
pub use none::{NoCc, NoCcConfig};
pub use rx_hpcc::{RxHpcc, RxHpccConfig};
pub use types::{
    AckEvent, Actions, IntHop, NakEvent, PathConfig, RxDataEvent, SendEvent, TimerArm, TimerKind,
};

/// The interface the NIC drives, one instance per QP.
///
/// Sender-side events: `on_send`, `on_ack`, `on_nak`, `on_cnp`, `on_rto`, `on_timer`,
/// `on_probe_response`; receiver-side: `on_rx_data`. No method allocates or panics on
/// odd input (zero RTT, zero bytes, wrapped counters, empty telemetry).
pub trait CongestionControl {
    /// A data packet is being sent. Call before its IP header is written: when the
    /// result has `fast_start`, send it Not-ECT (LDCP).
    fn on_send(&mut self, ev: &SendEvent) -> Actions;
    /// An ACK arrived (with or without telemetry, ECN-echo, RTT sample, Rx-HPCC window).
    fn on_ack(&mut self, ev: &AckEvent<'_>) -> Actions;
    /// A NAK (sequence error) arrived: loss was detected. The events from
    /// here to [`Self::on_probe_response`] default to no action, for the
    /// algorithms that do not react to them.
    fn on_nak(&mut self, _ev: &NakEvent) -> Actions {
        Actions::NONE
    }
    /// A CNP arrived.
    fn on_cnp(&mut self, _now_ns: u64) -> Actions {
        Actions::NONE
    }
    /// The transport's retransmission timer fired (loss without NAK).
    fn on_rto(&mut self, _now_ns: u64) -> Actions {
        Actions::NONE
    }
    /// A timer requested through [`Actions::timers`] expired. Stale expiries are ignored.
    fn on_timer(&mut self, _now_ns: u64, _kind: TimerKind) -> Actions {
        Actions::NONE
    }
    /// A telemetry response to a probe arrived (HPCC++ probe mode).
    fn on_probe_response(&mut self, _now_ns: u64, _telemetry: &[IntHop]) -> Actions {
        Actions::NONE
    }
    /// Receiver side: a data packet (or probe) arrived, with its CE bit and telemetry.
    fn on_rx_data(&mut self, ev: &RxDataEvent<'_>) -> Actions;
    /// Sending window in bytes of LSN (`u64::MAX` = unlimited). The scheduler may send
    /// while `snd_nxt - snd_una < window_bytes()`.
    fn window_bytes(&self) -> u64;
    /// Pacing rate in bits per second (never above the line rate).
    fn rate_bps(&self) -> u64;
    /// Which algorithm this is.
    fn kind(&self) -> CcKind;
}

/// The algorithms, as named on the command line (a `clap::ValueEnum` with
/// the `clap` feature) and at connection setup (`nic::exchange`): the one
/// CC enum of the project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum CcKind {
    /// Fixed window at line rate.
    None,
    /// DCQCN.
    Dcqcn,
    /// HPCC++ sender-based.
    Hpcc,
    /// HPCC++ receiver-based.
    RxHpcc,
    /// LDCP.
    Ldcp,
}

impl CcKind {
    /// All kinds.
    pub const ALL: [CcKind; 5] = [
        CcKind::None,
        CcKind::Dcqcn,
        CcKind::Hpcc,
        CcKind::RxHpcc,
        CcKind::Ldcp,
    ];

    /// The kind whose [`Self::as_str`] is exactly `s` (the connection
    /// exchange's strict spelling; [`FromStr`] also ignores case and
    /// surrounding blanks).
    pub fn from_wire(s: &str) -> Option<CcKind> {
        CcKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The lower-case name ("none", "dcqcn", "hpcc", "rx-hpcc", "ldcp").
    pub fn as_str(&self) -> &'static str {
        match self {
            CcKind::None => "none",
            CcKind::Dcqcn => "dcqcn",
            CcKind::Hpcc => "hpcc",
            CcKind::RxHpcc => "rx-hpcc",
            CcKind::Ldcp => "ldcp",
        }
    }

    /// Whether a QP using this kind needs the project's wire extensions (CC extension
    /// header with LSN / ECN-echo / telemetry / window, INT, probes; docs/design.md §4).
    /// `none` and `dcqcn` stay plain RoCEv2 and interoperate with hardware NICs.
    pub fn uses_extensions(&self) -> bool {
        matches!(self, CcKind::Hpcc | CcKind::RxHpcc | CcKind::Ldcp)
    }

    /// Whether a QP using this kind feeds its CC every ACK, also those that
    /// acknowledge nothing new (READ responses after the first; rdma's
    /// `QpConfig::ack_events_without_progress`): every kind but `none`.
    pub fn counts_acks(&self) -> bool {
        !matches!(self, CcKind::None)
    }

    /// Default configuration of this kind for a path.
    pub fn default_config(&self, path: PathConfig) -> CcConfig {
        match self {
            CcKind::None => CcConfig::None(NoCcConfig::for_path(path)),
            CcKind::Dcqcn => CcConfig::Dcqcn(DcqcnConfig::for_path(path)),
            CcKind::Hpcc => CcConfig::Hpcc(HpccConfig::for_path(path)),
            CcKind::RxHpcc => CcConfig::RxHpcc(HpccConfig::for_path(path)),
            CcKind::Ldcp => CcConfig::Ldcp(LdcpConfig::for_path(path)),
        }
    }

    /// An instance with the default configuration for a path.
    pub fn build(&self, path: PathConfig) -> AnyCc {
        AnyCc::new(&self.default_config(path))
    }
}

impl fmt::Display for CcKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`CcKind::from_str`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownCcKind(pub String);

impl fmt::Display for UnknownCcKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown congestion control {:?} (expected none, dcqcn, hpcc, rx-hpcc or ldcp)",
            self.0
        )
    }
}

impl std::error::Error for UnknownCcKind {}

impl FromStr for CcKind {
    type Err = UnknownCcKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        CcKind::ALL
            .iter()
            .copied()
            .find(|k| k.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| UnknownCcKind(s.to_string()))
    }
}

/// Configuration of any algorithm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CcConfig {
    /// Fixed window.
    None(NoCcConfig),
    /// DCQCN.
    Dcqcn(DcqcnConfig),
    /// HPCC++ sender-based.
    Hpcc(HpccConfig),
    /// HPCC++ receiver-based.
    RxHpcc(RxHpccConfig),
    /// LDCP.
    Ldcp(LdcpConfig),
}

impl CcConfig {
    /// The kind this configures.
    pub fn kind(&self) -> CcKind {
        match self {
            CcConfig::None(_) => CcKind::None,
            CcConfig::Dcqcn(_) => CcKind::Dcqcn,
            CcConfig::Hpcc(_) => CcKind::Hpcc,
            CcConfig::RxHpcc(_) => CcKind::RxHpcc,
            CcConfig::Ldcp(_) => CcKind::Ldcp,
        }
    }
}

/// Any algorithm, dispatched by `match` (no vtable, inlinable). This is what the NIC
/// stores per QP; its size is asserted in the tests (see `docs/cc.md`).
#[derive(Clone, Debug)]
pub enum AnyCc {
    /// Fixed window.
    None(NoCc),
    /// DCQCN.
    Dcqcn(Dcqcn),
    /// HPCC++ sender-based.
    Hpcc(Hpcc),
    /// HPCC++ receiver-based.
    RxHpcc(RxHpcc),
    /// LDCP.
    Ldcp(Ldcp),
}

impl AnyCc {
    /// Builds the algorithm a configuration names.
    pub fn new(cfg: &CcConfig) -> Self {
        match cfg {
            CcConfig::None(c) => AnyCc::None(NoCc::new(c)),
            CcConfig::Dcqcn(c) => AnyCc::Dcqcn(Dcqcn::new(c)),
            CcConfig::Hpcc(c) => AnyCc::Hpcc(Hpcc::new(c)),
            CcConfig::RxHpcc(c) => AnyCc::RxHpcc(RxHpcc::new(c)),
            CcConfig::Ldcp(c) => AnyCc::Ldcp(Ldcp::new(c)),
        }
    }
}

impl AnyCc {
    /// Whether data packets of this QP should carry the INT container: HPCC++ with
    /// inband telemetry (000 §6.2.1 item 1) and Rx-HPCC (its receiver reads `int.L`
    /// from data packets, 000 §6.3.2). In HPCC++ probe mode only probes carry it.
    pub fn int_on_data(&self) -> bool {
        match self {
            AnyCc::Hpcc(h) => h.mode() == TelemetryMode::EveryPacket,
            AnyCc::RxHpcc(_) => true,
            _ => false,
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $cc:ident => $e:expr) => {
        match $self {
            AnyCc::None($cc) => $e,
            AnyCc::Dcqcn($cc) => $e,
            AnyCc::Hpcc($cc) => $e,
            AnyCc::RxHpcc($cc) => $e,
            AnyCc::Ldcp($cc) => $e,
        }
    };
}

impl CongestionControl for AnyCc {
    #[inline]
    fn on_send(&mut self, ev: &SendEvent) -> Actions {
        dispatch!(self, c => c.on_send(ev))
    }
    #[inline]
    fn on_ack(&mut self, ev: &AckEvent<'_>) -> Actions {
        dispatch!(self, c => c.on_ack(ev))
    }
    #[inline]
    fn on_nak(&mut self, ev: &NakEvent) -> Actions {
        dispatch!(self, c => c.on_nak(ev))
    }
    #[inline]
    fn on_cnp(&mut self, now_ns: u64) -> Actions {
        dispatch!(self, c => c.on_cnp(now_ns))
    }
    #[inline]
    fn on_rto(&mut self, now_ns: u64) -> Actions {
        dispatch!(self, c => c.on_rto(now_ns))
    }
    #[inline]
    fn on_timer(&mut self, now_ns: u64, kind: TimerKind) -> Actions {
        dispatch!(self, c => c.on_timer(now_ns, kind))
    }
    #[inline]
    fn on_probe_response(&mut self, now_ns: u64, telemetry: &[IntHop]) -> Actions {
        dispatch!(self, c => c.on_probe_response(now_ns, telemetry))
    }
    #[inline]
    fn on_rx_data(&mut self, ev: &RxDataEvent<'_>) -> Actions {
        dispatch!(self, c => c.on_rx_data(ev))
    }
    #[inline]
    fn window_bytes(&self) -> u64 {
        dispatch!(self, c => c.window_bytes())
    }
    #[inline]
    fn rate_bps(&self) -> u64 {
        dispatch!(self, c => c.rate_bps())
    }
    #[inline]
    fn kind(&self) -> CcKind {
        dispatch!(self, c => c.kind())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn cc_kind_from_str_and_display_round_trip() {
        for (s, k) in [
            ("none", CcKind::None),
            ("dcqcn", CcKind::Dcqcn),
            ("hpcc", CcKind::Hpcc),
            ("rx-hpcc", CcKind::RxHpcc),
            ("ldcp", CcKind::Ldcp),
        ] {
            assert_eq!(s.parse::<CcKind>(), Ok(k));
            assert_eq!(k.to_string(), s);
        }
        assert_eq!(" HPCC ".parse::<CcKind>(), Ok(CcKind::Hpcc));
        let e = "timely".parse::<CcKind>().unwrap_err();
        assert!(e.to_string().contains("timely"));
        assert!("".parse::<CcKind>().is_err());
        assert!("rxhpcc".parse::<CcKind>().is_err());
        let ext: Vec<_> = CcKind::ALL.iter().filter(|k| k.uses_extensions()).collect();
        assert_eq!(ext, [&CcKind::Hpcc, &CcKind::RxHpcc, &CcKind::Ldcp]);
    }

    #[test]
    fn int_on_data_follows_telemetry_mode() {
        let path = PathConfig::default();
        assert!(CcKind::Hpcc.build(path).int_on_data());
        assert!(CcKind::RxHpcc.build(path).int_on_data());
        assert!(!CcKind::Ldcp.build(path).int_on_data());
        assert!(!CcKind::Dcqcn.build(path).int_on_data());
        let mut h = HpccConfig::for_path(path);
        h.mode = TelemetryMode::Probe;
        assert!(!AnyCc::new(&CcConfig::Hpcc(h)).int_on_data());
    }

    #[test]
    fn factory_builds_each_kind_with_its_defaults() {
        let path = PathConfig::default();
        for k in CcKind::ALL {
            let cc = k.build(path);
            assert_eq!(cc.kind(), k);
            assert_eq!(k.default_config(path).kind(), k);
            assert!(cc.rate_bps() > 0 && cc.rate_bps() <= path.line_rate_bps);
        }
        // all start at line rate with at least one BDP of window
        let bdp = path.bdp_bytes();
        assert_eq!(bdp, 62_500);
        for k in CcKind::ALL {
            let cc = k.build(path);
            assert_eq!(cc.rate_bps(), path.line_rate_bps, "{k}");
            assert!(cc.window_bytes() >= bdp, "{k}");
        }
    }

    /// Per-QP state size (documented in docs/cc.md). The largest variants hold the
    /// HPCC++ per-hop telemetry (`MAX_HOPS` x 24 B).
    #[test]
    fn state_sizes() {
        assert_eq!(size_of::<IntHop>(), 24);
        assert!(size_of::<NoCc>() <= 16);
        assert!(size_of::<Dcqcn>() <= 256, "{}", size_of::<Dcqcn>());
        assert!(size_of::<Ldcp>() <= 160, "{}", size_of::<Ldcp>());
        assert!(size_of::<Hpcc>() <= 384, "{}", size_of::<Hpcc>());
        assert!(size_of::<RxHpcc>() <= 384, "{}", size_of::<RxHpcc>());
        assert!(size_of::<AnyCc>() <= 384, "{}", size_of::<AnyCc>());
        assert!(size_of::<Actions>() <= 80, "{}", size_of::<Actions>());
        eprintln!(
            "sizes: IntHop {} NoCc {} Dcqcn {} Ldcp {} Hpcc {} RxHpcc {} AnyCc {} Actions {}",
            size_of::<IntHop>(),
            size_of::<NoCc>(),
            size_of::<Dcqcn>(),
            size_of::<Ldcp>(),
            size_of::<Hpcc>(),
            size_of::<RxHpcc>(),
            size_of::<AnyCc>(),
            size_of::<Actions>()
        );
    }
}
