//! The InfiniBand communication manager's messages (IBA vol. 1 12.6), as MADs of class
//! 0x07, class version 2, method Send ([`super::mad`]), which QP1 carries. The rdma_cm
//! conventions on top of them (port spaces, service IDs, the `cma_hdr`) are in
//! [`super::cma`], re-exported here.
//!
//! Every field is where the kernel's `include/rdma/ibta_vol1_c12.h` puts it (IBA tables
//! 106-120): a field is `width` bits that start at bit `7 - bit` of byte `byte` of the
//! class data (the 232 bytes after the MAD header) and run big-endian across bytes.
//!
//! ```text
//! REQ  (0x10)  0 local comm ID | 8 service ID | 16 local CA GUID | 28 local Q_Key
//!              32 local QPN(24)·responder resources | 36 local EECN·initiator depth
//!              40 remote EECN·remote CM response timeout(5)·transport(2)·E2E FC(1)
//!              44 starting PSN(24)·local CM response timeout(5)·retry count(3)
//!              48 P_Key | 50 path MTU(4)·RDC·RNR retry(3) | 51 max CM retries(4)·SRQ·ext(3)
//!              52 primary path (44 bytes) | 96 alternate path | 140 private data (92)
//! MRA  (0x11)  0 local | 4 remote comm ID | 8 message MRAed(2) | 9 service timeout(5)
//!              10 private data (222)
//! REJ  (0x12)  0 local | 4 remote | 8 message rejected(2) | 9 ARI length(7) | 10 reason
//!              12 ARI (72) | 84 private data (148)
//! REP  (0x13)  0 local | 4 remote | 8 local Q_Key | 12 local QPN(24) | 16 local EECN
//!              20 starting PSN(24) | 24 responder resources | 25 initiator depth
//!              26 target ACK delay(5)·failover(2)·E2E FC | 27 RNR retry(3)·SRQ
//!              28 local CA GUID | 36 private data (196)
//! RTU  (0x14)  0 local | 4 remote | 8 private data (224)
//! DREQ (0x15)  0 local | 4 remote | 8 remote QPN(24) | 12 private data (220)
//! DREP (0x16)  0 local | 4 remote | 8 private data (224)
//! SIDR_REQ (0x17)  0 request ID | 4 P_Key | 8 service ID | 16 private data (216)
//! SIDR_REP (0x18)  0 request ID | 4 status | 5 ARI length | 8 QPN(24) | 12 service ID
//!                  20 Q_Key | 24 ARI (72) | 96 private data (136)
//! path (44)    0 local LID | 2 remote LID | 4 local GID | 20 remote GID
//!              36 flow label(20) | 39 packet rate(6, low bits) | 40 traffic class
//!              41 hop limit | 42 SL(4)·subnet local | 43 local ACK timeout(5)
//! ```

use super::mad::{MadPacket, MadRepr, DATA_LEN, HEADER_LEN, MAD_LEN, METHOD_SEND};
use super::{need, need_out, Result, WireError};

pub use super::cma::{service_id, CmaHdr, RDMA_PS_IB, RDMA_PS_TCP, RDMA_PS_UDP, RDMA_UDP_QKEY};

/// The CM's management class (IBA 13.4.4, table 146).
pub const CM_CLASS: u8 = 0x07;
/// The CM class version (IBA 12.6).
pub const CM_CLASS_VERSION: u8 = 2;

/// REJ reasons (IBA 12.6.7.2, table 109) that a connection manager sends.
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Insufficient resources.
    pub const NO_RESOURCES: u16 = 3;
    /// A response timed out.
    pub const TIMEOUT: u16 = 4;
    /// An unsupported request.
    pub const UNSUPPORTED_REQ: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// No listener for the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// A connection with this QPN exists or is in timewait.
    pub const STALE_CONN: u16 = 10;
    /// Invalid GID.
    pub const INVALID_GID: u16 = 12;
    /// The consumer rejected (`rdma_reject`), private data in the REJ.
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid private data.
    pub const INVALID_PRIVATE_DATA: u16 = 31;
}

/// A field of a CM message: `width` bits from bit `7 - bit` of class-data byte `byte`.
#[derive(Debug, Clone, Copy)]
struct F {
    byte: usize,
    bit: u32,
    width: u32,
}

const fn f(byte: usize, bit: u32, width: u32) -> F {
    F { byte, bit, width }
}

