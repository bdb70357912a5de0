//! Tools and pipeline benchmarks built on the NIC and the switch.
//!
//! * [`chaos`]: the chaos soak's byte pattern, impaired link and memory census.
//! * [`fwd`]: the io-forwarding loop (our answer to `testpmd --forward-mode=io`).
//! * [`lossy`]: go-back-N against selective repeat on a lossy link (`roce-lossy`).
//! * [`memory`]: hugepages first, `--no-huge` as the fallback, for every benchmark
//!   process and its baseline.
//! * [`perftest`]: perftest's output tables, for `roce-perf`.
//! * [`testpmd`]: runs `dpdk-testpmd` on the same vdevs and reads its rates,
//!   the baseline every pipeline benchmark is a ratio against (docs/design.md §9).

#![forbid(unsafe_code)]

pub mod chaos;
pub mod fwd;
pub mod lossy;
pub mod memory;
pub mod perftest;
pub mod testbed;
pub mod testpmd;
