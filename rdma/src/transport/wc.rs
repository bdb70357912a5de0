//! Work requests and work completions, with the status and opcode values of ibverbs
//! (`enum ibv_wc_status`, `enum ibv_wc_opcode`), which follow IBA 11.4.2.1.

use super::mr::MwBind;

/// Completion status (`ibv_wc_status`; numeric values as in libibverbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR: a message longer than the receive buffer.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR: bad lkey / range / permission in a local SGE.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR: the QP went to the error state before this WR finished.
    WrFlushErr = 5,
    /// IBV_WC_MW_BIND_ERR: a memory window bind the window's or region's state,
    /// rights or range forbid (IBA 10.6.7.2.1).
    MwBindErr = 6,
    /// IBV_WC_BAD_RESP_ERR: unexpected response opcode or length.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR: the responder NAK-ed with "invalid request" (0x61).
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR: the responder NAK-ed with "remote access error" (0x62).
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR: the responder NAK-ed with "remote operational error" (0x63).
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR: the transport retry counter ran out (timeouts).
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR: the RNR retry counter ran out.
    RnrRetryExcErr = 13,
    /// IBV_WC_GENERAL_ERR.
    GeneralErr = 21,
}

/// Completion opcode (`ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW.
    BindMw = 5,
    /// IBV_WC_LOCAL_INV.
    LocalInv = 6,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
    /// A receive of a SEND with Invalidate: `IBV_WC_RECV` with `IBV_WC_WITH_INV` in
    /// `wc_flags` and the invalidated R_Key in `invalidated_rkey` (here: in
    /// [`WorkCompletion::imm`]). Not an ibverbs value: the library translates it.
    RecvInv = 130,
}

impl WcOpcode {
    /// A receive queue's completion (`IBV_WC_RECV` and after: the opcode's top bit,
    /// as in `enum ibv_wc_opcode`), which goes to the QP's receive CQ.
    pub fn is_recv(self) -> bool {
        self as u8 & 0x80 != 0
    }
}

/// A work completion (`ibv_wc`, the fields this transport fills). 32 bytes, as
/// before the UD fields (`src_qp`, `grh`) were added: they fill its padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's id from the work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes placed; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data (network order value as sent), for *_WITH_IMM; for
    /// [`WcOpcode::RecvInv`], the R_Key the SEND invalidated.
    pub imm: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    /// A receive completion of a message whose last packet carried the
    /// BTH SE bit (Solicited Event, IBA 9.2.2): what a CQ armed for
    /// solicited completions only waits for (`ibv_req_notify_cq(3)`, IBA
    /// 11.4.2.2). False for every other completion.
    pub solicited: bool,
    /// The sender's QP number (`ibv_wc.src_qp`): a UD receive's DETH source QP
    /// (IBA 11.4.2.1); 0 for every other completion.
    pub src_qp: u32,
    /// The receive buffer starts with the 40-byte GRH slot (`IBV_WC_GRH` in
    /// `ibv_wc.wc_flags`, IBA 11.4.1.2): every UD receive. False otherwise.
    pub grh: bool,
}

impl WorkCompletion {
    /// A blank completion (all zero: `wr_id` 0, success, SEND), to fill
    /// the arrays that completions are polled into.
    pub const BLANK: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        solicited: false,
        src_qp: 0,
        grh: false,
    };
}

/// A scatter/gather element: a local buffer inside a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// The operation of a send work request (`ibv_wr_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM.
    SendImm(u32),
    /// IBV_WR_RDMA_WRITE.
    Write {
        /// Remote address.
        remote_va: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    WriteImm {
        /// Remote address.
        remote_va: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// IBV_WR_RDMA_READ (the local SGE receives the data).
    Read {
        /// Remote address.
        remote_va: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP (the local 8-byte SGE receives the original value).
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_va: u64,
        /// Remote key.
        rkey: u32,
        /// Compare operand.
        compare: u64,
        /// Swap operand.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD (the local 8-byte SGE receives the original value).
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_va: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// IBV_WR_SEND_WITH_INV: a SEND whose last packet asks the responder to
    /// invalidate this R_Key of its own (a type 2 memory window, IBA 10.6.7.2.4).
    SendInv(u32),
    /// IBV_WR_LOCAL_INV: invalidate this R_Key of a type 2 memory window of this
    /// QP's device; no packet (IBA 10.6.7.2.4).
    LocalInv(u32),
    /// IBV_WR_BIND_MW: bind a memory window; no packet (IBA 10.6.7.2.1).
    BindMw(MwBind),
}

// A send work request fits the NIC's 64-byte doorbell slot: every operation's
// operands, the bind's included, leave room for the tag in their padding.
const _: () = assert!(core::mem::size_of::<SendOp>() == 32);

impl SendOp {
    /// The `imm` of this operation's send completion: `Some(0)` for an
    /// operation with immediate, whose completion says so
    /// (IBV_WC_WITH_IMM, the value 0) as rxe's and mlx5's do; None otherwise.
    pub fn completion_imm(&self) -> Option<u32> {
        matches!(self, SendOp::SendImm(_) | SendOp::WriteImm { .. }).then_some(0)
    }

    /// A local operation (bind, local invalidate): executed by the device on its
    /// own tables, no packet, completed in send-queue order.
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::LocalInv(_) | SendOp::BindMw(_))
    }

    /// The completion opcode of this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendImm(_) | SendOp::SendInv(_) => WcOpcode::Send,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::Write { .. } | SendOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// READ or ATOMIC: the requester waits for response data.
    pub fn needs_response(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// An ATOMIC.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
}

/// A send work request (`ibv_send_wr` with one SGE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's id, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local buffer (source for SEND/WRITE, destination for READ/ATOMIC).
    pub sge: Sge,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Set the BTH SE bit on the last packet.
    pub solicited: bool,
}

impl SendWr {
    /// A work request for `op` over `sge` that completes with a work
    /// completion (`IBV_SEND_SIGNALED`) and does not set SE.
    pub fn signaled(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
        SendWr {
            wr_id,
            op,
            sge,
            signaled: true,
            solicited: false,
        }
    }
}

/// An address handle of the NIC's (`ibv_ah`): the transport carries it from a UD work
/// request to the packet it sends ([`super::TxPacket::ah`]) and never looks inside;
/// the NIC resolves it to the destination's IP and MAC. Never 0, so that an
/// `Option<AhId>` takes 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhId(pub core::num::NonZeroU32);

/// Where a UD work request goes (`ibv_send_wr.wr.ud`: `ah`, `remote_qpn`,
/// `remote_qkey`), given beside the work request to [`super::Qp::post_send_ud`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// The NIC's address handle of the destination port.
    pub ah: AhId,
    /// The destination QP (24 bits).
    pub remote_qpn: u32,
    /// The destination's Q_Key; with its high bit set the sending QP's own Q_Key is
    /// sent instead (IBA 10.2.4.4, rxe `init_req_packet`).
    pub remote_qkey: u32,
}

impl UdDest {
    /// The Q_Key the DETH carries when the sending QP's own is `own` (IBA 10.2.4.4).
    pub fn effective_qkey(&self, own: u32) -> u32 {
        if self.remote_qkey & 0x8000_0000 != 0 {
            own
        } else {
            self.remote_qkey
        }
    }
}

/// A receive work request (`ibv_recv_wr` with one SGE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's id.
    pub wr_id: u64,
    /// Buffer for the incoming SEND.
    pub sge: Sge,
}
