//! The safe DPDK layer of the project, used by both the NIC and the switch.
//!
//! It wraps the raw `dpdk-sys` binding in types that make the datapath's
//! rules hold by construction (docs/design.md §3, §10):
//!
//! * [`Eal`]: initialised once per process; [`Eal::for_tests`] is the shared
//!   test EAL (`--no-huge --no-pci --no-shconf`).
//! * [`Mempool`] and the owned [`Mbuf`] (`repr(transparent)`, frees on drop,
//!   bounds-checked data access), [`Burst`] (a fixed array of mbufs that goes
//!   straight to `rte_eth_rx_burst`/`rte_eth_tx_burst`, no allocation).
//! * [`Port`] with unique, `Send` [`RxQueue`] / [`TxQueue`] handles that burst
//!   with `&mut self`; run-time vdevs (`net_null`, `net_tap`,
//!   `net_af_packet`, ...) and back-to-back ring pairs ([`Port::ring_pair`]);
//!   `net_af_xdp` ports on a kernel interface shared with the kernel
//!   ([`af_xdp`]: rsnic's XDP program, `af_xdp:IF`; [`xdp_link`] detaches
//!   it at exit from a process that never closed its port).
//! * [`Ring`] (mbuf rings), [`lcore::spawn_pinned`] (threads pinned with
//!   `core_affinity` and registered as EAL lcores), [`TscClock`] (TSC in ns).
//! * [`ExtBuf`]: memory that mbufs point into without copying.
//!
//! Every fallible call returns a typed [`Error`] carrying `rte_strerror` text.

#![deny(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

pub mod af_xdp;
mod burst;
pub mod census;
mod clock;
mod eal;
mod error;
mod extbuf;
pub mod lcore;
mod mbuf;
mod mempool;
mod port;
mod ring;
mod stash;
pub mod tap_signal;
pub mod xdp_link;

pub use burst::{Burst, Drain, BURST_SIZE};
pub use clock::TscClock;
pub use eal::{set_log_sink, tool_args, Eal, LogSink};
pub use error::{Error, Result};
pub use extbuf::ExtBuf;
pub use mbuf::Mbuf;
pub use mempool::Mempool;
pub use port::{needs_pci, Link, LinkWatch, Port, PortConfig, PortStats, RxQueue, TxQueue};
pub use ring::{Ring, RingConsumer, RingProducer};
pub use stash::{MbufStash, PREFETCH_AHEAD, STASH_REFILL};

/// A hint to load the cache line at `p` ahead of use, as DPDK's
/// `rte_prefetch0`: it never faults, whatever the address (a stale or
/// dangling pointer only wastes the load), so it is safe to call with any.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, whatever the address;
    // SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Raw binding, for the rare call the safe layer does not cover.
pub use dpdk_sys as sys;
