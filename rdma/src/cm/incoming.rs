//! The CM's side that reacts: to a MAD as it arrives (a REQ, REP, RTU, REJ,
//! MRA, DREQ, DREP or SIDR message, matched as the module documentation of
//! [`super`] says) and to its timers (retransmissions, handshakes given up,
//! timewait ends). The calls a consumer makes are in [`super`].

use super::*;

impl Cm {
    /// A CM MAD from `src_ip`.
    pub fn on_mad(&mut self, now: u64, src_ip: [u8; 4], mad: &CmMad) {
        match &mad.msg {
            CmMessage::Req(r) => self.on_req(now, src_ip, mad.tid, r),
            CmMessage::Rep(r) => self.on_rep(r),
            CmMessage::Rtu(r) => {
                if self.conn_in(r.remote_comm_id, &[CmState::RepSent]).is_ok() {
                    if let Some(c) = self.conns.get_mut(&r.remote_comm_id) {
                        c.state = CmState::Established;
                        c.deadline = None;
                        c.last = None;
                    }
                    self.events.push_back(CmEvent::Established {
                        id: r.remote_comm_id,
                    });
                }
            }
            CmMessage::Rej(r) => {
                let id = r.remote_comm_id;
                let waiting = [CmState::ReqSent, CmState::RepSent, CmState::RepRcvd];
                if self.conn_in(id, &waiting).is_ok() {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::Rejected {
                        id,
                        reason: r.reason,
                        private_data: Box::new(r.private_data),
                    });
                }
            }
            CmMessage::Mra(m) => {
                let id = m.remote_comm_id;
                let wait = timeout_ns(m.service_timeout)
                    .saturating_add(timeout_ns(self.cfg.response_timeout));
                if let Some(c) = self.conns.get_mut(&id) {
                    if matches!(c.state, CmState::ReqSent | CmState::RepSent) {
                        c.deadline = Some(now + wait);
                        c.wait_ns = wait;
                    }
                }
            }
            CmMessage::Dreq(d) => self.on_dreq(now, d),
            CmMessage::Drep(d) => {
                let id = d.remote_comm_id;
                if self.conn_in(id, &[CmState::DreqSent]).is_ok() {
                    self.enter_timewait(now, id);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
            }
            CmMessage::SidrReq(r) => {
                if self.listeners.contains(&r.service_id) {
                    self.events.push_back(CmEvent::SidrRequest {
                        peer_ip: src_ip,
                        tid: mad.tid,
                        req: r.clone(),
                    });
                } else {
                    let rep = SidrRep {
                        request_id: r.request_id,
                        status: sidr_status::SID_NOT_SUPPORTED,
                        ari_len: 0,
                        vendor_id: 0,
                        qpn: 0,
                        service_id: r.service_id,
                        qkey: 0,
                        ari: [0u8; 72],
                        private_data: [0u8; 136],
                    };
                    self.send(src_ip, mad.tid, CmMessage::SidrRep(Box::new(rep)));
                }
            }
            CmMessage::SidrRep(r) => {
                let id = r.request_id;
                if self.conn_in(id, &[CmState::SidrSent]).is_ok() {
                    self.conns.remove(&id);
                    self.events
                        .push_back(CmEvent::SidrReply { id, rep: r.clone() });
                }
            }
        }
    }

