//! The queue pair (IBA vol. 1 9.7 "reliable service", 9.8 "unreliable service", 10.3
//! QP states) of any of the three services ([`QpConfig::service`]), composed the
//! way Linux rxe splits it: a requester (`rxe_req.c`) that turns work
//! requests into packets, a completer (`rxe_comp.c`) that processes what
//! comes back, a responder (`rxe_resp.c`) that executes the peer's
//! requests, and the `cc_ext` state of the project's CC extension. `Qp` owns
//! the state machine (RESET -> INIT -> RTR -> RTS, ERR), dispatches received packets and
//! timers to the roles and merges their output. Driven by `(event, now_ns)`, it answers
//! packets to send ([`Qp::poll_tx`]), completions ([`Qp::poll_cq`]) and CC events
//! ([`Qp::poll_event`]). No clock reads, no allocation after [`Qp::new`]: every queue is
//! a `VecDeque` allocated at creation and bounded by the configured depths.
//!
//! UC and UD (IBA 9.8) reuse the requester's segmentation and the responder's
//! placement; what differs is here and in `responder::unreliable`: a packet goes out
//! without AckReq and counts as acknowledged when it is handed out (no window, no
//! retransmit timer), a send WQE completes when its last packet is handed out (rxe
//! `rxe_xmit_packet` marks a non-RC WQE done there), READ and ATOMIC are refused at
//! post, and a UD work request carries its destination ([`UdDest`],
//! [`Qp::post_send_ud`]) to its packet (the BTH DestQP, the DETH, [`TxPacket::ah`]).

