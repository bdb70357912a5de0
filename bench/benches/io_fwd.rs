//! io forwarding on two `net_null` ports: our loop ([`bench::fwd`]) against
//! `dpdk-testpmd --forward-mode=io` on the same vdevs, one after the other in
//! the same run, one forwarding core each. Prints both rates and the ratio.
//!
//! `cargo bench -p bench --bench io_fwd` (IO_FWD_SECS sets the seconds per
//! side, default 8).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::fwd::{forward, FwdCounters, Path};
use dpdk::{lcore, Eal, Mempool, Port};

const EAL_COMMON: &[&str] = &["--no-huge", "-m", "1024", "--no-pci", "--no-shconf", "--no-telemetry"];

fn main() {
    let secs: u64 = std::env::var("IO_FWD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(8);
    let cores = lcore::available_cores();
    let fwd_core = *cores.last().expect("no CPU");
    let main_core = *cores.first().expect("no CPU");
    let lcores = format!("{main_core},{fwd_core}");

    // Baseline first, in a child process.
    let mut eal: Vec<&str> = vec!["-l", &lcores];
    eal.extend_from_slice(EAL_COMMON);
    eal.extend_from_slice(&["--vdev", "net_null0", "--vdev", "net_null1"]);
    let testpmd = bench::testpmd::run(
        &eal,
        &["--forward-mode=io", "--nb-cores=1", "--burst=32", "--rxd=1024", "--txd=1024", "--mbcache=250"],
        secs,
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // Ours, in this process, on the same vdevs.
    let mut args = vec!["io_fwd"];
    args.extend_from_slice(EAL_COMMON);
    let eal = Eal::init(&args).expect("EAL");
    let pool = Mempool::new(eal, "io_fwd", 16384, 250, Mempool::DEFAULT_DATA_ROOM).expect("pool");
    let mut p0 = Port::open(eal, "net_null0").expect("net_null0");
    let mut p1 = Port::open(eal, "net_null1").expect("net_null1");
    let (rx0, tx0) = p0.configure_single(&pool).expect("configure");
    let (rx1, tx1) = p1.configure_single(&pool).expect("configure");
    let counters = Arc::new(FwdCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (c2, s2) = (counters.clone(), stop.clone());
    let worker = lcore::spawn_pinned(eal, "fwd", Some(fwd_core), move || {
        eprintln!("forwarding lcore id: {:?}", lcore::lcore_id());
        let mut paths = [Path { rx: rx0, tx: tx1 }, Path { rx: rx1, tx: tx0 }];
        forward(&mut paths, &c2, &s2);
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
    worker.join().expect("forwarding thread");
    let dropped = counters.dropped.load(Ordering::Relaxed);
    let mut steady: Vec<f64> = rates.into_iter().skip(2).collect();
    steady.sort_by(|a, b| a.total_cmp(b));
    let ours = steady[steady.len() / 2] / 1e6;

    println!("io forwarding, 2 x net_null, 1 forwarding core, burst 32, {secs} s each");
    println!("  dpdk-testpmd io : {:8.2} Mpps (median of {} periods)", testpmd.rx_mpps, testpmd.samples);
    println!("  ours (bench::fwd): {:8.2} Mpps (median of {} periods, {dropped} tx drops)", ours, steady.len());
    println!("  ratio ours/testpmd: {:.3}", ours / testpmd.rx_mpps);
}
