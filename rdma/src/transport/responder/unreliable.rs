//! The responder of the unreliable services (IBA vol. 1 9.8 "unreliable service";
//! Linux rxe `rxe_resp.c` with `qp_type` UC or UD): nothing is acknowledged, nothing
//! is retried, and what cannot be delivered is dropped and counted.
//!
//! - **UC** (IBA 9.8.3, rxe `check_psn` / `check_op_seq` / `drop_msg`): packets are
//!   taken in PSN order. A packet behind the expected PSN (a duplicate or a late one)
//!   is dropped alone. A packet ahead of it, or whose opcode
//!   does not continue the message in progress, drops that message and every later
//!   packet of it; a FIRST or ONLY packet always starts a new message (resync, its
//!   PSN becoming the expected one). A dropped SEND leaves its receive WQE unused: the
//!   next message starts over in it (rxe class D1 resets the WQE). WRITE data already
//!   placed stays (IBA 9.8.3.x: a UC RDMA WRITE may be partially executed); only the
//!   immediate's completion is withheld. No receive WQE: the message is dropped
//!   (class D, no RNR NAK). A SEND longer than its receive WQE completes the WQE with
//!   `LOC_LEN_ERR` and drops the rest of the message; the QP stays usable. A bad R_Key,
//!   range or WRITE length drops the message silently.
//! - **UD** (IBA 9.8, 11.4.1.2; rxe `execute` and `do_complete`): any PSN, any
//!   source; the QP's checks of the Q_Key come first ([`super::super::Qp`]). Each
//!   packet takes one receive WQE and fills it with the 40-byte GRH slot — for
//!   RoCEv2 over IPv4, 20 zero bytes then the packet's IPv4 header (`union
//!   rdma_network_hdr`, what rxe and rdma-core's `ibv_grh` consumers read) — then
//!   the payload, and completes it with `byte_len` = 40 + payload, the DETH source QP,
//!   `IBV_WC_GRH` and the immediate if any. A buffer too small completes the WQE with
//!   `LOC_LEN_ERR`; no WQE: dropped, counted.
//!
//! Where this differs from rxe: rxe drops a too-long UC/UD message silently when the QP
//! has its own receive queue (class D) and completes the WQE with `REM_INV_REQ_ERR` on
//! an SRQ (class E); this transport completes it with `LOC_LEN_ERR` in both cases, as
//! hardware does (IBA 11.6.2 "Local Length Error"). rxe drops a FIRST that arrives
//! while a UC message is still open with the right PSN (class D1, then loses the
//! message it starts); here it starts the new message, as IBA 9.8.3 reads. On an SRQ,
//! rxe completes the abandoned message's WQE with `REM_INV_REQ_ERR` (class E); here the
//! QP keeps holding it for the next message, which loses nothing. rxe also takes a
//! duplicated or late FIRST/ONLY (PSN behind the expected one) as a new message, which
//! on a link that duplicates or reorders delivers a message twice or out of order;
//! here such a packet is dropped, so messages arrive in order and at most once.

use super::{Check, InMsg, RecvWqe, Responder, Target};
use crate::transport::config::QpConfig;
use crate::transport::mr::{Access, MemorySpace, MrTable};
use crate::transport::output::Outputs;
use crate::transport::sgl;
use crate::transport::srq::Srq;
use crate::transport::wc::{Sge, WcOpcode, WcStatus};
use crate::wire::bth::BthFlags;
use crate::wire::frame::RoceFrame;
use crate::wire::psn;

use super::Verdict;

/// The GRH slot at the head of every UD receive buffer (IBA 11.4.1.2, `struct
/// ibv_grh`).
pub const GRH_LEN: u32 = 40;

impl Responder {
    /// Drops the UC message in progress and the rest of it (rxe `drop_msg`): its
    /// receive WQE, if any, stays for the next message.
    fn drop_message(&mut self, out: &mut Outputs) {
        self.cur = None;
        self.drop_msg = true;
        out.count_unreliable(|c| &mut c.rx_msg_dropped);
    }

