//! The port's communication manager through the verbs API (issue 41): connections set
//! up with the IB CM's REQ/REP/RTU on QP 1, as Linux's `ib_cm` and hardware RoCE NICs
//! do, instead of an out-of-band exchange of QPNs and PSNs. The state machine is
//! [`rdma::cm::Cm`]; the engine owns it (engine/gsi.rs). Unsharded devices.

use rdma::cm::{CmEvent, ConnParams};

use super::{QueuePair, RemoteQp, VerbsError};
use crate::contract::{CmDone, CmOp, Command};
use crate::device::Device;
use crate::notify::EventNotify;

/// The path MTU of a CM message's `enum ibv_mtu` (1 = 256 ... 5 = 4096).
pub fn mtu_of_enum(m: u8) -> u32 {
    match m {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

impl QueuePair {
    /// What a REQ or REP announces for this QP: its QPN and the PSN it
    /// **receives** from (its first expected PSN), the path MTU, 16
    /// READs/atomics each way, retry and RNR retry 7.
    ///
    /// The Starting PSN of a REQ or REP is the sender's receive PSN, as Linux's
    /// `ib_cm` uses it (`cm_req_handler`/`cm_rep_handler` take the peer's as
    /// the send queue's PSN): each side sends from the PSN the other announced.
    /// Call it before [`Self::cm_remote`], which moves the send PSN.
    pub fn cm_params(&self) -> ConnParams {
        let r = self.remote_info();
        let path_mtu = match r.mtu {
            256 => 1,
            512 => 2,
            1024 => 3,
            2048 => 4,
            _ => 5,
        };
        ConnParams {
            qpn: r.qpn,
            starting_psn: r.psn,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            path_mtu,
            srq: false,
            local_ack_timeout: 18,
            traffic_class: 0,
        }
    }

    /// The peer QP a CM exchange named (its QPN, the Starting PSN it announced
    /// and the path MTU, at `peer_ip`), to [`Self::connect`] to: this QP now
    /// sends from the peer's announced PSN and receives from the one
    /// [`Self::cm_params`] announced. The MAC is resolved by ARP.
    pub fn cm_remote(
        &mut self,
        peer_ip: [u8; 4],
        qpn: u32,
        psn: u32,
        path_mtu: u8,
    ) -> Result<RemoteQp, VerbsError> {
        let ours = self.remote_info();
        self.set_sq_psn(psn)?;
        Ok(RemoteQp {
            qpn,
            psn: ours.psn,
            ip: peer_ip,
            mac: None,
            mtu: mtu_of_enum(path_mtu),
            cc: ours.cc,
        })
    }
}

impl Device {
    fn cm(&self, op: CmOp) -> Result<CmDone, VerbsError> {
        self.call(0, |reply| Command::Cm { op, reply })
    }

    /// An eventfd the engine signals whenever CM events are queued (for a
    /// program that sleeps until [`Self::cm_events`] has something: librdmacm's
    /// event channels). One per device: a second call replaces the first.
    pub fn cm_notifier(&self) -> Result<std::sync::Arc<EventNotify>, VerbsError> {
        let n = std::sync::Arc::new(EventNotify::new().map_err(VerbsError::Channel)?);
        self.cm(CmOp::Notify(n.clone()))?;
        Ok(n)
    }

    /// Stops accepting requests for `service_id`.
    pub fn cm_unlisten(&self, service_id: u64) -> Result<(), VerbsError> {
        self.cm(CmOp::Unlisten(service_id)).map(drop)
    }

    /// Accept connection requests for `service_id` (`rdma::wire::cm::service_id`).
    pub fn cm_listen(&self, service_id: u64) -> Result<(), VerbsError> {
        self.cm(CmOp::Listen(service_id)).map(drop)
    }

    /// Sends a REQ to the service at `peer_ip` for the QP `params` describes: the
    /// connection's ID. Its [`CmEvent::ConnectReply`] (or `Rejected`) comes through
    /// [`Self::cm_events`].
    pub fn cm_connect(
        &self,
        peer_ip: [u8; 4],
        service_id: u64,
        params: ConnParams,
        private_data: &[u8],
    ) -> Result<u32, VerbsError> {
        match self.cm(CmOp::Connect {
            peer_ip,
            service_id,
            params,
            private_data: private_data.to_vec(),
        })? {
            CmDone::Id(id) => Ok(id),
            _ => unreachable!("Connect replies an ID"),
        }
    }

    /// Accepts a request (REP) for the QP `params` describes.
    pub fn cm_accept(
        &self,
        id: u32,
        params: ConnParams,
        private_data: &[u8],
    ) -> Result<(), VerbsError> {
        self.cm(CmOp::Accept {
            id,
            params,
            private_data: private_data.to_vec(),
        })
        .map(drop)
    }

    /// Rejects a request or a reply (REJ with `reason`).
    pub fn cm_reject(&self, id: u32, reason: u16, private_data: &[u8]) -> Result<(), VerbsError> {
        self.cm(CmOp::Reject {
            id,
            reason,
            private_data: private_data.to_vec(),
        })
        .map(drop)
    }

    /// The active side's QP is connected: the RTU goes out.
    pub fn cm_ready(&self, id: u32) -> Result<(), VerbsError> {
        self.cm(CmOp::Ready(id)).map(drop)
    }

    /// Releases a connection (DREQ).
    pub fn cm_disconnect(&self, id: u32, private_data: &[u8]) -> Result<(), VerbsError> {
        self.cm(CmOp::Disconnect {
            id,
            private_data: private_data.to_vec(),
        })
        .map(drop)
    }

    /// Asks the UD service `service_id` at `peer_ip` for its QPN and Q_Key
    /// (SIDR_REQ): the request's ID; the answer is a [`CmEvent::SidrReply`].
    pub fn cm_sidr_request(
        &self,
        peer_ip: [u8; 4],
        service_id: u64,
        private_data: &[u8],
    ) -> Result<u32, VerbsError> {
        match self.cm(CmOp::SidrRequest {
            peer_ip,
            service_id,
            private_data: private_data.to_vec(),
        })? {
            CmDone::Id(id) => Ok(id),
            _ => unreachable!("SidrRequest replies an ID"),
        }
    }

    /// Answers a [`CmEvent::SidrRequest`] with a UD QP's number and Q_Key
    /// (`status` 0) or a refusal (`rdma::cm::sidr_status`).
    pub fn cm_sidr_reply(
        &self,
        peer_ip: [u8; 4],
        tid: u64,
        req: Box<rdma::wire::cm::SidrReq>,
        status: u8,
        (qpn, qkey): (u32, u32),
    ) -> Result<(), VerbsError> {
        self.cm(CmOp::SidrReply {
            peer_ip,
            tid,
            req,
            status,
            qpn,
            qkey,
        })
        .map(drop)
    }

    /// The CM events queued since the last call, oldest first.
    pub fn cm_events(&self) -> Result<Vec<CmEvent>, VerbsError> {
        match self.cm(CmOp::Events)? {
            CmDone::Events(v) => Ok(v),
            _ => unreachable!("Events replies events"),
        }
    }

    /// Waits up to `timeout` for CM events (polling the engine every millisecond).
    pub fn cm_wait(&self, timeout: std::time::Duration) -> Result<Vec<CmEvent>, VerbsError> {
        let end = std::time::Instant::now() + timeout;
        loop {
            let v = self.cm_events()?;
            if !v.is_empty() || std::time::Instant::now() >= end {
                return Ok(v);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
