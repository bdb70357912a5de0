//! The poll-mode RoCEv2 NIC engine (docs/design.md §5).
//!
//! Pure building blocks (testable without DPDK) and the DPDK shell that runs
//! them on poll-mode lcores. A program opens a device ([`device`]) and uses
//! the handles of [`verbs`]; the engine ([`engine`]) runs the datapath; the
//! two meet only in [`contract`]. Unsafe code is denied outside `sys`
//! (registered memory, the eventfd and futex system calls).

#![deny(unsafe_code)]

pub mod contract;
pub mod control;
pub mod counters;
pub mod device;
mod doorbell;
pub mod engine;
pub mod error;
pub mod host;
pub mod io;
pub mod notify;
pub mod park;
pub mod pcapng;
pub mod port_shaper;
pub mod shard;
pub mod shmem;
mod sync;
#[allow(unsafe_code)]
mod sys;
pub mod verbs;

/// The flow scheduler and the timing wheel live in the pure `sched` crate, the loss
/// backoff of a QP without CC in the per-QP core `qpcore` (both shared with
/// `roce-sim`); re-exported under their old paths.
pub use qpcore::gbn_backoff;
pub use sched::{scheduler, timer_wheel};

/// Out-of-band connection set-up (the project's exchange and perftest's) lives in the
/// crate `oob`: the slow path of tools, not the NIC's core; re-exported under its old
/// paths.
pub use oob::{exchange, perftest as perftest_exchange};
