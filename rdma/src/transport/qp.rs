//! The RC queue pair: requester and responder state machines (IBA chapter 9.7-9.9, as the
//! Linux rxe driver implements them), driven by `(event, now_ns)` and answering actions:
//! packets to send ([`Qp::poll_tx`]), completions ([`Qp::poll_cq`]) and CC events
//! ([`Qp::poll_event`]). No clock reads, no allocation after [`Qp::new`]: every queue is a
//! `VecDeque` allocated at creation and bounded by the configured depths.

use super::mr::{Access, AccessError, MemorySpace, MrTable};
use super::wc::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::bth::{BthFlags, BthRepr, Opcode};
use crate::wire::ccext::{CcExtFlags, CcExtRepr, MAX_ECHO_HOPS};
use crate::wire::frame::{FrameBuilder, RoceFrame, RoceRepr};
use crate::wire::int::HopRecord;
use crate::wire::ipv4::Ecn;
use crate::wire::psn;
use crate::wire::transport_hdrs::{
    rnr_timer_ns, AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, ImmDtRepr, NakCode,
    RethRepr,
};
use crate::wire::WireError;
use std::collections::VecDeque;

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
    /// The QP's protection domain: it may only use keys of regions in the same PD
    /// (IBA 10.2.3), locally (lkeys of its work requests) and remotely (rkeys it is
    /// sent).
    pub pd: u32,
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
            pd: 0,
        }
    }
}

/// Where a packet's payload comes from, so the NIC can attach it zero-copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// No payload.
    None,
    /// From local memory of a send WQE (already checked against `lkey` at post time).
    Local {
        /// Local key.
        lkey: u32,
        /// Virtual address.
        va: u64,
        /// Length.
        len: u32,
    },
    /// From responder memory for a READ response (already checked against `rkey`).
    Remote {
        /// Remote key the requester used.
        rkey: u32,
        /// Virtual address.
        va: u64,
        /// Length.
        len: u32,
    },
}

impl Payload {
    /// Payload length.
    pub fn len(&self) -> u32 {
        match *self {
            Payload::None => 0,
            Payload::Local { len, .. } | Payload::Remote { len, .. } => len,
        }
    }

    /// No payload bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn range(&self) -> Option<(u64, usize)> {
        match *self {
            Payload::None => None,
            Payload::Local { va, len, .. } | Payload::Remote { va, len, .. } => {
                Some((va, len as usize))
            }
        }
    }
}

/// A packet to transmit, described abstractly (headers + payload reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPacket {
    /// BTH and extension headers.
    pub repr: RoceRepr,
    /// Payload reference.
    pub payload: Payload,
    /// IP ECN to send with: ECT(0) for data; the NIC may switch LDCP fast-start packets
    /// to Not-ECT.
    pub ecn: Ecn,
    /// ACK/NAK/CNP class: goes before data (DESIGN.md section 5).
    pub priority: bool,
    /// LSN of the packet's first byte (the requester or the READ-response space).
    pub lsn: u32,
    /// LSN charge of this packet (payload bytes, or [`LSN_HEADER_ONLY_CHARGE`]).
    pub lsn_len: u32,
    /// A retransmission (go-back-N, timeout or RNR).
    pub retransmit: bool,
}

impl TxPacket {
    /// Writes the full frame into `buf` (payload copied from `mem`); returns its length.
    /// For tests and simple paths: the NIC builds headers and attaches payload zero-copy.
    pub fn build_frame<M: MemorySpace + ?Sized>(
        &self,
        fb: &FrameBuilder,
        mem: &M,
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        let payload: &[u8] = match self.payload.range() {
            Some((va, len)) => mem.read(va, len),
            None => &[],
        };
        fb.emit_frame(&self.repr, payload, self.ecn, buf)
    }
}

/// Events for the congestion control and the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// An ACK (or READ response / ATOMIC ACK) made progress or was received.
    Ack {
        /// PSN acknowledged.
        psn: u32,
        /// Requester LSN now acknowledged (cumulative).
        acked_lsn: u32,
        /// Bytes of LSN newly acknowledged by this ACK.
        newly_acked: u32,
        /// CE marks echoed (CC extension).
        ce_count: u8,
        /// Receiver window (Rx-HPCC), if carried.
        window: Option<u32>,
        /// Echoed hop records.
        n_hops: u8,
        /// Hop records, newest first.
        hops: [HopRecord; MAX_ECHO_HOPS],
    },
    /// A NAK was received.
    Nak {
        /// PSN in the NAK.
        psn: u32,
        /// Syndrome.
        syndrome: AethSyndrome,
    },
    /// The retransmit timer fired; `retries_left` after this one.
    Timeout {
        /// Oldest unacknowledged PSN.
        psn: u32,
        /// Retries left.
        retries_left: u8,
    },
    /// A request arrived CE-marked: the NIC may send a CNP (DCQCN) and the next ACK
    /// echoes it (CC extension).
    CeMarked {
        /// PSN of the marked packet.
        psn: u32,
    },
    /// A CNP arrived for this QP (DCQCN reaction point).
    CnpReceived,
    /// The requester acknowledged our READ responses (LDCP section 3.1).
    ReadRespAck {
        /// Acknowledged response LSN (cumulative).
        lsn: u32,
        /// CE marks it echoes.
        ce_count: u8,
    },
    /// A probe response arrived (HPCC++ probe mode) with the path's telemetry.
    ProbeResponse {
        /// Echoed hop records.
        n_hops: u8,
        /// Hop records, newest first.
        hops: [HopRecord; MAX_ECHO_HOPS],
    },
    /// The QP entered the error state.
    Error,
}

/// Drop and error counters (each drop reason is counted, DESIGN.md section 3).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCounters {
    /// Packets transmitted.
    pub tx_packets: u64,
    /// Retransmitted packets.
    pub tx_retransmits: u64,
    /// Packets received and accepted.
    pub rx_packets: u64,
    /// Duplicate requests (re-ACKed or replayed).
    pub rx_duplicates: u64,
    /// Out-of-sequence requests dropped.
    pub rx_out_of_sequence: u64,
    /// Packets for another QP or in a state that ignores them.
    pub rx_dropped_state: u64,
    /// Malformed or unexpected responses dropped.
    pub rx_bad_response: u64,
    /// NAKs sent: PSN sequence error.
    pub nak_seq_sent: u64,
    /// RNR NAKs sent.
    pub rnr_nak_sent: u64,
    /// Remote access / invalid request NAKs sent.
    pub nak_error_sent: u64,
    /// Retransmit timeouts.
    pub timeouts: u64,
    /// Go-back-N rewinds (NAK, implied NAK, out-of-order READ response).
    pub rewinds: u64,
    /// Events dropped because the event queue was full.
    pub events_dropped: u64,
    /// Responses dropped because the response queue was full.
    pub resp_queue_full: u64,
}

#[derive(Debug, Clone, Copy)]
struct SendWqe {
    wr: SendWr,
    first_psn: u32,
    npkts: u32,
    first_lsn: u32,
    lsn_len: u32,
    started: bool,
}

impl SendWqe {
    fn end_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts)
    }
}

#[derive(Debug, Clone, Copy)]
enum InMsg {
    Send {
        offset: u32,
    },
    Write {
        va: u64,
        rkey: u32,
        remaining: u32,
        total: u32,
    },
}

