//! The responder (Linux rxe `rxe_resp.c`; IBA vol. 1 9.7.4 "responder", 9.7.5.2 NAK
//! codes, 9.9.3 responder error classes): a request packet goes through a chain of
//! checks, each a small function answering a [`Check`] — the PSN, the opcode sequence,
//! the length, the resource (a receive WQE, room for a response), the R_Key and range
//! — and is then executed: SEND data placed in the receive WQE, WRITE data in the
//! region, a READ queued for response, an ATOMIC done. A refusal is answered once, by
//! [`Responder::refuse`]: a NAK (and ERR) for what the requester must hear about, an
//! RNR NAK when no receive WQE is posted. Duplicates are re-ACKed, READs replayed from
//! memory and ATOMICs answered from the cache of their results (9.7.5.1.x, rxe
//! `find_resource`).

use super::cc_ext::CcExtState;
use super::config::{QpConfig, LSN_HEADER_ONLY_CHARGE};
use super::inline_deque::InlineDeque;
use super::mr::{Access, MemorySpace, MrTable, MwType};
use super::output::{Outputs, Payload, TxPacket};
use super::rq::RecvWqe;
use super::sack::SrState;
use super::sgl::{self, SglStore};
use super::srq::Srq;
use super::wc::{Sge, WcOpcode, WcStatus, WorkCompletion};
use crate::wire::bth::{BthRepr, Opcode};
use crate::wire::ccext::{CcExtFlags, CcExtRepr};
use crate::wire::frame::{RoceFrame, RoceRepr};
use crate::wire::ipv4::Ecn;
use crate::wire::psn;
use crate::wire::transport_hdrs::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, NakCode, RethRepr,
};
use std::collections::VecDeque;

mod checks;
mod execute;
mod recv;
mod selective;
mod unreliable;

/// The message being received, between its FIRST and LAST packets.
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

/// A READ response in progress: the next packet's PSN, address and what is left.
#[derive(Debug, Clone, Copy)]
struct ReadJob {
    psn: u32,
    va: u64,
    rkey: u32,
    remaining: u32,
    first: bool,
    msn: u32,
}

/// A READ executed, kept so that a duplicate of it (or of its tail) can be replayed
/// from memory (rxe `find_resource`).
#[derive(Debug, Clone, Copy)]
struct ReadResource {
    first_psn: u32,
    npkts: u32,
    va: u64,
    len: u32,
    rkey: u32,
    msn: u32,
}

impl ReadJob {
    /// The response PSNs it still sends (a zero-length READ sends one).
    fn npkts(&self, pmtu: u32) -> u32 {
        self.remaining.div_ceil(pmtu).max(1)
    }
}

impl ReadResource {
    /// The replay a duplicate READ at PSN `p` asking for `r` gets: from `p` on, if `p`
    /// is one of this READ's PSNs and `r` is exactly the rest of its range from there
    /// (the requester re-requests from the first missing response, IBA 9.7.5.1.5).
    /// A replay from inside the READ continues its opcode sequence (MIDDLE/LAST), as
    /// rxe's `read_reply` does and its completer expects.
    ///
    /// With `part` (an `sr` QP, crate::transport::sack) `r` may also ask for a
    /// shorter run from there, a hole in the responses the requester got: it is
    /// replayed alone, its last packet a READ RESPONSE LAST.
    fn replay(&self, p: u32, r: &RethRepr, pmtu: u32, part: bool) -> Option<ReadJob> {
        let idx = psn::sub(p, self.first_psn);
        if idx >= self.npkts || r.rkey != self.rkey {
            return None;
        }
        let off = idx * pmtu;
        let rest = self.len - off.min(self.len);
        let len_ok = r.dma_len == rest || (part && r.dma_len > 0 && r.dma_len < rest);
        (r.va == self.va + u64::from(off) && len_ok).then_some(ReadJob {
            psn: p,
            va: r.va,
            rkey: r.rkey,
            remaining: r.dma_len,
            first: idx == 0,
            msn: self.msn,
        })
    }
}

