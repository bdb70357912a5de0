//! The poll-mode RoCEv2 NIC engine (DESIGN.md §5).
//!
//! Pure building blocks (testable without DPDK) and the DPDK shell that runs
//! them on poll-mode lcores.

pub mod counters;
pub mod engine;
pub mod exchange;
pub mod impair;
pub mod io;
pub mod pcapng;
pub mod perftest_exchange;
pub mod scheduler;
pub mod shard;
pub mod timer_wheel;
pub mod verbs;