impl F {
    fn nbytes(self) -> usize {
        (self.bit + self.width).div_ceil(8) as usize
    }

    fn shift(self) -> u32 {
        self.nbytes() as u32 * 8 - self.bit - self.width
    }

    fn mask(self) -> u64 {
        if self.width == 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    /// The field's value in `d` (class data, checked to be [`DATA_LEN`] long).
    fn get(self, d: &[u8]) -> u64 {
        let v = d[self.byte..self.byte + self.nbytes()]
            .iter()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b));
        (v >> self.shift()) & self.mask()
    }

    /// Writes `val` (truncated to the width) into `d`, keeping the bits around it.
    fn set(self, d: &mut [u8], val: u64) {
        let n = self.nbytes();
        let bytes = &mut d[self.byte..self.byte + n];
        let mut v = bytes.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b));
        let m = self.mask() << self.shift();
        v = (v & !m) | ((val << self.shift()) & m);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (v >> (8 * (n - 1 - i))) as u8;
        }
    }
}

/// What every CM message starts with.
const LOCAL_COMM_ID: F = f(0, 0, 32);
const REMOTE_COMM_ID: F = f(4, 0, 32);

/// The CM attribute IDs (IBA 12.6, table 104).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum CmAttr {
    /// ConnectRequest.
    Req = 0x10,
    /// MsgRcptAck.
    Mra = 0x11,
    /// ConnectReject.
    Rej = 0x12,
    /// ConnectReply.
    Rep = 0x13,
    /// ReadyToUse.
    Rtu = 0x14,
    /// DisconnectRequest.
    Dreq = 0x15,
    /// DisconnectReply.
    Drep = 0x16,
    /// ServiceIDResReq.
    SidrReq = 0x17,
    /// ServiceIDResReqResp.
    SidrRep = 0x18,
}

impl CmAttr {
    /// The attribute of an ID; LAP/APR (alternate paths) and anything else are
    /// refused.
    pub fn from_u16(v: u16) -> Result<Self> {
        Ok(match v {
            0x10 => Self::Req,
            0x11 => Self::Mra,
            0x12 => Self::Rej,
            0x13 => Self::Rep,
            0x14 => Self::Rtu,
            0x15 => Self::Dreq,
            0x16 => Self::Drep,
            0x17 => Self::SidrReq,
            0x18 => Self::SidrRep,
            _ => return Err(WireError::FieldRange("CM attribute ID")),
        })
    }
}

/// A path of a REQ (IBA 12.6.5: primary at 52, alternate at 96): on RoCE the GIDs
/// hold the IPv4 addresses (`::ffff:a.b.c.d`), the LIDs are 0xFFFF when the hop
/// limit is above 1 (Linux `cm_format_req`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBA's rate encoding).
    pub packet_rate: u8,
    /// Traffic class (the IP TOS on RoCE).
    pub traffic_class: u8,
    /// Hop limit (the IP TTL on RoCE).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits: 4.096 us * 2^t).
    pub local_ack_timeout: u8,
}

impl CmPath {
    const LEN: usize = 44;

    fn parse(d: &[u8], at: usize) -> Self {
        let g = |o: usize| -> [u8; 16] { d[at + o..at + o + 16].try_into().expect("16 bytes") };
        Self {
            local_lid: f(at, 0, 16).get(d) as u16,
            remote_lid: f(at + 2, 0, 16).get(d) as u16,
            local_gid: g(4),
            remote_gid: g(20),
            flow_label: f(at + 36, 0, 20).get(d) as u32,
            packet_rate: f(at + 39, 2, 6).get(d) as u8,
            traffic_class: d[at + 40],
            hop_limit: d[at + 41],
            sl: f(at + 42, 0, 4).get(d) as u8,
            subnet_local: f(at + 42, 4, 1).get(d) != 0,
            local_ack_timeout: f(at + 43, 0, 5).get(d) as u8,
        }
    }

