//! roce-sim: a deterministic discrete-event simulator of a RoCEv2 datacenter fabric
//! that runs the project's own code at scale (issue 16): the RC transport
//! (`rdma::transport::Qp`), congestion control (`cc`), the NIC's per-QP core
//! (`qpcore`) with its flow scheduler and timing wheel (`sched`) in every host ([`nic`]), and the switch core (`switch`:
//! routing with ECMP, shaped egress queues, WRED/ECN, INT push at dequeue) in every
//! switch ([`fabric`]). Nothing here re-implements them; the simulator adds links,
//! topologies ([`topo`]), workloads ([`workload`]), the event loop ([`event`]) and the
//! report ([`report`]). Time is simulated nanoseconds; the run is a function of its
//! inputs and seed. See docs/sim.md.
//!
//! Beside it, [`bottleneck`]: the one-bottleneck packet-level model that proves the CC
//! algorithms alone (one queue, no transport; `tests/bottleneck_model.rs`,
//! `examples/bottleneck.rs`), moved here from the `cc` crate so that `cc` holds the
//! algorithms only.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod bottleneck;
pub mod event;
pub mod fabric;
pub mod frame;
pub mod nic;
pub mod report;
pub mod scenario;
pub mod topo;
pub mod workload;
