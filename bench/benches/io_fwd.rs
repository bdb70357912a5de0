//! io forwarding on two `net_null` ports: our loop ([`bench::fwd`]) against
//! `dpdk-testpmd --forward-mode=io` on the same vdevs, one forwarding core
//! each, alternating in the same run (testpmd, ours, testpmd, ours, ...) so
//! that a noisy neighbour hurts both alike. Prints every round, the medians
//! and their ratio.
//!
//! `cargo bench -p bench --bench io_fwd` (IO_FWD_SECS: seconds per side and
//! round, default 6; IO_FWD_ROUNDS: rounds, default 2).

use bench::testpmd::{median, Rounds};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fwd::{forward, FwdCounters, Path};
use dpdk::{lcore, Eal, Mempool, Port, RxQueue, TxQueue};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs our forwarder for `secs` on `queues` and returns (median Mpps over
/// the seconds after the first, the queues back, tx drops).
fn run_ours(
    eal: &'static Eal,
    core: usize,
    queues: [(RxQueue, TxQueue); 2],
    secs: u64,
) -> (f64, [(RxQueue, TxQueue); 2], u64) {
    let counters = Arc::new(FwdCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (counters.clone(), stop.clone());
    let [(rx0, tx0), (rx1, tx1)] = queues;
    let worker = lcore::spawn_pinned(eal, "fwd", Some(core), move || {
        let mut paths = [Path { rx: rx0, tx: tx1 }, Path { rx: rx1, tx: tx0 }];
        forward(&mut paths, &c2, &s2);
        paths
    })
    .expect("spawn");
    let mut rates = Vec::new();
    let mut last = (Instant::now(), 0u64);
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        let now = (Instant::now(), counters.packets.load(Ordering::Relaxed));
        rates.push((now.1 - last.1) as f64 / now.0.duration_since(last.0).as_secs_f64());
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
    let [p0, p1] = worker.join().expect("forwarding thread");
    let steady: Vec<f64> = rates.into_iter().skip(1).collect();
    // Give the queues back in their original pairing (port 0's rx with its tx).
    let queues = [(p0.rx, p1.tx), (p1.rx, p0.tx)];
    (
        median(steady) / 1e6,
        queues,
        counters.dropped.load(Ordering::Relaxed),
    )
}

fn main() {
    let secs = env("IO_FWD_SECS", 6).max(3);
    let rounds = env("IO_FWD_ROUNDS", 2).max(1);
    let cores = lcore::available_cores();
    let fwd_core = *cores.last().expect("no CPU");
    let main_core = *cores.first().expect("no CPU");
    let lcores = format!("{main_core},{fwd_core}");
    let mut tp_eal: Vec<&str> = vec!["-l", &lcores];
    tp_eal.extend_from_slice(&["--vdev", "net_null0", "--vdev", "net_null1"]);
    let tp_app = [
        "--forward-mode=io",
        "--nb-cores=1",
        "--burst=32",
        "--rxd=1024",
        "--txd=1024",
        "--mbcache=250",
    ];

    let (eal, mem) = bench::memory::init_eal("io_fwd", 128, 1024);
    let pool = Mempool::new(eal, "io_fwd", 8191, 250, Mempool::DEFAULT_DATA_ROOM).expect("pool");
    let mut p0 = Port::open(eal, "net_null0").expect("net_null0");
    let mut p1 = Port::open(eal, "net_null1").expect("net_null1");
    let mut queues = [
        p0.configure_single(&pool).expect("configure"),
        p1.configure_single(&pool).expect("configure"),
    ];

    println!("io forwarding, 2 x net_null, 1 forwarding core, burst 32, {secs} s per side, {rounds} rounds, ours on {mem}");
    let mut report = Rounds::new("dpdk-testpmd io");
    for round in 1..=rounds {
        let tp = bench::testpmd::run(&tp_eal, &tp_app, secs).unwrap_or_else(|e| panic!("{e}"));
        let (mpps, q, dropped) = run_ours(eal, fwd_core, queues, secs);
        queues = q;
        report.record(round, &tp, mpps, &format!(" ({dropped} tx drops)"));
    }
    report.finish();
}
