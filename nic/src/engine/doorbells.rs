//! Doorbells: the work requests programs posted ([`crate::contract::Doorbell`]),
//! taken from the rings of the QPs that rang and handed to their transport;
//! a request the transport refuses completes at once with an error.

use rdma::transport::{QpError, WcOpcode, WcStatus, WorkCompletion};

use super::Engine;
use crate::contract::Doorbell;

impl Engine {
    /// Takes the work requests of every QP that rang; whether any did.
    pub(super) fn doorbells(&mut self) -> bool {
        let mut rung = false;
        while let Some(i) = self.shared.take_rung() {
            rung = true;
            self.take_doorbells(i);
        }
        rung
    }

    pub(super) fn take_doorbells(&mut self, i: usize) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        let Some(qp) = s.qp.as_mut() else { return };
        s.doorbell_blocked = false;
        while let Ok(d) = s.doorbell.peek() {
            let d = *d;
            let r = match d {
                Doorbell::Send(wr) => qp
                    .post_send(wr, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, wr.op.wc_opcode(), s.send_cq)),
                Doorbell::Recv(wr) => qp
                    .post_recv(wr, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, WcOpcode::Recv, s.recv_cq)),
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
                    };
                    if let Some(ring) = self.cqs.get_mut(cq as usize) {
                        if ring.push(wc).is_err() {
                            // CQ overrun: the completion is counted, not silently lost.
                            self.counters.completion_errors += 1;
                        }
                    }
                }
            }
            let _ = s.doorbell.pop();
        }
        let _ = self.sched.mark_ready(i as u32, s.next_bytes);
    }
}
