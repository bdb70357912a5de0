//! The InfiniBand communication manager's state machine (IBA vol. 1 12.9, Linux
//! `drivers/infiniband/core/cm.c` as the reference for what a RoCE peer sends and
//! expects): connection establishment (REQ, REP, RTU), rejection (REJ), "wait longer"
//! (MRA), release (DREQ, DREP) and timewait, with the retransmissions and duplicate
//! answers that make it work over a lossy link. Pure: time is an argument, MADs come in
//! as [`CmMad`]s from a source IP and go out through [`Cm::poll_out`], what the
//! consumer must act on through [`Cm::poll_event`]. The messages themselves are
//! [`crate::wire::cm`]; the rdma_cm conventions (service IDs, `cma_hdr`) live one layer
//! up, in whoever builds the private data.
//!
//! Matching (IBA 12.6): a REQ by (source address, its local communication ID); every
//! other message by the communication ID it names as ours. Retransmission (IBA 12.7.34,
//! 12.9.7): a REQ, REP or DREQ is resent every `4.096 us * 2^response_timeout` until
//! answered, at most `max_retries` times; an MRA stretches the wait to its service
//! timeout. Duplicates are answered from the last message sent: a REQ while our REP is
//! out gets the REP again, a REP after our RTU the RTU, a DREQ in timewait the DREP.

use std::collections::{HashMap, HashSet, VecDeque};

pub mod ext;
mod incoming;

use crate::wire::cm::{
    rej_reason, CmDreq, CmIds, CmMad, CmMessage, CmMra, CmPath, CmRej, CmRep, CmReq, SidrRep,
    SidrReq,
};

/// `4.096 us * 2^t` in ns: the unit of every CM timeout (IBA 12.7.34; `t` above 31
/// counts as 31).
pub fn timeout_ns(t: u8) -> u64 {
    4096u64 << t.min(31)
}

/// A REJ (IBA 12.6.7) without additional rejection information:
/// `message_rejected` 0 = REQ, 1 = REP, 2 = other.
fn rej(
    local_comm_id: u32,
    remote_comm_id: u32,
    message_rejected: u8,
    reason: u16,
    private_data: [u8; 148],
) -> CmMessage {
    CmMessage::Rej(Box::new(CmRej {
        local_comm_id,
        remote_comm_id,
        message_rejected,
        ari_len: 0,
        reason,
        ari: [0u8; 72],
        private_data,
    }))
}

/// The IPv4-mapped GID of an address (`::ffff:a.b.c.d`, RoCE v2, IBA annex A17.4.5).
pub fn gid_of(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// How this side's CM behaves.
#[derive(Debug, Clone, Copy)]
pub struct CmConfig {
    /// This port's IPv4 address (its GID in every REQ).
    pub ip: [u8; 4],
    /// This CA's GUID.
    pub ca_guid: u64,
    /// The CM response timeout announced and waited by (Linux: 20, ~4.3 s).
    pub response_timeout: u8,
    /// Retransmissions before giving up (Linux: 15).
    pub max_retries: u8,
    /// Timewait after a release, as a timeout exponent (IBA 12.9.7.4; ~1 s at 18).
    pub timewait: u8,
    /// The service timeout an MRA of ours asks for (Linux: 24).
    pub mra_service_timeout: u8,
    /// Seeds the communication IDs and the TIDs (draw it from the OS).
    pub seed: u32,
    /// Connections received and not yet established (REQ received, REP
    /// sent) at most: a REQ beyond them is dropped unanswered and counted
    /// ([`Cm::reqs_dropped`]), as Linux's ib_cm drops one its consumer
    /// could not take (-ENOMEM: no REJ, "to allow future retries"), so a
    /// flood of REQs holds bounded state and the peer's retry may find room.
    pub max_half_open: usize,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            ip: [0; 4],
            ca_guid: 0,
            response_timeout: 20,
            max_retries: 15,
            timewait: 18,
            mra_service_timeout: 24,
            seed: 0x1234_5678,
            max_half_open: 1024,
        }
    }
}

/// What a side of a connection puts in its REQ or REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// Its QPN.
    pub qpn: u32,
    /// Its first PSN (random, 24 bits).
    pub starting_psn: u32,
    /// READs/atomics it accepts at once (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics it issues at once (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Path MTU (`enum ibv_mtu`).
    pub path_mtu: u8,
    /// Its QP uses an SRQ.
    pub srq: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
    /// The IP TOS (the path's traffic class).
    pub traffic_class: u8,
}

/// Where a connection stands (IBA 12.9.6 figure 155, the states this side uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Active: REQ sent, waiting for the REP.
    ReqSent,
    /// Passive: REQ received, the consumer decides ([`Cm::accept`], [`Cm::reject`]).
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Active: REP received, the consumer readies its QP ([`Cm::ready`]).
    RepRcvd,
    /// Both sides may use the QPs.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// Released; the QPN is not reused until this ends.
    TimeWait,
    /// Active: SIDR_REQ sent, waiting for the SIDR_REP.
    SidrSent,
}

