//! The TX pipeline: the flow scheduler picks what goes next (control
//! packets first, then round robin over the QPs with data, paced by credit),
//! the QP's transport gives the packet (gated by its CC window in LSN
//! bytes), and the frame is built into an mbuf (through the QP's header
//! template) and sent in bursts.

use rdma::transport::qp::Payload as QpPayload;
use rdma::transport::TxPacket;
use rdma::wire::frame::{FrameBuilder, IntInsert, RoceRepr};
use rdma::wire::transport_hdrs::AethSyndrome;
use rdma::wire::{BthRepr, Ecn, Opcode};

use super::{cc_glue, Engine, CAPTURE_SNAP, MAX_HOPS};
use crate::io::{build_frame, build_frame_tpl, Payload};
use crate::scheduler::Decision;

/// Ethernet preamble, inter-frame gap and FCS: what the wire adds to a frame.
const WIRE_OVERHEAD: u64 = 24;
/// Capture interface id of sent frames (`rx.rs` has the received ones).
pub(super) const CAPTURE_TX: u32 = 1;

impl Engine {
    /// Fills a TX burst as the flow scheduler decides: control packets
    /// (ACK/NAK/CNP, probe responses) first, then round robin over QPs with
    /// data, each charged its packet against its pacing credit; the QP's
    /// transport applies the CC window in LSN bytes; the port's shaper
    /// stops the burst at the line rate (crate::port_shaper). Amortised O(1) per
    /// packet whatever the number of QPs (crate::scheduler).
    pub(super) fn transmit(&mut self, now: u64) {
        // What the port did not take last time goes first.
        if !self.txb.is_empty() {
            self.io.send(&mut self.txb);
            if !self.txb.is_empty() {
                return;
            }
        }
        while !self.txb.is_full() && self.shaper.may_send(now) {
            match self.sched.next(now) {
                Decision::Idle { .. } => break,
                Decision::Control(q) => self.send_control(q as usize, now),
                Decision::Qp { qp, .. } => self.send_data(qp as usize, now),
            }
        }
        if let Some(cap) = self.capture.as_mut() {
            let mut head = [0u8; CAPTURE_SNAP];
            for m in self.txb.as_slice() {
                let n = m.pkt_len().min(CAPTURE_SNAP);
                if m.read(0, &mut head[..n]).is_ok() {
                    cap.capture_head(CAPTURE_TX, now, &head[..n], m.pkt_len());
                }
            }
        }
        if !self.txb.is_empty() {
            self.io.send(&mut self.txb);
        }
    }

    /// One control packet of QP `i`: a CNP it owes, else its transport's
    /// next ACK/NAK or probe response. Not charged to the QP's credit.
    fn send_control(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            self.life.clear_ctrl_orphan(i);
            return;
        };
        s.ctrl_queued = false;
        let Some(qp) = s.qp.as_mut() else { return };
        // Control packets carry no INT container (probe responses echo
        // telemetry in their CC extension header, HPCC++ 000 §6.2).
        let mut fb = s.fb;
        fb.int = None;
        let pkt = if s.cnp_pending {
            s.cnp_pending = false;
            self.counters.tx_cnps += 1;
            TxPacket {
                repr: RoceRepr::new(BthRepr::new(Opcode::Cnp, qp.config().dest_qpn, 0)),
                payload: QpPayload::None,
                ecn: Ecn::NotEct,
                priority: true,
                lsn: 0,
                lsn_len: 0,
                retransmit: false,
            }
        } else if let Some(p) = qp.poll_tx_control(now) {
            p
        } else {
            return;
        };
        if s.cnp_pending || qp.has_control() {
            s.ctrl_queued = self.sched.push_control(i as u32).is_ok();
        }
        self.emit(i, &fb, &pkt);
    }

    /// The next packet of QP `i`'s transport (data, a READ request, a probe,
    /// or an ACK that was due), with the CC told of data sent; a QP with
    /// nothing sendable leaves the round robin.
    fn send_data(&mut self, i: usize, now: u64) {
        let q = i as u32;
        let Some(s) = self.qps[i].as_deref_mut() else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let Some(qp) = s.qp.as_mut() else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let Some(mut pkt) = qp.poll_tx(now) else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let data = !pkt.priority && pkt.lsn_len > 0 && pkt.repr.bth.opcode != Opcode::Acknowledge;
        let mut fb = s.fb;
        if data {
            cc_glue::on_data_sent(s, &mut pkt, now);
        } else if pkt.repr.bth.opcode == Opcode::Probe {
            // Probes always collect telemetry (HPCC++ 000 §6.2).
            fb.int = Some(IntInsert {
                int_dscp: self.int_dscp,
                max_hops: MAX_HOPS as u8,
            });
        } else {
            fb.int = None;
        }
        let built = self.emit(i, &fb, &pkt);
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        // Even when the frame could not be built (counted in `emit`), the
        // transport has taken the packet as sent: its retransmit timer must
        // still go on the wheel below, or a lost tail would never be resent.
        if let Some(bytes) = built {
            let wire = (bytes + WIRE_OVERHEAD) as u32;
            let _ = self.sched.on_sent(q, wire, now);
            if data {
                s.next_bytes = wire;
            }
        }
        self.requeue(i, now);
    }

    /// Builds `pkt` of QP `i` into an mbuf, counts it and puts it in the TX
    /// burst: its frame length, or `None` if it could not be built (counted).
    fn emit(&mut self, i: usize, fb: &FrameBuilder, pkt: &TxPacket) -> Option<u64> {
        let payload = match pkt.payload {
            QpPayload::None => Payload::None,
            QpPayload::Local { lkey: key, va, len } | QpPayload::Remote { rkey: key, va, len } => {
                match key
                    .checked_shr(8)
                    .and_then(|k| k.checked_sub(1))
                    .and_then(|k| self.mr_mem.get(k as usize))
                    .and_then(Option::as_ref)
                {
                    Some(mem) => Payload::Ext {
                        mem,
                        offset: (va - mem.base_ptr() as u64) as usize,
                        len: len as usize,
                    },
                    None => {
                        // Deregistered while in flight: not sendable.
                        self.counters.tx_drop_no_mbuf += 1;
                        return None;
                    }
                }
            }
        };
        // The QP's template when the packet uses the QP's own headers (a probe
        // adds INT, a CNP or ACK may drop it: those take the general path);
        // same bytes either way.
        let tpl = self.qps[i].as_deref().and_then(|s| s.tpl.as_ref());
        let built = match tpl {
            Some(t) if t.frame_builder() == fb => {
                build_frame_tpl(t, &pkt.repr, pkt.ecn, payload, &self.pools)
            }
            _ => build_frame(fb, &pkt.repr, pkt.ecn, payload, &self.pools),
        };
        match built {
            Ok(m) => {
                let bytes = m.pkt_len() as u64;
                self.shaper.charge(bytes + WIRE_OVERHEAD);
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += bytes;
                match pkt.repr.bth.opcode {
                    Opcode::Acknowledge => match pkt.repr.aeth.map(|a| a.syndrome) {
                        Some(AethSyndrome::Ack { .. }) => self.counters.tx_acks += 1,
                        _ => self.counters.tx_naks += 1,
                    },
                    Opcode::Cnp => {}
                    _ => self.counters.tx_data_packets += 1,
                }
                let _ = self.txb.push(m);
                Some(bytes)
            }
            Err(_) => {
                self.counters.tx_drop_no_mbuf += 1;
                None
            }
        }
    }
}
