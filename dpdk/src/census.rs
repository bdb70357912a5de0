//! Every mempool of the process, for leak checks and fault injection from
//! the control path (never the hot path: `rte_mempool_walk` takes the
//! mempool list's read lock).

use std::ffi::{c_void, CStr, CString};

use crate::error::{Error, Result};
use crate::{Eal, Mbuf};

/// One mempool's occupancy, as `rte_mempool_walk` finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool's name.
    pub name: String,
    /// Mbufs in the pool.
    pub size: u32,
    /// Mbufs allocated (not in the pool's ring; per-lcore caches count as in use).
    pub in_use: u32,
}

unsafe extern "C" fn collect(mp: *mut dpdk_sys::rte_mempool, arg: *mut c_void) {
    // SAFETY: `arg` is the Vec passed by `mempools`, `mp` a live pool (the
    // walk holds the list lock, so no pool is freed under us).
    let out = unsafe { &mut *(arg as *mut Vec<PoolUsage>) };
    // SAFETY: `mp` is a live pool (above); its name is NUL-terminated.
    let (name, size, in_use) = unsafe {
        (
            CStr::from_ptr((*mp).name.as_ptr())
                .to_string_lossy()
                .into_owned(),
            (*mp).size,
            dpdk_sys::rte_mempool_in_use_count(mp),
        )
    };
    out.push(PoolUsage { name, size, in_use });
}

/// Every mempool of this process with its size and in-use count (the
/// engines' RX/header and TX pools included, which only they hold).
pub fn mempools(_eal: &Eal) -> Vec<PoolUsage> {
    let mut out: Vec<PoolUsage> = Vec::new();
    // SAFETY: the callback only reads the pool and pushes to `out`.
    unsafe { dpdk_sys::rte_mempool_walk(Some(collect), &mut out as *mut _ as *mut c_void) };
    out
}

/// Takes every mbuf the pool named `name` can still give: the pool is then
/// exhausted until the returned mbufs are dropped (a fault-injection hook:
/// "what if the RX pool runs dry"). Fails if no pool has that name.
pub fn take_free_mbufs(_eal: &Eal, name: &str) -> Result<Vec<Mbuf>> {
    let cname = CString::new(name).map_err(|_| Error::InvalidArgument(name.into(), "NUL byte"))?;
    // SAFETY: valid C string, EAL initialised.
    let mp = unsafe { dpdk_sys::rte_mempool_lookup(cname.as_ptr()) };
    if mp.is_null() {
        return Err(Error::InvalidArgument(
            name.into(),
            "no mempool of that name",
        ));
    }
    let mut taken = Vec::new();
    loop {
        // SAFETY: a live pool (its owner keeps it while mbufs are out: a
        // pool dropped with mbufs in use is leaked, never freed).
        let m = unsafe { dpdk_sys::shim_rte_pktmbuf_alloc(mp) };
        if m.is_null() {
            return Ok(taken);
        }
        // SAFETY: a fresh mbuf we now own.
        taken.push(unsafe { Mbuf::from_raw(m) });
    }
}
