//! The NIC's flow scheduler, timing wheel and per-QP congestion-control glue
//! (DESIGN.md §5, §7), pure Rust without DPDK.
//!
//! They live apart from the `nic` crate (which links DPDK) so that the discrete-event
//! simulator `roce-sim` runs exactly the code the NIC engine runs; `nic` re-exports
//! `scheduler`, `timer_wheel` and `gbn_backoff` under their old paths
//! (`nic::scheduler`, ...).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod gbn_backoff;
pub mod qp_cc;
pub mod scheduler;
pub mod timer_wheel;
