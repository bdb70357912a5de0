//! Doorbells: the work requests programs posted ([`crate::contract::Doorbell`]),
//! taken from the rings of the QPs that rang and handed to their transport;
//! a request the transport refuses completes at once with an error.

use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{QpError, Sge, WcOpcode, WcStatus, WorkCompletion};

use super::Engine;
use crate::contract::{AsyncEvent, Doorbell, DoorbellSlot};

/// How many of a QP's doorbell slots [`prefetch_slots`] brings in at a time.
const DOORBELL_PREFETCH: usize = 16;

/// Hints the CPU to load the next [`DOORBELL_PREFETCH`] slots of a QP's
/// doorbell ring (each a line the program's thread wrote on its core), so
/// that a batch of posts costs overlapping misses, not one after another.
/// Peeks only: the slots stay in the ring.
fn prefetch_slots(ring: &mut rtrb::Consumer<DoorbellSlot>) {
    let n = ring.slots().min(DOORBELL_PREFETCH);
    if n > 1 {
        if let Ok(chunk) = ring.read_chunk(n) {
            let (a, b) = chunk.as_slices();
            for slot in a.iter().chain(b) {
                dpdk::prefetch(std::ptr::from_ref(slot).cast());
            }
        }
    }
}

/// The request at the head of `ring` whose SGE list starts there
/// ([`Doorbell::Sges`] slots, then its `Send` or `Recv`), its SGEs copied
/// into `sges`: the request, its SGE count and the slots it takes. Peeks
/// only (the caller pops them once the request is taken). `None` when the
/// list is longer than [`MAX_SGE`] or not followed by its request.
fn gathered(
    ring: &mut rtrb::Consumer<DoorbellSlot>,
    sges: &mut [Sge; MAX_SGE],
) -> Option<(Doorbell, usize, usize)> {
    let chunk = ring.read_chunk(ring.slots()).ok()?;
    let (a, b) = chunk.as_slices();
    let mut n = 0;
    for (used, slot) in a.iter().chain(b).enumerate() {
        match slot.0 {
            Doorbell::Sges { sges: part, n: k } => {
                let part = part.get(..usize::from(k))?;
                sges.get_mut(n..n + part.len())?.copy_from_slice(part);
                n += part.len();
            }
            d => return Some((d, n, used + 1)),
        }
    }
    None
}

/// A work request at the head of a doorbell ring: the request, its SGE list
/// when it has several SGEs (copied into the caller's array), and the slots
/// it takes (the caller pops them once the request is taken).
pub(super) type Request<'a> = (Doorbell, Option<&'a [Sge]>, usize);

/// The request at the head of `ring` ([`Request`]), peeked; `None` when the
/// ring is empty; `Some(Err(()))` for an SGE list without its request or
/// longer than [`MAX_SGE`] (the producer's bug: it commits them together),
/// whose first slot is dropped here (the caller counts it).
///
/// `sges` is the caller's scratch for a list, filled (and zeroed first)
/// only when a request has one: the requests of one SGE, the common case,
/// cost no 512-byte clear per doorbell.
pub(super) fn next_request<'a>(
    ring: &mut rtrb::Consumer<DoorbellSlot>,
    sges: &'a mut Option<[Sge; MAX_SGE]>,
) -> Option<Result<Request<'a>, ()>> {
    let d = ring.peek().ok()?.0;
    Some(match d {
        Doorbell::Sges { .. } => {
            match gathered(ring, sges.get_or_insert([Sge::default(); MAX_SGE])) {
                Some((d, n, used)) => Ok((d, sges.as_ref().map(|l| &l[..n]), used)),
                None => {
                    let _ = ring.pop();
                    Err(())
                }
            }
        }
        d => Ok((d, None, 1)),
    })
}

impl Engine {
    /// Takes the work requests of every QP that rang; whether any did.
    pub(super) fn doorbells(&mut self) -> bool {
        if !self.srqs.is_empty() {
            self.srq_doorbells();
        }
        let mut rung = false;
        while let Some(i) = self.shared.take_rung() {
            rung = true;
            self.take_doorbells(i);
            self.after_flushed_posts(i);
        }
        rung
    }