    fn on_req(&mut self, now: u64, src_ip: [u8; 4], tid: u64, r: &CmReq) {
        // A duplicate: answered from what was sent for it.
        let dup = self
            .conns
            .iter()
            .find(|(_, c)| c.peer_ip == src_ip && c.remote_id == r.local_comm_id)
            .map(|(&id, c)| (id, c.last.clone()));
        if let Some((_, last)) = dup {
            if let Some(m) = last {
                self.out.push_back((src_ip, m));
            }
            return;
        }
        let reject = |reason| rej(0, r.local_comm_id, 0, reason, [0u8; 148]);
        // The peer's QPN still connected (or in timewait) here: stale (IBA 12.9.8.3.3).
        let stale = self
            .conns
            .values()
            .any(|c| c.peer_ip == src_ip && c.remote_qpn == r.local_qpn);
        if stale {
            self.send(src_ip, tid, reject(rej_reason::STALE_CONN));
            return;
        }
        if !self.listeners.contains(&r.service_id) {
            self.send(src_ip, tid, reject(rej_reason::INVALID_SERVICE_ID));
            return;
        }
        let half_open = self
            .conns
            .values()
            .filter(|c| matches!(c.state, CmState::ReqRcvd | CmState::RepSent))
            .count();
        if half_open >= self.cfg.max_half_open {
            self.reqs_dropped += 1;
            return;
        }
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqRcvd,
                peer_ip: src_ip,
                remote_id: r.local_comm_id,
                remote_qpn: r.local_qpn,
                local_qpn: 0,
                tid,
                last: None,
                // A consumer slow to answer gets an MRA sent for it halfway
                // through the time the active side waits (as Linux's CM does when
                // its consumer has not accepted yet).
                deadline: Some(now + timeout_ns(r.remote_cm_response_timeout) / 2),
                wait_ns: 0,
                retries_left: 0,
                sr_offered: false,
                sr_agreed: false,
            },
        );
        let mut req = Box::new(*r);
        let offer = ext::take(&mut req.private_data);
        if let Some(c) = self.conns.get_mut(&id) {
            c.sr_offered = offer.is_some_and(|f| f & ext::SELECTIVE_REPEAT != 0);
        }
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            peer_ip: src_ip,
            req,
        });
    }

    fn on_rep(&mut self, r: &CmRep) {
        let id = r.remote_comm_id;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            CmState::ReqSent => {
                c.state = CmState::RepRcvd;
                c.remote_id = r.local_comm_id;
                c.remote_qpn = r.local_qpn;
                c.deadline = None;
                c.last = None;
                let mut rep = Box::new(*r);
                let answer = ext::take(&mut rep.private_data);
                c.sr_agreed =
                    c.sr_offered && answer.is_some_and(|f| f & ext::SELECTIVE_REPEAT != 0);
                self.events.push_back(CmEvent::ConnectReply { id, rep });
            }
            // Our RTU was lost: the REP comes again; so does the RTU.
            CmState::Established if c.remote_id == r.local_comm_id => {
                if let Some(m) = c.last.clone() {
                    self.out.push_back((c.peer_ip, m));
                }
            }
            _ => {}
        }
    }

    fn on_dreq(&mut self, now: u64, d: &CmDreq) {
        let id = d.remote_comm_id;
        let Some(c) = self.conns.get(&id) else { return };
        if c.remote_id != d.local_comm_id || c.local_qpn != d.remote_qpn {
            return;
        }
        let (to, tid, state, remote_id) = (c.peer_ip, c.tid, c.state, c.remote_id);
        let drep = CmMessage::Drep(Box::new(CmIds {
            local_comm_id: id,
            remote_comm_id: remote_id,
            private_data: [0u8; 224],
        }));
        match state {
            CmState::Established | CmState::DreqSent => {
                self.send(to, tid, drep);
                self.enter_timewait(now, id);
                self.events.push_back(CmEvent::DisconnectRequest { id });
            }
            // A duplicate (our DREP was lost): answered again.
            CmState::TimeWait => {
                self.send(to, tid, drep);
            }
            _ => {}
        }
    }

    /// Runs what is due at `now`: retransmissions, handshakes given up, timewait ends.
    pub fn on_timer(&mut self, now: u64) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            match c.state {
                CmState::TimeWait => {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::TimewaitExit { id });
                }
                CmState::ReqSent | CmState::RepSent | CmState::DreqSent | CmState::SidrSent
                    if c.retries_left > 0 =>
                {
                    c.retries_left -= 1;
                    c.deadline = Some(now + c.wait_ns);
                    if let Some(m) = c.last.clone() {
                        self.out.push_back((c.peer_ip, m));
                    }
                }
                CmState::ReqSent | CmState::RepSent => {
                    // Given up: the peer is told (REJ timeout, as Linux does).
                    let (to, tid, remote_id) = (c.peer_ip, c.tid, c.remote_id);
                    let message_rejected = if c.state == CmState::ReqSent { 2 } else { 1 };
                    self.conns.remove(&id);
                    self.send(
                        to,
                        tid,
                        rej(
                            id,
                            remote_id,
                            message_rejected,
                            rej_reason::TIMEOUT,
                            [0u8; 148],
                        ),
                    );
                    self.events.push_back(CmEvent::TimedOut { id });
                }
                CmState::DreqSent => {
                    self.enter_timewait(now, id);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
                CmState::ReqRcvd => {
                    c.deadline = None;
                    let _ = self.send_mra(id);
                }
                CmState::SidrSent => {
                    self.conns.remove(&id);
                    self.events.push_back(CmEvent::SidrTimeout { id });
                }
                _ => c.deadline = None,
            }
        }
    }
}
