//! The requester (Linux rxe `rxe_req.c`; IBA vol. 1 9.7 "reliable service", 9.7.1
//! PSNs, 9.5 opcode sequences): the send queue and the cursor that turns its work
//! requests into request packets — PSN and LSN assignment, SEND/WRITE segmentation at
//! the path MTU, READ and ATOMIC requests, the congestion window gate, the
//! outstanding-READ limit and the RNR wait. What comes back (ACKs, NAKs, responses) is
//! the [`super::completer`]'s; it moves this cursor back for go-back-N.

use super::config::{QpConfig, QpError, LSN_HEADER_ONLY_CHARGE};
use super::mr::{Access, MrTable};
use super::output::{CompletionQueue, Payload, TxPacket};
use super::sgl::{self, SglRef, SglStore};
use super::wc::{SendOp, SendWr, Sge, WcStatus, WorkCompletion};
use crate::wire::bth::{BthFlags, BthRepr, Opcode};
use crate::wire::ccext::{CcExtFlags, CcExtRepr};
use crate::wire::frame::RoceRepr;
use crate::wire::ipv4::Ecn;
use crate::wire::psn;
use crate::wire::transport_hdrs::{AtomicEthRepr, IethRepr, ImmDtRepr, RethRepr};
use std::collections::VecDeque;

mod selective;

/// A posted send work request and, once started, where it sits in PSN and LSN space.
#[derive(Debug, Clone, Copy)]
pub(super) struct SendWqe {
    /// The request; with several SGEs, `wr.sge` is the first SGE with the
    /// message's whole length, and `sgl` names the list.
    pub wr: SendWr,
    pub sgl: SglRef,
    pub first_psn: u32,
    pub npkts: u32,
    pub first_lsn: u32,
    pub lsn_len: u32,
    pub started: bool,
    /// A local operation ([`SendOp::is_local`]) that failed when the engine executed
    /// it: the status it completes with, after which the QP enters ERR. The cursor
    /// stops at it, so nothing posted after it leaves.
    pub local_err: Option<WcStatus>,
    /// A plain WRITE sent as one WRITE ONLY per path MTU, each with the RETH of
    /// its bytes, so that a responder in `sr` can place any of them on arrival
    /// (crate::transport::sack): started while the QP was in `sr`.
    pub chunked: bool,
}

impl SendWqe {
    /// The PSN after its last packet.
    pub fn end_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts)
    }

    /// Whether PSN `p` is one of its packets (started WQEs only).
    pub fn holds(&self, p: u32) -> bool {
        self.started && psn::sub(p, self.first_psn) < self.npkts
    }
}

/// The requester's state: the send queue and the transmit cursor.
#[derive(Debug)]
pub(super) struct Requester {
    /// Posted WQEs, oldest first; the completer pops them.
    pub sq: VecDeque<SendWqe>,
    /// Index in `sq` of the WQE the next packet comes from.
    tx_idx: usize,
    /// Packet index inside that WQE.
    tx_pkt: u32,
    /// PSN the next new WQE starts at.
    pub next_psn: u32,
    /// PSN just past the highest one sent.
    pub sent_hi: u32,
    /// LSN the next new WQE starts at.
    pub next_lsn: u32,
    /// Congestion window in LSN bytes.
    pub window: u32,
    /// READ/ATOMIC WQEs started and not completed.
    pub rd_outstanding: u8,
    /// No packet before this time (an RNR NAK's timer); 0 = no wait.
    pub rnr_until: u64,
    /// Packets sent since the last one with AckReq.
    noack_pkts: u32,
    /// The QP is in `sr`: a plain WRITE of several packets starts chunked
    /// ([`SendWqe::chunked`]).
    pub chunk_writes: bool,
}

/// A request packet asks for an ACK (BTH AckReq) at the end of every message, when
/// it fills the send window, and at least once in this many packets, as rxe's requester does (`RXE_MAX_PKT_PER_ACK`):
/// a standard responder (rxe, hardware) may acknowledge only the packets that ask.
pub(super) const ACK_REQ_EVERY: u32 = 64;

