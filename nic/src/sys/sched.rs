//! How the kernel schedules a thread that parks (see [`super`] and
//! [`crate::park`]): its timer slack and its scheduler slice.

/// Sets the calling thread's timer slack (`PR_SET_TIMERSLACK`) to `ns`: a
/// timed park then oversleeps by at most that, not the default 50 us.
pub(crate) fn set_timer_slack_ns(ns: u64) {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0);
    }
}

/// `struct sched_attr` as `sched_setattr(2)` takes it (its first version,
/// 48 bytes).
#[repr(C)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Asks the kernel for a scheduler slice of `ns` for the calling thread
/// (`sched_setattr(2)`, `SCHED_OTHER` with `sched_runtime`; Linux 6.12+
/// EEVDF, clamped to 0.1..100 ms; older kernels ignore it), keeping its
/// nice value. A thread that sleeps and wakes often with a short slice
/// preempts a CPU-bound neighbour when woken (EEVDF's PREEMPT_SHORT)
/// instead of waiting for the neighbour's slice to end (~3 ms). Whether the
/// kernel took it.
pub(crate) fn set_slice_ns(ns: u64) -> bool {
    // SAFETY: getpriority takes integers; -1 with errno set is an error,
    // which leaves nice 0 (the default).
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: nice.clamp(-20, 19),
        sched_priority: 0,
        sched_runtime: ns,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: a live, initialised sched_attr of the size it states, for the
    // calling thread (pid 0); flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    rc == 0
}

/// The CPU the calling thread runs on now (`sched_getcpu(3)`: glibc reads
/// the kernel's rseq area, no system call), None where the kernel does not
/// say. Stale as soon as the scheduler moves the thread: a hint.
pub(crate) fn current_cpu() -> Option<u32> {
    // SAFETY: no arguments; -1 is the error.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).ok()
}
