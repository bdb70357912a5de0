//! The poll-mode RoCEv2 NIC engine (DESIGN.md §5).
//!
//! Pure building blocks (testable without DPDK) and the DPDK shell that runs
//! them on poll-mode lcores. A program opens a device ([`device`]) and uses
//! the handles of [`verbs`]; the engine ([`engine`]) runs the datapath; the
//! two meet only in [`contract`]. Unsafe code is denied outside [`sys`]
//! (registered memory and the eventfd system calls).

#![deny(unsafe_code)]

pub mod contract;
pub mod control;
pub mod counters;
pub mod device;
mod doorbell;
pub mod engine;
pub mod exchange;
pub mod host;
pub mod impair;
pub mod io;
pub mod notify;
pub mod pcapng;
pub mod perftest_exchange;
pub mod port_shaper;
pub mod shard;
mod staging;
mod sync;
#[allow(unsafe_code)]
mod sys;
pub mod verbs;

/// The flow scheduler and the timing wheel live in the pure `sched` crate (shared with
/// `roce-sim`); re-exported under their old paths.
pub use sched::{gbn_backoff, scheduler, timer_wheel};
