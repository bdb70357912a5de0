//! The one module of `nic` with `unsafe` code (the crate denies it
//! everywhere else): access to registered memory, the caller's memory a
//! region is registered over, and the eventfd system calls of completion
//! notification and of parking.
//!
//! # Registered memory
//! Registered bytes are shared like a NIC's DMA memory: the program, the
//! engine's RX path (placing a peer's WRITE, SEND or READ response) and the
//! engine's TX path (reading what it sends, copying or zero-copy through an
//! attached mbuf) all reach them, from different threads. The rules here:
//! - No reference is ever formed over a whole region: the program's
//!   [`MemoryRegion::write`]/[`MemoryRegion::read`], its copies between
//!   regions and the engine's RX placement ([`RawMemory`]) copy through raw
//!   pointers.
//! - The TX path forms a shared reference over exactly the bytes of one
//!   operation in flight ([`in_flight`], and an attached mbuf's data), for
//!   as long as it hashes or copies them. The verbs contract (IBA 10.7.2.2;
//!   `ibv_post_send(3)`: the buffer must not change until the work
//!   completes) says nobody writes those bytes meanwhile. A program or a
//!   peer that does races with the NIC, as it would with hardware, and the
//!   bytes sent are unspecified; Rust has no atomic `memcpy` (RFC 3301) to
//!   make such a race defined without losing vectorised copies.
//! - Every access is range-checked first (by [`MrTable`] for the engine,
//!   by the handle's length for the program), and the memory lives as long
//!   as any handle, engine table entry or attached mbuf refers to it
//!   ([`ExtBuf`]'s reference count).
//!
//! [`MrTable`]: rdma::transport::MrTable
//! [`MemoryRegion::write`]: crate::verbs::MemoryRegion::write
//! [`MemoryRegion::read`]: crate::verbs::MemoryRegion::read
//! [`ExtBuf`]: dpdk::ExtBuf
//!
//! # Files
//! - [`memory`]: the engine's access to registered memory ([`RawMemory`], [`in_flight`]);
//! - `region`: the program's access ([`crate::verbs::MemoryRegion`]'s copies) and
//!   [`crate::device::Device::reg_user_mr`] (the caller's memory);
//! - [`eventfd`]: the eventfd system calls;
//! - [`futex`]: the futex a parked thread sleeps on ([`crate::park`]);
//! - [`sched`]: the timer slack and scheduler slice of a thread that parks,
//!   and the CPU a thread runs on;
//! - [`netlink`]: host mode's rtnetlink socket (slow path);
//! - [`shmem`]: memfds, the program's mappings and moving its pages onto a
//!   memfd ([`crate::shmem`], slow path).
//!
//! `memory` and `eventfd` use nothing of the crate; `region` adds methods to the
//! verbs' types and nothing imports from it.

pub(crate) mod eventfd;
pub(crate) mod futex;
pub(crate) mod memory;
pub(crate) mod netlink;
mod region;
pub(crate) mod sched;
pub(crate) mod shmem;

pub(crate) use eventfd::EventFd;
pub(crate) use futex::Futex;
pub(crate) use memory::{in_flight, MrMem, RawMemory};
pub(crate) use netlink::NetlinkSocket;
pub(crate) use sched::{current_cpu, set_slice_ns, set_timer_slack_ns};