/// What the consumer must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service listened on: accept or reject it.
    ConnectRequest {
        /// The new connection.
        id: u32,
        /// Where it came from.
        peer_ip: [u8; 4],
        /// The REQ.
        req: Box<CmReq>,
    },
    /// Our REQ was accepted: ready the QP, then [`Cm::ready`] sends the RTU.
    ConnectReply {
        /// The connection.
        id: u32,
        /// The REP.
        rep: Box<CmRep>,
    },
    /// The connection is established (passive: the RTU came; active: `ready`).
    Established {
        /// The connection.
        id: u32,
    },
    /// The peer rejected (REJ; its reason may be [`rej_reason::TIMEOUT`]
    /// when the peer's own wait ran out).
    Rejected {
        /// The connection (gone now).
        id: u32,
        /// Why.
        reason: u16,
        /// The REJ's private data.
        private_data: Box<[u8; 148]>,
    },
    /// Our REQ or REP went unanswered through every retry (ib_cm's
    /// REQ_ERROR / REP_ERROR): the connection is gone, and the peer was sent
    /// a REJ with reason [`rej_reason::TIMEOUT`] (IBA 12.9.7.1).
    TimedOut {
        /// The connection (gone now).
        id: u32,
    },
    /// The peer released the connection (its DREQ, answered with a DREP).
    DisconnectRequest {
        /// The connection (in timewait now).
        id: u32,
    },
    /// Our release completed (the DREP came, or the DREQ timed out).
    Disconnected {
        /// The connection (in timewait now).
        id: u32,
    },
    /// Timewait ended: the connection is forgotten.
    TimewaitExit {
        /// The connection.
        id: u32,
    },
    /// A SIDR_REQ for a service listened on (IBA 12.11, rdma_cm's UDP port space):
    /// answer it with [`Cm::sidr_reply`]. Nothing is kept for it.
    SidrRequest {
        /// Where it came from.
        peer_ip: [u8; 4],
        /// Its TID (the reply reuses it).
        tid: u64,
        /// The request.
        req: Box<SidrReq>,
    },
    /// The answer to our SIDR_REQ: the service's QPN and Q_Key when `status` is 0.
    SidrReply {
        /// The request.
        id: u32,
        /// The reply.
        rep: Box<SidrRep>,
    },
    /// Our SIDR_REQ went unanswered through every retry.
    SidrTimeout {
        /// The request.
        id: u32,
    },
}

/// SIDR_REP statuses (IBA 12.11.2, table 121).
pub mod sidr_status {
    /// The QPN and Q_Key are valid.
    pub const VALID: u8 = 0;
    /// No such service.
    pub const SID_NOT_SUPPORTED: u8 = 1;
    /// The service rejected the request.
    pub const REJECTED: u8 = 2;
}

/// Why a consumer call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection with that ID.
    #[error("no connection {0:#x}")]
    NoSuchId(u32),
    /// The call does not fit the connection's state.
    #[error("connection in state {0:?}")]
    State(CmState),
    /// More private data than the message holds.
    #[error("{0} bytes of private data, the message holds {1}")]
    PrivateData(usize, usize),
}

/// One connection.
#[derive(Debug, Clone)]
struct Conn {
    state: CmState,
    peer_ip: [u8; 4],
    remote_id: u32,
    remote_qpn: u32,
    local_qpn: u32,
    tid: u64,
    /// What a retransmission or a duplicate's answer sends.
    last: Option<CmMad>,
    deadline: Option<u64>,
    wait_ns: u64,
    retries_left: u8,
    /// Selective repeat (issue 43, [`ext`]): active, our REQ offered it;
    /// passive, the peer's REQ did.
    sr_offered: bool,
    /// Selective repeat agreed: the REP said so (active), or ours did (passive).
    sr_agreed: bool,
}

/// The connection manager of one port.
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    conns: HashMap<u32, Conn>,
    listeners: HashSet<u64>,
    next_id: u32,
    out: VecDeque<([u8; 4], CmMad)>,
    events: VecDeque<CmEvent>,
    reqs_dropped: u64,
}

fn copy_private<const N: usize>(data: &[u8]) -> Result<[u8; N], CmError> {
    if data.len() > N {
        return Err(CmError::PrivateData(data.len(), N));
    }
    let mut p = [0u8; N];
    p[..data.len()].copy_from_slice(data);
    Ok(p)
}

impl Cm {
    /// A CM with no connection and no listener.
    pub fn new(cfg: CmConfig) -> Self {
        Self {
            cfg,
            conns: HashMap::new(),
            listeners: HashSet::new(),
            next_id: cfg.seed | 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            reqs_dropped: 0,
        }
    }

    /// REQs dropped for want of room ([`CmConfig::max_half_open`]).
    pub fn reqs_dropped(&self) -> u64 {
        self.reqs_dropped
    }

    /// Accept REQs for `service_id`; false if already listened on.
    pub fn listen(&mut self, service_id: u64) -> bool {
        self.listeners.insert(service_id)
    }

    /// Stop accepting REQs for `service_id`.
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// A connection's state.
    pub fn state(&self, id: u32) -> Option<CmState> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// The next MAD to send and its destination.
    pub fn poll_out(&mut self) -> Option<([u8; 4], CmMad)> {
        self.out.pop_front()
    }