    fn emit(&self, d: &mut [u8], at: usize) {
        d[at..at + Self::LEN].fill(0);
        f(at, 0, 16).set(d, self.local_lid.into());
        f(at + 2, 0, 16).set(d, self.remote_lid.into());
        d[at + 4..at + 20].copy_from_slice(&self.local_gid);
        d[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        f(at + 36, 0, 20).set(d, self.flow_label.into());
        f(at + 39, 2, 6).set(d, self.packet_rate.into());
        d[at + 40] = self.traffic_class;
        d[at + 41] = self.hop_limit;
        f(at + 42, 0, 4).set(d, self.sl.into());
        f(at + 42, 4, 1).set(d, self.subnet_local.into());
        f(at + 43, 0, 5).set(d, self.local_ack_timeout.into());
    }
}

/// ConnectRequest (IBA 12.6.5, table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmReq {
    /// The active side's communication ID.
    pub local_comm_id: u32,
    /// Vendor ID (24 bits).
    pub vendor_id: u32,
    /// The service the connection is for ([`service_id`]).
    pub service_id: u64,
    /// The active side's CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (UD/RD only).
    pub local_qkey: u32,
    /// The active side's QPN (24 bits).
    pub local_qpn: u32,
    /// READs/atomics the active side accepts at once (its `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// READs/atomics the active side issues at once (its `max_rd_atomic`).
    pub initiator_depth: u8,
    /// How long the passive side may take to answer (5 bits: 4.096 us * 2^t).
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits: 0 RC, 1 UC, 2 RD).
    pub transport: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// The active side's first PSN (24 bits).
    pub starting_psn: u32,
    /// How long the active side may take to answer (5 bits).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// Path MTU (4 bits, `enum ibv_mtu`: 3 = 1024).
    pub path_mtu: u8,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The active side's QP uses an SRQ.
    pub srq: bool,
    /// The primary path.
    pub primary: CmPath,
    /// The alternate path (all zero: none).
    pub alternate: CmPath,
    /// Private data (92 bytes; rdma_cm's `cma_hdr` first).
    pub private_data: [u8; 92],
}

/// ConnectReply (IBA 12.6.8, table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRep {
    /// The passive side's communication ID.
    pub local_comm_id: u32,
    /// The REQ's.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// The passive side's QPN (24 bits).
    pub local_qpn: u32,
    /// Vendor ID (24 bits, split over three bytes on the wire).
    pub vendor_id: u32,
    /// The passive side's first PSN (24 bits).
    pub starting_psn: u32,
    /// READs/atomics the passive side accepts at once.
    pub responder_resources: u8,
    /// READs/atomics the passive side issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub e2e_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The passive side's QP uses an SRQ.
    pub srq: bool,
    /// The passive side's CA GUID.
    pub local_ca_guid: u64,
    /// Private data (196 bytes).
    pub private_data: [u8; 196],
}

/// ConnectReject (IBA 12.6.7, table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRej {
    /// The rejecting side's communication ID.
    pub local_comm_id: u32,
    /// The other side's (0 when a REQ is rejected before an ID exists).
    pub remote_comm_id: u32,
    /// What is rejected (2 bits: 0 REQ, 1 REP, 2 no message).
    pub message_rejected: u8,
    /// Length of the additional rejection information (7 bits).
    pub ari_len: u8,
    /// Why ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (148 bytes).
    pub private_data: [u8; 148],
}

/// MsgRcptAck (IBA 12.6.6, table 107): "wait longer".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The other side's.
    pub remote_comm_id: u32,
    /// Which message it acknowledges (2 bits: 0 REQ, 1 REP, 2 LAP).
    pub message_mraed: u8,
    /// How much longer to wait (5 bits: 4.096 us * 2^t).
    pub service_timeout: u8,
    /// Private data (222 bytes).
    pub private_data: [u8; 222],
}

/// ReadyToUse (table 111), DisconnectReply (table 113): the two IDs and private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmIds {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The other side's.
    pub remote_comm_id: u32,
    /// Private data (224 bytes).
    pub private_data: [u8; 224],
}

/// DisconnectRequest (IBA 12.6.10, table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmDreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The other side's.
    pub remote_comm_id: u32,
    /// The other side's QPN (24 bits).
    pub remote_qpn: u32,
    /// Private data (220 bytes).
    pub private_data: [u8; 220],
}

/// ServiceIDResReq (IBA 12.11.1, table 119): the UD resolution of a service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID.
    pub request_id: u32,
    /// P_Key.
    pub pkey: u16,
    /// The service ID ([`service_id`] in [`RDMA_PS_UDP`]).
    pub service_id: u64,
    /// Private data (216 bytes; rdma_cm's `cma_hdr` first).
    pub private_data: [u8; 216],
}

