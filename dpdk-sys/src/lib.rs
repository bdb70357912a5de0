//! Raw FFI to the system DPDK (22.11, as Debian 12 ships it).
//!
//! Everything here is `unsafe` and mirrors the C API one to one: the
//! bindgen output for the public headers listed in `csrc/wrapper.h`, plus
//! `shim_*` functions that forward to DPDK's `static inline` functions
//! (burst I/O, mbuf alloc/free/append/prepend/adj/trim, external buffers,
//! ring burst enqueue/dequeue, lcore id, `rte_errno`), which bindgen cannot
//! call. The safe layer is the `dpdk` crate (`dpdk/`, beside it).
//!
//! See README.md for why this crate exists instead of the crates.io ones.

#![allow(non_upper_case_globals)]
#![allow(non_camel_case_types)]
#![allow(non_snake_case)]
#![allow(dead_code)]
#![allow(clippy::all)]
#![allow(rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim links and the bindings describe the same mbuf layout as C:
    /// `rte_mbuf` is two cache lines in 22.11.
    #[test]
    fn mbuf_is_two_cache_lines() {
        assert_eq!(core::mem::size_of::<rte_mbuf>(), 128);
    }

    #[test]
    fn lcore_id_outside_eal_is_any() {
        // Before (and without) rte_eal_init the calling thread has no lcore.
        let id = unsafe { shim_rte_lcore_id() };
        assert_eq!(id, u32::MAX);
    }
}
