//! RoCEv2 in pure Rust: wire formats, ICRC, the INT-MD container and the RC transport.
//!
//! This crate never depends on DPDK and never reads a clock (DESIGN.md section 2): the
//! NIC shell feeds it bytes and timestamps, and it answers with actions.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod transport;
pub mod wire;
