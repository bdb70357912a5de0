//! The NIC's flow scheduler and timing wheel (DESIGN.md §5), pure Rust without DPDK.
//!
//! They live apart from the `nic` crate (which links DPDK) so that the discrete-event
//! simulator `roce-sim` runs exactly the code the NIC engine runs; `nic` re-exports
//! both modules under their old paths (`nic::scheduler`, `nic::timer_wheel`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod scheduler;
pub mod timer_wheel;