use super::cc_ext::CcExtState;
use super::completer::{Completer, Heard};
pub use super::config::{QpConfig, QpError, QpState, LSN_HEADER_ONLY_CHARGE, RNR_RETRY_INFINITE};
use super::mr::{MemorySpace, MrTable};
use super::output::Outputs;
pub use super::output::{EchoedHops, Payload, QpCounters, QpEvent, TxPacket, UnreliableCounters};
use super::requester::Requester;
use super::responder::{Responder, Verdict};
use super::sack::{LossRecovery, SrCounters, SrParams, SrState};
use super::sgl::SglStore;
use super::srq::Srq;
use super::wc::{RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::bth::{Opcode, Service};
use crate::wire::ccext::CcExtFlags;
use crate::wire::frame::RoceFrame;
use crate::wire::ipv4::Ipv4Address;
use crate::wire::psn;
use crate::wire::transport_hdrs::DethRepr;
use std::collections::VecDeque;

mod datapath;
mod post;

/// An RC queue pair: its configuration and state, and the four roles.
///
/// In a set order (`repr(C)`), for thousands of QPs whose state is cold at
/// each visit, so that a visit touches few cache lines: the state, the peer,
/// the configuration, the completer and the requester first (176 bytes,
/// three lines, what a sender's visit reads), then the output queues (their
/// own lines, `Outputs`), the responder (two lines a receiver's visit
/// reads, then its duplicate caches) and last the CC extension's state,
/// which a QP without the extension never reads (`ext_control`,
/// `ext_probe`).
#[derive(Debug)]
#[repr(C)]
pub struct Qp {
    state: QpState,
    /// The CC extension has a control packet waiting (`ext.has_control()`).
    /// Kept here, with `state` (which every packet reads), with `ext_probe`:
    /// a QP with nothing waiting there (every QP without the extension)
    /// then does not read the extension's lines, cold on every visit when
    /// thousands of QPs take turns.
    ext_control: bool,
    /// The CC extension has a probe to send (`ext.probe_pending`).
    ext_probe: bool,
    /// The responder has something queued to send (an ACK, a NAK, an
    /// ATOMIC ACK, READ responses: `resp.has_output()`), kept here for the
    /// same reason: a QP that only sends (each requester of thousands) then
    /// does not read the responder's line on each packet it sends.
    resp_output: bool,
    /// The connected peer's address, if set: nothing else is accepted.
    peer_ip: Option<Ipv4Address>,
    cfg: QpConfig,
    comp: Completer,
    req: Requester,
    out: Outputs,
    resp: Responder,
    ext: CcExtState,
    /// The gather/scatter lists of send WQEs with several SGEs (read when
    /// such a WQE's packets are built or its READ responses placed).
    sq_sgls: SglStore,
    /// The destinations of a UD QP's posted send WQEs, in posting order (one per
    /// WQE; room for `sq_depth`, none for RC and UC).
    ud_dests: VecDeque<UdDest>,
    /// Selective repeat (crate::transport::sack): an RC QP configured `sr` has
    /// its state here, cold for every other QP.
    sr: Option<Box<SrState>>,
}

impl Qp {
    /// The byte offsets of the lines a visit reads (the struct's docs): the
    /// first three, the output queues' three, the responder's two. For an
    /// engine that prefetches a QP's state ahead of its visit.
    pub const HOT_LINES: [usize; 8] = {
        let out = core::mem::offset_of!(Qp, out);
        let resp = core::mem::offset_of!(Qp, resp);
        [
            0,
            64,
            128,
            out + Outputs::HOT_LINES[0],
            out + Outputs::HOT_LINES[1],
            out + Outputs::HOT_LINES[2],
            resp,
            resp + 64,
        ]
    };

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
        if usize::from(cfg.max_send_sge.max(cfg.max_recv_sge)) > super::sgl::MAX_SGE {
            return Err(QpError::Config("at most 32 SGEs per work request"));
        }
        if cfg.service != Service::Rc && cfg.cc_ext {
            return Err(QpError::Config(
                "the CC extension is negotiated on RC QPs only",
            ));
        }
        let ud = cfg.service == Service::Ud;
        let sr = (cfg.service == Service::Rc && cfg.loss_recovery == LossRecovery::Sr)
            .then(|| Box::new(SrState::new(cfg.sq_psn, SrParams::default())));
        let mut req = Requester::new(&cfg);
        req.chunk_writes = sr.is_some();
        Ok(Self {
            cfg,
            state: QpState::Reset,
            req,
            comp: Completer::new(&cfg),
            resp: Responder::new(&cfg),
            ext: CcExtState::new(),
            sq_sgls: SglStore::new(cfg.sq_depth, cfg.max_send_sge),
            out: Outputs::new(cfg.sq_depth as usize, cfg.rq_depth as usize, cfg.cc_ext),
            peer_ip: None,
            ext_control: false,
            ext_probe: false,
            resp_output: false,
            ud_dests: VecDeque::with_capacity(if ud { cfg.sq_depth.into() } else { 0 }),
            sr,
        })
    }

    /// How the QP recovers a loss now: `sr` while configured so and not fallen
    /// back (crate::transport::sack), else `gbn`.
    pub fn loss_recovery(&self) -> LossRecovery {
        if self.sr_active() {
            LossRecovery::Sr
        } else {
            LossRecovery::Gbn
        }
    }

    /// The selective-repeat counters of a QP configured `sr` (also after it fell
    /// back to go-back-N).
    pub fn sr_counters(&self) -> Option<&SrCounters> {
        self.sr.as_deref().map(|s| &s.counters)
    }

    /// Sets the selective-repeat parameters of a QP configured `sr` (IRN's BDP
    /// cap and two timeouts; crate::transport::sack::SrParams), before it sends.
    pub fn set_sr_params(&mut self, p: SrParams) -> Result<(), QpError> {
        let Some(sr) = self.sr.as_deref_mut() else {
            return Result::Err(QpError::Config("the QP is not configured sr"));
        };
        if p.bdp_pkts == 0 || p.rto_low_ns == 0 || p.rto_high_ns == 0 {
            return Result::Err(QpError::Config("sr: cap and timeouts above 0"));
        }
        sr.params = SrParams {
            bdp_pkts: p.bdp_pkts.min(super::sack::WINDOW),
            ..p
        };
        Ok(())
    }

    #[inline]
    fn sr_active(&self) -> bool {
        self.sr.as_ref().is_some_and(|s| s.active)
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
        &self.out.counters
    }

    /// The drop counters of a UC or UD QP (all zero on RC).
    pub fn unreliable_counters(&self) -> &UnreliableCounters {
        &self.out.unreliable
    }

    /// Moves to `to` if IBA 10.3.1 allows it (any state may go to RESET or ERR).
    /// Entering ERR flushes every queued work request with WR_FLUSH_ERR. The
    /// transitions are the same for every service; what each needs is given at
    /// creation ([`QpConfig`]: a UD QP's Q_Key for RESET -> INIT, no peer for
    /// INIT -> RTR, IBA 10.3.1 table 84) or by the setters before RTS.
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
                let params = self.sr.as_ref().map(|s| s.params);
                *self = Self::new(cfg)?;
                if let (Some(sr), Some(p)) = (self.sr.as_deref_mut(), params) {
                    sr.params = p;
                }
            }
            _ => self.state = to,
        }
        Ok(())
    }

    /// Sets the requester's retry attributes (`ibv_modify_qp` with
    /// `IBV_QP_TIMEOUT`, `IBV_QP_RETRY_CNT`, `IBV_QP_RNR_RETRY`, given at
    /// RTR -> RTS in ibverbs while this transport takes them at creation):
    /// allowed before RTS, as [`Self::set_sq_psn`] (IBA 10.3.1 table 84:
    /// they are attributes of the RTR -> RTS transition). Counts above 7
    /// are refused (IBA 9.7.5.2.8: 3-bit fields).
    pub fn set_retry(
        &mut self,
        timeout_ns: u64,
        retry_cnt: u8,
        rnr_retry: u8,
    ) -> Result<(), QpError> {
        if retry_cnt > 7 || rnr_retry > 7 || timeout_ns == 0 {
            return Result::Err(QpError::Config("retry counts <= 7, timeout > 0"));
        }
        if !matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Result::Err(QpError::IllegalTransition {
                from: self.state,
                to: QpState::Rts,
            });
        }
        self.cfg.timeout_ns = timeout_ns;
        self.cfg.retry_cnt = retry_cnt;
        self.cfg.rnr_retry = rnr_retry;
        self.comp.set_retry(retry_cnt, rnr_retry);
        Ok(())
    }

    /// Sets the first PSN the requester sends (`ibv_modify_qp` with
    /// `IBV_QP_SQ_PSN`, given at RTR -> RTS in ibverbs while this transport
    /// takes `sq_psn` at creation): allowed before the requester has sent
    /// anything, i.e. in INIT or RTR (IBA 10.3.1 table 84: SQ_PSN is an
    /// attribute of the RTR -> RTS transition).
    pub fn set_sq_psn(&mut self, psn: u32) -> Result<(), QpError> {
        if psn > psn::MASK {
            return Result::Err(QpError::Config("QPN/PSN above 24 bits"));
        }
        if !matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Result::Err(QpError::IllegalTransition {
                from: self.state,
                to: QpState::Rts,
            });
        }
        self.cfg.sq_psn = psn;
        self.req.next_psn = psn;
        self.req.sent_hi = psn;
        self.comp.una = psn;
        if let Some(sr) = self.sr.as_deref_mut() {
            *sr = SrState::new(psn, sr.params);
        }
        Ok(())
    }

    /// Sets a UD QP's Q_Key (`ibv_modify_qp` with `IBV_QP_QKEY`, IBA 10.3.1
    /// table 84: allowed on RESET -> INIT and in every later transition but to
    /// RESET or ERR). Refused on RC and UC QPs, which have none.
    pub fn set_qkey(&mut self, qkey: u32) -> Result<(), QpError> {
        if self.cfg.service != Service::Ud {
            return Result::Err(QpError::Config("only UD QPs have a Q_Key"));
        }
        if matches!(self.state, QpState::Err) {
            return Result::Err(QpError::BadState(self.state));
        }
        self.cfg.qkey = qkey;
        Ok(())
    }

    /// Sets the congestion window in LSN bytes (from the CC module). Sending stops while
    /// `lsn_end - acked_lsn` of the next packet would exceed it, except that one packet may
    /// always go when nothing is in flight (so a window below one packet, LDCP section
    /// 2.2 "cw < 1 is ticked out by a timer", sends one packet at a time instead of
    /// deadlocking; the NIC's timer spaces them).
    pub fn set_window(&mut self, bytes: u32) {
        self.req.window = bytes;
    }

    /// Sets the window for READ responses this QP sends as responder (their own LSN
    /// space, LDCP section 3.1).
    pub fn set_resp_window(&mut self, bytes: u32) {
        self.resp.resp_window = bytes;
    }

    /// Responder ACK coalescing (delayed ACK, docs/design.md §5): acknowledge every
    /// `n` in-order SEND/WRITE packets, and always a packet with AckReq (the last of each
    /// message), a duplicate, or before a READ/ATOMIC response. 1 (the default) ACKs
    /// every packet, which LDCP's per-ACK window adjustment wants. 0 is taken as 1.
    pub fn set_ack_coalesce(&mut self, n: u16) {
        self.resp.ack_coalesce = n.max(1);
    }

    /// The connected peer's IPv4 address (its GID, from the address vector given at
    /// RTR): from then on a packet from any other source address is dropped and
    /// counted ([`QpCounters::rx_wrong_source`]), as rxe's `check_addr` does; the UDP
    /// source port is not checked (senders vary it for ECMP entropy). Unset (the
    /// default), any source is accepted. RESET clears it.
    pub fn set_peer_ip(&mut self, ip: [u8; 4]) {
        self.peer_ip = Some(Ipv4Address(ip));
    }

    /// Puts a receiver-computed window (Rx-HPCC) into the next ACK's CC extension.
    pub fn set_ack_window(&mut self, bytes: u32) {
        self.ext.ack_window = Some(bytes);
    }

    /// Queues an HPCC++ probe (opcode 0xC0, same 5-tuple and queue as the data, PSN not
    /// consumed); the peer answers with a probe response carrying the path telemetry,
    /// reported as [`QpEvent::ProbeResponse`]. Needs the CC extension.
    pub fn send_probe(&mut self) {
        if self.cfg.cc_ext {
            self.ext.probe_pending = true;
            self.ext_probe = true;
        }
    }

    /// Next LSN the requester will assign (HPCC++ `snd_nxt`, for `lastUpdateSeq`).
    pub fn next_lsn(&self) -> u32 {
        self.req.next_lsn
    }

    /// Cumulatively acknowledged requester LSN.
    pub fn acked_lsn(&self) -> u32 {
        self.comp.acked_lsn
    }

    /// Next PSN the requester will assign to a new work request.
    pub fn next_psn(&self) -> u32 {
        self.req.next_psn
    }

    /// Oldest unacknowledged PSN.
    pub fn una_psn(&self) -> u32 {
        self.comp.una
    }

    /// PSN the responder expects next.
    pub fn expected_psn(&self) -> u32 {
        self.resp.epsn
    }

    /// Work requests posted and not completed.
    pub fn sq_outstanding(&self) -> usize {
        self.req.sq.len()
    }

    /// Bytes in flight (LSN sent and not acknowledged).
    pub fn in_flight(&self) -> u32 {
        self.req.in_flight(self.comp.acked_lsn, self.cfg.pmtu)
    }
}

