//! Poll-mode threads, pinned to a CPU and registered with the EAL.
//!
//! We use ordinary `std` threads rather than `rte_eal_remote_launch`, so the
//! number of cores is a run-time choice and not an EAL argument; each thread
//! registers itself with `rte_thread_register`, which gives it an lcore id
//! and therefore the mempool's per-lcore cache (without it every alloc and
//! free goes to the shared ring).

use std::thread::JoinHandle;

/// The CPUs this process may run on.
pub fn available_cores() -> Vec<usize> {
    core_affinity::get_core_ids()
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.id)
        .collect()
}

/// The calling thread's EAL lcore id, if it has one.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local.
    let id = unsafe { dpdk_sys::shim_rte_lcore_id() };
    (id != u32::MAX).then_some(id)
}

/// Registers the calling thread as an EAL lcore for as long as it lives.
pub struct LcoreRegistration {
    registered: bool,
}

impl LcoreRegistration {
    /// Registers the calling thread (the EAL must be initialised). A thread
    /// that already has an lcore id keeps it.
    pub fn register(_eal: &crate::Eal) -> LcoreRegistration {
        if lcore_id().is_some() {
            return LcoreRegistration { registered: false };
        }
        // SAFETY: EAL is up; registers the current thread.
        let rc = unsafe { dpdk_sys::rte_thread_register() };
        if rc != 0 {
            tracing::warn!(error = %crate::Error::last("rte_thread_register"), "thread not registered as an lcore; mempool caches unused");
        }
        LcoreRegistration {
            registered: rc == 0,
        }
    }
}

impl Drop for LcoreRegistration {
    fn drop(&mut self) {
        if self.registered {
            // SAFETY: this thread registered itself.
            unsafe { dpdk_sys::rte_thread_unregister() };
        }
    }
}

/// Pins the calling thread to `core`; whether the OS accepted it.
pub fn pin_current(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Spawns a named thread pinned to `core` (if that CPU exists) and
/// registered as an EAL lcore, running `f`.
pub fn spawn_pinned<F, T>(
    eal: &'static crate::Eal,
    name: &str,
    core: Option<usize>,
    f: F,
) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Some(core) = core {
                if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                    tracing::warn!(core, "could not pin thread");
                }
            }
            let _reg = LcoreRegistration::register(eal);
            f()
        })
}
