//! The connection manager's requests to the engine ([`CmOp`], a
//! [`super::Command::Cm`]) and their answers ([`CmDone`]): the engine owns
//! QP 1 and the CM's state machine (`rdma::cm`), the program drives it.

/// A request to the communication manager ([`Command::Cm`]; `rdma::cm::Cm`'s calls).
#[derive(Debug, Clone)]
pub enum CmOp {
    /// Signal this notifier whenever events are queued (one per device; a
    /// later one replaces it).
    Notify(std::sync::Arc<crate::notify::EventNotify>),
    /// Accept REQs for a service ID.
    Listen(u64),
    /// Stop accepting them.
    Unlisten(u64),
    /// Send a REQ (replies the new connection's ID).
    Connect {
        /// The passive side's address.
        peer_ip: [u8; 4],
        /// The service.
        service_id: u64,
        /// What the REQ announces.
        params: rdma::cm::ConnParams,
        /// At most 92 bytes.
        private_data: Vec<u8>,
    },
    /// Accept a request (REP).
    Accept {
        /// The connection.
        id: u32,
        /// What the REP announces.
        params: rdma::cm::ConnParams,
        /// At most 196 bytes.
        private_data: Vec<u8>,
    },
    /// Reject a request or a reply (REJ).
    Reject {
        /// The connection.
        id: u32,
        /// The REJ reason (`rdma::wire::cm::rej_reason`).
        reason: u16,
        /// At most 148 bytes.
        private_data: Vec<u8>,
    },
    /// Ask the active side to wait longer (MRA).
    Mra(u32),
    /// The active side's QP is ready: send the RTU.
    Ready(u32),
    /// Release (DREQ).
    Disconnect {
        /// The connection.
        id: u32,
        /// At most 220 bytes.
        private_data: Vec<u8>,
    },
    /// Resolve a UD service (SIDR_REQ; replies the request's ID).
    SidrRequest {
        /// The service's address.
        peer_ip: [u8; 4],
        /// The service.
        service_id: u64,
        /// At most 216 bytes.
        private_data: Vec<u8>,
    },
    /// Answer a SIDR request (SIDR_REP).
    SidrReply {
        /// Where the request came from.
        peer_ip: [u8; 4],
        /// Its TID.
        tid: u64,
        /// The request.
        req: Box<rdma::wire::cm::SidrReq>,
        /// `rdma::cm::sidr_status`.
        status: u8,
        /// The UD QP's number.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
    },
    /// Take the events queued since the last time.
    Events,
}

/// A [`CmOp`]'s outcome.
#[derive(Debug, Clone)]
pub enum CmDone {
    /// Done.
    Done,
    /// The new connection's ID.
    Id(u32),
    /// The queued events, oldest first.
    Events(Vec<rdma::cm::CmEvent>),
}