/// ServiceIDResReqResp (IBA 12.11.2, table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRep {
    /// The request's ID.
    pub request_id: u32,
    /// Status (0: valid QP).
    pub status: u8,
    /// Length of the additional information.
    pub ari_len: u8,
    /// Vendor ID (24 bits, split on the wire).
    pub vendor_id: u32,
    /// The service's QPN (24 bits).
    pub qpn: u32,
    /// The service ID.
    pub service_id: u64,
    /// The service's Q_Key.
    pub qkey: u32,
    /// Additional information (72 bytes).
    pub ari: [u8; 72],
    /// Private data (136 bytes).
    pub private_data: [u8; 136],
}

/// A CM message: the class data of a CM MAD, by attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ.
    Req(Box<CmReq>),
    /// MRA.
    Mra(Box<CmMra>),
    /// REJ.
    Rej(Box<CmRej>),
    /// REP.
    Rep(Box<CmRep>),
    /// RTU.
    Rtu(Box<CmIds>),
    /// DREQ.
    Dreq(Box<CmDreq>),
    /// DREP.
    Drep(Box<CmIds>),
    /// SIDR_REQ.
    SidrReq(Box<SidrReq>),
    /// SIDR_REP.
    SidrRep(Box<SidrRep>),
}

fn arr<const N: usize>(d: &[u8], at: usize) -> [u8; N] {
    d[at..at + N].try_into().expect("within the class data")
}

impl CmMessage {
    /// Its attribute.
    pub fn attr(&self) -> CmAttr {
        match self {
            Self::Req(_) => CmAttr::Req,
            Self::Mra(_) => CmAttr::Mra,
            Self::Rej(_) => CmAttr::Rej,
            Self::Rep(_) => CmAttr::Rep,
            Self::Rtu(_) => CmAttr::Rtu,
            Self::Dreq(_) => CmAttr::Dreq,
            Self::Drep(_) => CmAttr::Drep,
            Self::SidrReq(_) => CmAttr::SidrReq,
            Self::SidrRep(_) => CmAttr::SidrRep,
        }
    }

