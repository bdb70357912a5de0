//! A nanosecond clock from the TSC, read once per burst (docs/design.md §3).

/// Converts TSC cycles to nanoseconds since the clock was created, with a
/// fixed-point multiply (no division on the hot path).
#[derive(Debug, Clone, Copy)]
pub struct TscClock {
    hz: u64,
    base: u64,
    /// ns per cycle in 32.32 fixed point.
    mult: u64,
}

impl TscClock {
    /// A clock using DPDK's measured TSC frequency (EAL must be up).
    pub fn new(_eal: &crate::Eal) -> TscClock {
        // SAFETY: EAL is initialised; this reads a calibrated value.
        let hz = unsafe { dpdk_sys::rte_get_tsc_hz() };
        Self::with_hz(hz.max(1))
    }

    /// A clock for a known TSC frequency.
    pub fn with_hz(hz: u64) -> TscClock {
        let mult = ((1_000_000_000u128 << 32) / hz as u128) as u64;
        TscClock {
            hz,
            base: rdtsc(),
            mult,
        }
    }

    /// TSC frequency in Hz.
    pub fn hz(&self) -> u64 {
        self.hz
    }

    /// Raw cycle counter.
    #[inline]
    pub fn cycles(&self) -> u64 {
        rdtsc()
    }

    /// Nanoseconds since the clock was created.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.cycles_to_ns(rdtsc().wrapping_sub(self.base))
    }

    /// Converts a cycle count to nanoseconds.
    #[inline]
    pub fn cycles_to_ns(&self, cycles: u64) -> u64 {
        ((cycles as u128 * self.mult as u128) >> 32) as u64
    }
}

#[inline]
fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc is always available on x86_64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unsafe { dpdk_sys::shim_rte_rdtsc() }
    }
}