/// The hot lines of a struct that reads its own first `own` lines and then
/// those of a member at byte offset `at` whose hot lines are `inner` (as
/// [`Qp::HOT_LINES`]): how each layer that holds a `Qp` names its own. `OUT`
/// must be `own + IN`.
pub const fn nest_hot_lines<const OUT: usize, const IN: usize>(
    own: usize,
    at: usize,
    inner: [usize; IN],
) -> [usize; OUT] {
    assert!(OUT == own + IN, "OUT must be own + IN");
    let mut lines = [0; OUT];
    let mut k = 0;
    while k < OUT {
        lines[k] = if k < own { k * 64 } else { at + inner[k - own] };
        k += 1;
    }
    lines
}

/// Post-time helper: an SGE for `len` bytes at `addr` in region `lkey`.
pub fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
    Sge { addr, len, lkey }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    /// What a sender's visit reads (state, peer, configuration, completer,
    /// requester) fills the first three lines, and the output queues and the
    /// responder each start a line (the struct's docs): a field added in the
    /// wrong place shows here, not as a slower 16k-QP run.
    #[test]
    fn a_visit_reads_few_lines() {
        assert_eq!(align_of::<Qp>(), 64);
        assert!(offset_of!(Qp, req) + size_of::<Requester>() <= 3 * 64);
        assert_eq!(offset_of!(Qp, out), 3 * 64);
        assert_eq!(offset_of!(Qp, resp) % 64, 0);
        assert!(offset_of!(Qp, ext) >= offset_of!(Qp, resp) + size_of::<Responder>());
    }

    #[test]
    fn nested_hot_lines_follow_the_owner_s_own() {
        assert_eq!(
            nest_hot_lines::<5, 2>(3, 640, [0, 128]),
            [0, 64, 128, 640, 768]
        );
        assert_eq!(nest_hot_lines::<2, 2>(0, 64, [0, 64]), [64, 128]);
    }

    /// Every hot line starts a line of the struct, once.
    #[test]
    fn the_hot_lines_are_lines_of_the_struct() {
        let mut lines = Qp::HOT_LINES.to_vec();
        assert!(lines.iter().all(|&l| l % 64 == 0 && l < size_of::<Qp>()));
        lines.dedup();
        assert_eq!(lines.len(), Qp::HOT_LINES.len());
    }
}
