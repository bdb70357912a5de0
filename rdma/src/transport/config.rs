//! What a queue pair is configured with and answers besides packets: its attributes
//! ([`QpConfig`], the `ibv_modify_qp` attributes this transport uses), its states
//! (IBA 10.3.1), its errors, and the constants the roles share. Below [`super::qp`] and
//! the roles (`requester`, `completer`, `responder`,
//! `cc_ext`), which all use it; it uses none of them.

use super::mr::AccessError;
pub use crate::wire::bth::Service;

/// LSN charge of a packet without payload (READ request, ATOMIC, zero-length message):
/// the minimum Ethernet frame, so that the window gates header-only packets too.
pub const LSN_HEADER_ONLY_CHARGE: u32 = 64;
/// `rnr_retry` value meaning "retry forever" (IBA 9.7.5.2.8).
pub const RNR_RETRY_INFINITE: u8 = 7;

/// QP states (IBA 10.3.1; `ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing works.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive: the responder works.
    Rtr,
    /// Ready to send: both work.
    Rts,
    /// Send queue drain: no new WQEs start, outstanding ones finish.
    Sqd,
    /// Send queue error (not used by RC; accepted for completeness).
    Sqe,
    /// Error: everything flushed.
    Err,
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QpError {
    /// Transition not allowed by IBA 10.3.1.
    #[error("illegal QP transition {from:?} -> {to:?}")]
    IllegalTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Posting in a state that does not accept it.
    #[error("QP in state {0:?} does not accept this work request")]
    BadState(QpState),
    /// The queue is full (its depth was fixed at creation).
    #[error("queue full")]
    QueueFull,
    /// The local SGE fails the MR check (would complete with LOC_PROT_ERR).
    #[error("local protection error: {0}")]
    LocalProtection(AccessError),
    /// The local SGE has the wrong length (ATOMIC needs 8 bytes).
    #[error("local length error")]
    LocalLength,
    /// Invalid configuration.
    #[error("invalid QP configuration: {0}")]
    Config(&'static str),
    /// A work request the QP's service does not have (a READ or ATOMIC on UC, a
    /// UD SEND longer than the path MTU or without a destination, ...): refused at
    /// post, as rxe's `validate_send_wr` answers EINVAL.
    #[error("work request not valid for this QP: {0}")]
    InvalidWr(&'static str),
}

/// Per-QP attributes (the `ibv_modify_qp` attributes this transport uses, plus the
/// negotiated extensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Local QP number (24 bits).
    pub qpn: u32,
    /// Remote QP number.
    pub dest_qpn: u32,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (IBA 9.2.1 / `ibv_mtu`).
    pub pmtu: u32,
    /// Send queue depth.
    pub sq_depth: u16,
    /// Receive queue depth.
    pub rq_depth: u16,
    /// Outstanding READ/ATOMIC as requester and replay depth as responder.
    pub max_rd_atomic: u8,
    /// Local ACK timeout in ns (IBA: 4.096 us * 2^timeout).
    pub timeout_ns: u64,
    /// Transport retries on timeout (0..=7).
    pub retry_cnt: u8,
    /// RNR retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this responder advertises in RNR NAKs (IBA table 45).
    pub min_rnr_timer: u8,
    /// First PSN the requester sends.
    pub sq_psn: u32,
    /// First PSN the responder expects.
    pub rq_psn: u32,
    /// The CC extension header was negotiated (both ends).
    pub cc_ext: bool,
    /// The requester acknowledges READ responses (LDCP section 3.1; needs `cc_ext`).
    pub ack_read_responses: bool,
    /// A READ response packet that acknowledges nothing new (every one after
    /// the first: a READ's LSN is acknowledged by its first response) still
    /// raises a [`super::QpEvent::Ack`]: a CC counts ACKs. False for a QP
    /// without CC, which has nothing to feed them to: one event per READ
    /// instead of one per response packet (those with a CC extension header
    /// raise theirs either way).
    pub ack_events_without_progress: bool,
    /// The QP's protection domain: it may only use keys of regions in the same PD
    /// (IBA 10.2.3), locally (lkeys of its work requests) and remotely (rkeys it is
    /// sent).
    pub pd: u32,
    /// Most SGEs a send work request may carry (`ibv_qp_cap.max_send_sge`,
    /// 1..=[`super::sgl::MAX_SGE`]): the send queue keeps room for that many
    /// per WQE ([`super::sgl::SglStore`]).
    pub max_send_sge: u8,
    /// Most SGEs a receive work request may carry (`ibv_qp_cap.max_recv_sge`).
    pub max_recv_sge: u8,
    /// Receives come from a shared receive queue (`ibv_qp_init_attr.srq`;
    /// super::srq): the QP's own receive queue is unused.
    pub srq: bool,
    /// The transport service (`ibv_qp_init_attr.qp_type`): RC (the default), UC
    /// (IBA 9.8.3 rules: SEND and RDMA WRITE, no ACK, a message either arrives whole
    /// or is dropped) or UD (IBA 9.8: one-packet SENDs to a destination per work
    /// request, [`super::Qp::post_send_ud`]).
    pub service: Service,
    /// The Q_Key of a UD QP (`IBV_QP_QKEY`, an attribute of RESET -> INIT, IBA
    /// 10.3.1 table 84): a received UD packet is accepted only if its DETH carries
    /// it, and a work request whose remote Q_Key has the high bit set sends it
    /// instead (IBA 10.2.4.4). Unused by RC and UC.
    pub qkey: u32,
    /// How an RC QP recovers a loss (crate::transport::sack): go-back-N (the
    /// default, IBA 9.7.5.1.3) or selective repeat, which both ends must have
    /// agreed on (the NIC sets `Sr` only with a peer known to run it: the IB CM's
    /// negotiation, `crate::cm::ext`, or an exchange between rsnic programs).
    /// Unused by UC and UD.
    pub loss_recovery: super::sack::LossRecovery,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            qpn: 1,
            dest_qpn: 1,
            pmtu: 1024,
            sq_depth: 128,
            rq_depth: 128,
            max_rd_atomic: 16,
            timeout_ns: 1_000_000,
            retry_cnt: 7,
            rnr_retry: RNR_RETRY_INFINITE,
            min_rnr_timer: 1,
            sq_psn: 0,
            rq_psn: 0,
            cc_ext: false,
            ack_read_responses: false,
            ack_events_without_progress: true,
            pd: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            srq: false,
            service: Service::Rc,
            qkey: 0,
            loss_recovery: super::sack::LossRecovery::Gbn,
        }
    }
}
