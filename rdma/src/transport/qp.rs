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

    /// A work request posted in ERR completes at once with WR_FLUSH_ERR.
    fn flushed(&mut self, wr_id: u64, opcode: WcOpcode) {
        self.out.push_wc(WorkCompletion {
            wr_id,
            status: WcStatus::WrFlushErr,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.cfg.qpn,
            solicited: false,
            src_qp: 0,
            grh: false,
        });
    }

    /// Posts a send work request. The local SGE is checked against `mrs` now; a failure is
    /// returned synchronously instead of as a LOC_PROT_ERR completion.
    pub fn post_send(&mut self, wr: SendWr, mrs: &MrTable) -> Result<(), QpError> {
        self.post_send_sgl(wr, None, mrs)
    }

    /// Posts a UD send work request to `dest` (`ibv_post_send` with `wr.ud`; `sgl` as
    /// [`Self::post_send_sgl`]). Only SEND and SEND with immediate, of at most the
    /// path MTU (IBA 9.8: one packet per message; `ibv_port_attr.max_msg_sz` of a UD
    /// QP), and only on a UD QP: anything else is refused
    /// ([`QpError::InvalidWr`], rxe's EINVAL). Where IBA C10-93.1.1 lets a CI drop
    /// an over-long UD message silently (rxe fakes its success), this transport
    /// refuses it at post, so the caller learns of it.
    pub fn post_send_ud(
        &mut self,
        wr: SendWr,
        dest: UdDest,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if self.cfg.service != Service::Ud {
            return Err(QpError::InvalidWr("a UD destination on a connected QP"));
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendImm(_)) {
            return Err(QpError::InvalidWr("UD has SEND only"));
        }
        if dest.remote_qpn > psn::MASK {
            return Err(QpError::InvalidWr("remote QPN above 24 bits"));
        }
        let len = match sgl {
            Some(l) => super::sgl::total_len(l).ok_or(QpError::LocalLength)?,
            None => wr.sge.len,
        };
        if len > self.cfg.pmtu {
            return Err(QpError::InvalidWr("a UD message is at most the path MTU"));
        }
        if matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.ud_dests.len() >= self.ud_dests.capacity()
        {
            return Err(QpError::QueueFull);
        }
        self.post_checked(wr, sgl, mrs)?;
        if matches!(self.state, QpState::Rts | QpState::Sqd) {
            super::inline_deque::push_compact(&mut self.ud_dests, dest);
        }
        Ok(())
    }

    /// [`Self::post_send`] of a work request whose gather list (or READ
    /// scatter list) is `sgl` (`wr.sge` ignored; up to
    /// [`QpConfig::max_send_sge`] entries, each checked now).
    pub fn post_send_sgl(
        &mut self,
        wr: SendWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if wr.op.is_local() {
            return Err(QpError::InvalidWr("a local operation: post_local"));
        }
        match self.cfg.service {
            Service::Rc => {}
            // IBA 9.8.2 / rxe `validate_send_wr`: UC has SEND and RDMA WRITE only.
            Service::Uc if wr.op.needs_response() => {
                return Err(QpError::InvalidWr("UC has no READ or ATOMIC"))
            }
            // IBA table 38: SEND with Invalidate is RC's alone.
            Service::Uc if matches!(wr.op, SendOp::SendInv(_)) => {
                return Err(QpError::InvalidWr("UC has no SEND with Invalidate"))
            }
            Service::Uc => {}
            Service::Ud => return Err(QpError::InvalidWr("UD needs a destination: post_send_ud")),
        }
        self.post_checked(wr, sgl, mrs)
    }

    /// Queues a send work request the service allows (or flushes it in ERR).
    fn post_checked(
        &mut self,
        wr: SendWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        match self.state {
            QpState::Rts | QpState::Sqd => {
                self.req.post(wr, sgl, &mut self.sq_sgls, &self.cfg, mrs)
            }
            QpState::Err => {
                self.flushed(wr.wr_id, wr.op.wc_opcode());
                Ok(())
            }
            s => Err(QpError::BadState(s)),
        }
    }

    /// Posts a local operation ([`SendOp::is_local`]: `IBV_WR_BIND_MW`,
    /// `IBV_WR_LOCAL_INV`) and executes it on `mrs` now, when the device takes it
    /// from the send queue's doorbell, in the order of the work requests posted on
    /// this QP (IBA 10.6.7.2; rxe executes it when its requester reaches it, which
    /// orders it the same way against this QP's other work requests). Its
    /// completion comes in send-queue order, after those posted before it; one that
    /// failed completes with `MW_BIND_ERR` (a bind) or `LOC_QP_OP_ERR` (an
    /// invalidation) and the QP then enters ERR, so nothing posted after it runs.
    /// RC QPs only (rsnic's limit; rxe also binds on UC).
    pub fn post_local(&mut self, wr: SendWr, mrs: &mut MrTable) -> Result<(), QpError> {
        if !wr.op.is_local() {
            return Err(QpError::InvalidWr("not a local operation"));
        }
        if self.cfg.service != Service::Rc {
            return Err(QpError::InvalidWr("memory windows are bound on RC QPs"));
        }
        match self.state {
            QpState::Rts | QpState::Sqd => {}
            QpState::Err => {
                self.flushed(wr.wr_id, wr.op.wc_opcode());
                return Ok(());
            }
            s => return Err(QpError::BadState(s)),
        }
        if self.req.sq.len() >= self.cfg.sq_depth as usize {
            return Err(QpError::QueueFull);
        }
        let err = if self.req.local_failed() {
            // The QP enters ERR before this one's turn: it is flushed, not run.
            Some(WcStatus::WrFlushErr)
        } else {
            match wr.op {
                SendOp::BindMw(b) => mrs
                    .bind_window(self.cfg.pd, self.cfg.qpn, &b)
                    .err()
                    .map(|_| WcStatus::MwBindErr),
                SendOp::LocalInv(rkey) => mrs.invalidate(rkey).err().map(|_| WcStatus::LocQpOpErr),
                _ => None,
            }
        };
        self.req.post_local(wr, err, &self.cfg)?;
        self.complete_local_front();
        Ok(())
    }

    /// Completes the local operations at the front of the send queue: everything
    /// posted before them has completed. A failed one moves the QP to ERR with its
    /// status (the rest flushed).
    fn complete_local_front(&mut self) {
        while let Some(w) = self.req.sq.front().copied() {
            if !w.wr.op.is_local() {
                return;
            }
            if let Some(st) = w.local_err {
                self.enter_error(Some(st));
                return;
            }
            self.req.pop_front();
            if w.wr.signaled {
                self.out.push_wc(WorkCompletion {
                    wr_id: w.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: w.wr.op.wc_opcode(),
                    byte_len: 0,
                    imm: None,
                    qp_num: self.cfg.qpn,
                    solicited: false,
                    src_qp: 0,
                    grh: false,
                });
            }
        }
    }

    /// Posts a receive work request (buffer must be LOCAL_WRITE).
    pub fn post_recv(&mut self, wr: RecvWr, mrs: &MrTable) -> Result<(), QpError> {
        self.post_recv_sgl(wr, None, mrs)
    }

    /// [`Self::post_recv`] of a work request whose scatter list is `sgl`
    /// (`wr.sge` ignored; up to [`QpConfig::max_recv_sge`] entries).
    pub fn post_recv_sgl(
        &mut self,
        wr: RecvWr,
        sgl: Option<&[Sge]>,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        match self.state {
            QpState::Init | QpState::Rtr | QpState::Rts | QpState::Sqd => {
                self.resp.post_recv(wr, sgl, &self.cfg, mrs)
            }
            QpState::Err => {
                self.flushed(wr.wr_id, WcOpcode::Recv);
                Ok(())
            }
            s => Err(QpError::BadState(s)),
        }
    }

    /// The gather list a [`Payload::Gather`] of this QP's packets refers
    /// to (empty for any other payload): the NIC attaches its
    /// [`super::sgl::pieces`].
    #[inline]
    pub fn gather_list(&self, p: &Payload) -> &[Sge] {
        match *p {
            Payload::Gather { sgl, .. } => self.sq_sgls.get(sgl),
            _ => &[],
        }
    }

    /// Next completion.
    pub fn poll_cq(&mut self) -> Option<WorkCompletion> {
        self.out.cq.pop_front()
    }

    /// Completions waiting to be taken with [`Self::poll_cq`].
    pub fn pending_completions(&self) -> usize {
        self.out.cq.len()
    }

    /// Next event for CC / the NIC, with the hop records it echoed (an ACK's
    /// or a probe response's telemetry, when it carried some).
    pub fn poll_event(&mut self) -> Option<(QpEvent, Option<EchoedHops>)> {
        self.out.pop_event()
    }

    /// The earliest time [`Qp::on_timer`] has work to do, if any.
    pub fn next_timer(&self) -> Option<u64> {
        let rnr = (self.req.rnr_until > 0).then_some(self.req.rnr_until);
        let t = match (self.comp.rto_deadline, rnr) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sr = self.sr.as_ref().filter(|s| s.active);
        match (
            t,
            sr.and_then(|s| s.deadline(self.comp.una, self.req.sent_hi)),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// ERR: every queued WR completes (the oldest send WR with `failing`, if given; the
    /// rest with WR_FLUSH_ERR) and the timers stop.
    fn enter_error(&mut self, failing: Option<WcStatus>) {
        if self.state == QpState::Err {
            return;
        }
        self.state = QpState::Err;
        let q = self.cfg.qpn;
        self.req.flush(failing, q, &mut self.out.cq);
        self.ud_dests.clear();
        self.resp.flush(q, &mut self.out.cq);
        self.comp.rto_deadline = None;
        if let Some(sr) = self.sr.as_deref_mut() {
            sr.armed_at = None;
        }
        self.out.push_event(QpEvent::Error);
        tracing::debug!(qpn = q, ?failing, "QP entered error state");
    }

    // ------------------------------------------------------------------ entry points

    /// Whether a control packet (ACK, NAK, atomic ACK, the LDCP ACK of READ
    /// responses, a probe response) waits: what a NIC's scheduler sends ahead of
    /// data (docs/design.md §5, HPCC++ 002 §7.2), via [`Qp::poll_tx_control`].
    pub fn has_control(&self) -> bool {
        debug_assert_eq!(self.resp_output, self.resp.has_output());
        !matches!(self.state, QpState::Reset | QpState::Init)
            && (self.ext_control || (self.resp_output && self.resp.has_control()))
    }

    /// The next control packet only (see [`Qp::has_control`]); never data, so
    /// a scheduler may send it without charging the QP's pacing credit.
    pub fn poll_tx_control(&mut self, _now_ns: u64) -> Option<TxPacket> {
        if !self.has_control() {
            return None;
        }
        if self.ext_control {
            let t = self.ext.poll_control(&self.cfg);
            self.ext_control = self.ext.has_control();
            if t.is_some() {
                return t;
            }
        }
        // The front of the responder's queue is an ACK/NAK or atomic ACK.
        self.poll_responder()
    }

    /// The responder's next packet ([`Responder::poll_tx`]), counted, with
    /// `resp_output` brought up to date.
    fn poll_responder(&mut self) -> Option<TxPacket> {
        let t = self.resp.poll_tx(&self.cfg, &mut self.ext);
        self.resp_output = self.resp.has_output();
        if t.is_some() {
            self.out.counters.tx_packets += 1;
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
        if self.resp_output {
            if let Some(t) = self.poll_responder() {
                return Some(t);
            }
        }
        if self.state == QpState::Err {
            return None;
        }
        let (psn, lsn) = (self.req.next_psn, self.req.next_lsn);
        if std::mem::take(&mut self.ext_probe) {
            if let Some(t) = self.ext.poll_probe(&self.cfg, psn, lsn) {
                return Some(t);
            }
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        let sqd = self.state == QpState::Sqd;
        if let Some(sr) = self.sr.as_deref_mut().filter(|s| s.active) {
            // Selective repeat: a hole first, then new packets within the cap.
            if self.req.rnr_until <= now_ns {
                if let Some(p) = self.comp.sr_next_hole(&self.req, sr, &self.cfg) {
                    self.comp.on_sent(now_ns, &self.cfg);
                    self.comp.sr_on_sent(now_ns, sr);
                    self.out.counters.tx_packets += 1;
                    self.out.counters.count_error(|c| &mut c.tx_retransmits);
                    return Some(p);
                }
            }
            if !self
                .req
                .within_cap(self.comp.una, sr.done_ahead, sr.params.bdp_pkts)
            {
                return None;
            }
        }
        // The packet stays where the requester built it (returned as is, only
        // looked at here): a `TxPacket` is ~300 bytes, and moving it out of the
        // `Option` and back in cost two copies per packet.
        let mut t = self
            .req
            .next_packet(now_ns, &self.cfg, sqd, self.comp.acked_lsn);
        if self.cfg.service != Service::Rc {
            if let Some(p) = &mut t {
                self.unreliable_sent(p);
            }
            return t;
        }
        if let Some(p) = &t {
            self.comp.on_sent(now_ns, &self.cfg);
            self.out.counters.tx_packets += 1;
            if p.retransmit {
                self.out.counters.count_error(|c| &mut c.tx_retransmits);
            }
            if let Some(sr) = self.sr.as_deref_mut().filter(|s| s.active) {
                self.comp.sr_on_sent(now_ns, sr);
            }
        }
        t
    }

    /// A UC or UD packet the requester built, made what its service sends (IBA 9.8):
    /// the service's opcode, no AckReq, for UD the work request's destination (BTH
    /// DestQP, the DETH with the Q_Key rule of IBA 10.2.4.4 and this QP as source,
    /// [`TxPacket::ah`]); it counts as acknowledged now (nothing will acknowledge it:
    /// no window gate, no retransmit timer), and its WQE completes with success
    /// when its last packet is handed out (rxe `rxe_xmit_packet`).
    #[cold]
    fn unreliable_sent(&mut self, p: &mut TxPacket) {
        let svc = self.cfg.service;
        let op = p.repr.bth.opcode;
        p.repr.bth.opcode = op.in_service(svc).unwrap_or(op);
        p.repr.bth.ack_req = false;
        if svc == Service::Ud {
            if let Some(d) = self.ud_dests.front() {
                p.repr.bth.dest_qp = d.remote_qpn;
                p.repr.deth = Some(DethRepr {
                    qkey: d.effective_qkey(self.cfg.qkey),
                    src_qp: self.cfg.qpn,
                });
                p.ah = Some(d.ah);
            }
        }
        self.comp.acked_lsn = p.lsn.wrapping_add(p.lsn_len);
        self.out.counters.tx_packets += 1;
        if op.is_last() || op.is_only() {
            if let Some(w) = self.req.pop_front() {
                if w.wr.signaled {
                    self.out.push_wc(WorkCompletion {
                        wr_id: w.wr.wr_id,
                        status: WcStatus::Success,
                        opcode: w.wr.op.wc_opcode(),
                        byte_len: w.wr.sge.len,
                        imm: w.wr.op.completion_imm(),
                        qp_num: self.cfg.qpn,
                        solicited: false,
                        src_qp: 0,
                        grh: false,
                    });
                }
                self.comp.una = w.end_psn();
            }
            if svc == Service::Ud {
                self.ud_dests.pop_front();
            }
        }
    }

    /// Handles a received frame already parsed by [`crate::wire::parse_frame`] (ICRC
    /// checked, INT stripped or not). Memory is touched only through `mem`, and only after
    /// the `mrs` checks pass; `mrs` changes only when a SEND with Invalidate frees a
    /// memory window (IBA 10.6.7.2.4).
    pub fn on_rx<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now_ns: u64,
        mrs: &mut MrTable,
        mem: &mut M,
    ) {
        self.on_rx_srq(f, now_ns, mrs, mem, None);
    }

    /// [`Self::on_rx`] for a QP created to receive from a shared receive
    /// queue ([`QpConfig::srq`]): `srq` is it.
    pub fn on_rx_srq<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        now_ns: u64,
        mrs: &mut MrTable,
        mem: &mut M,
        srq: Option<&mut Srq>,
    ) {
        let op = f.bth.opcode;
        // A packet of another service is not for this QP (rxe `check_type_state`);
        // a CNP slows any QP.
        if f.bth.dest_qp != self.cfg.qpn
            || matches!(self.state, QpState::Reset | QpState::Init | QpState::Err)
            || (op.service() != self.cfg.service && op != Opcode::Cnp)
        {
            self.out.counters.count_error(|c| &mut c.rx_dropped_state);
            return;
        }
        if self.cfg.service == Service::Ud {
            self.on_rx_ud(f, &*mrs, mem, srq);
            return;
        }
        if self.peer_ip.is_some_and(|ip| ip != f.ip.src) {
            self.out.counters.count_error(|c| &mut c.rx_wrong_source);
            return;
        }
        match op {
            Opcode::Cnp => self.out.push_event(QpEvent::CnpReceived),
            Opcode::Acknowledge
                if f.ccext
                    .is_some_and(|e| e.flags.contains(CcExtFlags::RESP_SPACE)) =>
            {
                // The requester acknowledges our READ responses (LDCP 3.1).
                let e = f.ccext.expect("matched above");
                if (e.lsn.wrapping_sub(self.resp.resp_acked_lsn) as i32) > 0 {
                    self.resp.resp_acked_lsn = e.lsn;
                }
                self.out.push_event(QpEvent::ReadRespAck {
                    lsn: e.lsn,
                    ce_count: e.ce_count,
                });
            }
            Opcode::Probe => {
                self.ext.on_probe(f);
                self.ext_control = true;
            }
            Opcode::ProbeResponse => {
                self.out
                    .push_echo(QpEvent::ProbeResponse { n_hops: 0 }, f.ccext.as_ref());
            }
            _ if op.is_request() => {
                let v = if self.cfg.service == Service::Uc {
                    self.resp
                        .on_uc_request(f, &self.cfg, &*mrs, mem, &mut self.out, srq)
                } else {
                    let sr = self.sr.as_deref_mut().filter(|s| s.active);
                    self.resp.on_request(
                        f,
                        &self.cfg,
                        mrs,
                        mem,
                        &mut self.ext,
                        &mut self.out,
                        srq,
                        sr,
                    )
                };
                self.resp_output = self.resp.has_output();
                if v == Verdict::Error {
                    self.enter_error(None);
                }
            }
            _ if op.is_response()
                && matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) =>
            {
                let sr = self.sr.as_deref_mut().filter(|s| s.active);
                let heard = sr
                    .and_then(|sr| {
                        self.comp.sr_on_response(
                            f,
                            now_ns,
                            &self.cfg,
                            &mut self.req,
                            &self.sq_sgls,
                            mem,
                            &mut self.out,
                            sr,
                        )
                    })
                    .unwrap_or_else(|| {
                        self.comp.on_response(
                            f,
                            now_ns,
                            &self.cfg,
                            &mut self.req,
                            &self.sq_sgls,
                            mem,
                            &mut self.out,
                        )
                    });
                match heard {
                    Heard::Done => {}
                    Heard::ReadData => {
                        self.ext.on_read_response(f, &self.cfg);
                        self.ext_control = self.ext.has_control();
                    }
                    Heard::Error(st) => self.enter_error(Some(st)),
                }
                if self.state != QpState::Err && !self.req.sq.is_empty() {
                    self.complete_local_front();
                }
            }
            _ => self.out.counters.count_error(|c| &mut c.rx_dropped_state),
        }
    }

    /// A UD packet for this QP (any source, any PSN; IBA 9.8, rxe `check_keys`): a
    /// SEND whose DETH carries this QP's Q_Key is placed; any other is dropped and
    /// counted.
    #[cold]
    fn on_rx_ud<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        mrs: &MrTable,
        mem: &mut M,
        srq: Option<&mut Srq>,
    ) {
        match f.deth {
            Some(d) if d.qkey == self.cfg.qkey && f.bth.opcode.is_send() => {
                let v = self
                    .resp
                    .on_ud_send(f, &self.cfg, mrs, mem, &mut self.out, srq);
                if v == Verdict::Error {
                    self.enter_error(None);
                }
            }
            Some(_) => self.out.count_unreliable(|c| &mut c.rx_qkey_mismatch),
            None => self.out.counters.count_error(|c| &mut c.rx_dropped_state),
        }
    }

    /// Fires due timers: the retransmit timeout (go-back-N from the oldest unacknowledged
    /// PSN, or ERR with RETRY_EXC_ERR when the retry count is spent) and the RNR wait.
    pub fn on_timer(&mut self, now_ns: u64) {
        if self.req.rnr_until != 0 && self.req.rnr_until <= now_ns {
            self.req.rnr_until = 0;
        }
        if self.state == QpState::Err {
            return;
        }
        let fatal = match self.sr.as_deref_mut().filter(|s| s.active) {
            Some(sr) => self
                .comp
                .sr_on_timer(now_ns, &mut self.req, &mut self.out, sr),
            None => self.comp.on_timer(now_ns, &mut self.req, &mut self.out),
        };
        if let Some(st) = fatal {
            self.enter_error(Some(st));
        }
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
