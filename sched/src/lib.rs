//! The NIC's flow scheduler and timing wheel (docs/design.md "The engine's loop"),
//! pure Rust without DPDK and without the transport or the CC: what decides which QP
//! sends next and when a timer fires, and nothing else.
//!
//! They live apart from the `nic` crate (which links DPDK) so that the discrete-event
//! simulator `roce-sim` runs exactly the code the NIC engine runs; the per-QP core that
//! drives them is the `qpcore` crate. `nic` re-exports `scheduler` and `timer_wheel`
//! under their old paths (`nic::scheduler`, `nic::timer_wheel`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod scheduler;
pub mod timer_wheel;