impl Requester {
    pub fn new(cfg: &QpConfig) -> Self {
        Self {
            sq: VecDeque::with_capacity(cfg.sq_depth as usize),
            tx_idx: 0,
            tx_pkt: 0,
            next_psn: cfg.sq_psn,
            sent_hi: cfg.sq_psn,
            next_lsn: 0,
            window: u32::MAX,
            rd_outstanding: 0,
            rnr_until: 0,
            noack_pkts: 0,
            chunk_writes: false,
        }
    }

    /// Checks a send WR against the queue depth and its local SGEs against
    /// `mrs`, and queues it. `sgl`, when given, is the WR's whole gather (or
    /// scatter, for a READ) list, `wr.sge` ignored (IBA 10.7.2.1; at most
    /// `max_send_sge` entries, kept in `sgls`; an ATOMIC takes exactly one
    /// 8-byte SGE, 9.4.5).
    pub fn post(
        &mut self,
        mut wr: SendWr,
        sgl: Option<&[Sge]>,
        sgls: &mut SglStore,
        cfg: &QpConfig,
        mrs: &MrTable,
    ) -> Result<(), QpError> {
        if self.sq.len() >= cfg.sq_depth as usize {
            return Err(QpError::QueueFull);
        }
        let need = if wr.op.needs_response() {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        let list = match sgl {
            Some([one]) => {
                wr.sge = *one;
                None
            }
            Some([]) => {
                wr.sge = Sge::default();
                None
            }
            Some(l) => Some(l),
            None => None,
        };
        let mut sgl_ref = SglRef::OWN;
        if let Some(l) = list {
            if l.len() > sgls.max_sge() || wr.op.is_atomic() {
                return Err(QpError::LocalLength);
            }
            let total = sgl::total_len(l).ok_or(QpError::LocalLength)?;
            for s in l.iter().filter(|s| s.len > 0) {
                mrs.check_local_in(cfg.pd, s.lkey, s.addr, u64::from(s.len), need)
                    .map_err(QpError::LocalProtection)?;
            }
            wr.sge = Sge {
                addr: l[0].addr,
                len: total,
                lkey: l[0].lkey,
            };
            sgl_ref = sgls.push(l);
        } else {
            if wr.op.is_atomic() && wr.sge.len != 8 {
                return Err(QpError::LocalLength);
            }
            if wr.sge.len > 0 || wr.op.needs_response() {
                mrs.check_local_in(
                    cfg.pd,
                    wr.sge.lkey,
                    wr.sge.addr,
                    u64::from(wr.sge.len),
                    need,
                )
                .map_err(QpError::LocalProtection)?;
            }
        }
        let pm = cfg.pmtu;
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
        super::inline_deque::push_compact(
            &mut self.sq,
            SendWqe {
                wr,
                sgl: sgl_ref,
                first_psn: 0,
                npkts,
                first_lsn: 0,
                lsn_len,
                started: false,
                local_err: None,
                chunked: false,
            },
        );
        Ok(())
    }

    /// Queues a local operation (bind, local invalidate) that the caller executed
    /// already, with its outcome (`err`: the status it failed with). It takes no PSN
    /// and sends nothing; it completes in send-queue order (rxe `rxe_do_local_ops`
    /// and the completer after it).
    pub fn post_local(
        &mut self,
        wr: SendWr,
        err: Option<WcStatus>,
        cfg: &QpConfig,
    ) -> Result<(), QpError> {
        if self.sq.len() >= cfg.sq_depth as usize {
            return Err(QpError::QueueFull);
        }
        super::inline_deque::push_compact(
            &mut self.sq,
            SendWqe {
                wr: SendWr {
                    sge: Sge::default(),
                    ..wr
                },
                sgl: SglRef::OWN,
                first_psn: 0,
                npkts: 0,
                first_lsn: 0,
                lsn_len: 0,
                started: false,
                local_err: err,
                chunked: false,
            },
        );
        Ok(())
    }

    /// Whether a failed local operation waits in the queue (the QP enters ERR when it
    /// reaches the front; what is posted after it is not executed).
    pub fn local_failed(&self) -> bool {
        self.sq.iter().any(|w| w.local_err.is_some())
    }

    /// LSN of PSN `p` within the started WQEs (`p` in `[una, next_psn]`).
    pub fn lsn_at(&self, p: u32, pmtu: u32) -> u32 {
        // PSN ranges of the started WQEs are disjoint, so any WQE holding
        // `p` gives the answer. Asked per packet (the window gate, with
        // `sent_hi`), `p` is most often the PSN after every started WQE or
        // inside the one at the cursor: checked first, so that the gate
        // does not walk hundreds of small WQEs in flight.
        if p == self.next_psn {
            return self.next_lsn;
        }
        let near = [self.tx_idx, self.tx_idx.wrapping_sub(1)];
        near.iter()
            .filter_map(|&i| self.sq.get(i))
            .filter(|w| w.started)
            .chain(self.sq.iter().take_while(|w| w.started))
            .find_map(|w| Self::lsn_in(w, p, pmtu))
            .unwrap_or(self.next_lsn)
    }

    /// The LSN of PSN `p` if it is one of started WQE `w`'s packets.
    fn lsn_in(w: &SendWqe, p: u32, pmtu: u32) -> Option<u32> {
        let d = psn::sub(p, w.first_psn);
        (d < w.npkts).then(|| {
            if w.wr.op.needs_response() {
                if d == 0 {
                    w.first_lsn
                } else {
                    w.first_lsn.wrapping_add(w.lsn_len)
                }
            } else {
                w.first_lsn.wrapping_add((d * pmtu).min(w.lsn_len))
            }
        })
    }

    /// Bytes in flight: LSN sent and not acknowledged.
    pub fn in_flight(&self, acked_lsn: u32, pmtu: u32) -> u32 {
        self.lsn_at(self.sent_hi, pmtu).wrapping_sub(acked_lsn)
    }

    /// PSN of the next packet the cursor sends.
    pub fn cursor_psn(&self) -> u32 {
        match self.sq.get(self.tx_idx) {
            Some(w) if w.started => psn::add(w.first_psn, self.tx_pkt),
            _ => self.next_psn,
        }
    }

    /// Go-back-N: the next packet sent is the one with PSN `p`.
    pub fn rewind(&mut self, p: u32) {
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

    /// Removes the oldest WQE (completed or failed), keeping the cursor on its packet.
    pub fn pop_front(&mut self) -> Option<SendWqe> {
        let w = self.sq.pop_front()?;
        if w.wr.op.needs_response() {
            self.rd_outstanding = self.rd_outstanding.saturating_sub(1);
        }
        if self.tx_idx > 0 {
            self.tx_idx -= 1;
        } else {
            self.tx_pkt = 0;
        }
        Some(w)
    }

    /// Completes every WQE with WR_FLUSH_ERR (the first with `first`, if given) and
    /// stops the cursor: the QP entered ERR.
    pub fn flush(&mut self, mut first: Option<WcStatus>, qpn: u32, cq: &mut CompletionQueue) {
        while let Some(w) = self.sq.pop_front() {
            cq.push_back(WorkCompletion {
                wr_id: w.wr.wr_id,
                status: first.take().unwrap_or(WcStatus::WrFlushErr),
                opcode: w.wr.op.wc_opcode(),
                byte_len: 0,
                imm: None,
                qp_num: qpn,
                solicited: false,
                src_qp: 0,
                grh: false,
            });
        }
        self.rnr_until = 0;
        self.tx_idx = 0;
        self.tx_pkt = 0;
    }

    /// The next request packet at `now`, if the RNR wait, the READ limit and the
    /// window allow one; `sqd` holds back new WQEs (send queue drain). One packet may
    /// always go when nothing is in flight (a window below one packet sends one packet
    /// at a time instead of deadlocking).
    pub fn next_packet(
        &mut self,
        now: u64,
        cfg: &QpConfig,
        sqd: bool,
        acked_lsn: u32,
    ) -> Option<TxPacket> {
        if self.rnr_until > now {
            return None;
        }
        self.rnr_until = 0;
        let pm = cfg.pmtu;
        let mut w = *self.sq.get(self.tx_idx)?;
        // Local operations take no PSN: the cursor passes them (placing them in PSN
        // order for the completer), and stops at a failed one.
        while w.wr.op.is_local() {
            if w.local_err.is_some() {
                return None;
            }
            if !w.started {
                w.first_psn = self.next_psn;
                w.first_lsn = self.next_lsn;
                w.started = true;
                self.sq[self.tx_idx] = w;
            }
            self.tx_idx += 1;
            self.tx_pkt = 0;
            w = *self.sq.get(self.tx_idx)?;
        }
        if !w.started {
            if sqd {
                return None;
            }
            if w.wr.op.needs_response() && self.rd_outstanding >= cfg.max_rd_atomic {
                return None;
            }
            let charge = if w.wr.op.needs_response() {
                w.lsn_len
            } else {
                w.lsn_len.min(pm)
            };
            if self.next_lsn.wrapping_add(charge).wrapping_sub(acked_lsn) > self.window
                && self.in_flight(acked_lsn, pm) > 0
            {
                return None;
            }
            w.first_psn = self.next_psn;
            w.first_lsn = self.next_lsn;
            w.started = true;
            w.chunked = self.chunk_writes && w.npkts > 1 && matches!(w.wr.op, SendOp::Write { .. });
            self.next_psn = psn::add(self.next_psn, w.npkts);
            self.next_lsn = self.next_lsn.wrapping_add(w.lsn_len);
            if w.wr.op.needs_response() {
                self.rd_outstanding += 1;
            }
            self.sq[self.tx_idx] = w;
        }
        let idx = self.tx_pkt;
        let p = psn::add(w.first_psn, idx);
        let (repr, payload, lsn, lsn_len, done) = build_request(&w, idx, p, cfg);
        // Window gate for this packet (retransmissions too, if the window shrank).
        if lsn.wrapping_add(lsn_len).wrapping_sub(acked_lsn) > self.window
            && self.in_flight(acked_lsn, pm) > 0
        {
            return None;
        }
        let mut repr = repr;
        self.noack_pkts += 1;
        // The last packet the window lets go asks too: a responder that
        // acknowledges only on request would otherwise leave a window of
        // fewer than ACK_REQ_EVERY packets closed until the retransmit timer.
        let window_full = lsn
            .wrapping_add(lsn_len)
            .wrapping_add(pm)
            .wrapping_sub(acked_lsn)
            > self.window;
        if self.noack_pkts >= ACK_REQ_EVERY || window_full {
            repr.bth.ack_req = true;
        }
        if repr.bth.ack_req {
            self.noack_pkts = 0;
        }
        if cfg.cc_ext {
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
        Some(TxPacket {
            repr,
            payload,
            ecn: Ecn::Ect0,
            priority: false,
            lsn,
            lsn_len,
            retransmit,
            ah: None,
        })
    }
}

/// Packet `idx` (PSN `p`) of WQE `w`: headers, payload reference, LSN, LSN charge, and
/// whether it is the WQE's last request packet (IBA 9.5 opcode sequences).
fn build_request(
    w: &SendWqe,
    idx: u32,
    p: u32,
    cfg: &QpConfig,
) -> (RoceRepr, Payload, u32, u32, bool) {
    let pm = cfg.pmtu;
    let off = idx * pm;
    let dq = cfg.dest_qpn;
    let header_only = |opcode, reth, atomic| {
        let mut r = RoceRepr::new(BthRepr::new(opcode, dq, p));
        r.bth.ack_req = true;
        r.reth = reth;
        r.atomic = atomic;
        (r, Payload::None, w.first_lsn, w.lsn_len, true)
    };
    match w.wr.op {
        SendOp::Read { remote_va, rkey } => header_only(
            Opcode::ReadRequest,
            Some(RethRepr {
                va: remote_va.wrapping_add(u64::from(off)),
                rkey,
                dma_len: w.wr.sge.len - off.min(w.wr.sge.len),
            }),
            None,
        ),
        SendOp::CompareSwap {
            remote_va,
            rkey,
            compare,
            swap,
        } => header_only(
            Opcode::CompareSwap,
            None,
            Some(AtomicEthRepr {
                va: remote_va,
                rkey,
                swap_add: swap,
                compare,
            }),
        ),
        SendOp::FetchAdd {
            remote_va,
            rkey,
            add,
        } => header_only(
            Opcode::FetchAdd,
            None,
            Some(AtomicEthRepr {
                va: remote_va,
                rkey,
                swap_add: add,
                compare: 0,
            }),
        ),
        op => {
            let total = w.wr.sge.len;
            let len = (total - off.min(total)).min(pm);
            let last = idx + 1 == w.npkts;
            let imm = match op {
                SendOp::SendImm(i) | SendOp::WriteImm { imm: i, .. } => Some(i),
                _ => None,
            };
            let mut opcode = if w.chunked {
                Opcode::WriteOnly
            } else {
                data_opcode(
                    matches!(op, SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_)),
                    w.npkts == 1,
                    idx == 0,
                    last,
                    imm.is_some(),
                )
            };
            // SEND with Invalidate: its last (or only) packet carries the IETH.
            let ieth = match op {
                SendOp::SendInv(rkey) if last => {
                    opcode = if w.npkts == 1 {
                        Opcode::SendOnlyInv
                    } else {
                        Opcode::SendLastInv
                    };
                    Some(IethRepr(rkey))
                }
                _ => None,
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
                    r.reth = Some(if w.chunked {
                        RethRepr {
                            va: remote_va.wrapping_add(u64::from(off)),
                            rkey,
                            dma_len: len,
                        }
                    } else {
                        RethRepr {
                            va: remote_va,
                            rkey,
                            dma_len: total,
                        }
                    });
                }
            }
            if opcode.has_immdt() {
                r.immdt = imm.map(ImmDtRepr);
            }
            r.ieth = ieth;
            let payload = if len > 0 && w.sgl.is_list() {
                Payload::Gather {
                    sgl: w.sgl,
                    offset: off,
                    len,
                }
            } else if len > 0 {
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
    }
}

/// The SEND or WRITE opcode of a packet: its message kind, position and immediate.
fn data_opcode(is_send: bool, only: bool, first: bool, last: bool, imm: bool) -> Opcode {
    match (is_send, only, first, last, imm) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wc::Sge;

    /// `lsn_at` as it was, a walk over every started WQE: the reference.
    fn lsn_by_walk(r: &Requester, p: u32, pmtu: u32) -> u32 {
        r.sq.iter()
            .take_while(|w| w.started)
            .find_map(|w| Requester::lsn_in(w, p, pmtu))
            .unwrap_or(r.next_lsn)
    }

    /// The shortcuts of `lsn_at` (the PSN after every started WQE, the WQE
    /// at or before the cursor) answer what the walk answers, for every PSN
    /// in flight and every cursor, across the PSN wrap, with WRITEs of one
    /// and many packets and READs mixed.
    #[test]
    fn lsn_at_answers_as_the_walk_over_started_wqes() {
        let pmtu = 1024;
        let op = |k: u32| match k % 3 {
            0 => SendOp::Read {
                remote_va: 0,
                rkey: 1,
            },
            _ => SendOp::Write {
                remote_va: 0,
                rkey: 1,
            },
        };
        let lens = [64u32, 4096, 1, 3000, 1024, 65536, 0, 2048];
        let mut r = Requester::new(&QpConfig::default());
        let (mut p, mut l) = (psn::add(0xFF_FFF0, 0), 77u32);
        for (k, &len) in lens.iter().enumerate() {
            let wr = SendWr {
                wr_id: k as u64,
                op: op(k as u32),
                sge: Sge {
                    addr: 0,
                    len,
                    lkey: 1,
                },
                signaled: true,
                solicited: false,
            };
            let npkts = len.div_ceil(pmtu).max(1);
            let lsn_len = if wr.op.needs_response() {
                LSN_HEADER_ONLY_CHARGE
            } else {
                len.max(1)
            };
            let started = k < 6;
            r.sq.push_back(SendWqe {
                wr,
                sgl: SglRef::OWN,
                first_psn: p,
                npkts,
                first_lsn: l,
                lsn_len,
                started,
                local_err: None,
                chunked: false,
            });
            if started {
                p = psn::add(p, npkts);
                l = l.wrapping_add(lsn_len);
            }
        }
        r.next_psn = p;
        r.next_lsn = l;
        let first = r.sq[0].first_psn;
        for cursor in 0..=lens.len() {
            r.tx_idx = cursor;
            let mut q = first;
            loop {
                assert_eq!(
                    r.lsn_at(q, pmtu),
                    lsn_by_walk(&r, q, pmtu),
                    "psn {q:#x}, cursor {cursor}"
                );
                if q == r.next_psn {
                    break;
                }
                q = psn::add(q, 1);
            }
        }
    }
}