#[derive(Debug, Clone, Copy)]
struct ReadJob {
    psn: u32,
    va: u64,
    rkey: u32,
    remaining: u32,
    first: bool,
    msn: u32,
}

#[derive(Debug, Clone, Copy)]
enum RespItem {
    Ack {
        psn: u32,
        msn: u32,
        syndrome: AethSyndrome,
    },
    Read(ReadJob),
    AtomicAck {
        psn: u32,
        msn: u32,
        orig: u64,
    },
}

/// An RC queue pair.
#[derive(Debug)]
pub struct Qp {
    cfg: QpConfig,
    state: QpState,
    // ---- requester ----
    sq: VecDeque<SendWqe>,
    tx_idx: usize,
    tx_pkt: u32,
    next_psn: u32,
    sent_hi: u32,
    una: u32,
    next_lsn: u32,
    acked_lsn: u32,
    window: u32,
    rto_deadline: Option<u64>,
    retry_left: u8,
    rnr_left: u8,
    rnr_until: u64,
    rewound_for: Option<u32>,
    rd_outstanding: u8,
    resp_rx_lsn: u32,
    resp_ack_pending: Option<(u32, u32, u8)>,
    resp_ce: u8,
    // ---- responder ----
    epsn: u32,
    msn: u32,
    nak_sent: bool,
    unacked: u16,
    ack_coalesce: u16,
    cur: Option<InMsg>,
    rq: VecDeque<RecvWr>,
    out: VecDeque<RespItem>,
    atomic_cache: VecDeque<(u32, u64)>,
    exp_lsn: u32,
    ce_pending: u8,
    echo_hops: [HopRecord; MAX_ECHO_HOPS],
    echo_n: u8,
    ack_window: Option<u32>,
    resp_next_lsn: u32,
    resp_acked_lsn: u32,
    resp_window: u32,
    probe_pending: bool,
    probe_resp: Option<(u32, u8, [HopRecord; MAX_ECHO_HOPS])>,
    // ---- outputs ----
    cq: VecDeque<WorkCompletion>,
    events: VecDeque<QpEvent>,
    events_cap: usize,
    counters: QpCounters,
}

impl Qp {
    /// Creates a QP in RESET with every queue preallocated.
    pub fn new(cfg: QpConfig) -> Result<Self, QpError> {
        if !matches!(cfg.pmtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(QpError::Config("pmtu must be 256..4096, a power of two"));
        }
        if cfg.qpn > psn::MASK
            || cfg.dest_qpn > psn::MASK
            || cfg.sq_psn > psn::MASK
            || cfg.rq_psn > psn::MASK
        {
            return Err(QpError::Config("QPN/PSN above 24 bits"));
        }
        if cfg.sq_depth == 0
            || cfg.rq_depth == 0
            || cfg.max_rd_atomic == 0
            || cfg.retry_cnt > 7
            || cfg.rnr_retry > 7
        {
            return Err(QpError::Config("depths must be > 0, retry counts <= 7"));
        }
        let rd = cfg.max_rd_atomic as usize;
        let events_cap = 4 * (cfg.sq_depth as usize + cfg.rq_depth as usize) + 64;
        Ok(Self {
            cfg,
            state: QpState::Reset,
            sq: VecDeque::with_capacity(cfg.sq_depth as usize),
            tx_idx: 0,
            tx_pkt: 0,
            next_psn: cfg.sq_psn,
            sent_hi: cfg.sq_psn,
            una: cfg.sq_psn,
            next_lsn: 0,
            acked_lsn: 0,
            window: u32::MAX,
            rto_deadline: None,
            retry_left: cfg.retry_cnt,
            rnr_left: cfg.rnr_retry,
            rnr_until: 0,
            rewound_for: None,
            rd_outstanding: 0,
            resp_rx_lsn: 0,
            resp_ack_pending: None,
            resp_ce: 0,
            epsn: cfg.rq_psn,
            msn: 0,
            nak_sent: false,
            unacked: 0,
            ack_coalesce: 1,
            cur: None,
            rq: VecDeque::with_capacity(cfg.rq_depth as usize),
            out: VecDeque::with_capacity(2 * rd + 8),
            atomic_cache: VecDeque::with_capacity(rd),
            exp_lsn: 0,
            ce_pending: 0,
            echo_hops: [HopRecord::default(); MAX_ECHO_HOPS],
            echo_n: 0,
            ack_window: None,
            resp_next_lsn: 0,
            resp_acked_lsn: 0,
            resp_window: u32::MAX,
            probe_pending: false,
            probe_resp: None,
            cq: VecDeque::with_capacity(cfg.sq_depth as usize + cfg.rq_depth as usize + 8),
            events: VecDeque::with_capacity(events_cap),
            events_cap,
            counters: QpCounters::default(),
        })
    }

    /// Configuration.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// Counters.
    pub fn counters(&self) -> &QpCounters {
        &self.counters
    }

    /// Moves to `to` if IBA 10.3.1 allows it (any state may go to RESET or ERR).
    /// Entering ERR flushes every queued work request with WR_FLUSH_ERR.
    pub fn modify(&mut self, to: QpState) -> Result<(), QpError> {
        use QpState::*;
        let ok = matches!(
            (self.state, to),
            (_, Reset)
                | (_, Err)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
                | (Sqd, Sqd)
                | (Sqe, Rts)
        );
        if !ok {
            return Result::Err(QpError::IllegalTransition {
                from: self.state,
                to,
            });
        }
        match to {
            Err => self.enter_error(None),
            Reset => {
                let cfg = self.cfg;
                *self = Self::new(cfg)?;
            }
            _ => self.state = to,
        }
        Ok(())
    }

    /// Sets the congestion window in LSN bytes (from the CC module). Sending stops while
    /// `lsn_end - acked_lsn` of the next packet would exceed it, except that one packet may
    /// always go when nothing is in flight (so a window below one packet, LDCP section
    /// 2.2 "cw < 1 is ticked out by a timer", sends one packet at a time instead of
    /// deadlocking; the NIC's timer spaces them).
    pub fn set_window(&mut self, bytes: u32) {
        self.window = bytes;
    }

    /// Sets the window for READ responses this QP sends as responder (their own LSN
    /// space, LDCP section 3.1).
    pub fn set_resp_window(&mut self, bytes: u32) {
        self.resp_window = bytes;
    }

    /// Responder ACK coalescing (delayed ACK, DESIGN.md section 5): acknowledge every
    /// `n` in-order SEND/WRITE packets, and always a packet with AckReq (the last of each
    /// message), a duplicate, or before a READ/ATOMIC response. 1 (the default) ACKs
    /// every packet, which LDCP's per-ACK window adjustment wants. 0 is taken as 1.
    pub fn set_ack_coalesce(&mut self, n: u16) {
        self.ack_coalesce = n.max(1);
    }

    /// Puts a receiver-computed window (Rx-HPCC) into the next ACK's CC extension.
    pub fn set_ack_window(&mut self, bytes: u32) {
        self.ack_window = Some(bytes);
    }