/// The responder's queue of what it sends: its first entry inline.
type RespQueue = InlineDeque<RespItem, 1>;

/// What the responder sends, in order.
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

impl RespItem {
    /// What fills the queue's unused inline slot.
    const BLANK: RespItem = RespItem::Ack {
        psn: 0,
        msn: 0,
        syndrome: AethSyndrome::ACK,
    };
}

/// Why a request is refused (rxe's `RESPST_ERR_*` states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// NAK `code`; the QP enters ERR and the receive WQE the message used completes
    /// with `local` (IBA 9.9.3 class C; class A for a malformed receive WQE).
    Fatal { code: NakCode, local: WcStatus },
    /// No receive WQE (IBA 9.7.5.2.8): RNR NAK, the PSN is not consumed.
    NotReady,
    /// No room to queue the response: dropped (counted); the requester retries.
    NoRoom,
}

/// The answer of one check of the chain.
type Check<T> = Result<T, Refusal>;

// The largest message IBA allows: a RETH asking for more is an invalid request.
use sgl::MAX_MESSAGE;

/// Shorthand for the fatal refusals.
const fn fatal(code: NakCode, local: WcStatus) -> Refusal {
    Refusal::Fatal { code, local }
}
const INVALID: Refusal = fatal(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
const ACCESS: Refusal = fatal(NakCode::RemoteAccessError, WcStatus::RemAccessErr);

/// Where an in-sequence request's PSN stands (IBA 9.7.4.1.1).
enum PsnCheck {
    Expected,
    Duplicate,
    Ahead,
}

/// What a checked request acts on.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// SEND bytes go at `offset` of receive WQE `wqe` (the RQ's head).
    Recv { wqe: RecvWqe, offset: u32 },
    /// WRITE bytes go at `va`; `remaining` of `total` are still to come; an immediate
    /// completes the RQ's head.
    Write {
        va: u64,
        rkey: u32,
        remaining: u32,
        total: u32,
    },
    /// A READ of this range, and the key of the region its bytes are read through
    /// (the R_Key's own, or the region a memory window of that R_Key is bound to).
    Read(RethRepr, u32),
    /// An ATOMIC (its `rkey` the region's key once checked, as a READ's).
    Atomic(AtomicEthRepr),
}

/// What the QP does after a request: go on, or enter ERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Continue,
    Error,
}

/// The responder's state.
///
/// In a set order (`repr(C)`), for thousands of QPs whose state is cold at
/// each visit: what every request reads comes first, on two lines when the
/// responder starts a line (as it does in [`super::Qp`]): the ACK queue's
/// first entry, inline ([`InlineDeque`]), on the first; the message in
/// progress and the sequence numbers on the second; the receive queue and
/// the duplicate caches, read only on a SEND or a duplicate READ or ATOMIC,
/// after them.
#[derive(Debug)]
#[repr(C)]
pub(super) struct Responder {
    /// ACKs, NAKs and responses to send.
    out: RespQueue,
    cur: Option<InMsg>,
    out_cap: u32,
    /// Expected PSN.
    pub epsn: u32,
    /// Message sequence number (messages completed).
    msn: u32,
    /// READ-response LSN space (LDCP 3.1): next, acknowledged, window.
    pub resp_next_lsn: u32,
    pub resp_acked_lsn: u32,
    pub resp_window: u32,
    /// In-order packets not yet acknowledged (delayed ACK).
    unacked: u16,
    pub ack_coalesce: u16,
    /// A PSN sequence NAK went out for the current gap.
    nak_sent: bool,
    /// UC: the rest of the current message is dropped, up to the next FIRST or
    /// ONLY packet (IBA 9.8.3, rxe `drop_msg`).
    drop_msg: bool,
    /// Posted receive WQEs.
    pub rq: VecDeque<RecvWqe>,
    /// The scatter lists of the receive WQEs with several SGEs.
    pub rq_sgls: SglStore,
    /// Receives come from a shared receive queue (super::srq), not `rq`.
    uses_srq: bool,
    /// The SRQ's WQE a message in progress holds (taken at its first
    /// packet that needs one, released at its completion), and a copy of
    /// its scatter list (rxe's `srq_wqe`).
    held: Option<RecvWqe>,
    held_sgl: Vec<Sge>,
    /// (PSN, original value) of recent ATOMICs, for duplicates.
    atomic_cache: VecDeque<(u32, u64)>,
    /// Recent READs (rxe's RDMA/atomic resources), for duplicates.
    read_cache: VecDeque<ReadResource>,
}