    /// Parses the class data `d` (at least [`DATA_LEN`] bytes) of attribute `attr`.
    pub fn parse(attr: CmAttr, d: &[u8]) -> Result<Self> {
        need("CM message", DATA_LEN, d.len())?;
        let ids = |d: &[u8]| (LOCAL_COMM_ID.get(d) as u32, REMOTE_COMM_ID.get(d) as u32);
        Ok(match attr {
            CmAttr::Req => Self::Req(Box::new(CmReq {
                local_comm_id: LOCAL_COMM_ID.get(d) as u32,
                vendor_id: f(5, 0, 24).get(d) as u32,
                service_id: f(8, 0, 64).get(d),
                local_ca_guid: f(16, 0, 64).get(d),
                local_qkey: f(28, 0, 32).get(d) as u32,
                local_qpn: f(32, 0, 24).get(d) as u32,
                responder_resources: d[35],
                initiator_depth: d[39],
                remote_cm_response_timeout: f(43, 0, 5).get(d) as u8,
                transport: f(43, 5, 2).get(d) as u8,
                e2e_flow_control: f(43, 7, 1).get(d) != 0,
                starting_psn: f(44, 0, 24).get(d) as u32,
                local_cm_response_timeout: f(47, 0, 5).get(d) as u8,
                retry_count: f(47, 5, 3).get(d) as u8,
                pkey: f(48, 0, 16).get(d) as u16,
                path_mtu: f(50, 0, 4).get(d) as u8,
                rnr_retry_count: f(50, 5, 3).get(d) as u8,
                max_cm_retries: f(51, 0, 4).get(d) as u8,
                srq: f(51, 4, 1).get(d) != 0,
                primary: CmPath::parse(d, 52),
                alternate: CmPath::parse(d, 96),
                private_data: arr(d, 140),
            })),
            CmAttr::Rep => {
                let (l, r) = ids(d);
                Self::Rep(Box::new(CmRep {
                    local_comm_id: l,
                    remote_comm_id: r,
                    local_qkey: f(8, 0, 32).get(d) as u32,
                    local_qpn: f(12, 0, 24).get(d) as u32,
                    vendor_id: u32::from(d[15]) << 16 | u32::from(d[19]) << 8 | u32::from(d[23]),
                    starting_psn: f(20, 0, 24).get(d) as u32,
                    responder_resources: d[24],
                    initiator_depth: d[25],
                    target_ack_delay: f(26, 0, 5).get(d) as u8,
                    failover_accepted: f(26, 5, 2).get(d) as u8,
                    e2e_flow_control: f(26, 7, 1).get(d) != 0,
                    rnr_retry_count: f(27, 0, 3).get(d) as u8,
                    srq: f(27, 3, 1).get(d) != 0,
                    local_ca_guid: f(28, 0, 64).get(d),
                    private_data: arr(d, 36),
                }))
            }
            CmAttr::Rej => {
                let (l, r) = ids(d);
                Self::Rej(Box::new(CmRej {
                    local_comm_id: l,
                    remote_comm_id: r,
                    message_rejected: f(8, 0, 2).get(d) as u8,
                    ari_len: f(9, 0, 7).get(d) as u8,
                    reason: f(10, 0, 16).get(d) as u16,
                    ari: arr(d, 12),
                    private_data: arr(d, 84),
                }))
            }
            CmAttr::Mra => {
                let (l, r) = ids(d);
                Self::Mra(Box::new(CmMra {
                    local_comm_id: l,
                    remote_comm_id: r,
                    message_mraed: f(8, 0, 2).get(d) as u8,
                    service_timeout: f(9, 0, 5).get(d) as u8,
                    private_data: arr(d, 10),
                }))
            }
            CmAttr::Rtu | CmAttr::Drep => {
                let (l, r) = ids(d);
                let m = Box::new(CmIds {
                    local_comm_id: l,
                    remote_comm_id: r,
                    private_data: arr(d, 8),
                });
                if attr == CmAttr::Rtu {
                    Self::Rtu(m)
                } else {
                    Self::Drep(m)
                }
            }
            CmAttr::Dreq => {
                let (l, r) = ids(d);
                Self::Dreq(Box::new(CmDreq {
                    local_comm_id: l,
                    remote_comm_id: r,
                    remote_qpn: f(8, 0, 24).get(d) as u32,
                    private_data: arr(d, 12),
                }))
            }
            CmAttr::SidrReq => Self::SidrReq(Box::new(SidrReq {
                request_id: LOCAL_COMM_ID.get(d) as u32,
                pkey: f(4, 0, 16).get(d) as u16,
                service_id: f(8, 0, 64).get(d),
                private_data: arr(d, 16),
            })),
            CmAttr::SidrRep => Self::SidrRep(Box::new(SidrRep {
                request_id: LOCAL_COMM_ID.get(d) as u32,
                status: d[4],
                ari_len: d[5],
                vendor_id: (f(6, 0, 16).get(d) as u32) << 8 | u32::from(d[11]),
                qpn: f(8, 0, 24).get(d) as u32,
                service_id: f(12, 0, 64).get(d),
                qkey: f(20, 0, 32).get(d) as u32,
                ari: arr(d, 24),
                private_data: arr(d, 96),
            })),
        })
    }