    /// Queues an HPCC++ probe (opcode 0xC0, same 5-tuple and queue as the data, PSN not
    /// consumed); the peer answers with a probe response carrying the path telemetry,
    /// reported as [`QpEvent::ProbeResponse`]. Needs the CC extension.
    pub fn send_probe(&mut self) {
        if self.cfg.cc_ext {
            self.probe_pending = true;
        }
    }

    /// Next LSN the requester will assign (HPCC++ `snd_nxt`, for `lastUpdateSeq`).
    pub fn next_lsn(&self) -> u32 {
        self.next_lsn
    }

    /// Cumulatively acknowledged requester LSN.
    pub fn acked_lsn(&self) -> u32 {
        self.acked_lsn
    }

    /// Next PSN the requester will assign to a new work request.
    pub fn next_psn(&self) -> u32 {
        self.next_psn
    }

    /// Oldest unacknowledged PSN.
    pub fn una_psn(&self) -> u32 {
        self.una
    }

    /// PSN the responder expects next.
    pub fn expected_psn(&self) -> u32 {
        self.epsn
    }

    /// Work requests posted and not completed.
    pub fn sq_outstanding(&self) -> usize {
        self.sq.len()
    }

    /// Bytes in flight (LSN sent and not acknowledged).
    pub fn in_flight(&self) -> u32 {
        self.lsn_sent_hi().wrapping_sub(self.acked_lsn)
    }

    fn lsn_sent_hi(&self) -> u32 {
        // LSN just past the highest PSN sent.
        self.lsn_at(self.sent_hi)
    }