impl Responder {
    pub fn new(cfg: &QpConfig) -> Self {
        let rd = cfg.max_rd_atomic as usize;
        Self {
            epsn: cfg.rq_psn,
            msn: 0,
            nak_sent: false,
            drop_msg: false,
            unacked: 0,
            ack_coalesce: 1,
            cur: None,
            rq: VecDeque::with_capacity(cfg.rq_depth as usize),
            rq_sgls: SglStore::new(cfg.rq_depth, cfg.max_recv_sge),
            uses_srq: cfg.srq,
            held: None,
            held_sgl: Vec::with_capacity(if cfg.srq { sgl::MAX_SGE } else { 0 }),
            out: RespQueue::with_capacity(2 * rd + 8, RespItem::BLANK),
            out_cap: 2 * rd as u32 + 8,
            atomic_cache: VecDeque::with_capacity(rd),
            read_cache: VecDeque::with_capacity(rd),
            resp_next_lsn: 0,
            resp_acked_lsn: 0,
            resp_window: u32::MAX,
        }
    }

    /// Something is queued to send (what [`Self::poll_tx`] looks at).
    #[inline]
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// An ACK, NAK or ATOMIC ACK is at the head of the queue (what a scheduler sends
    /// ahead of data).
    pub fn has_control(&self) -> bool {
        matches!(
            self.out.front(),
            Some(RespItem::Ack { .. } | RespItem::AtomicAck { .. })
        )
    }

    fn push_out(&mut self, item: RespItem, out: &mut Outputs) -> bool {
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
        if self.out.len() >= self.out_cap as usize {
            out.counters.resp_queue_full += 1;
            return false;
        }
        self.out.push_back(item);
        true
    }

    fn ack_item(&self, p: u32, syndrome: AethSyndrome) -> RespItem {
        RespItem::Ack {
            psn: p,
            msn: self.msn,
            syndrome,
        }
    }

    /// Queues the cumulative ACK for everything received in order so far, if any packet
    /// is still unacknowledged (delayed ACK).
    fn flush_ack(&mut self, out: &mut Outputs) {
        if self.unacked == 0 {
            return;
        }
        let item = self.ack_item(psn::sub(self.epsn, 1), AethSyndrome::ACK);
        self.push_out(item, out);
    }

    // ------------------------------------------------------------ the request chain