    /// Whether every byte of `[offset, offset + len)` of receive WQE `wqe` lies in a
    /// region the QP may still write (it may have been deregistered since the post).
    fn recv_writable(
        &self,
        wqe: &RecvWqe,
        offset: u32,
        len: u32,
        cfg: &QpConfig,
        mrs: &MrTable,
    ) -> bool {
        let writable = |p: Sge| {
            mrs.check_local_in(
                cfg.pd,
                p.lkey,
                p.addr,
                u64::from(p.len),
                Access::LOCAL_WRITE,
            )
            .is_ok()
        };
        if wqe.sgl.is_list() {
            sgl::pieces(self.recv_sgl(wqe), offset, len).all(writable)
        } else {
            len == 0
                || writable(Sge {
                    addr: wqe.wr.sge.addr + u64::from(offset),
                    len,
                    lkey: wqe.wr.sge.lkey,
                })
        }
    }

    /// Copies `data` to bytes `offset..` of receive WQE `wqe` (checked writable).
    fn place<M: MemorySpace + ?Sized>(&self, wqe: &RecvWqe, offset: u32, data: &[u8], mem: &mut M) {
        if wqe.sgl.is_list() {
            let mut rest = data;
            for p in sgl::pieces(self.recv_sgl(wqe), offset, data.len() as u32) {
                let (now_in, later) = rest.split_at(p.len as usize);
                mem.copy_in_key(p.lkey, p.addr, now_in);
                rest = later;
            }
        } else if !data.is_empty() {
            mem.copy_in_key(wqe.wr.sge.lkey, wqe.wr.sge.addr + u64::from(offset), data);
        }
    }

    /// Completes the receive WQE of the message at hand with error `status`.
    fn fail_recv(&mut self, status: WcStatus, cfg: &QpConfig, out: &mut Outputs) {
        if let Some(w) = self.take_recv(None) {
            out.push_wc(super::recv_wc(
                w.wr.wr_id,
                status,
                WcOpcode::Recv,
                0,
                None,
                cfg.qpn,
                false,
            ));
        }
    }