    /// The next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`Self::on_timer`] must run next.
    pub fn next_deadline(&self) -> Option<u64> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn new_id(&mut self) -> u32 {
        loop {
            // A Weyl sequence over the seed: IDs are not guessable from one another
            // and never 0.
            self.next_id = self.next_id.wrapping_add(0x9E37_79B9);
            let id = self.next_id;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn send(&mut self, to: [u8; 4], tid: u64, msg: CmMessage) -> CmMad {
        let mad = CmMad {
            tid,
            attr_mod: 0,
            msg,
        };
        self.out.push_back((to, mad.clone()));
        mad
    }

    /// Sends `msg` on connection `id` and waits for its answer (resent on timeout).
    fn send_and_wait(&mut self, now: u64, id: u32, msg: CmMessage, wait_ns: u64) {
        let Some(c) = self.conns.get(&id) else { return };
        let (to, tid) = (c.peer_ip, c.tid);
        let mad = self.send(to, tid, msg);
        let retries = self.cfg.max_retries;
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(mad);
            c.wait_ns = wait_ns;
            c.deadline = Some(now + wait_ns);
            c.retries_left = retries;
        }
    }

    /// Opens a connection to the service `service_id` at `peer_ip` (REQ): its ID.
    /// `private_data` (at most 92 bytes) is the REQ's; rdma_cm's starts with its
    /// `cma_hdr`.
    pub fn connect(
        &mut self,
        now: u64,
        peer_ip: [u8; 4],
        service_id: u64,
        p: &ConnParams,
        private_data: &[u8],
    ) -> Result<u32, CmError> {
        self.connect_offering(now, peer_ip, service_id, p, private_data, false)
    }

    /// [`Self::connect`] for a QP that would run selective repeat: with `sr`, the
    /// REQ offers it to an rsnic peer ([`ext`], in the private data's last bytes
    /// where the consumer's leave them free; otherwise nothing is offered).
    pub fn connect_offering(
        &mut self,
        now: u64,
        peer_ip: [u8; 4],
        service_id: u64,
        p: &ConnParams,
        private_data: &[u8],
        sr: bool,
    ) -> Result<u32, CmError> {
        let used = private_data.len();
        let mut private_data = copy_private::<92>(private_data)?;
        let sr = sr && ext::put(&mut private_data, used, ext::SELECTIVE_REPEAT);
        let id = self.new_id();
        let t = self.cfg.response_timeout;
        let req = CmReq {
            local_comm_id: id,
            vendor_id: 0,
            service_id,
            local_ca_guid: self.cfg.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: t,
            transport: 0,
            e2e_flow_control: false,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            local_cm_response_timeout: t,
            retry_count: p.retry_count.min(7),
            pkey: 0xFFFF,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count.min(7),
            max_cm_retries: self.cfg.max_retries.min(15),
            srq: p.srq,
            primary: CmPath {
                // Routed RoCE v2 (hop limit above 1): LIDs 0xFFFF (Linux cm_format_req).
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: gid_of(self.cfg.ip),
                remote_gid: gid_of(peer_ip),
                flow_label: 0,
                packet_rate: 0,
                traffic_class: p.traffic_class,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: p.local_ack_timeout,
            },
            alternate: CmPath::default(),
            private_data,
        };
        let tid = (u64::from(self.cfg.seed) << 32) | u64::from(id);
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqSent,
                peer_ip,
                remote_id: 0,
                remote_qpn: 0,
                local_qpn: p.qpn,
                tid,
                last: None,
                deadline: None,
                wait_ns: 0,
                retries_left: 0,
                sr_offered: sr,
                sr_agreed: false,
            },
        );
        self.send_and_wait(now, id, CmMessage::Req(Box::new(req)), timeout_ns(t));
        Ok(id)
    }

    fn conn_in(&self, id: u32, states: &[CmState]) -> Result<&Conn, CmError> {
        let c = self.conns.get(&id).ok_or(CmError::NoSuchId(id))?;
        if states.contains(&c.state) {
            Ok(c)
        } else {
            Err(CmError::State(c.state))
        }
    }

    /// Accepts a connection request (REP; private data at most 196 bytes); the RTU
    /// establishes it.
    pub fn accept(
        &mut self,
        now: u64,
        id: u32,
        p: &ConnParams,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.accept_offering(now, id, p, private_data, false)
    }

    /// [`Self::accept`] for a QP that would run selective repeat: with `sr`, and
    /// where the REQ offered it, the REP agrees ([`ext`]; only where the consumer's
    /// private data leaves room, else the connection stays go-back-N).
    pub fn accept_offering(
        &mut self,
        now: u64,
        id: u32,
        p: &ConnParams,
        private_data: &[u8],
        sr: bool,
    ) -> Result<(), CmError> {
        let used = private_data.len();
        let mut private_data = copy_private::<196>(private_data)?;
        let c = self.conn_in(id, &[CmState::ReqRcvd])?;
        let remote_id = c.remote_id;
        let sr = sr && c.sr_offered && ext::put(&mut private_data, used, ext::SELECTIVE_REPEAT);
        let rep = CmRep {
            local_comm_id: id,
            remote_comm_id: remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            starting_psn: p.starting_psn & 0xFF_FFFF,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 0,
            failover_accepted: 0,
            e2e_flow_control: false,
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data,
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::RepSent;
            c.local_qpn = p.qpn;
            c.sr_agreed = sr;
        }
        let t = timeout_ns(self.cfg.response_timeout);
        self.send_and_wait(now, id, CmMessage::Rep(Box::new(rep)), t);
        Ok(())
    }

    /// Rejects a connection request (REJ with `reason`, private data at most 148
    /// bytes); the connection is forgotten.
    pub fn reject(&mut self, id: u32, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        let private_data = copy_private::<148>(private_data)?;
        let c = self.conn_in(id, &[CmState::ReqRcvd, CmState::RepRcvd])?;
        let (to, tid, remote_id) = (c.peer_ip, c.tid, c.remote_id);
        let message_rejected = if c.state == CmState::ReqRcvd { 0 } else { 1 };
        self.conns.remove(&id);
        self.send(
            to,
            tid,
            rej(id, remote_id, message_rejected, reason, private_data),
        );
        Ok(())
    }

    /// Tells the active side to wait longer for our answer (MRA of the REQ, service
    /// timeout [`CmConfig::mra_service_timeout`]); a duplicate REQ gets it again.
    pub fn send_mra(&mut self, id: u32) -> Result<(), CmError> {
        let c = self.conn_in(id, &[CmState::ReqRcvd])?;
        let (to, tid, remote_id) = (c.peer_ip, c.tid, c.remote_id);
        let mra = CmMessage::Mra(Box::new(CmMra {
            local_comm_id: id,
            remote_comm_id: remote_id,
            message_mraed: 0,
            service_timeout: self.cfg.mra_service_timeout,
            private_data: [0u8; 222],
        }));
        let mad = self.send(to, tid, mra);
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(mad);
        }
        Ok(())
    }

    /// The active side's QP is ready: the RTU goes out and the connection is
    /// established.
    pub fn ready(&mut self, id: u32) -> Result<(), CmError> {
        let c = self.conn_in(id, &[CmState::RepRcvd])?;
        let (to, tid, remote_id) = (c.peer_ip, c.tid, c.remote_id);
        let rtu = CmMessage::Rtu(Box::new(CmIds {
            local_comm_id: id,
            remote_comm_id: remote_id,
            private_data: [0u8; 224],
        }));
        let mad = self.send(to, tid, rtu);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::Established;
            c.last = Some(mad);
            c.deadline = None;
        }
        self.events.push_back(CmEvent::Established { id });
        Ok(())
    }

    /// Releases an established connection (DREQ, private data at most 220 bytes).
    pub fn disconnect(&mut self, now: u64, id: u32, private_data: &[u8]) -> Result<(), CmError> {
        let private_data = copy_private::<220>(private_data)?;
        let c = self.conn_in(id, &[CmState::Established])?;
        let (remote_id, remote_qpn) = (c.remote_id, c.remote_qpn);
        let tid = (u64::from(self.cfg.seed) << 32) | u64::from(id.wrapping_add(1));
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::DreqSent;
            c.tid = tid;
        }
        let dreq = CmMessage::Dreq(Box::new(CmDreq {
            local_comm_id: id,
            remote_comm_id: remote_id,
            remote_qpn,
            private_data,
        }));
        let t = timeout_ns(self.cfg.response_timeout);
        self.send_and_wait(now, id, dreq, t);
        Ok(())
    }

    fn enter_timewait(&mut self, now: u64, id: u32) {
        let tw = timeout_ns(self.cfg.timewait);
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::TimeWait;
            c.deadline = Some(now + tw);
        }
    }

    /// Whether the QP at `peer_ip` numbered `remote_qpn` and ours run selective
    /// repeat, as this port's CM negotiated it ([`ext`]): the peer's REP agreed to
    /// our REQ's offer, or the peer's REQ offered it (we agree in our REP when our QP
    /// is configured `sr`, the caller's check). False for any peer the CM did not
    /// connect, and after the connection ended.
    pub fn sr_agreed(&self, peer_ip: [u8; 4], remote_qpn: u32) -> bool {
        self.conns.values().any(|c| {
            c.peer_ip == peer_ip
                && c.remote_qpn == remote_qpn
                && match c.state {
                    CmState::ReqRcvd => c.sr_offered,
                    CmState::RepSent | CmState::RepRcvd | CmState::Established => c.sr_agreed,
                    _ => false,
                }
        })
    }

    /// Asks the service `service_id` at `peer_ip` for its UD QPN and Q_Key (SIDR_REQ,
    /// IBA 12.11.1; private data at most 216 bytes, rdma_cm's `cma_hdr` first): the
    /// request's ID, answered by [`CmEvent::SidrReply`] or [`CmEvent::SidrTimeout`].
    pub fn sidr_request(
        &mut self,
        now: u64,
        peer_ip: [u8; 4],
        service_id: u64,
        private_data: &[u8],
    ) -> Result<u32, CmError> {
        let private_data = copy_private::<216>(private_data)?;
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrSent,
                peer_ip,
                remote_id: 0,
                remote_qpn: 0,
                local_qpn: 0,
                tid: (u64::from(self.cfg.seed) << 32) | u64::from(id),
                last: None,
                deadline: None,
                wait_ns: 0,
                retries_left: 0,
                sr_offered: false,
                sr_agreed: false,
            },
        );
        let req = CmMessage::SidrReq(Box::new(SidrReq {
            request_id: id,
            pkey: 0xFFFF,
            service_id,
            private_data,
        }));
        let t = timeout_ns(self.cfg.response_timeout);
        self.send_and_wait(now, id, req, t);
        Ok(id)
    }

    /// Answers a [`CmEvent::SidrRequest`]: `status` ([`sidr_status`]) and, when
    /// valid, the UD QP's number and Q_Key (private data at most 136 bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn sidr_reply(
        &mut self,
        peer_ip: [u8; 4],
        tid: u64,
        req: &SidrReq,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<136>(private_data)?;
        let rep = SidrRep {
            request_id: req.request_id,
            status,
            ari_len: 0,
            vendor_id: 0,
            qpn,
            service_id: req.service_id,
            qkey,
            ari: [0u8; 72],
            private_data,
        };
        self.send(peer_ip, tid, CmMessage::SidrRep(Box::new(rep)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cm::{service_id, RDMA_PS_TCP};

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [10, 0, 0, 2];
    const SVC: u64 = service_id(RDMA_PS_TCP, 18515);

    fn params(qpn: u32, psn: u32) -> ConnParams {
        ConnParams {
            qpn,
            starting_psn: psn,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu: 3,
            srq: false,
            local_ack_timeout: 18,
            traffic_class: 0,
        }
    }

    fn pair() -> (Cm, Cm) {
        let cfg = |ip, seed| CmConfig {
            ip,
            ca_guid: u64::from(seed),
            response_timeout: 10,
            max_retries: 3,
            timewait: 12,
            seed,
            ..CmConfig::default()
        };
        (Cm::new(cfg(A, 1)), Cm::new(cfg(B, 2)))
    }

    /// Moves every MAD between the two (through the wire format and back), dropping
    /// those `drop` says; returns how many moved.
    fn pump(now: u64, a: &mut Cm, b: &mut Cm, mut drop: impl FnMut(&CmMad) -> bool) -> usize {
        let mut n = 0;
        loop {
            let mut moved = false;
            for (from_a, src) in [(true, A), (false, B)] {
                let (x, y) = if from_a {
                    (&mut *a, &mut *b)
                } else {
                    (&mut *b, &mut *a)
                };
                while let Some((dst, mad)) = x.poll_out() {
                    moved = true;
                    n += 1;
                    assert_ne!(dst, src);
                    let mut buf = [0u8; 256];
                    mad.emit(&mut buf).unwrap();
                    let back = CmMad::parse(&buf).unwrap();
                    if !drop(&back) {
                        y.on_mad(now, src, &back);
                    }
                }
            }
            if !moved {
                return n;
            }
        }
    }

    fn events(c: &mut Cm) -> Vec<CmEvent> {
        std::iter::from_fn(|| c.poll_event()).collect()
    }

    /// Selective repeat is agreed only where both sides want it (issue 43): the
    /// offer and the answer ride in the private data's tail ([`ext`]), which the
    /// consumers never see; a REQ whose data leaves no room offers nothing.
    #[test]
    fn selective_repeat_is_agreed_only_where_both_want_it() {
        for (a_sr, b_sr, data_len) in [
            (true, true, 5),
            (true, false, 5),
            (false, true, 5),
            (false, false, 5),
            (true, true, 85),
        ] {
            let (mut a, mut b) = pair();
            b.listen(SVC);
            let data: Vec<u8> = (1..=data_len as u8).collect();
            let ia = a
                .connect_offering(0, B, SVC, &params(0x11, 0x1000), &data, a_sr)
                .unwrap();
            pump(0, &mut a, &mut b, |_| false);
            let ib = match events(&mut b).as_slice() {
                [CmEvent::ConnectRequest { id, req, .. }] => {
                    assert_eq!(&req.private_data[..data_len], &data[..]);
                    assert!(req.private_data[data_len..].iter().all(|&x| x == 0));
                    *id
                }
                e => panic!("{e:?}"),
            };
            let offered = a_sr && data_len <= 84;
            assert_eq!(b.sr_agreed(A, 0x11), offered, "passive, before accepting");
            b.accept_offering(0, ib, &params(0x22, 0x2000), b"ok", b_sr)
                .unwrap();
            pump(0, &mut a, &mut b, |_| false);
            match events(&mut a).as_slice() {
                [CmEvent::ConnectReply { rep, .. }] => {
                    assert_eq!(&rep.private_data[..2], b"ok");
                    assert!(rep.private_data[2..].iter().all(|&x| x == 0));
                }
                e => panic!("{e:?}"),
            }
            let both = offered && b_sr;
            assert_eq!(a.sr_agreed(B, 0x22), both, "{a_sr} {b_sr} {data_len}");
            assert_eq!(b.sr_agreed(A, 0x11), both, "{a_sr} {b_sr} {data_len}");
            assert!(!a.sr_agreed(B, 0x23) && !a.sr_agreed(A, 0x22), "another QP");
            a.ready(ia).unwrap();
            pump(0, &mut a, &mut b, |_| false);
            assert_eq!(a.sr_agreed(B, 0x22), both);
        }
    }

    /// A flood of REQs holds at most `max_half_open` connections on the
    /// passive side; the rest are dropped unanswered and counted, and the
    /// active side's retries find room once the consumer answers.
    #[test]
    fn a_flood_of_reqs_holds_bounded_state_and_a_retry_finds_room() {
        let (mut a, _) = pair();
        let mut b = Cm::new(CmConfig {
            ip: B,
            ca_guid: 2,
            response_timeout: 10,
            max_retries: 3,
            timewait: 12,
            seed: 2,
            max_half_open: 16,
            ..CmConfig::default()
        });
        b.listen(SVC);
        for i in 0..2000u32 {
            a.connect(0, B, SVC, &params(0x100 + i, 0x1000), b"")
                .unwrap();
        }
        pump(0, &mut a, &mut b, |_| false);
        let reqs = events(&mut b);
        assert_eq!(reqs.len(), 16);
        assert_eq!(b.conns.len(), 16);
        assert_eq!(b.reqs_dropped(), 1984);
        for e in reqs {
            let CmEvent::ConnectRequest { id, .. } = e else {
                panic!("{e:?}")
            };
            b.reject(id, rej_reason::CONSUMER_DEFINED, b"").unwrap();
        }
        // Long after every REQ's timeout: the active side resends them all.
        let later = 1_000_000_000_000;
        a.on_timer(later);
        pump(later, &mut a, &mut b, |_| false);
        let again = events(&mut b);
        assert_eq!(again.len(), 16, "{again:?}");
        assert!(again
            .iter()
            .all(|e| matches!(e, CmEvent::ConnectRequest { .. })));
        assert_eq!(b.conns.len(), 16);
    }

    /// A standard CM's REQ (no tail) gets no agreement, and its REP none either:
    /// only `connect`/`accept` of a Linux peer, which never add the tail.
    #[test]
    fn a_standard_peer_gets_no_selective_repeat() {
        let (mut a, mut b) = pair();
        b.listen(SVC);
        let ia = a.connect(0, B, SVC, &params(0x11, 0x1000), b"std").unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let ib = match events(&mut b).as_slice() {
            [CmEvent::ConnectRequest { id, .. }] => *id,
            e => panic!("{e:?}"),
        };
        assert!(!b.sr_agreed(A, 0x11));
        b.accept_offering(0, ib, &params(0x22, 0x2000), b"", true)
            .unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::ConnectReply { rep, .. }] => {
                assert!(rep.private_data.iter().all(|&x| x == 0), "no tail sent")
            }
            e => panic!("{e:?}"),
        }
        assert!(!a.sr_agreed(B, 0x22) && !b.sr_agreed(A, 0x11));
        let _ = ia;
    }

    /// REQ, REP, RTU: both sides established, each with the other's QPN and PSN.
    #[test]
    fn handshake_establishes_both_sides() {
        let (mut a, mut b) = pair();
        assert!(b.listen(SVC));
        let ia = a
            .connect(0, B, SVC, &params(0x11, 0x1000), b"hello")
            .unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let ib = match events(&mut b).as_slice() {
            [CmEvent::ConnectRequest { id, peer_ip, req }] => {
                assert_eq!(*peer_ip, A);
                assert_eq!((req.local_qpn, req.starting_psn), (0x11, 0x1000));
                assert_eq!(&req.private_data[..5], b"hello");
                assert_eq!(req.primary.remote_gid, gid_of(B));
                *id
            }
            e => panic!("{e:?}"),
        };
        b.accept(0, ib, &params(0x22, 0x2000), b"welcome").unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::ConnectReply { id, rep }] => {
                assert_eq!(*id, ia);
                assert_eq!((rep.local_qpn, rep.starting_psn), (0x22, 0x2000));
                assert_eq!(&rep.private_data[..7], b"welcome");
            }
            e => panic!("{e:?}"),
        }
        a.ready(ia).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        assert_eq!(events(&mut a), [CmEvent::Established { id: ia }]);
        assert_eq!(events(&mut b), [CmEvent::Established { id: ib }]);
        assert_eq!(
            (a.state(ia), b.state(ib)),
            (Some(CmState::Established), Some(CmState::Established))
        );
        assert_eq!(a.next_deadline(), None);
        assert_eq!(b.next_deadline(), None);
    }

    /// No listener: REJ "invalid service ID"; the consumer's reject: its reason and
    /// private data; too much private data is refused.
    #[test]
    fn rejections() {
        let (mut a, mut b) = pair();
        let ia = a.connect(0, B, SVC, &params(1, 1), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::Rejected { id, reason, .. }] => {
                assert_eq!((*id, *reason), (ia, rej_reason::INVALID_SERVICE_ID))
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(a.state(ia), None);
        b.listen(SVC);
        let ia = a.connect(0, B, SVC, &params(2, 1), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let CmEvent::ConnectRequest { id: ib, .. } = events(&mut b).remove(0) else {
            panic!()
        };
        b.reject(ib, rej_reason::CONSUMER_DEFINED, b"busy").unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::Rejected {
                id,
                reason,
                private_data,
            }] => {
                assert_eq!((*id, *reason), (ia, rej_reason::CONSUMER_DEFINED));
                assert_eq!(&private_data[..4], b"busy");
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(
            a.connect(0, B, SVC, &params(3, 1), &[0u8; 93]),
            Err(CmError::PrivateData(93, 92))
        );
        assert_eq!(
            b.accept(0, 12345, &params(1, 1), &[]),
            Err(CmError::NoSuchId(12345))
        );
    }

    /// A lost REQ is resent after the response timeout; a lost REP too (the duplicate
    /// REQ gets it again); a lost RTU makes B resend its REP, and A answers with the
    /// RTU again. Both end established exactly once.
    #[test]
    fn losses_are_recovered_by_retransmission() {
        let (mut a, mut b) = pair();
        b.listen(SVC);
        let wait = timeout_ns(10);
        let ia = a.connect(0, B, SVC, &params(0x11, 5), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| true); // the REQ is lost
        assert_eq!(a.next_deadline(), Some(wait));
        a.on_timer(wait - 1);
        assert_eq!(pump(wait - 1, &mut a, &mut b, |_| false), 0, "not yet");
        a.on_timer(wait);
        pump(wait, &mut a, &mut b, |_| false);
        let CmEvent::ConnectRequest { id: ib, .. } = events(&mut b).remove(0) else {
            panic!()
        };
        b.accept(wait, ib, &params(0x22, 6), &[]).unwrap();
        pump(wait, &mut a, &mut b, |m| matches!(m.msg, CmMessage::Rep(_))); // REP lost
        a.on_timer(2 * wait); // A resends the REQ; B answers it with the REP
        pump(2 * wait, &mut a, &mut b, |_| false);
        assert!(
            events(&mut b).is_empty(),
            "a duplicate REQ is no new request"
        );
        assert!(matches!(
            events(&mut a).as_slice(),
            [CmEvent::ConnectReply { .. }]
        ));
        a.ready(ia).unwrap();
        pump(2 * wait, &mut a, &mut b, |m| {
            matches!(m.msg, CmMessage::Rtu(_))
        }); // RTU lost
        b.on_timer(3 * wait); // B resends the REP; A answers with the RTU
        pump(3 * wait, &mut a, &mut b, |_| false);
        assert_eq!(events(&mut a), [CmEvent::Established { id: ia }]);
        assert_eq!(events(&mut b), [CmEvent::Established { id: ib }]);
        assert_eq!(b.next_deadline(), None);
    }

    /// Nobody answers: after `max_retries` resends the REQ is given up, the consumer
    /// told (timeout) and a REJ sent; an MRA stretches the wait to its service timeout.
    #[test]
    fn an_unanswered_req_times_out_and_an_mra_stretches_the_wait() {
        let (mut a, mut b) = pair();
        let wait = timeout_ns(10);
        let ia = a.connect(0, B, SVC, &params(1, 1), &[]).unwrap();
        let mut sent = 0;
        let mut now = 0;
        while a.state(ia).is_some() {
            sent += std::iter::from_fn(|| a.poll_out())
                .filter(|(_, m)| matches!(m.msg, CmMessage::Req(_)))
                .count();
            now = a.next_deadline().expect("a timer while waiting");
            a.on_timer(now);
        }
        assert_eq!(sent, 1 + 3, "the REQ and 3 retries");
        assert_eq!(now, 4 * wait);
        assert!(matches!(
            events(&mut a).as_slice(),
            [CmEvent::TimedOut { .. }]
        ));
        assert!(matches!(
            a.poll_out(),
            Some((
                B,
                CmMad {
                    msg: CmMessage::Rej(_),
                    ..
                }
            ))
        ));

        // With an MRA: B's consumer is slow; A waits the MRA's service timeout.
        b.listen(SVC);
        let ia = a.connect(0, B, SVC, &params(2, 1), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let CmEvent::ConnectRequest { id: ib, .. } = events(&mut b).remove(0) else {
            panic!()
        };
        b.send_mra(ib).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let stretched = timeout_ns(24) + wait;
        assert_eq!(a.next_deadline(), Some(stretched));
        a.on_timer(4 * wait);
        assert_eq!(a.state(ia), Some(CmState::ReqSent), "still waiting");
        b.accept(4 * wait, ib, &params(3, 1), &[]).unwrap();
        pump(4 * wait, &mut a, &mut b, |_| false);
        assert!(matches!(
            events(&mut a).as_slice(),
            [CmEvent::ConnectReply { .. }]
        ));
    }

    fn established() -> (Cm, Cm, u32, u32) {
        let (mut a, mut b) = pair();
        b.listen(SVC);
        let ia = a.connect(0, B, SVC, &params(0x11, 5), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let CmEvent::ConnectRequest { id: ib, .. } = events(&mut b).remove(0) else {
            panic!()
        };
        b.accept(0, ib, &params(0x22, 6), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        a.ready(ia).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        events(&mut a);
        events(&mut b);
        (a, b, ia, ib)
    }

    /// DREQ/DREP: both sides in timewait, then forgotten; a lost DREP is answered
    /// again for the resent DREQ; a REQ from the same QPN during timewait is stale.
    #[test]
    fn release_timewait_and_stale_requests() {
        let (mut a, mut b, ia, ib) = established();
        let wait = timeout_ns(10);
        a.disconnect(0, ia, &[]).unwrap();
        pump(0, &mut a, &mut b, |m| matches!(m.msg, CmMessage::Drep(_))); // DREP lost
        assert_eq!(events(&mut b), [CmEvent::DisconnectRequest { id: ib }]);
        assert_eq!(b.state(ib), Some(CmState::TimeWait));
        a.on_timer(wait);
        pump(wait, &mut a, &mut b, |_| false);
        assert_eq!(events(&mut a), [CmEvent::Disconnected { id: ia }]);
        assert!(
            events(&mut b).is_empty(),
            "the duplicate DREQ is no new event"
        );
        // A new REQ from A's QP 0x11 while B remembers it: stale.
        let again = a.connect(wait, B, SVC, &params(0x11, 9), &[]).unwrap();
        pump(wait, &mut a, &mut b, |_| false);
        assert!(matches!(
            events(&mut a).as_slice(),
            [CmEvent::Rejected { id, reason: rej_reason::STALE_CONN, .. }] if *id == again
        ));
        let tw = timeout_ns(12);
        b.on_timer(tw);
        assert_eq!(events(&mut b), [CmEvent::TimewaitExit { id: ib }]);
        assert_eq!(b.state(ib), None);
        a.on_timer(wait + tw);
        assert_eq!(events(&mut a), [CmEvent::TimewaitExit { id: ia }]);
        // And a DREQ that names the wrong QPN is ignored.
        let (a, mut b, ia, ib) = established();
        let bad = CmMad {
            tid: 1,
            attr_mod: 0,
            msg: CmMessage::Dreq(Box::new(CmDreq {
                local_comm_id: ia,
                remote_comm_id: ib,
                remote_qpn: 0x99,
                private_data: [0u8; 220],
            })),
        };
        b.on_mad(0, A, &bad);
        assert!(b.poll_out().is_none());
        assert_eq!(a.state(ia), Some(CmState::Established));
        assert_eq!(b.state(ib), Some(CmState::Established));
    }

    /// SIDR (rdma_cm's UDP port space): the listener's consumer answers with its
    /// UD QPN and Q_Key; a service nobody listens on is "not supported"; an
    /// unanswered request is resent, then times out.
    #[test]
    fn sidr_resolves_a_ud_service() {
        use crate::wire::cm::{RDMA_PS_UDP, RDMA_UDP_QKEY};
        let (mut a, mut b) = pair();
        let udp = service_id(RDMA_PS_UDP, 7174);
        let none = a.sidr_request(0, B, udp, b"who").unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::SidrReply { id, rep }] => {
                assert_eq!((*id, rep.status), (none, sidr_status::SID_NOT_SUPPORTED))
            }
            e => panic!("{e:?}"),
        }
        b.listen(udp);
        let ia = a.sidr_request(0, B, udp, b"who").unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let (tid, req) = match events(&mut b).remove(0) {
            CmEvent::SidrRequest { peer_ip, tid, req } => {
                assert_eq!((peer_ip, req.service_id), (A, udp));
                assert_eq!(&req.private_data[..3], b"who");
                (tid, req)
            }
            e => panic!("{e:?}"),
        };
        b.sidr_reply(A, tid, &req, sidr_status::VALID, 0x77, RDMA_UDP_QKEY, &[])
            .unwrap();
        pump(0, &mut a, &mut b, |_| false);
        match events(&mut a).as_slice() {
            [CmEvent::SidrReply { id, rep }] => {
                assert_eq!(*id, ia);
                assert_eq!((rep.status, rep.qpn, rep.qkey), (0, 0x77, RDMA_UDP_QKEY));
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(a.state(ia), None);
        // Unanswered: the REQ and 3 retries, then the timeout.
        let lost = a.sidr_request(0, B, udp, &[]).unwrap();
        let mut sent = 0;
        while a.state(lost).is_some() {
            sent += std::iter::from_fn(|| a.poll_out()).count();
            let at = a.next_deadline().unwrap();
            a.on_timer(at);
        }
        assert_eq!(sent, 4);
        assert_eq!(events(&mut a), [CmEvent::SidrTimeout { id: lost }]);
    }

    /// A consumer that has not answered a REQ halfway through the active side's
    /// wait gets an MRA sent for it; the active side then waits the MRA's service
    /// timeout instead of resending, and a late accept still connects.
    #[test]
    fn a_slow_accept_is_covered_by_an_automatic_mra() {
        let (mut a, mut b) = pair();
        b.listen(SVC);
        let wait = timeout_ns(10);
        let ia = a.connect(0, B, SVC, &params(1, 1), &[]).unwrap();
        pump(0, &mut a, &mut b, |_| false);
        let CmEvent::ConnectRequest { id: ib, .. } = events(&mut b).remove(0) else {
            panic!()
        };
        assert_eq!(b.next_deadline(), Some(wait / 2));
        b.on_timer(wait / 2);
        let mut mras = 0;
        pump(wait / 2, &mut a, &mut b, |m| {
            mras += usize::from(matches!(m.msg, CmMessage::Mra(_)));
            false
        });
        assert_eq!(mras, 1);
        assert_eq!(b.next_deadline(), None, "one MRA");
        assert_eq!(a.next_deadline(), Some(wait / 2 + timeout_ns(24) + wait));
        a.on_timer(3 * wait);
        assert_eq!(a.poll_out(), None, "no resend while the MRA's time runs");
        b.accept(3 * wait, ib, &params(2, 2), &[]).unwrap();
        pump(3 * wait, &mut a, &mut b, |_| false);
        assert!(matches!(
            events(&mut a).as_slice(),
            [CmEvent::ConnectReply { id, .. }] if *id == ia
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Under random loss, duplication and reordering of MADs, with the timers
        /// run: no side establishes a connection twice, or both establishes and
        /// rejects it; B is established only once A is; a duplicate REQ is never a
        /// second request; when nothing was lost, both end established.
        #[test]
        fn handshake_under_loss_duplication_and_reordering(
            fate in proptest::collection::vec(0u8..10, 64),
        ) {
            let (mut a, mut b) = pair();
            b.listen(SVC);
            let mut k = 0usize;
            let mut next = |fate: &[u8]| { let f = fate[k % fate.len()]; k += 1; f };
            let ia = a.connect(0, B, SVC, &params(0x11, 5), &[]).unwrap();
            let (mut ea, mut eb) = (Vec::new(), Vec::new());
            let mut ib = None;
            let mut lost = false;
            let mut now = 0u64;
            for _round in 0..40 {
                // Deliver what is queued: fate 0-1 lost, 2 duplicated, 3 held back a round.
                let mut held = Vec::new();
                for (from_a, src) in [(true, A), (false, B)] {
                    let (x, y) = if from_a { (&mut a, &mut b) } else { (&mut b, &mut a) };
                    while let Some((_, m)) = x.poll_out() {
                        match next(&fate) {
                            0 | 1 => lost = true,
                            2 => { y.on_mad(now, src, &m); y.on_mad(now, src, &m); }
                            3 => held.push((from_a, src, m)),
                            _ => y.on_mad(now, src, &m),
                        }
                    }
                }
                for (from_a, src, m) in held {
                    if from_a { b.on_mad(now, src, &m) } else { a.on_mad(now, src, &m) }
                }
                let evs: Vec<CmEvent> = std::iter::from_fn(|| b.poll_event()).collect();
                for e in evs {
                    if let CmEvent::ConnectRequest { id, .. } = e {
                        proptest::prop_assert!(ib.is_none(), "one request, not a duplicate");
                        ib = Some(id);
                        b.accept(now, id, &params(0x22, 6), &[]).unwrap();
                    }
                    eb.push(e);
                }
                let evs: Vec<CmEvent> = std::iter::from_fn(|| a.poll_event()).collect();
                for e in evs {
                    if let CmEvent::ConnectReply { id, .. } = e {
                        a.ready(id).unwrap();
                    }
                    ea.push(e);
                }
                now = now.max(a.next_deadline().into_iter().chain(b.next_deadline()).min().unwrap_or(now));
                a.on_timer(now);
                b.on_timer(now);
            }
            let est = |v: &[CmEvent]| v.iter().filter(|e| matches!(e, CmEvent::Established { .. })).count();
            let rej = |v: &[CmEvent]| v.iter().position(|e| matches!(e, CmEvent::Rejected { .. }));
            proptest::prop_assert!(est(&ea) <= 1 && est(&eb) <= 1, "{ea:?} {eb:?}");
            if est(&eb) == 1 {
                proptest::prop_assert_eq!(est(&ea), 1, "B established before A: {:?} {:?}", ea, eb);
            }
            for v in [&ea, &eb] {
                proptest::prop_assert!(!(est(v) == 1 && rej(v).is_some()), "established and rejected: {v:?}");
            }
            if !lost {
                proptest::prop_assert_eq!(a.state(ia), Some(CmState::Established));
                let ib = ib.expect("the request arrived");
                proptest::prop_assert_eq!(b.state(ib), Some(CmState::Established));
            }
        }
    }
}
