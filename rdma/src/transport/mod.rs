//! The RC, UC and UD transports (IBA chapter 9): queue pairs as pure state machines, memory regions,
//! work requests and completions. A [`Qp`] composes the roles Linux rxe splits it into:
//! requester (`rxe_req.c`), completer (`rxe_comp.c`), responder (`rxe_resp.c`), plus
//! the project's CC-extension state.

mod cc_ext;
mod completer;
pub mod config;
mod inline_deque;
pub mod mr;
mod output;
pub mod qp;
mod requester;
mod responder;
mod rq;
pub mod sack;
pub mod sgl;
pub mod srq;
pub mod wc;

pub use crate::wire::bth::Service;
pub use mr::{
    Access, AccessError, MemorySpace, Mr, MrTable, Mw, MwBind, MwBinding, MwError, MwType,
    VecMemory,
};
pub use qp::{
    nest_hot_lines, EchoedHops, Payload, Qp, QpConfig, QpCounters, QpError, QpEvent, QpState,
    TxPacket, UnreliableCounters,
};
pub use sack::{LossRecovery, SrCounters, SrParams};
pub use srq::Srq;
pub use wc::{AhId, RecvWr, SendOp, SendWr, Sge, UdDest, WcOpcode, WcStatus, WorkCompletion};