    pub(super) fn take_doorbells(&mut self, i: usize) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        let Some(qp) = s.core.qp.as_mut() else { return };
        s.doorbell_blocked = false;
        // Every DOORBELL_PREFETCH / 2 slots, the next DOORBELL_PREFETCH: half
        // of them are on their way already (asked again, a hit).
        let mut taken = 0usize;
        let mut sges = None;
        loop {
            if taken.is_multiple_of(DOORBELL_PREFETCH / 2) {
                prefetch_slots(&mut s.doorbell);
            }
            taken += 1;
            let (d, sgl, used) = match next_request(&mut s.doorbell, &mut sges) {
                None => break,
                Some(Ok(r)) => r,
                Some(Err(())) => {
                    self.counters.completion_errors += 1;
                    continue;
                }
            };
            let r = match d {
                // A bind or local invalidation runs on the engine's table now,
                // in this QP's posting order (rdma `Qp::post_local`).
                Doorbell::Send(wr) if wr.op.is_local() => qp
                    .post_local(wr, &mut self.mrs)
                    .map_err(|e| (e, wr.wr_id, wr.op.wc_opcode(), s.send_cq)),
                Doorbell::Send(wr) => qp
                    .post_send_sgl(wr, sgl, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, wr.op.wc_opcode(), s.send_cq)),
                Doorbell::Recv(wr) => qp
                    .post_recv_sgl(wr, sgl, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, WcOpcode::Recv, s.recv_cq)),
                Doorbell::SendUd(u) => {
                    let wr = u.send_wr();
                    qp.post_send_ud(wr, u.dest, sgl, &self.mrs)
                        .map_err(|e| (e, wr.wr_id, wr.op.wc_opcode(), s.send_cq))
                }
                Doorbell::Sges { .. } => unreachable!("gathered() returns the request"),
            };
            match r {
                Ok(()) => {}
                Err((QpError::QueueFull, ..)) => {
                    // Retried when completions free the queue.
                    s.doorbell_blocked = true;
                    break;
                }
                Err((e, wr_id, opcode, cq)) => {
                    let status = match e {
                        QpError::LocalProtection(_) => WcStatus::LocProtErr,
                        QpError::LocalLength => WcStatus::LocLenErr,
                        _ => WcStatus::LocQpOpErr,
                    };
                    self.counters.completion_errors += 1;
                    let wc = WorkCompletion {
                        wr_id,
                        status,
                        opcode,
                        byte_len: 0,
                        imm: None,
                        qp_num: qp.config().qpn,
                        solicited: false,
                        src_qp: 0,
                        grh: false,
                    };
                    if let Some(ring) = self.cqs.get_mut(cq as usize) {
                        if ring.push(wc).is_err() {
                            // CQ overrun: the completion is counted, not silently lost.
                            self.counters.completion_errors += 1;
                            self.life.queue(
                                AsyncEvent::CqOverrun { cq, lost: true },
                                &mut self.counters,
                            );
                        }
                    }
                }
            }
            if let Ok(c) = s.doorbell.read_chunk(used) {
                c.commit_all();
            }
        }
        let _ = self.sched.mark_ready(i as u32, s.core.next_bytes);
    }

    /// Work posted to a QP in ERR completes at once with WR_FLUSH_ERR
    /// (IBA 10.3.1), and a local operation at the front of the send queue
    /// (a bind, a local invalidation) completes when it is posted: those
    /// completions go to the CQs now, not with the QP's next packet or timer
    /// (it may have none).
    fn after_flushed_posts(&mut self, i: usize) {
        let flushed = self.qps[i]
            .as_ref()
            .and_then(|s| s.core.qp.as_ref())
            .is_some_and(|qp| qp.pending_completions() > 0);
        if flushed {
            let now = self.clock.now_ns();
            self.after_qp_work(i, now);
        }
    }
}
