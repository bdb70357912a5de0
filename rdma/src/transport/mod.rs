//! The RC transport (IBA chapter 9): queue pairs as pure state machines, memory regions,
//! work requests and completions.

pub mod mr;
pub mod qp;
pub mod wc;

pub use mr::{Access, AccessError, MemorySpace, Mr, MrTable, VecMemory};
pub use qp::{Payload, Qp, QpConfig, QpCounters, QpError, QpEvent, QpState, TxPacket};
pub use wc::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};
