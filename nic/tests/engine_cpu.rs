//! A program waiting for its NIC's work learns whether it runs on the CPU
//! of one of the process's engine threads (`CompletionQueue::on_engine_cpu`,
//! `nic::park::an_engine_runs_on`), so that its wait parks at once instead
//! of spinning where an engine must run.
//!
//! These tests have a file, and so a process, of their own: the answer
//! covers every engine thread of the process, and the other tests' engines
//! (unpinned, anywhere) would be counted too.

mod support;

use std::sync::Mutex;

use dpdk::{Eal, Port};
use nic::verbs::QpOptions;
use rdma::transport::Access;

/// The CPUs the calling thread may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; getaffinity fills
    // it for the calling thread (pid 0).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: as in `allowed_cpus`; setaffinity reads the set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity to CPU {cpu}");
}

/// The CPUs of `cpus` on which `on()` says yes, the test's thread pinned
/// to each in turn.
fn where_yes(cpus: &[usize], on: impl Fn() -> bool) -> Vec<usize> {
    cpus.iter()
        .copied()
        .filter(|&c| {
            pin_to(c);
            on()
        })
        .collect()
}

/// The tests of this file one at a time: each pins engines of its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const ACC: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// With both devices' engines on one thread pinned to the last CPU, a CQ
/// says yes on that CPU and on no other; and a wait from there completes.
/// Once the devices are closed, no CPU has an engine.
#[test]
fn a_cq_knows_when_its_waiter_is_on_the_engines_cpu() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let cpus = allowed_cpus();
    let engine_cpu = *cpus.last().unwrap();
    let (pa, pb) = Port::ring_pair(eal, "cpu_one", 1024).unwrap();
    let mut devs = support::parking_group(
        eal,
        vec![(pa, [10, 8, 0, 1]), (pb, [10, 8, 0, 2])],
        Some(engine_cpu),
    );
    let (b, a) = (devs.pop().unwrap(), devs.pop().unwrap());
    // Creating the CQ is a command the group's thread answers: it runs.
    let mut ca = a.create_cq(64).unwrap();
    let cb = b.create_cq(64).unwrap();
    assert_eq!(where_yes(&cpus, || ca.on_engine_cpu()), vec![engine_cpu]);
    pin_to(engine_cpu);
    let (mut qa, qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let (ma, mb) = (a.reg_mr(128, ACC).unwrap(), b.reg_mr(128, ACC).unwrap());
    for i in 1..=50 {
        support::write8(&mut qa, i, &ma, &mb);
        support::completes(&mut ca, i);
    }
    drop((qa, qb, ma, mb, cb));
    drop((a, b));
    // The thread has ended: its CPU is taken back.
    assert_eq!(where_yes(&cpus, || ca.on_engine_cpu()), vec![]);
}

/// With each device's engine on a thread of its own, A's on the first CPU
/// and B's on the last (as roce-perf's `--loopback` runs them), A's CQ
/// says yes on both: a WRITE's completion at A needs B's engine to answer
/// first. Once B is closed, only A's CPU is left.
#[test]
fn a_cq_knows_when_its_waiter_is_on_the_peers_engine_cpu() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("one CPU allowed: nothing to tell apart");
        return;
    }
    let (first, last) = (cpus[0], *cpus.last().unwrap());
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "cpu_two", 1024).unwrap();
    let a = support::parking_group(eal, vec![(pa, [10, 9, 0, 1])], Some(first)).remove(0);
    let b = support::parking_group(eal, vec![(pb, [10, 9, 0, 2])], Some(last)).remove(0);
    let mut ca = a.create_cq(64).unwrap();
    let cb = b.create_cq(64).unwrap();
    assert_eq!(where_yes(&cpus, || ca.on_engine_cpu()), vec![first, last]);
    let (mut qa, qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
    let (ma, mb) = (a.reg_mr(128, ACC).unwrap(), b.reg_mr(128, ACC).unwrap());
    for (i, cpu) in (1..=40).zip([first, last].into_iter().cycle()) {
        pin_to(cpu);
        support::write8(&mut qa, i, &ma, &mb);
        support::completes(&mut ca, i);
    }
    drop((qb, mb, cb));
    drop(b);
    assert_eq!(where_yes(&cpus, || ca.on_engine_cpu()), vec![first]);
    drop((qa, ma));
}
