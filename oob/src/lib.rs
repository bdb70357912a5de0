//! Out-of-band connection set-up of RC queue pairs over TCP (docs/connection.md):
//! what two ends exchange before their NICs talk RoCEv2.
//!
//! - [`exchange`]: the project's own one-line exchange (QPN, PSN, IP, MAC, rkey, VA,
//!   MTU, CC and its extensions), strict parsing and the compatibility check;
//! - [`perftest`]: perftest 4.5's exchange, byte for byte, so that `roce-perf` and the
//!   real `ib_write_bw`, `ib_read_lat`, ... set up QPs with each other.
//!
//! Not the NIC's core: the slow path of tools and programs, blocking and allocating
//! freely. `nic` re-exports both as `nic::exchange` and `nic::perftest_exchange`.
#![deny(unsafe_code)]

pub mod exchange;
pub mod perftest;
