//! RoCEv2 in pure Rust: wire formats, ICRC, the INT-MD container and the RC transport.
//!
//! This crate never depends on DPDK and never reads a clock (docs/design.md §2): the
//! NIC shell feeds it bytes and timestamps, and it answers with actions.
//!
//! # How the NIC uses it
//!
//! RX, per frame (an mbuf it owns):
//! 1. [`wire::prepare_rx`]: if the IPv4 DSCP is the INT DSCP, copies the hop records out
//!    and strips the container in place; then verifies the ICRC in place.
//! 2. [`wire::parse_frame`] on the prepared bytes with `verify_icrc: false` (or with
//!    verification, on a read-only buffer); the `has_ccext` closure answers from the QP
//!    table whether that QP negotiated the CC extension.
//! 3. CNP (opcode 0x81) goes to the DCQCN reaction point; everything else to
//!    [`transport::Qp::on_rx`] with the protection domain's [`transport::MrTable`] and a
//!    [`transport::MemorySpace`] over registered memory.
//!
//! TX, per scheduler decision: [`transport::Qp::poll_tx`] returns a
//! [`transport::TxPacket`] (headers as a [`wire::frame::RoceRepr`], payload as a
//! reference into registered memory). Build the headers with
//! [`wire::frame::FrameBuilder::emit_headers`], attach the payload zero-copy, and
//! compute the ICRC incrementally ([`wire::frame::FrameBuilder::icrc_start`],
//! [`wire::IcrcHasher::update`], [`wire::frame::FrameBuilder::finish_icrc`]); or
//! materialise the whole frame with [`transport::TxPacket::build_frame`].
//!
//! Timers: call [`transport::Qp::on_timer`] at or after [`transport::Qp::next_timer`].
//! Outputs: [`transport::Qp::poll_cq`] (work completions with ibverbs statuses),
//! [`transport::Qp::poll_event`] (ACK/NAK/CE/timeout/probe events for the CC module).
//! CC inputs: [`transport::Qp::set_window`], [`transport::Qp::set_resp_window`],
//! [`transport::Qp::set_ack_window`] (Rx-HPCC), [`transport::Qp::send_probe`].
//!
//! Byte layouts: `docs/wire.md`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cm;
pub mod transport;
pub mod wire;
