//! QP 1, the general services interface (IBA 13.5): the port's communication manager
//! ([`rdma::cm::Cm`], issue 41). A GSI frame is a UD SEND Only to QP 1 with the GSI
//! Q_Key (IBA 10.2.4.5; Linux rxe drops any other, `check_keys`) carrying a 256-byte
//! MAD; CM MADs go to the state machine, whose answers go out the same way, to the
//! peer's MAC from the ARP cache (a destination not resolved yet waits for ARP). Its
//! timers run on the slow path; its events wait here until the API takes them
//! ([`crate::contract::Command::Cm`]).

use rdma::transport::{LossRecovery, Service};
use rdma::wire::bth::{BthRepr, Opcode};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceFrame, RoceRepr};
use rdma::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use rdma::wire::transport_hdrs::DethRepr;
use rdma::wire::{CmMad, Ecn, EthernetAddress, Ipv4Address};

use super::Engine;
use crate::contract::{CmDone, CmOp, EngineError};
use crate::control::Resolution;

/// The UDP source port of GSI frames (any; RoCE v2 leaves it to the sender).
const GSI_UDP_SPORT: u16 = 0xC001;

impl Engine {
    /// A received frame for QP 1.
    pub(super) fn gsi_frame(&mut self, f: &RoceFrame<'_>, now: u64) {
        let gsi_send =
            f.bth.opcode == Opcode::UdSendOnly && f.deth.is_some_and(|d| d.qkey == GSI_QKEY);
        let mad = gsi_send.then(|| CmMad::parse(f.payload).ok()).flatten();
        let Some(mad) = mad else {
            self.counters.rx_drop_gsi += 1;
            return;
        };
        self.counters.rx_cm_mads += 1;
        self.cm.on_mad(now, f.ip.src.0, &mad);
        self.counters.rx_drop_cm_req = self.cm.reqs_dropped();
        self.gsi_flush(now);
    }

    /// Sends what the CM queued and keeps its events for the API.
    fn gsi_flush(&mut self, now: u64) {
        while let Some((ip, mad)) = self.cm.poll_out() {
            self.gsi_send(ip, mad, now);
        }
        let queued = self.cm_events.len();
        while let Some(e) = self.cm.poll_event() {
            self.cm_events.push_back(e);
        }
        if self.cm_events.len() > queued {
            if let Some(n) = &self.cm_notify {
                n.signal();
            }
        }
    }