    /// Posts a send work request. The local SGE is checked against `mrs` now; a failure is
    /// returned synchronously instead of as a LOC_PROT_ERR completion.
    pub fn post_send(&mut self, wr: SendWr, mrs: &MrTable) -> Result<(), QpError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.push_wc(WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: wr.op.wc_opcode(),
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                });
                return Ok(());
            }
            s => return Err(QpError::BadState(s)),
        }
        if self.sq.len() >= self.cfg.sq_depth as usize {
            return Err(QpError::QueueFull);
        }
        let need = if wr.op.needs_response() {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        if wr.op.is_atomic() && wr.sge.len != 8 {
            return Err(QpError::LocalLength);
        }
        if wr.sge.len > 0 || wr.op.needs_response() {
            mrs.check_local_in(
                self.cfg.pd,
                wr.sge.lkey,
                wr.sge.addr,
                u64::from(wr.sge.len),
                need,
            )
            .map_err(QpError::LocalProtection)?;
        }
        let pm = self.cfg.pmtu;
        let (npkts, lsn_len) = match wr.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => (1, LSN_HEADER_ONLY_CHARGE),
            SendOp::Read { .. } => (wr.sge.len.div_ceil(pm).max(1), LSN_HEADER_ONLY_CHARGE),
            _ => (
                wr.sge.len.div_ceil(pm).max(1),
                if wr.sge.len == 0 {
                    LSN_HEADER_ONLY_CHARGE
                } else {
                    wr.sge.len
                },
            ),
        };
        self.sq.push_back(SendWqe {
            wr,
            first_psn: 0,
            npkts,
            first_lsn: 0,
            lsn_len,
            started: false,
        });
        Ok(())
    }

    /// Posts a receive work request (buffer must be LOCAL_WRITE).
    pub fn post_recv(&mut self, wr: RecvWr, mrs: &MrTable) -> Result<(), QpError> {
        match self.state {
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.push_wc(WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                });
                return Ok(());
            }
            s => return Err(QpError::BadState(s)),
        }
        if self.rq.len() >= self.cfg.rq_depth as usize {
            return Err(QpError::QueueFull);
        }
        if wr.sge.len > 0 {
            mrs.check_local_in(
                self.cfg.pd,
                wr.sge.lkey,
                wr.sge.addr,
                u64::from(wr.sge.len),
                Access::LOCAL_WRITE,
            )
            .map_err(QpError::LocalProtection)?;
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Next completion.
    pub fn poll_cq(&mut self) -> Option<WorkCompletion> {
        self.cq.pop_front()
    }

    /// Completions waiting to be taken with [`Self::poll_cq`].
    pub fn pending_completions(&self) -> usize {
        self.cq.len()
    }

    /// Next event for CC / the NIC.
    pub fn poll_event(&mut self) -> Option<QpEvent> {
        self.events.pop_front()
    }

    /// The earliest time [`Qp::on_timer`] has work to do, if any.
    pub fn next_timer(&self) -> Option<u64> {
        let rnr = if self.rnr_until > 0 {
            Some(self.rnr_until)
        } else {
            None
        };
        match (self.rto_deadline, rnr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn push_wc(&mut self, wc: WorkCompletion) {
        // Bounded by sq_depth + rq_depth: every WQE completes once.
        self.cq.push_back(wc);
    }

    fn push_event(&mut self, e: QpEvent) {
        if self.events.len() >= self.events_cap {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    fn push_out(&mut self, item: RespItem) -> bool {
        if let RespItem::Ack { .. } = item {
            // Every ACK/NAK the responder queues covers all packets received in order.
            self.unacked = 0;
        }
        if let (
            RespItem::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            },
            Some(RespItem::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            }),
        ) = (&item, self.out.back())
        {
            // Coalesce consecutive ACKs: the newest cumulative ACK supersedes.
            if let Some(b) = self.out.back_mut() {
                *b = item;
            }
            return true;
        }
        if self.out.len() >= self.out.capacity() {
            self.counters.resp_queue_full += 1;
            return false;
        }
        self.out.push_back(item);
        true
    }

    fn enter_error(&mut self, failing: Option<WcStatus>) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        let q = self.cfg.qpn;
        let mut first = failing;
        while let Some(w) = self.sq.pop_front() {
            let st = first.take().unwrap_or(WcStatus::WrFlushErr);
            self.cq.push_back(WorkCompletion {
                wr_id: w.wr.wr_id,
                status: st,
                opcode: w.wr.op.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: q,
            });
        }
        while let Some(r) = self.rq.pop_front() {
            self.cq.push_back(WorkCompletion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                imm: None,
                qp_num: q,
            });
        }
        self.rto_deadline = None;
        self.rnr_until = 0;
        self.tx_idx = 0;
        self.tx_pkt = 0;
        self.push_event(QpEvent::Error);
        tracing::debug!(qpn = q, ?failing, "QP entered error state");
    }

    // ------------------------------------------------------------------ requester

    /// LSN of PSN `p` within the posted WQEs (p in [una, next_psn]).
    fn lsn_at(&self, p: u32) -> u32 {
        for w in self.sq.iter() {
            if !w.started {
                break;
            }
            let d = psn::sub(p, w.first_psn);
            if d < w.npkts {
                return if w.wr.op.needs_response() {
                    if d == 0 {
                        w.first_lsn
                    } else {
                        w.first_lsn.wrapping_add(w.lsn_len)
                    }
                } else {
                    w.first_lsn.wrapping_add((d * self.cfg.pmtu).min(w.lsn_len))
                };
            }
        }
        self.next_lsn
    }

    fn cursor_psn(&self) -> u32 {
        match self.sq.get(self.tx_idx) {
            Some(w) if w.started => psn::add(w.first_psn, self.tx_pkt),
            _ => self.next_psn,
        }
    }

    /// Go-back-N: the next packet sent is the one with PSN `p`.
    fn rewind(&mut self, p: u32) {
        self.counters.rewinds += 1;
        for (i, w) in self.sq.iter().enumerate() {
            if !w.started {
                self.tx_idx = i;
                self.tx_pkt = 0;
                return;
            }
            let d = psn::sub(p, w.first_psn);
            if d < w.npkts {
                self.tx_idx = i;
                self.tx_pkt = d;
                return;
            }
        }
        self.tx_idx = self.sq.len();
        self.tx_pkt = 0;
    }

    fn complete_front(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.pop_front() {
            if w.wr.op.needs_response() {
                self.rd_outstanding = self.rd_outstanding.saturating_sub(1);
            }
            if self.tx_idx > 0 {
                self.tx_idx -= 1;
            } else {
                self.tx_pkt = 0;
            }
            if w.wr.signaled || status != WcStatus::Success {
                let byte_len = if status == WcStatus::Success {
                    w.wr.sge.len
                } else {
                    0
                };
                self.push_wc(WorkCompletion {
                    wr_id: w.wr.wr_id,
                    status,
                    opcode: w.wr.op.wc_opcode(),
                    byte_len,
                    imm: None,
                    qp_num: self.cfg.qpn,
                });
            }
            self.una = w.end_psn();
        }
    }

    fn progress(&mut self, now: u64) {
        self.retry_left = self.cfg.retry_cnt;
        self.rnr_left = self.cfg.rnr_retry;
        self.rewound_for = None;
        self.rto_deadline = if self.una != self.sent_hi {
            Some(now + self.cfg.timeout_ns)
        } else {
            None
        };
        if psn::lt(self.cursor_psn(), self.una) {
            let u = self.una;
            self.rewind(u);
        }
    }

    /// Cumulative acknowledgement of every PSN before `to` (exclusive). Returns the LSN
    /// bytes newly acknowledged.
    fn ack_until(&mut self, to: u32, now: u64) -> u32 {
        if psn::le(to, self.una) || psn::lt(self.sent_hi, to) {
            return 0;
        }
        let before = self.acked_lsn;
        while let Some(w) = self.sq.front().copied() {
            if !w.started {
                break;
            }
            if w.wr.op.needs_response() {
                // ACK beyond an unfinished READ/ATOMIC: its response was lost (implied
                // NAK, IBA 9.7.5.1.3): re-request from the oldest missing PSN.
                if psn::lt(self.una, to) && self.rewound_for != Some(self.una) {
                    let u = self.una;
                    self.rewound_for = Some(u);
                    self.rewind(u);
                }
                break;
            }
            if psn::le(w.end_psn(), to) {
                self.complete_front(WcStatus::Success);
            } else {
                self.una = to;
                break;
            }
        }
        self.acked_lsn = self.lsn_at(self.una);
        let n = self.acked_lsn.wrapping_sub(before);
        if n > 0 {
            self.progress(now);
        }
        n
    }

    fn requester_tx(&mut self, now: u64) -> Option<TxPacket> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        if self.rnr_until > now {
            return None;
        }
        self.rnr_until = 0;
        let pm = self.cfg.pmtu;
        let mut w = *self.sq.get(self.tx_idx)?;
        if !w.started {
            if self.state == QpState::Sqd {
                return None;
            }
            if w.wr.op.needs_response() && self.rd_outstanding >= self.cfg.max_rd_atomic {
                return None;
            }
            let charge = if w.wr.op.needs_response() {
                w.lsn_len
            } else {
                w.lsn_len.min(pm)
            };
            if self
                .next_lsn
                .wrapping_add(charge)
                .wrapping_sub(self.acked_lsn)
                > self.window
                && self.in_flight() > 0
            {
                return None;
            }
            w.first_psn = self.next_psn;
            w.first_lsn = self.next_lsn;
            w.started = true;
            self.next_psn = psn::add(self.next_psn, w.npkts);
            self.next_lsn = self.next_lsn.wrapping_add(w.lsn_len);
            if w.wr.op.needs_response() {
                self.rd_outstanding += 1;
            }
            self.sq[self.tx_idx] = w;
        }
        let idx = self.tx_pkt;
        let p = psn::add(w.first_psn, idx);
        let off = idx * pm;
        let dq = self.cfg.dest_qpn;
        let (repr, payload, lsn, lsn_len, done) = match w.wr.op {
            SendOp::Read { remote_va, rkey } => {
                let mut r = RoceRepr::new(BthRepr::new(Opcode::ReadRequest, dq, p));
                r.bth.ack_req = true;
                r.reth = Some(RethRepr {
                    va: remote_va.wrapping_add(u64::from(off)),
                    rkey,
                    dma_len: w.wr.sge.len - off.min(w.wr.sge.len),
                });
                (r, Payload::None, w.first_lsn, w.lsn_len, true)
            }
            SendOp::CompareSwap {
                remote_va,
                rkey,
                compare,
                swap,
            } => {
                let mut r = RoceRepr::new(BthRepr::new(Opcode::CompareSwap, dq, p));
                r.bth.ack_req = true;
                r.atomic = Some(AtomicEthRepr {
                    va: remote_va,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (r, Payload::None, w.first_lsn, w.lsn_len, true)
            }
            SendOp::FetchAdd {
                remote_va,
                rkey,
                add,
            } => {
                let mut r = RoceRepr::new(BthRepr::new(Opcode::FetchAdd, dq, p));
                r.bth.ack_req = true;
                r.atomic = Some(AtomicEthRepr {
                    va: remote_va,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (r, Payload::None, w.first_lsn, w.lsn_len, true)
            }
            op => {
                let total = w.wr.sge.len;
                let len = (total - off.min(total)).min(pm);
                let only = w.npkts == 1;
                let last = idx + 1 == w.npkts;
                let is_send = matches!(op, SendOp::Send | SendOp::SendImm(_));
                let imm = match op {
                    SendOp::SendImm(i) | SendOp::WriteImm { imm: i, .. } => Some(i),
                    _ => None,
                };
                let opcode = match (is_send, only, idx == 0, last, imm.is_some()) {
                    (true, true, _, _, false) => Opcode::SendOnly,
                    (true, true, _, _, true) => Opcode::SendOnlyImm,
                    (true, false, true, _, _) => Opcode::SendFirst,
                    (true, false, false, true, false) => Opcode::SendLast,
                    (true, false, false, true, true) => Opcode::SendLastImm,
                    (true, false, false, false, _) => Opcode::SendMiddle,
                    (false, true, _, _, false) => Opcode::WriteOnly,
                    (false, true, _, _, true) => Opcode::WriteOnlyImm,
                    (false, false, true, _, _) => Opcode::WriteFirst,
                    (false, false, false, true, false) => Opcode::WriteLast,
                    (false, false, false, true, true) => Opcode::WriteLastImm,
                    (false, false, false, false, _) => Opcode::WriteMiddle,
                };
                let mut r = RoceRepr::new(BthRepr::new(opcode, dq, p));
                r.bth.ack_req = last;
                if last && w.wr.solicited {
                    r.bth.flags |= BthFlags::SE;
                }
                if opcode.has_reth() {
                    if let SendOp::Write { remote_va, rkey }
                    | SendOp::WriteImm {
                        remote_va, rkey, ..
                    } = op
                    {
                        r.reth = Some(RethRepr {
                            va: remote_va,
                            rkey,
                            dma_len: total,
                        });
                    }
                }
                if opcode.has_immdt() {
                    r.immdt = imm.map(ImmDtRepr);
                }
                let payload = if len > 0 {
                    Payload::Local {
                        lkey: w.wr.sge.lkey,
                        va: w.wr.sge.addr + u64::from(off),
                        len,
                    }
                } else {
                    Payload::None
                };
                let charge = if total == 0 {
                    LSN_HEADER_ONLY_CHARGE
                } else {
                    len
                };
                (r, payload, w.first_lsn.wrapping_add(off), charge, last)
            }
        };
        // Window gate for this packet (retransmissions too, if the window shrank).
        if lsn.wrapping_add(lsn_len).wrapping_sub(self.acked_lsn) > self.window
            && self.in_flight() > 0
        {
            return None;
        }
        let mut repr = repr;
        if self.cfg.cc_ext {
            repr.ccext = Some(CcExtRepr::data(lsn, CcExtFlags::empty()));
        }
        let retransmit = psn::lt(p, self.sent_hi);
        if done {
            self.tx_idx += 1;
            self.tx_pkt = 0;
        } else {
            self.tx_pkt += 1;
        }
        let end = if w.wr.op.needs_response() {
            w.end_psn()
        } else {
            psn::add(p, 1)
        };
        if psn::lt(self.sent_hi, end) {
            self.sent_hi = end;
        }
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.cfg.timeout_ns);
        }
        self.counters.tx_packets += 1;
        if retransmit {
            self.counters.tx_retransmits += 1;
        }
        Some(TxPacket {
            repr,
            payload,
            ecn: Ecn::Ect0,
            priority: false,
            lsn,
            lsn_len,
            retransmit,
        })
    }

    fn ack_event(&mut self, p: u32, newly: u32, ext: Option<&CcExtRepr>) {
        let (ce, window, n, hops) = match ext {
            Some(e) => (e.ce_count, e.window, e.n_hops, e.hops),
            None => (0, None, 0, [HopRecord::default(); MAX_ECHO_HOPS]),
        };
        let acked_lsn = self.acked_lsn;
        self.push_event(QpEvent::Ack {
            psn: p,
            acked_lsn,
            newly_acked: newly,
            ce_count: ce,
            window,
            n_hops: n,
            hops,
        });
    }

    fn on_response<M: MemorySpace + ?Sized>(&mut self, f: &RoceFrame<'_>, now: u64, mem: &mut M) {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if op == Opcode::Acknowledge {
            let Some(aeth) = f.aeth else { return };
            match aeth.syndrome {
                AethSyndrome::Ack { .. } => {
                    let n = self.ack_until(psn::add(p, 1), now);
                    self.ack_event(p, n, f.ccext.as_ref());
                }
                AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                    let n = self.ack_until(p, now);
                    self.push_event(QpEvent::Nak {
                        psn: p,
                        syndrome: aeth.syndrome,
                    });
                    if n > 0 {
                        self.ack_event(p, n, f.ccext.as_ref());
                    }
                    if psn::le(self.una, p) && psn::lt(p, self.sent_hi) {
                        self.rewind(p);
                    }
                }
                AethSyndrome::RnrNak { timer } => {
                    self.ack_until(p, now);
                    self.push_event(QpEvent::Nak {
                        psn: p,
                        syndrome: aeth.syndrome,
                    });
                    if !(psn::le(self.una, p) && psn::lt(p, self.sent_hi)) {
                        return;
                    }
                    if self.cfg.rnr_retry != RNR_RETRY_INFINITE {
                        if self.rnr_left == 0 {
                            self.enter_error(Some(WcStatus::RnrRetryExcErr));
                            return;
                        }
                        self.rnr_left -= 1;
                    }
                    self.rewind(p);
                    self.rnr_until = now + rnr_timer_ns(timer).max(1);
                    self.rto_deadline = None;
                }
                AethSyndrome::Nak(code) => {
                    self.ack_until(p, now);
                    self.push_event(QpEvent::Nak {
                        psn: p,
                        syndrome: aeth.syndrome,
                    });
                    let st = match code {
                        NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
                            WcStatus::RemInvReqErr
                        }
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::BadRespErr,
                    };
                    if psn::le(self.una, p) && psn::lt(p, self.sent_hi) {
                        self.enter_error(Some(st));
                    }
                }
                AethSyndrome::Reserved(_) => self.counters.rx_bad_response += 1,
            }
            return;
        }
        // READ responses and ATOMIC ACKs must be the oldest outstanding PSN.
        let Some(w) = self.sq.front().copied() else {
            self.counters.rx_bad_response += 1;
            return;
        };
        if !w.started || !w.wr.op.needs_response() || p != self.una {
            if psn::lt(self.una, p) && psn::lt(p, self.sent_hi) && op.is_read_response() {
                // Out-of-order READ response: the responder does not NAK READs, so the
                // requester re-requests from the missing PSN (LDCP 3.1, IBA 9.7.5.1.5).
                if self.rewound_for != Some(self.una) {
                    let u = self.una;
                    self.rewound_for = Some(u);
                    self.rewind(u);
                }
            }
            self.counters.rx_bad_response += 1;
            return;
        }
        let idx = psn::sub(p, w.first_psn);
        if op == Opcode::AtomicAcknowledge {
            let (true, Some(a)) = (w.wr.op.is_atomic(), f.atomic_ack) else {
                self.counters.rx_bad_response += 1;
                return;
            };
            mem.write_u64(w.wr.sge.addr, a.orig);
            let before = self.acked_lsn;
            self.complete_front(WcStatus::Success);
            self.acked_lsn = self.lsn_at(self.una);
            let n = self.acked_lsn.wrapping_sub(before);
            self.progress(now);
            self.ack_event(p, n, f.ccext.as_ref());
            return;
        }
        if !op.is_read_response() || !matches!(w.wr.op, SendOp::Read { .. }) {
            self.counters.rx_bad_response += 1;
            return;
        }
        let pm = self.cfg.pmtu;
        let total = w.wr.sge.len;
        let last = idx + 1 == w.npkts;
        let off = idx * pm;
        let expect_len = if last { total - off } else { pm };
        let op_ok = if last {
            op.is_last() || op.is_only()
        } else {
            op.is_first() || op.is_middle()
        };
        if !op_ok || f.payload.len() as u32 != expect_len {
            self.counters.rx_bad_response += 1;
            return;
        }
        if !f.payload.is_empty() {
            mem.write(w.wr.sge.addr + u64::from(off), f.payload);
        }
        let before = self.acked_lsn;
        if last {
            self.complete_front(WcStatus::Success);
        } else {
            self.una = psn::add(self.una, 1);
        }
        self.acked_lsn = self.lsn_at(self.una);
        let n = self.acked_lsn.wrapping_sub(before);
        self.progress(now);
        self.ack_event(p, n, f.ccext.as_ref());
        // LDCP 3.1: acknowledge READ responses so the responder's CC sees them.
        let charge = if f.payload.is_empty() {
            LSN_HEADER_ONLY_CHARGE
        } else {
            f.payload.len() as u32
        };
        self.resp_rx_lsn = f
            .ccext
            .map_or(self.resp_rx_lsn, |e| e.lsn)
            .wrapping_add(charge);
        if f.ip.ecn == Ecn::Ce {
            self.resp_ce = self.resp_ce.saturating_add(1);
        }
        if self.cfg.ack_read_responses && self.cfg.cc_ext {
            self.resp_ack_pending = Some((p, self.resp_rx_lsn, self.resp_ce));
        }
    }

    // ------------------------------------------------------------------ responder

    fn nak(&mut self, p: u32, code: NakCode, fatal: bool) {
        let msn = self.msn;
        self.push_out(RespItem::Ack {
            psn: p,
            msn,
            syndrome: AethSyndrome::Nak(code),
        });
        match code {
            NakCode::PsnSequenceError => self.counters.nak_seq_sent += 1,
            _ => self.counters.nak_error_sent += 1,
        }
        if fatal {
            self.enter_error(None);
        }
    }

    fn on_request<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        mrs: &MrTable,
        mem: &mut M,
    ) {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if f.ip.ecn == Ecn::Ce {
            self.ce_pending = self.ce_pending.saturating_add(1);
            self.push_event(QpEvent::CeMarked { psn: p });
        }
        if let Some(c) = &f.int {
            self.echo_n = c.copy_hops(&mut self.echo_hops) as u8;
        }
        let d = psn::diff(p, self.epsn);
        if d > 0 {
            // A gap: one NAK per gap, then silent drops until the expected PSN arrives.
            self.counters.rx_out_of_sequence += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                let e = self.epsn;
                self.nak(e, NakCode::PsnSequenceError, false);
            }
            return;
        }
        if d < 0 {
            self.counters.rx_duplicates += 1;
            self.duplicate(f, mrs);
            return;
        }
        self.counters.rx_packets += 1;
        // Opcode sequence (IBA 9.8.3.1): inside a message only MIDDLE/LAST of its kind.
        let seq_ok = match self.cur {
            Some(InMsg::Send { .. }) => op.is_send() && (op.is_middle() || op.is_last()),
            Some(InMsg::Write { .. }) => op.is_write() && (op.is_middle() || op.is_last()),
            None => !(op.is_middle() || op.is_last()),
        };
        if !seq_ok {
            self.nak(p, NakCode::InvalidRequest, true);
            return;
        }
        let pm = self.cfg.pmtu as usize;
        let len = f.payload.len();
        if (op.is_first() || op.is_middle()) && len != pm || len > pm {
            self.nak(p, NakCode::InvalidRequest, true);
            return;
        }
        if let Some(e) = &f.ccext {
            let charge = if len == 0 {
                LSN_HEADER_ONLY_CHARGE
            } else {
                len as u32
            };
            self.exp_lsn = e.lsn.wrapping_add(charge);
        }
        if op.is_send() {
            let Some(recv) = self.rq.front().copied() else {
                // Receiver not ready (IBA 9.7.5.2.8): RNR NAK, PSN not consumed.
                let msn = self.msn;
                let t = self.cfg.min_rnr_timer;
                self.push_out(RespItem::Ack {
                    psn: p,
                    msn,
                    syndrome: AethSyndrome::RnrNak { timer: t },
                });
                self.counters.rnr_nak_sent += 1;
                return;
            };
            let offset = match self.cur {
                Some(InMsg::Send { offset }) => offset,
                _ => 0,
            };
            if offset as usize + len > recv.sge.len as usize {
                self.rq.pop_front();
                self.push_wc(WorkCompletion {
                    wr_id: recv.wr_id,
                    status: WcStatus::LocLenErr,
                    opcode: WcOpcode::Recv,
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                });
                self.nak(p, NakCode::InvalidRequest, true);
                return;
            }
            if len > 0 {
                mem.write(recv.sge.addr + u64::from(offset), f.payload);
            }
            let nofs = offset + len as u32;
            if op.is_last() || op.is_only() {
                self.rq.pop_front();
                self.cur = None;
                self.msn = psn::add(self.msn, 1);
                let imm = f.immdt.map(|i| i.0);
                self.push_wc(WorkCompletion {
                    wr_id: recv.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: nofs,
                    imm,
                    qp_num: self.cfg.qpn,
                });
            } else {
                self.cur = Some(InMsg::Send { offset: nofs });
            }
        } else if op.is_write() {
            let (va, rkey, remaining, total) = match (self.cur, f.reth) {
                (
                    Some(InMsg::Write {
                        va,
                        rkey,
                        remaining,
                        total,
                    }),
                    _,
                ) => (va, rkey, remaining, total),
                (None, Some(r)) => {
                    if mrs
                        .check_remote_in(
                            self.cfg.pd,
                            r.rkey,
                            r.va,
                            u64::from(r.dma_len),
                            Access::REMOTE_WRITE,
                        )
                        .is_err()
                    {
                        self.nak(p, NakCode::RemoteAccessError, true);
                        return;
                    }
                    (r.va, r.rkey, r.dma_len, r.dma_len)
                }
                _ => {
                    self.nak(p, NakCode::InvalidRequest, true);
                    return;
                }
            };
            let end = op.is_last() || op.is_only();
            if len as u32 > remaining || (end && len as u32 != remaining) {
                self.nak(p, NakCode::InvalidRequest, true);
                return;
            }
            let imm = f.immdt.map(|i| i.0);
            if imm.is_some() && self.rq.is_empty() {
                let msn = self.msn;
                let t = self.cfg.min_rnr_timer;
                self.push_out(RespItem::Ack {
                    psn: p,
                    msn,
                    syndrome: AethSyndrome::RnrNak { timer: t },
                });
                self.counters.rnr_nak_sent += 1;
                return;
            }
            if len > 0 {
                mem.write(va, f.payload);
            }
            if end {
                self.cur = None;
                self.msn = psn::add(self.msn, 1);
                if imm.is_some() {
                    if let Some(recv) = self.rq.pop_front() {
                        self.push_wc(WorkCompletion {
                            wr_id: recv.wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: total,
                            imm,
                            qp_num: self.cfg.qpn,
                        });
                    }
                }
            } else {
                self.cur = Some(InMsg::Write {
                    va: va + len as u64,
                    rkey,
                    remaining: remaining - len as u32,
                    total,
                });
            }
        } else if op == Opcode::ReadRequest {
            let Some(r) = f.reth else { return };
            if mrs
                .check_remote_in(
                    self.cfg.pd,
                    r.rkey,
                    r.va,
                    u64::from(r.dma_len),
                    Access::REMOTE_READ,
                )
                .is_err()
            {
                self.nak(p, NakCode::RemoteAccessError, true);
                return;
            }
            let npkts = r.dma_len.div_ceil(self.cfg.pmtu).max(1);
            // Responses carry PSNs after the delayed ACK's: acknowledge first.
            self.flush_ack();
            self.msn = psn::add(self.msn, 1);
            let job = ReadJob {
                psn: p,
                va: r.va,
                rkey: r.rkey,
                remaining: r.dma_len,
                first: true,
                msn: self.msn,
            };
            if !self.push_out(RespItem::Read(job)) {
                self.msn = psn::sub(self.msn, 1);
                return;
            }
            self.epsn = psn::add(self.epsn, npkts);
            self.nak_sent = false;
            return;
        } else if op.has_atomic_eth() {
            let Some(a) = f.atomic else { return };
            if a.va % 8 != 0 {
                self.nak(p, NakCode::InvalidRequest, true);
                return;
            }
            if mrs
                .check_remote_in(self.cfg.pd, a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
                .is_err()
            {
                self.nak(p, NakCode::RemoteAccessError, true);
                return;
            }
            self.flush_ack();
            if self.out.len() >= self.out.capacity() {
                self.counters.resp_queue_full += 1;
                return;
            }
            let orig = mem.read_u64(a.va);
            let new = if op == Opcode::CompareSwap {
                if orig == a.compare {
                    a.swap_add
                } else {
                    orig
                }
            } else {
                orig.wrapping_add(a.swap_add)
            };
            mem.write_u64(a.va, new);
            self.msn = psn::add(self.msn, 1);
            let msn = self.msn;
            self.push_out(RespItem::AtomicAck { psn: p, msn, orig });
            if self.atomic_cache.len() >= self.atomic_cache.capacity() {
                self.atomic_cache.pop_front();
            }
            self.atomic_cache.push_back((p, orig));
            self.epsn = psn::add(self.epsn, 1);
            self.nak_sent = false;
            return;
        } else {
            self.counters.rx_dropped_state += 1;
            return;
        }
        self.epsn = psn::add(self.epsn, 1);
        self.nak_sent = false;
        self.unacked += 1;
        if self.unacked >= self.ack_coalesce || f.bth.ack_req {
            self.flush_ack();
        }
    }

    /// Queues the cumulative ACK for everything received in order so far, if any packet
    /// is still unacknowledged (delayed ACK).
    fn flush_ack(&mut self) {
        if self.unacked == 0 {
            return;
        }
        self.unacked = 0;
        let msn = self.msn;
        let last = psn::sub(self.epsn, 1);
        self.push_out(RespItem::Ack {
            psn: last,
            msn,
            syndrome: AethSyndrome::ACK,
        });
    }

    fn duplicate(&mut self, f: &RoceFrame<'_>, mrs: &MrTable) {
        let p = f.bth.psn;
        let op = f.bth.opcode;
        if op == Opcode::ReadRequest {
            // READs are idempotent: replay from the requested PSN with the (re-checked)
            // range of the re-issued request (IBA 9.7.5.1.5). Everything before it is
            // treated as delivered for the READ-response window.
            let Some(r) = f.reth else { return };
            if mrs
                .check_remote_in(
                    self.cfg.pd,
                    r.rkey,
                    r.va,
                    u64::from(r.dma_len),
                    Access::REMOTE_READ,
                )
                .is_err()
            {
                return;
            }
            self.resp_acked_lsn = self.resp_next_lsn;
            let msn = self.msn;
            let job = ReadJob {
                psn: p,
                va: r.va,
                rkey: r.rkey,
                remaining: r.dma_len,
                first: true,
                msn,
            };
            self.push_out(RespItem::Read(job));
        } else if op.has_atomic_eth() {
            if let Some(&(_, orig)) = self.atomic_cache.iter().find(|(q, _)| *q == p) {
                let msn = self.msn;
                self.push_out(RespItem::AtomicAck { psn: p, msn, orig });
            }
        } else {
            // Re-ACK the newest PSN received in order.
            let msn = self.msn;
            let last = psn::sub(self.epsn, 1);
            self.push_out(RespItem::Ack {
                psn: last,
                msn,
                syndrome: AethSyndrome::ACK,
            });
        }
    }

    fn ack_ext(&mut self, flags: CcExtFlags, lsn: u32) -> Option<CcExtRepr> {
        if !self.cfg.cc_ext {
            return None;
        }
        let mut e = CcExtRepr::data(lsn, flags | CcExtFlags::ACK);
        e.ce_count = self.ce_pending;
        self.ce_pending = 0;
        e.window = self.ack_window.take();
        e.n_hops = self.echo_n;
        e.hops = self.echo_hops;
        self.echo_n = 0;
        Some(e)
    }

    fn responder_tx(&mut self) -> Option<TxPacket> {
        let item = *self.out.front()?;
        let dq = self.cfg.dest_qpn;
        match item {
            RespItem::Ack {
                psn: p,
                msn,
                syndrome,
            } => {
                self.out.pop_front();
                let mut r = RoceRepr::new(BthRepr::new(Opcode::Acknowledge, dq, p));
                r.aeth = Some(AethRepr { syndrome, msn });
                let l = self.exp_lsn;
                r.ccext = self.ack_ext(CcExtFlags::empty(), l);
                Some(TxPacket {
                    repr: r,
                    payload: Payload::None,
                    ecn: Ecn::Ect0,
                    priority: true,
                    lsn: 0,
                    lsn_len: 0,
                    retransmit: false,
                })
            }
            RespItem::AtomicAck { psn: p, msn, orig } => {
                self.out.pop_front();
                let mut r = RoceRepr::new(BthRepr::new(Opcode::AtomicAcknowledge, dq, p));
                r.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK,
                    msn,
                });
                r.atomic_ack = Some(AtomicAckEthRepr { orig });
                let l = self.exp_lsn;
                r.ccext = self.ack_ext(CcExtFlags::empty(), l);
                Some(TxPacket {
                    repr: r,
                    payload: Payload::None,
                    ecn: Ecn::Ect0,
                    priority: true,
                    lsn: 0,
                    lsn_len: 0,
                    retransmit: false,
                })
            }
            RespItem::Read(mut j) => {
                let pm = self.cfg.pmtu;
                let len = j.remaining.min(pm);
                let last = j.remaining <= pm;
                let charge = if len == 0 {
                    LSN_HEADER_ONLY_CHARGE
                } else {
                    len
                };
                if self
                    .resp_next_lsn
                    .wrapping_add(charge)
                    .wrapping_sub(self.resp_acked_lsn)
                    > self.resp_window
                    && self.resp_next_lsn != self.resp_acked_lsn
                {
                    return None;
                }
                let opcode = match (j.first, last) {
                    (true, true) => Opcode::ReadResponseOnly,
                    (true, false) => Opcode::ReadResponseFirst,
                    (false, true) => Opcode::ReadResponseLast,
                    (false, false) => Opcode::ReadResponseMiddle,
                };
                let mut r = RoceRepr::new(BthRepr::new(opcode, dq, j.psn));
                if opcode.has_aeth() {
                    r.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::ACK,
                        msn: j.msn,
                    });
                }
                let lsn = self.resp_next_lsn;
                if self.cfg.cc_ext {
                    r.ccext = Some(CcExtRepr::data(lsn, CcExtFlags::RESP_SPACE));
                }
                self.resp_next_lsn = lsn.wrapping_add(charge);
                let payload = if len > 0 {
                    Payload::Remote {
                        rkey: j.rkey,
                        va: j.va,
                        len,
                    }
                } else {
                    Payload::None
                };
                if last {
                    self.out.pop_front();
                } else {
                    j.psn = psn::add(j.psn, 1);
                    j.va += u64::from(len);
                    j.remaining -= len;
                    j.first = false;
                    self.out[0] = RespItem::Read(j);
                }
                Some(TxPacket {
                    repr: r,
                    payload,
                    ecn: Ecn::Ect0,
                    priority: false,
                    lsn,
                    lsn_len: charge,
                    retransmit: false,
                })
            }
        }
    }

    // ------------------------------------------------------------------ entry points

    /// Whether a control packet (ACK, NAK, atomic ACK, the LDCP ACK of READ
    /// responses, a probe response) waits: what a NIC's scheduler sends ahead of
    /// data (DESIGN.md §5, HPCC++ 002 §7.2), via [`Qp::poll_tx_control`].
    pub fn has_control(&self) -> bool {
        !matches!(self.state, QpState::Reset | QpState::Init)
            && (self.resp_ack_pending.is_some()
                || self.probe_resp.is_some()
                || matches!(
                    self.out.front(),
                    Some(RespItem::Ack { .. } | RespItem::AtomicAck { .. })
                ))
    }

    /// The next control packet only (see [`Qp::has_control`]); never data, so
    /// a scheduler may send it without charging the QP's pacing credit.
    pub fn poll_tx_control(&mut self, _now_ns: u64) -> Option<TxPacket> {
        if !self.has_control() {
            return None;
        }
        if let Some((p, lsn, ce)) = self.resp_ack_pending.take() {
            let mut r = RoceRepr::new(BthRepr::new(Opcode::Acknowledge, self.cfg.dest_qpn, p));
            r.aeth = Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: 0,
            });
            let mut e = CcExtRepr::data(lsn, CcExtFlags::ACK | CcExtFlags::RESP_SPACE);
            e.ce_count = ce;
            self.resp_ce = 0;
            r.ccext = Some(e);
            return Some(TxPacket {
                repr: r,
                payload: Payload::None,
                ecn: Ecn::Ect0,
                priority: true,
                lsn: 0,
                lsn_len: 0,
                retransmit: false,
            });
        }
        if let Some((p, n, hops)) = self.probe_resp.take() {
            let mut r = RoceRepr::new(BthRepr::new(Opcode::ProbeResponse, self.cfg.dest_qpn, p));
            let mut e = CcExtRepr::data(self.exp_lsn, CcExtFlags::PROBE | CcExtFlags::ACK);
            e.n_hops = n;
            e.hops = hops;
            r.ccext = Some(e);
            return Some(TxPacket {
                repr: r,
                payload: Payload::None,
                ecn: Ecn::Ect0,
                priority: true,
                lsn: 0,
                lsn_len: 0,
                retransmit: false,
            });
        }
        // The front of the responder's queue is an ACK/NAK or atomic ACK.
        let t = self.responder_tx();
        if t.is_some() {
            self.counters.tx_packets += 1;
        }
        t
    }

    /// The next packet to transmit at `now_ns`, if any: responses and ACKs first
    /// (including the LDCP ACK of READ responses), then requester packets gated by the
    /// window, RNR wait and outstanding-READ limit.
    pub fn poll_tx(&mut self, now_ns: u64) -> Option<TxPacket> {
        if matches!(self.state, QpState::Reset | QpState::Init) {
            return None;
        }
        if let Some(t) = self.poll_tx_control(now_ns) {
            return Some(t);
        }
        if let Some(t) = self.responder_tx() {
            self.counters.tx_packets += 1;
            return Some(t);
        }
        if self.state == QpState::Err {
            return None;
        }
        if self.probe_pending {
            self.probe_pending = false;
            let mut r = RoceRepr::new(BthRepr::new(
                Opcode::Probe,
                self.cfg.dest_qpn,
                self.next_psn,
            ));
            r.ccext = Some(CcExtRepr::data(self.next_lsn, CcExtFlags::PROBE));
            return Some(TxPacket {
                repr: r,
                payload: Payload::None,
                ecn: Ecn::Ect0,
                priority: false,
                lsn: self.next_lsn,
                lsn_len: 0,
                retransmit: false,
            });
        }
        self.requester_tx(now_ns)
    }

    /// Handles a received frame already parsed by [`crate::wire::parse_frame`] (ICRC
    /// checked, INT stripped or not). Memory is touched only through `mem`, and only after
    /// the `mrs` checks pass.
    pub fn on_rx<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now_ns: u64,
        mrs: &MrTable,
        mem: &mut M,
    ) {
        if f.bth.dest_qp != self.cfg.qpn
            || matches!(self.state, QpState::Reset | QpState::Init | QpState::Err)
        {
            self.counters.rx_dropped_state += 1;
            return;
        }
        let op = f.bth.opcode;
        if op == Opcode::Cnp {
            self.push_event(QpEvent::CnpReceived);
            return;
        }
        if op == Opcode::Acknowledge {
            if let Some(e) = f.ccext.filter(|e| e.flags.contains(CcExtFlags::RESP_SPACE)) {
                // The requester acknowledges our READ responses (LDCP 3.1).
                if (e.lsn.wrapping_sub(self.resp_acked_lsn) as i32) > 0 {
                    self.resp_acked_lsn = e.lsn;
                }
                self.push_event(QpEvent::ReadRespAck {
                    lsn: e.lsn,
                    ce_count: e.ce_count,
                });
                return;
            }
        }
        if op == Opcode::Probe {
            let mut hops = [HopRecord::default(); MAX_ECHO_HOPS];
            let n = f.int.as_ref().map_or(0, |c| c.copy_hops(&mut hops)) as u8;
            self.probe_resp = Some((f.bth.psn, n, hops));
            return;
        }
        if op == Opcode::ProbeResponse {
            let (n_hops, hops) = f
                .ccext
                .map_or((0, [HopRecord::default(); MAX_ECHO_HOPS]), |e| {
                    (e.n_hops, e.hops)
                });
            self.push_event(QpEvent::ProbeResponse { n_hops, hops });
            return;
        }
        if op.is_request() {
            self.on_request(f, mrs, mem);
        } else if op.is_response() {
            if matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
                self.on_response(f, now_ns, mem);
            } else {
                self.counters.rx_dropped_state += 1;
            }
        } else {
            self.counters.rx_dropped_state += 1;
        }
    }

    /// Fires due timers: the retransmit timeout (go-back-N from the oldest unacknowledged
    /// PSN, or ERR with RETRY_EXC_ERR when the retry count is spent) and the RNR wait.
    pub fn on_timer(&mut self, now_ns: u64) {
        if self.rnr_until != 0 && self.rnr_until <= now_ns {
            self.rnr_until = 0;
        }
        let Some(d) = self.rto_deadline else { return };
        if d > now_ns || self.state == QpState::Err {
            return;
        }
        self.rto_deadline = None;
        if self.una == self.sent_hi {
            return;
        }
        self.counters.timeouts += 1;
        if self.retry_left == 0 {
            self.push_event(QpEvent::Timeout {
                psn: self.una,
                retries_left: 0,
            });
            self.enter_error(Some(WcStatus::RetryExcErr));
            return;
        }
        self.retry_left -= 1;
        self.push_event(QpEvent::Timeout {
            psn: self.una,
            retries_left: self.retry_left,
        });
        let u = self.una;
        self.rewound_for = Some(u);
        self.rewind(u);
    }
}

/// Post-time helper: an SGE for `len` bytes at `addr` in region `lkey`.
pub fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
    Sge { addr, len, lkey }
}