    /// A UC request packet (SEND or RDMA WRITE; the QP checked the service). Never
    /// answers; [`Verdict::Error`] only for a receive WQE whose region was
    /// deregistered since the post (IBA 9.9.3 class A, rxe `RESPST_ERR_MALFORMED_WQE`).
    pub fn on_uc_request<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &MrTable,
        mem: &mut M,
        out: &mut Outputs,
        srq: Option<&mut Srq>,
    ) -> Verdict {
        let op = f.bth.opcode;
        let p = f.bth.psn;
        let start = op.is_first() || op.is_only();
        let d = psn::diff(p, self.epsn);
        if d < 0 {
            // Behind the expected PSN (IBA 9.7.1 serial comparison): a duplicate or a
            // late packet. Dropped alone, so that no message is delivered twice or
            // out of order (rxe would take a late FIRST/ONLY as a new message).
            out.counters.count_error(|c| &mut c.rx_duplicates);
            return Verdict::Continue;
        }
        if self.drop_msg || d > 0 {
            if d > 0 {
                out.counters.count_error(|c| &mut c.rx_out_of_sequence);
            }
            if !start {
                self.drop_message(out);
                return Verdict::Continue;
            }
            // A FIRST or ONLY resynchronises (IBA 9.8.3, rxe check_psn).
            self.drop_msg = false;
        }
        if start {
            // Whatever was open is abandoned; its receive WQE serves this message.
            self.cur = None;
        }
        let in_seq = match self.cur {
            Some(InMsg::Send { .. }) => op.is_send(),
            Some(InMsg::Write { .. }) => op.is_write(),
            None => start,
        };
        if !in_seq {
            self.drop_message(out);
            return Verdict::Continue;
        }
        self.epsn = psn::add(p, 1);
        out.counters.rx_packets += 1;
        if self.check_length(f, cfg).is_err() {
            self.drop_message(out);
            return Verdict::Continue;
        }
        let len = f.payload.len() as u32;
        if op.is_send() {
            let Some(wqe) = self.hold_recv(srq) else {
                out.count_unreliable(|c| &mut c.rx_no_recv_wqe);
                self.drop_message(out);
                return Verdict::Continue;
            };
            let offset = match self.cur {
                Some(InMsg::Send { offset }) => offset,
                _ => 0,
            };
            if u64::from(offset) + u64::from(len) > u64::from(wqe.wr.sge.len) {
                self.fail_recv(WcStatus::LocLenErr, cfg, out);
                self.drop_message(out);
                return Verdict::Continue;
            }
            if !self.recv_writable(&wqe, offset, len, cfg, mrs) {
                self.fail_recv(WcStatus::LocQpOpErr, cfg, out);
                return Verdict::Error;
            }
            self.execute_send(f, wqe, offset, cfg, mem, out);
            return Verdict::Continue;
        }
        let target: Check<Target> = match (self.cur, f.reth) {
            (
                Some(InMsg::Write {
                    va,
                    rkey,
                    remaining,
                    total,
                }),
                _,
            ) => Ok(Target::Write {
                va,
                rkey,
                remaining,
                total,
            }),
            (None, Some(r)) => Ok(Target::Write {
                va: r.va,
                rkey: r.rkey,
                remaining: r.dma_len,
                total: r.dma_len,
            }),
            _ => {
                self.drop_message(out);
                return Verdict::Continue;
            }
        };
        let Ok(Target::Write {
            va,
            rkey,
            remaining,
            total,
        }) = target.and_then(|t| self.check_rkey(t, cfg, mrs))
        else {
            self.drop_message(out);
            return Verdict::Continue;
        };
        let end = op.is_last() || op.is_only();
        if len > remaining || (end && len != remaining) {
            self.drop_message(out);
            return Verdict::Continue;
        }
        if f.immdt.is_some() && self.hold_recv(srq).is_none() {
            out.count_unreliable(|c| &mut c.rx_no_recv_wqe);
            self.drop_message(out);
            return Verdict::Continue;
        }
        self.execute_write(f, (va, rkey, remaining, total), cfg, mem, out);
        Verdict::Continue
    }

    /// A UD SEND Only (with or without immediate) whose Q_Key the QP accepted: one
    /// receive WQE, the GRH slot, the payload (the module's docs).
    pub fn on_ud_send<M: MemorySpace + ?Sized>(
        &mut self,
        f: &RoceFrame<'_>,
        cfg: &QpConfig,
        mrs: &MrTable,
        mem: &mut M,
        out: &mut Outputs,
        srq: Option<&mut Srq>,
    ) -> Verdict {
        let len = f.payload.len() as u32;
        if len > cfg.pmtu {
            out.count_unreliable(|c| &mut c.rx_msg_dropped);
            return Verdict::Continue;
        }
        out.counters.rx_packets += 1;
        let Some(wqe) = self.hold_recv(srq) else {
            out.count_unreliable(|c| &mut c.rx_no_recv_wqe);
            return Verdict::Continue;
        };
        let need = GRH_LEN + len;
        if need > wqe.wr.sge.len {
            self.fail_recv(WcStatus::LocLenErr, cfg, out);
            return Verdict::Continue;
        }
        if !self.recv_writable(&wqe, 0, need, cfg, mrs) {
            self.fail_recv(WcStatus::LocQpOpErr, cfg, out);
            return Verdict::Error;
        }
        self.place(&wqe, 0, &grh(f.ipv4_header), mem);
        self.place(&wqe, GRH_LEN, f.payload, mem);
        self.take_recv(None);
        self.epsn = psn::add(f.bth.psn, 1);
        let mut wc = super::recv_wc(
            wqe.wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            need,
            f.immdt.map(|i| i.0),
            cfg.qpn,
            f.bth.flags.contains(BthFlags::SE),
        );
        wc.src_qp = f.deth.map_or(0, |d| d.src_qp);
        wc.grh = true;
        out.push_wc(wc);
        Verdict::Continue
    }
}

/// The 40-byte GRH slot of a UD receive over RoCEv2/IPv4 (`union rdma_network_hdr`
/// in Linux, read through rdma-core's `struct ibv_grh`): 20 zero bytes, then the
/// first 20 bytes of the packet's IPv4 header (rxe `execute`).
pub fn grh(ipv4_header: &[u8]) -> [u8; GRH_LEN as usize] {
    let mut g = [0u8; GRH_LEN as usize];
    let ip = &ipv4_header[..ipv4_header.len().min(20)];
    g[20..20 + ip.len()].copy_from_slice(ip);
    g
}