    /// Writes the class data into `d` (at least [`DATA_LEN`] bytes, all of them
    /// written: reserved bits are zero).
    pub fn emit(&self, d: &mut [u8]) -> Result<()> {
        need_out("CM message", DATA_LEN, d.len())?;
        let d = &mut d[..DATA_LEN];
        d.fill(0);
        let ids = |d: &mut [u8], l: u32, r: u32| {
            LOCAL_COMM_ID.set(d, l.into());
            REMOTE_COMM_ID.set(d, r.into());
        };
        match self {
            Self::Req(m) => {
                LOCAL_COMM_ID.set(d, m.local_comm_id.into());
                f(5, 0, 24).set(d, m.vendor_id.into());
                f(8, 0, 64).set(d, m.service_id);
                f(16, 0, 64).set(d, m.local_ca_guid);
                f(28, 0, 32).set(d, m.local_qkey.into());
                f(32, 0, 24).set(d, m.local_qpn.into());
                d[35] = m.responder_resources;
                d[39] = m.initiator_depth;
                f(43, 0, 5).set(d, m.remote_cm_response_timeout.into());
                f(43, 5, 2).set(d, m.transport.into());
                f(43, 7, 1).set(d, m.e2e_flow_control.into());
                f(44, 0, 24).set(d, m.starting_psn.into());
                f(47, 0, 5).set(d, m.local_cm_response_timeout.into());
                f(47, 5, 3).set(d, m.retry_count.into());
                f(48, 0, 16).set(d, m.pkey.into());
                f(50, 0, 4).set(d, m.path_mtu.into());
                f(50, 5, 3).set(d, m.rnr_retry_count.into());
                f(51, 0, 4).set(d, m.max_cm_retries.into());
                f(51, 4, 1).set(d, m.srq.into());
                m.primary.emit(d, 52);
                m.alternate.emit(d, 96);
                d[140..].copy_from_slice(&m.private_data);
            }
            Self::Rep(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                f(8, 0, 32).set(d, m.local_qkey.into());
                f(12, 0, 24).set(d, m.local_qpn.into());
                d[15] = (m.vendor_id >> 16) as u8;
                d[19] = (m.vendor_id >> 8) as u8;
                d[23] = m.vendor_id as u8;
                f(20, 0, 24).set(d, m.starting_psn.into());
                d[24] = m.responder_resources;
                d[25] = m.initiator_depth;
                f(26, 0, 5).set(d, m.target_ack_delay.into());
                f(26, 5, 2).set(d, m.failover_accepted.into());
                f(26, 7, 1).set(d, m.e2e_flow_control.into());
                f(27, 0, 3).set(d, m.rnr_retry_count.into());
                f(27, 3, 1).set(d, m.srq.into());
                f(28, 0, 64).set(d, m.local_ca_guid);
                d[36..].copy_from_slice(&m.private_data);
            }
            Self::Rej(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                f(8, 0, 2).set(d, m.message_rejected.into());
                f(9, 0, 7).set(d, m.ari_len.into());
                f(10, 0, 16).set(d, m.reason.into());
                d[12..84].copy_from_slice(&m.ari);
                d[84..].copy_from_slice(&m.private_data);
            }
            Self::Mra(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                f(8, 0, 2).set(d, m.message_mraed.into());
                f(9, 0, 5).set(d, m.service_timeout.into());
                d[10..].copy_from_slice(&m.private_data);
            }
            Self::Rtu(m) | Self::Drep(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                d[8..].copy_from_slice(&m.private_data);
            }
            Self::Dreq(m) => {
                ids(d, m.local_comm_id, m.remote_comm_id);
                f(8, 0, 24).set(d, m.remote_qpn.into());
                d[12..].copy_from_slice(&m.private_data);
            }
            Self::SidrReq(m) => {
                LOCAL_COMM_ID.set(d, m.request_id.into());
                f(4, 0, 16).set(d, m.pkey.into());
                f(8, 0, 64).set(d, m.service_id);
                d[16..].copy_from_slice(&m.private_data);
            }
            Self::SidrRep(m) => {
                LOCAL_COMM_ID.set(d, m.request_id.into());
                d[4] = m.status;
                d[5] = m.ari_len;
                f(6, 0, 16).set(d, u64::from(m.vendor_id >> 8));
                f(8, 0, 24).set(d, m.qpn.into());
                d[11] = m.vendor_id as u8;
                f(12, 0, 64).set(d, m.service_id);
                f(20, 0, 32).set(d, m.qkey.into());
                d[24..96].copy_from_slice(&m.ari);
                d[96..].copy_from_slice(&m.private_data);
            }
        }
        Ok(())
    }
}

