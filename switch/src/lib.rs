//! The pure core of the DPDK software switch (docs/design.md §6): a static LPM
//! forwarding table, per-port egress shaping at the link speed B, byte-bounded queues
//! with a strict high-priority class for ACK/NAK/CNP, WRED/ECN on the instantaneous queue
//! as in the LDCP draft (004 section 2.1, Not-ECT drop at K per section 2.3), and INT-MD
//! v2.0 hop records at dequeue carrying what HPCC++ needs (000 section 3: ts, qlen,
//! txBytes, B, switch_ID, port_ID).
//!
//! Functional core, imperative shell (docs/design.md §2): time is an argument in ns,
//! nothing reads a clock, nothing allocates per packet, nothing depends on DPDK (the DPDK shell,
//! the `dataplane` module, is behind the default feature `dataplane`). The DPDK poll loop feeds [`Switch::receive`] and drains [`Switch::dequeue`]; the core is
//! generic over the packet handle through [`PacketBuf`].
//!
//! Wire formats come from `rdma::wire` (Ethernet/IPv4/UDP views, the INT container and
//! its push). See `docs/switch.md`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod classify;
pub mod config;
pub mod counters;
#[cfg(feature = "dataplane")]
pub mod dataplane;
pub mod drop_reason;
pub mod fib;
pub mod int_push;
pub mod packet;
pub mod queue;
pub mod rewrite;
pub mod shaper;
pub mod shared_buffer;
pub mod switch;
pub mod wred;

pub use classify::CTRL_OPCODES;
pub use config::{Config, ConfigError, PortSettings, Quantity, Route, SwitchSettings};
pub use counters::{PortCounters, StatsLine};
pub use fib::ecmp_hash;
pub use packet::{FrameBuf, PacketBuf};
pub use queue::PktQueue;
pub use shaper::{wire_bytes, Shaper};
pub use shared_buffer::SharedBuffer;
pub use switch::{Class, DropReason, Enqueued, Rejected, Switch, BURST};
pub use wred::{Rng, RngBatch, Wred, WredAction};
