//! The responder's side of selective repeat (crate::transport::sack; IRN §3.1 and
//! §5.2): a request ahead of the expected PSN, within the window, is placed now if
//! it carries its own RETH (a plain RDMA WRITE ONLY, which is all of one for an `sr`
//! requester's WRITEs) and acknowledged selectively; anything else ahead is dropped
//! and reported unplaced. Once the expected PSN arrives and executes, the PSNs placed
//! ahead are passed in order: each ends its WRITE message (the MSN moves, IBA
//! 9.7.5.1.1) and is acknowledged with them. Receive WQEs, SEND data and completions
//! never see a packet out of order.

use super::{Responder, Verdict};
use crate::transport::config::QpConfig;
use crate::transport::mr::{Access, MemorySpace, MrTable};
use crate::transport::output::Outputs;
use crate::transport::sack::{Sack, SrState, WINDOW};
use crate::wire::bth::Opcode;
use crate::wire::frame::RoceFrame;
use crate::wire::psn;

impl Responder {
    /// A request ahead of the expected PSN on an `sr` QP.
    pub(super) fn sr_ahead<M: MemorySpace + ?Sized>(
        &mut self,
        sr: &mut SrState,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &MrTable,
        mem: &mut M,
        out: &mut Outputs,
    ) -> Verdict {
        let p = f.bth.psn;
        if psn::sub(p, self.epsn) >= WINDOW {
            out.counters.count_error(|c| &mut c.rx_out_of_sequence);
            self.sack(sr, p, false, out);
        } else if sr.arrived.get(p) {
            out.counters.count_error(|c| &mut c.rx_duplicates);
            self.sack(sr, p, true, out);
        } else if place_ahead(f, cfg, mrs, mem) {
            sr.arrived.set(p);
            sr.counters.rx_placed_ahead += 1;
            out.counters.rx_packets += 1;
            self.sack(sr, p, true, out);
        } else {
            out.counters.count_error(|c| &mut c.rx_out_of_sequence);
            self.sack(sr, p, false, out);
        }
        Verdict::Continue
    }

    /// Queues a selective ACK of `p` (placed or not) with the expected PSN. Unplaced
    /// ones with the same expected PSN coalesce (the requester keeps the highest);
    /// a full queue drops it (counted), as any ACK: the requester's timer covers.
    fn sack(&mut self, sr: &mut SrState, p: u32, placed: bool, out: &mut Outputs) {
        let item = super::RespItem::Ack {
            psn: self.epsn,
            msn: p,
            syndrome: Sack::syndrome(placed),
        };
        if !placed {
            if let Some(super::RespItem::Ack {
                psn: e,
                msn,
                syndrome,
            }) = self.out.back_mut()
            {
                if *e == self.epsn && *syndrome == Sack::syndrome(false) {
                    if psn::lt(*msn, p) {
                        *msn = p;
                    }
                    return;
                }
            }
        }
        if self.push_out(item, out) {
            sr.counters.sacks_sent += 1;
        }
    }

    /// After the request at `from` executed in order and moved the expected PSN: the
    /// PSNs it passed are forgotten, and every PSN placed ahead that is now the
    /// expected one is passed, in order, and acknowledged.
    pub(super) fn sr_pass(&mut self, sr: &mut SrState, from: u32, out: &mut Outputs) {
        sr.arrived.clear_span(from, psn::sub(self.epsn, from));
        let mut n = 0u16;
        // A WRITE ONLY placed ahead ends its message; inside a SEND or WRITE
        // message it would break the opcode sequence (IBA 9.8.3.1): it is
        // then forgotten, and its resend gets the in-order checks' NAK.
        while self.cur.is_none() && sr.arrived.take(self.epsn) {
            self.msn = psn::add(self.msn, 1);
            self.epsn = psn::add(self.epsn, 1);
            n = n.saturating_add(1);
        }
        if self.cur.is_some() {
            sr.arrived.take(self.epsn);
        }
        if n > 0 {
            self.nak_sent = false;
            self.unacked = self.unacked.saturating_add(n);
            self.flush_ack(out);
        }
    }
}

/// Places a request that arrived ahead of the expected PSN, if it can be placed now:
/// an RDMA WRITE ONLY without immediate whose RETH names exactly its payload, within
/// a region that allows remote writes (`check_rkey`'s checks). Anything else waits
/// for its turn.
fn place_ahead<M: MemorySpace + ?Sized>(
    f: &RoceFrame<'_>,
    cfg: &QpConfig,
    mrs: &MrTable,
    mem: &mut M,
) -> bool {
    if f.bth.opcode != Opcode::WriteOnly || f.immdt.is_some() {
        return false;
    }
    let Some(r) = f.reth else { return false };
    let len = f.payload.len() as u32;
    if len > cfg.pmtu || r.dma_len != len {
        return false;
    }
    if len == 0 {
        return true;
    }
    // The key the bytes are reached through: the region's, also for a memory
    // window's R_Key (`check_rkey`).
    let Ok(key) = mrs.check_remote_in(
        cfg.pd,
        cfg.qpn,
        r.rkey,
        r.va,
        u64::from(len),
        Access::REMOTE_WRITE,
    ) else {
        return false;
    };
    mem.copy_in_key(key, r.va, f.payload);
    true
}