    /// A request packet (SEND, WRITE, READ, ATOMIC) for this QP. `sr` is the QP's
    /// selective-repeat state while it is in `sr` (crate::transport::sack): a
    /// request ahead of the expected PSN is then placed or reported
    /// (`selective`), not NAKed.
    #[allow(clippy::too_many_arguments)]
    pub fn on_request<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &mut MrTable,
        mem: &mut M,
        ext: &mut CcExtState,
        out: &mut Outputs,
        mut srq: Option<&mut Srq>,
        sr: Option<&mut SrState>,
    ) -> Verdict {
        ext.on_request(f, out);
        match self.check_psn(f.bth.psn) {
            PsnCheck::Ahead => {
                if let Some(sr) = sr {
                    return self.sr_ahead(sr, f, cfg, mrs, mem, out);
                }
                self.out_of_sequence(out);
                return Verdict::Continue;
            }
            PsnCheck::Duplicate => {
                out.counters.count_error(|c| &mut c.rx_duplicates);
                self.duplicate(f, cfg, &*mrs, out, sr.is_some());
                return Verdict::Continue;
            }
            PsnCheck::Expected => out.counters.rx_packets += 1,
        }
        let checked = self
            .check_op_seq(f.bth.opcode)
            .and_then(|()| self.check_length(f, cfg))
            .inspect(|()| ext.on_in_order_request(f))
            .and_then(|()| self.check_invalidate(f, &*mrs))
            .and_then(|()| self.check_resource(f, cfg, &*mrs, srq.as_deref_mut()))
            .and_then(|t| self.check_rkey(t, cfg, &*mrs));
        match checked {
            Ok(t) => {
                if let Some(i) = f.ieth {
                    // Checked by `check_invalidate`: the window goes free once
                    // the message is placed (IBA 10.6.7.2.4).
                    let _ = mrs.invalidate(i.0);
                }
                let from = self.epsn;
                self.execute(f, t, cfg, mem, out);
                if let Some(sr) = sr {
                    self.sr_pass(sr, from, out);
                }
                Verdict::Continue
            }
            Err(r) => self.refuse(f, r, cfg, out, srq),
        }
    }

    // ------------------------------------------------------------ transmit

    /// The next packet of the responder: an ACK/NAK, an ATOMIC ACK or a READ response
    /// packet (the latter gated by the READ-response window).
    pub fn poll_tx(&mut self, cfg: &QpConfig, ext: &mut CcExtState) -> Option<TxPacket> {
        let item = *self.out.front()?;
        let dq = cfg.dest_qpn;
        match item {
            RespItem::Ack {
                psn: p,
                msn,
                syndrome,
            } => {
                self.out.pop_front();
                let mut r = RoceRepr::new(BthRepr::new(Opcode::Acknowledge, dq, p));
                r.aeth = Some(AethRepr { syndrome, msn });
                r.ccext = ext.ack_ext(cfg);
                Some(TxPacket::control(r))
            }
            RespItem::AtomicAck { psn: p, msn, orig } => {
                self.out.pop_front();
                let mut r = RoceRepr::new(BthRepr::new(Opcode::AtomicAcknowledge, dq, p));
                r.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::ACK,
                    msn,
                });
                r.atomic_ack = Some(AtomicAckEthRepr { orig });
                r.ccext = ext.ack_ext(cfg);
                Some(TxPacket::control(r))
            }
            RespItem::Read(j) => self.read_response(j, cfg),
        }
    }

    /// The next packet of READ job `j` at the head of the queue.
    fn read_response(&mut self, mut j: ReadJob, cfg: &QpConfig) -> Option<TxPacket> {
        let pm = cfg.pmtu;
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
        let mut r = RoceRepr::new(BthRepr::new(opcode, cfg.dest_qpn, j.psn));
        if opcode.has_aeth() {
            r.aeth = Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: j.msn,
            });
        }
        let lsn = self.resp_next_lsn;
        if cfg.cc_ext {
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
            if let Some(front) = self.out.front_mut() {
                *front = RespItem::Read(j);
            }
        }
        Some(TxPacket {
            repr: r,
            payload,
            ecn: Ecn::Ect0,
            priority: false,
            lsn,
            lsn_len: charge,
            retransmit: false,
            ah: None,
        })
    }
}

/// A receive completion.
fn recv_wc(
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
    imm: Option<u32>,
    qpn: u32,
    solicited: bool,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm,
        qp_num: qpn,
        solicited,
        src_qp: 0,
        grh: false,
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use core::mem::offset_of;

    /// What every request reads takes the responder's first two lines (the
    /// ACK queue's inline entry on the first), the receive queue and the
    /// duplicate caches the third (the struct's docs).
    #[test]
    fn a_request_reads_two_lines() {
        assert_eq!(offset_of!(Responder, out), 0);
        const { assert!(RespQueue::HOT_BYTES <= 64) };
        assert!(offset_of!(Responder, cur) >= 64);
        assert!(offset_of!(Responder, nak_sent) < 2 * 64);
        assert!(offset_of!(Responder, rq) >= 2 * 64);
        assert!(offset_of!(Responder, atomic_cache) >= 2 * 64);
        assert!(offset_of!(Responder, read_cache) >= 2 * 64);
    }
}