    /// One MAD to QP 1 at `ip`: out now if its MAC is known, else after ARP.
    fn gsi_send(&mut self, ip: [u8; 4], mad: CmMad, now: u64) {
        let mut out = std::mem::take(&mut self.control_out);
        let mac = match self.control.resolve(ip, now, &mut out) {
            Resolution::Known(mac) => Some(mac),
            Resolution::Pending(request) => {
                if let Some(n) = request {
                    self.send_frame(&out[..n], now);
                }
                self.gsi_waiting.push((ip, mad.clone()));
                None
            }
            Resolution::Failed => {
                self.counters.tx_drop_gsi += 1;
                None
            }
        };
        self.control_out = out;
        let Some(mac) = mac else { return };
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress(self.mac),
                dst_mac: EthernetAddress(mac),
                src_ip: Ipv4Address(self.ip),
                dst_ip: Ipv4Address(ip),
                udp_src_port: GSI_UDP_SPORT,
                dscp: 0,
                ttl: 64,
            },
            int: None,
        };
        let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnly, GSI_QPN, self.gsi_psn));
        self.gsi_psn = (self.gsi_psn + 1) & 0xFF_FFFF;
        r.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp: GSI_QPN,
        });
        let mut body = [0u8; MAD_LEN];
        let mut frame = [0u8; 512];
        let built = mad
            .emit(&mut body)
            .and_then(|_| fb.emit_frame(&r, &body, Ecn::NotEct, &mut frame));
        match built {
            Ok(n) => {
                self.counters.tx_cm_mads += 1;
                self.send_frame(&frame[..n], now);
            }
            Err(_) => self.counters.tx_drop_gsi += 1,
        }
    }

    /// The slow path's share: the CM's due timers, MADs whose ARP completed.
    pub(super) fn gsi_slow_path(&mut self, now: u64) {
        if !self.gsi_waiting.is_empty() {
            for (ip, mad) in std::mem::take(&mut self.gsi_waiting) {
                self.gsi_send(ip, mad, now);
            }
        }
        if self.cm.next_deadline().is_some_and(|d| d <= now) {
            self.cm.on_timer(now);
        }
        self.gsi_flush(now);
    }

    /// MADs wait for an ARP resolution (retried on the slow path).
    pub(super) fn gsi_pending(&self) -> bool {
        !self.gsi_waiting.is_empty()
    }

    /// When the CM must run next (the park's bound).
    pub(super) fn gsi_deadline(&self) -> Option<u64> {
        self.cm.next_deadline()
    }

    /// Whether QP `qpn` of this port wants selective repeat (an RC QP whose options
    /// say `sr`): its REQ offers it, its REP agrees where the REQ offered it
    /// (`rdma::cm::ext`; issue 43).
    fn wants_sr(&self, qpn: u32) -> bool {
        qpn.checked_sub(self.qpn_base)
            .and_then(|i| self.qps.get(i as usize))
            .and_then(Option::as_ref)
            .is_some_and(|s| {
                s.opts.service == Service::Rc && s.opts.loss_recovery == LossRecovery::Sr
            })
    }

    /// A [`crate::contract::Command::Cm`] request.
    pub(super) fn cm_command(&mut self, op: CmOp, now: u64) -> Result<CmDone, EngineError> {
        let r = match op {
            CmOp::Notify(n) => {
                if !self.cm_events.is_empty() {
                    n.signal();
                }
                self.cm_notify = Some(n);
                Ok(CmDone::Done)
            }
            CmOp::Listen(sid) => {
                self.cm.listen(sid);
                Ok(CmDone::Done)
            }
            CmOp::Unlisten(sid) => {
                self.cm.unlisten(sid);
                Ok(CmDone::Done)
            }
            CmOp::Connect {
                peer_ip,
                service_id,
                params,
                private_data,
            } => {
                let sr = self.wants_sr(params.qpn);
                self.cm
                    .connect_offering(now, peer_ip, service_id, &params, &private_data, sr)
                    .map(CmDone::Id)
            }
            CmOp::Accept {
                id,
                params,
                private_data,
            } => {
                let sr = self.wants_sr(params.qpn);
                self.cm
                    .accept_offering(now, id, &params, &private_data, sr)
                    .map(|()| CmDone::Done)
            }
            CmOp::Reject {
                id,
                reason,
                private_data,
            } => self
                .cm
                .reject(id, reason, &private_data)
                .map(|()| CmDone::Done),
            CmOp::Mra(id) => self.cm.send_mra(id).map(|()| CmDone::Done),
            CmOp::Ready(id) => self.cm.ready(id).map(|()| CmDone::Done),
            CmOp::Disconnect { id, private_data } => self
                .cm
                .disconnect(now, id, &private_data)
                .map(|()| CmDone::Done),
            CmOp::SidrRequest {
                peer_ip,
                service_id,
                private_data,
            } => self
                .cm
                .sidr_request(now, peer_ip, service_id, &private_data)
                .map(CmDone::Id),
            CmOp::SidrReply {
                peer_ip,
                tid,
                req,
                status,
                qpn,
                qkey,
            } => self
                .cm
                .sidr_reply(peer_ip, tid, &req, status, qpn, qkey, &[])
                .map(|()| CmDone::Done),
            CmOp::Events => {
                self.gsi_flush(now);
                return Ok(CmDone::Events(self.cm_events.drain(..).collect()));
            }
        };
        self.gsi_flush(now);
        r.map_err(EngineError::Cm)
    }
}
