//! The responder's execution of a request that passed every check (rxe `execute`,
//! IBA 9.7.4-9.7.5): a SEND into the receive WQE, a WRITE into the region, a READ
//! queued as responses, an ATOMIC executed once and its result cached; then the
//! expected PSN moves on and the ACK is coalesced.

use super::{InMsg, ReadJob, ReadResource, RespItem, Responder, Target};
use crate::transport::config::QpConfig;
use crate::transport::mr::MemorySpace;
use crate::transport::output::Outputs;
use crate::transport::rq::RecvWqe;
use crate::transport::sgl;
use crate::transport::wc::{WcOpcode, WcStatus};
use crate::wire::bth::{BthFlags, Opcode};
use crate::wire::frame::RoceFrame;
use crate::wire::psn;
use crate::wire::transport_hdrs::RethRepr;

impl Responder {
    /// Executes a request that passed every check (rxe `execute`).
    pub(super) fn execute<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        t: Target,
        cfg: &QpConfig,
        mem: &mut M,
        out: &mut Outputs,
    ) {
        match t {
            Target::Recv { wqe, offset } => self.execute_send(f, wqe, offset, cfg, mem, out),
            Target::Write {
                va,
                rkey,
                remaining,
                total,
            } => self.execute_write(f, (va, rkey, remaining, total), cfg, mem, out),
            Target::Read(r, key) => {
                self.execute_read(f.bth.psn, &r, key, cfg, out);
                return;
            }
            Target::Atomic(a) => {
                self.execute_atomic(f, (a.rkey, a.va), a.compare, a.swap_add, mem, out);
                return;
            }
        }
        self.epsn = psn::add(self.epsn, 1);
        self.nak_sent = false;
        self.unacked += 1;
        if self.unacked >= self.ack_coalesce || f.bth.ack_req {
            self.flush_ack(out);
        }
    }

    /// SEND bytes into the receive WQE at the RQ's head; its last packet completes
    /// it (`IBV_WC_RECV`, with the immediate if any).
    pub(super) fn execute_send<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        wqe: RecvWqe,
        offset: u32,
        cfg: &QpConfig,
        mem: &mut M,
        out: &mut Outputs,
    ) {
        let len = f.payload.len() as u32;
        if wqe.sgl.is_list() {
            // Scattered over the receive WQE's SGEs (IBA 10.7.2.1).
            let mut rest = f.payload;
            for p in sgl::pieces(self.recv_sgl(&wqe), offset, len) {
                let (now_in, later) = rest.split_at(p.len as usize);
                mem.copy_in_key(p.lkey, p.addr, now_in);
                rest = later;
            }
        } else if len > 0 {
            mem.copy_in_key(
                wqe.wr.sge.lkey,
                wqe.wr.sge.addr + u64::from(offset),
                f.payload,
            );
        }
        if f.bth.opcode.is_last() || f.bth.opcode.is_only() {
            // Held (an SRQ's) or the QP's oldest: check_resource found it.
            self.take_recv(None);
            self.cur = None;
            self.msn = psn::add(self.msn, 1);
            // A SEND with Invalidate reports the R_Key it invalidated
            // (`IBV_WC_WITH_INV`, IBA 11.4.2.1).
            let (opcode, imm) = match f.ieth {
                Some(i) => (WcOpcode::RecvInv, Some(i.0)),
                None => (WcOpcode::Recv, f.immdt.map(|i| i.0)),
            };
            let wc = super::recv_wc(
                wqe.wr.wr_id,
                WcStatus::Success,
                opcode,
                offset + len,
                imm,
                cfg.qpn,
                f.bth.flags.contains(BthFlags::SE),
            );
            out.push_wc(wc);
        } else {
            self.cur = Some(InMsg::Send {
                offset: offset + len,
            });
        }
    }

    /// WRITE bytes into the region at `va`; a last packet with an immediate
    /// completes the RQ's head (`IBV_WC_RECV_RDMA_WITH_IMM`). `w` is (va, rkey,
    /// bytes remaining, message length).
    pub(super) fn execute_write<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        (va, rkey, remaining, total): (u64, u32, u32, u32),
        cfg: &QpConfig,
        mem: &mut M,
        out: &mut Outputs,
    ) {
        let len = f.payload.len() as u32;
        if len > 0 {
            mem.copy_in_key(rkey, va, f.payload);
        }
        if f.bth.opcode.is_last() || f.bth.opcode.is_only() {
            self.cur = None;
            self.msn = psn::add(self.msn, 1);
            let imm = f.immdt.map(|i| i.0);
            if imm.is_some() {
                if let Some(wqe) = self.take_recv(None) {
                    let wc = super::recv_wc(
                        wqe.wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::RecvRdmaWithImm,
                        total,
                        imm,
                        cfg.qpn,
                        f.bth.flags.contains(BthFlags::SE),
                    );
                    out.push_wc(wc);
                }
            }
        } else {
            self.cur = Some(InMsg::Write {
                va: va + u64::from(len),
                rkey,
                remaining: remaining - len,
                total,
            });
        }
    }

    /// The READ `r` (first PSN `p`), its bytes reached through `key` (the region's,
    /// `check_rkey`): its responses are queued after the delayed ACK, it is
    /// remembered (under the R_Key it came with) for a duplicate's replay, and the
    /// expected PSN moves past every response PSN.
    fn execute_read(&mut self, p: u32, r: &RethRepr, key: u32, cfg: &QpConfig, out: &mut Outputs) {
        let (va, len) = (r.va, r.dma_len);
        // Responses carry PSNs after the delayed ACK's: acknowledge first.
        self.flush_ack(out);
        self.msn = psn::add(self.msn, 1);
        let job = ReadJob {
            psn: p,
            va,
            rkey: key,
            remaining: len,
            first: true,
            msn: self.msn,
        };
        self.push_out(RespItem::Read(job), out);
        let npkts = len.div_ceil(cfg.pmtu).max(1);
        if self.read_cache.len() >= self.read_cache.capacity() {
            self.read_cache.pop_front();
        }
        self.read_cache.push_back(ReadResource {
            first_psn: p,
            npkts,
            va,
            len,
            rkey: r.rkey,
            msn: self.msn,
        });
        self.epsn = psn::add(self.epsn, npkts);
        self.nak_sent = false;
    }

    /// An ATOMIC at `va` (COMPARE_SWAP or FETCH_ADD), executed once: its original
    /// value goes back in the ATOMIC ACK and into the result cache that answers a
    /// duplicate.
    fn execute_atomic<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        (rkey, va): (u32, u64),
        compare: u64,
        swap_add: u64,
        mem: &mut M,
        out: &mut Outputs,
    ) {
        let p = f.bth.psn;
        self.flush_ack(out);
        let orig = mem.read_u64_key(rkey, va);
        let new = if f.bth.opcode == Opcode::CompareSwap {
            if orig == compare {
                swap_add
            } else {
                orig
            }
        } else {
            orig.wrapping_add(swap_add)
        };
        mem.write_u64_key(rkey, va, new);
        self.msn = psn::add(self.msn, 1);
        let msn = self.msn;
        self.push_out(RespItem::AtomicAck { psn: p, msn, orig }, out);
        if self.atomic_cache.len() >= self.atomic_cache.capacity() {
            self.atomic_cache.pop_front();
        }
        self.atomic_cache.push_back((p, orig));
        self.epsn = psn::add(self.epsn, 1);
        self.nak_sent = false;
    }
}
