//! The per-QP core of the NIC (docs/design.md "The per-QP core"): what the NIC engine
//! does around one queue pair, pure Rust without DPDK, with time as an argument and
//! generic over where frames and completions go, so that the DPDK engine
//! (`nic/src/engine`) and the simulator (`sim/src/nic.rs`) run one copy of it.
//!
//! - [`qp_core`]: [`QpCore`], one QP's transport, CC, scheduling and timers, and the
//!   steps the drivers call; [`FrameSink`] and [`Completions`], what a driver provides;
//! - [`qp_cc`]: the glue between a QP's transport events and its congestion control;
//! - [`gbn_backoff`]: the loss backoff of a QP without congestion control.
//!
//! Uses `rdma` (the transport), `cc` (the algorithms) and `sched` (the flow
//! scheduler and the timer wheel); used by `nic` and `sim`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod gbn_backoff;
pub mod qp_cc;
pub mod qp_core;

pub use qp_core::{is_data, Completions, Fed, FrameSink, QpCore};

/// Timer wheel of a NIC's transport and CC timers: 1 us ticks ...
pub const TIMER_TICK_NS: u64 = 1_000;
/// ... and 4096 slots (one rotation is 4 ms; the 67 ms retransmit timer waits in the
/// wheel's overflow list).
pub const TIMER_SLOTS: usize = 4096;
/// Timers per QP on the wheel: the transport's (retransmit or RNR) and the four CC
/// timers.
pub const TIMERS_PER_QP: usize = 5;
/// Token-bucket depth of the pacer: a QP paced below line rate may send at most this
/// many bytes back to back after being idle. Deep enough that a poll turn of ~5 us
/// does not cap a QP paced at 100 Gbit/s (with 16 KiB, DCQCN at line rate got 17
/// Gbit/s on a ring pair, 23 with 64 KiB).
pub const PACING_BURST_BYTES: u32 = 64 << 10;
/// DSCP of RoCEv2 data and control traffic.
pub const ROCE_DSCP: u8 = 26;