/// A whole CM MAD: its header (TID, attribute modifier) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID (Linux: its agent's high 32 bits, then the local comm ID; a
    /// reply reuses the request's).
    pub tid: u64,
    /// Attribute modifier (ECE options in newer kernels: 0 sent, ignored received).
    pub attr_mod: u32,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// Parses a MAD (the payload of a GSI SEND): class [`CM_CLASS`], version
    /// [`CM_CLASS_VERSION`], method Send; anything else is an error.
    pub fn parse(mad: &[u8]) -> Result<Self> {
        let p = MadPacket::new_checked(mad)?;
        let h = MadRepr::parse(&p);
        if h.mgmt_class != CM_CLASS {
            return Err(WireError::FieldRange("MAD class is not the CM's"));
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(WireError::FieldRange("CM class version is not 2"));
        }
        if h.method != METHOD_SEND {
            return Err(WireError::FieldRange("CM method is not Send"));
        }
        let attr = CmAttr::from_u16(h.attr_id)?;
        Ok(Self {
            tid: h.tid,
            attr_mod: h.attr_mod,
            msg: CmMessage::parse(attr, p.data())?,
        })
    }

    /// Writes the 256-byte MAD into `buf`; returns [`MAD_LEN`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        need_out("CM MAD", MAD_LEN, buf.len())?;
        MadRepr {
            mgmt_class: CM_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid: self.tid,
            attr_id: self.msg.attr() as u16,
            attr_mod: self.attr_mod,
        }
        .emit(buf)?;
        self.msg.emit(&mut buf[HEADER_LEN..MAD_LEN])?;
        Ok(MAD_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid4(ip: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        g
    }

    pub(crate) fn sample_req() -> CmReq {
        let mut private_data = [0u8; 92];
        CmaHdr::ipv4([10, 0, 0, 1], 0xC001, [10, 0, 0, 2])
            .emit(&mut private_data)
            .unwrap();
        private_data[36..40].copy_from_slice(b"user");
        CmReq {
            local_comm_id: 0x1234_5678,
            vendor_id: 0,
            service_id: service_id(RDMA_PS_TCP, 18515),
            local_ca_guid: 0x0202_03ff_fe04_0506,
            local_qkey: 0,
            local_qpn: 0xAB_CDEF,
            responder_resources: 16,
            initiator_depth: 4,
            remote_cm_response_timeout: 20,
            transport: 0,
            e2e_flow_control: false,
            starting_psn: 0x65_4321,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            srq: true,
            primary: CmPath {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: gid4([10, 0, 0, 1]),
                remote_gid: gid4([10, 0, 0, 2]),
                flow_label: 0xF_1234,
                packet_rate: 0x2A,
                traffic_class: 0x68,
                hop_limit: 64,
                sl: 5,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            alternate: CmPath::default(),
            private_data,
        }
    }

    /// Each field lands where ibta_vol1_c12.h puts it (byte offsets after the
    /// 24-byte MAD header), and parses back.
    #[test]
    fn req_fields_are_where_iba_puts_them() {
        let req = sample_req();
        let mad = CmMad {
            tid: 0xAAAA_BBBB_1234_5678,
            attr_mod: 0,
            msg: CmMessage::Req(Box::new(req)),
        };
        let mut b = [0xEEu8; MAD_LEN];
        assert_eq!(mad.emit(&mut b).unwrap(), MAD_LEN);
        let d = &b[HEADER_LEN..];
        assert_eq!(&b[..4], &[1, CM_CLASS, 2, METHOD_SEND]);
        assert_eq!(&b[16..18], &[0, 0x10]);
        assert_eq!(&d[0..4], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&d[4..8], &[0, 0, 0, 0], "reserved and vendor ID zero");
        assert_eq!(&d[8..16], &[0, 0, 0, 0, 1, 6, 0x48, 0x53]);
        assert_eq!(&d[32..36], &[0xAB, 0xCD, 0xEF, 16]);
        assert_eq!(d[39], 4);
        assert_eq!(d[43], 20 << 3, "timeout 20, RC, no E2E");
        assert_eq!(&d[44..48], &[0x65, 0x43, 0x21, (20 << 3) | 7]);
        assert_eq!(&d[48..52], &[0xFF, 0xFF, (3 << 4) | 6, (15 << 4) | 8]);
        assert_eq!(&d[52..56], &[0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(&d[56 + 10..56 + 16], &[0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(&d[88..92], &[0xF1, 0x23, 0x40, 0x2A], "flow label, rate");
        assert_eq!(&d[92..96], &[0x68, 64, 5 << 4, 18 << 3]);
        assert!(d[96..140].iter().all(|&x| x == 0), "no alternate path");
        assert_eq!(&d[140..142], &[0, 0x40]);
        assert_eq!(&d[176..180], b"user");
        let back = CmMad::parse(&b).unwrap();
        assert_eq!(back, mad);
        match back.msg {
            CmMessage::Req(r) => {
                let h = CmaHdr::parse(&r.private_data).unwrap();
                assert_eq!(
                    (h.src_v4(), h.src_port, h.dst_v4()),
                    ([10, 0, 0, 1], 0xC001, [10, 0, 0, 2])
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Every message kind round-trips, with its fields at their offsets.
    #[test]
    fn every_message_roundtrips() {
        let mut pd = [0u8; 224];
        pd[0] = 0x5A;
        pd[223] = 0xA5;
        let msgs = [
            CmMessage::Rep(Box::new(CmRep {
                local_comm_id: 1,
                remote_comm_id: 2,
                local_qkey: 3,
                local_qpn: 0x12_3456,
                vendor_id: 0xAB_CDEF,
                starting_psn: 0xFE_DCBA,
                responder_resources: 8,
                initiator_depth: 9,
                target_ack_delay: 17,
                failover_accepted: 2,
                e2e_flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                local_ca_guid: 0x0102_0304_0506_0708,
                private_data: [7u8; 196],
            })),
            CmMessage::Rej(Box::new(CmRej {
                local_comm_id: 4,
                remote_comm_id: 5,
                message_rejected: 0,
                ari_len: 0,
                reason: rej_reason::INVALID_SERVICE_ID,
                ari: [0u8; 72],
                private_data: [1u8; 148],
            })),
            CmMessage::Mra(Box::new(CmMra {
                local_comm_id: 6,
                remote_comm_id: 7,
                message_mraed: 1,
                service_timeout: 24,
                private_data: [2u8; 222],
            })),
            CmMessage::Rtu(Box::new(CmIds {
                local_comm_id: 8,
                remote_comm_id: 9,
                private_data: pd,
            })),
            CmMessage::Dreq(Box::new(CmDreq {
                local_comm_id: 10,
                remote_comm_id: 11,
                remote_qpn: 0x00_0042,
                private_data: [3u8; 220],
            })),
            CmMessage::Drep(Box::new(CmIds {
                local_comm_id: 12,
                remote_comm_id: 13,
                private_data: pd,
            })),
            CmMessage::SidrReq(Box::new(SidrReq {
                request_id: 14,
                pkey: 0xFFFF,
                service_id: service_id(RDMA_PS_UDP, 7174),
                private_data: [4u8; 216],
            })),
            CmMessage::SidrRep(Box::new(SidrRep {
                request_id: 14,
                status: 0,
                ari_len: 0,
                vendor_id: 0x11_2233,
                qpn: 0x00_0099,
                service_id: service_id(RDMA_PS_UDP, 7174),
                qkey: RDMA_UDP_QKEY,
                ari: [0u8; 72],
                private_data: [5u8; 136],
            })),
        ];
        for m in msgs {
            let mad = CmMad {
                tid: 77,
                attr_mod: 0,
                msg: m,
            };
            let mut b = [0u8; MAD_LEN];
            mad.emit(&mut b).unwrap();
            assert_eq!(CmMad::parse(&b).unwrap(), mad, "{:?}", mad.msg.attr());
            let d = &b[HEADER_LEN..];
            match &mad.msg {
                CmMessage::Rep(_) => {
                    assert_eq!(&d[12..16], &[0x12, 0x34, 0x56, 0xAB]);
                    assert_eq!(&d[20..24], &[0xFE, 0xDC, 0xBA, 0xEF]);
                    assert_eq!(d[19], 0xCD);
                    assert_eq!(&d[26..28], &[(17 << 3) | (2 << 1) | 1, (7 << 5) | (1 << 4)]);
                }
                CmMessage::Rej(_) => assert_eq!(&d[10..12], &[0, 8]),
                CmMessage::Mra(_) => assert_eq!(&d[8..10], &[1 << 6, 24 << 3]),
                CmMessage::Dreq(_) => assert_eq!(&d[8..13], &[0, 0, 0x42, 0, 3]),
                CmMessage::SidrRep(_) => {
                    assert_eq!(&d[6..12], &[0x11, 0x22, 0, 0, 0x99, 0x33]);
                    assert_eq!(&d[20..24], &[1, 0x23, 0x45, 0x67]);
                }
                _ => {}
            }
        }
    }

    #[test]
    fn bad_mads_are_errors() {
        let mut b = [0u8; MAD_LEN];
        CmMad {
            tid: 1,
            attr_mod: 0,
            msg: CmMessage::Rtu(Box::new(CmIds {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: [0u8; 224],
            })),
        }
        .emit(&mut b)
        .unwrap();
        assert!(CmMad::parse(&b[..200]).is_err(), "short");
        for (at, v) in [
            (0, 2u8),
            (1, 0x81),
            (2, 1),
            (3, 0x83),
            (17, 0x19),
            (17, 0x1A),
        ] {
            let mut x = b;
            x[at] = v;
            assert!(CmMad::parse(&x).is_err(), "byte {at} = {v:#x}");
        }
        assert!(CmaHdr::parse(&[1u8; 36]).is_err(), "version 1");
        let mut h = [0u8; 36];
        h[1] = 0x50;
        assert!(CmaHdr::parse(&h).is_err(), "IP version 5");
        assert!(CmaHdr::parse(&h[..35]).is_err());
        assert!(CmMad::parse(&b).is_ok());
    }
}
