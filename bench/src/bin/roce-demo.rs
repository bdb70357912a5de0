//! The foundation demo: moves packets between two DPDK ports and prints
//! rates every second. A generator thread builds frames and sends them out
//! of port A; a receiver thread takes them off port B, checks their sequence
//! numbers, and frees them. By default A and B are a ring pair (two ports
//! cabled back to back in this process); `--port-a/--port-b` take any
//! devargs (e.g. two `net_tap` ports bridged in Linux).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use dpdk::{lcore, Burst, Eal, Mempool, Port};

/// Move packets between two DPDK ports and print the rates.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Devargs of the sending port (default: one end of an in-process ring pair).
    #[arg(long)]
    port_a: Option<String>,
    /// Devargs of the receiving port (default: the other end of the ring pair).
    #[arg(long)]
    port_b: Option<String>,
    /// Frame size in bytes (60..=1514, without FCS).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u16).range(60..=1514))]
    size: u16,
    /// Seconds to run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// EAL arguments (after `--`).
    #[arg(last = true)]
    eal: Vec<String>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("roce-demo: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let eal = Eal::init(&dpdk::tool_args("roce-demo", &args.eal, false))?;
    let pool = Mempool::new(eal, "demo", 8191, 256, Mempool::DEFAULT_DATA_ROOM)?;
    let (mut a, mut b) = match (&args.port_a, &args.port_b) {
        (Some(pa), Some(pb)) => (Port::open(eal, pa)?, Port::open(eal, pb)?),
        (None, None) => Port::ring_pair(eal, "demo", 4096)?,
        _ => return Err("give both --port-a and --port-b, or neither".into()),
    };
    let (_arx, mut atx) = a.configure_single(&pool)?;
    let (mut brx, _btx) = b.configure_single(&pool)?;
    println!(
        "roce-demo: {} -> {}, {} B frames, {} s",
        a.name(),
        b.name(),
        args.size,
        args.seconds
    );

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let cores = lcore::available_cores();
    let size = args.size as usize;

    let (s2, st2, p2) = (sent.clone(), stop.clone(), pool.clone());
    let tx = lcore::spawn_pinned(eal, "demo-tx", cores.first().copied(), move || {
        let mut burst: Burst = Burst::new();
        let mut frame = vec![0u8; size];
        frame[0..6].copy_from_slice(&[0xff; 6]);
        frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xa]);
        frame[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        let mut seq = 0u64;
        while !st2.load(Ordering::Relaxed) {
            while !burst.is_full() {
                let Ok(mut m) = p2.alloc() else { break };
                frame[14..22].copy_from_slice(&seq.to_be_bytes());
                if m.extend_from_slice(&frame).is_err() {
                    break;
                }
                let _ = burst.push(m);
                seq += 1;
            }
            let n = atx.send(&mut burst);
            // What the port did not take is resent next round, in order.
            s2.fetch_add(n as u64, Ordering::Relaxed);
        }
    })?;
    let stop_rx = Arc::new(AtomicBool::new(false));
    let (r2, st3, o2) = (received.clone(), stop_rx.clone(), out_of_order.clone());
    let rx = lcore::spawn_pinned(eal, "demo-rx", cores.last().copied(), move || {
        let mut burst: Burst = Burst::new();
        let mut expect = 0u64;
        while !st3.load(Ordering::Relaxed) {
            if brx.recv(&mut burst) == 0 {
                continue;
            }
            let mut n = 0;
            for m in burst.drain() {
                let mut seq = [0u8; 8];
                if m.read(14, &mut seq).is_ok() {
                    let seq = u64::from_be_bytes(seq);
                    if seq != expect {
                        o2.fetch_add(1, Ordering::Relaxed);
                    }
                    expect = seq + 1;
                }
                n += 1;
            }
            r2.fetch_add(n, Ordering::Relaxed);
        }
    })?;

    let bits_per_frame = (size as f64 + 24.0) * 8.0; // + preamble, IFG, FCS
    let mut last = (Instant::now(), 0u64, 0u64);
    for sec in 1..=args.seconds {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        let (s, r) = (
            sent.load(Ordering::Relaxed),
            received.load(Ordering::Relaxed),
        );
        let dt = now.duration_since(last.0).as_secs_f64();
        let tx_pps = (s - last.1) as f64 / dt;
        let rx_pps = (r - last.2) as f64 / dt;
        println!(
            "[{sec:>3}s] tx {:7.3} Mpps {:7.2} Gbps | rx {:7.3} Mpps {:7.2} Gbps",
            tx_pps / 1e6,
            tx_pps * bits_per_frame / 1e9,
            rx_pps / 1e6,
            rx_pps * bits_per_frame / 1e9
        );
        last = (now, s, r);
    }
    // Stop the sender, let the receiver drain what is in flight, then stop it.
    stop.store(true, Ordering::Relaxed);
    tx.join().map_err(|_| "tx thread panicked")?;
    let deadline = Instant::now() + Duration::from_secs(1);
    while received.load(Ordering::Relaxed) < sent.load(Ordering::Relaxed)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    stop_rx.store(true, Ordering::Relaxed);
    rx.join().map_err(|_| "rx thread panicked")?;
    let (sa, sb) = (a.stats()?, b.stats()?);
    println!(
        "total: sent {} received {} out-of-order {} | port {} tx {} | port {} rx {} missed {}",
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        out_of_order.load(Ordering::Relaxed),
        a.name(),
        sa.tx_packets,
        b.name(),
        sb.rx_packets,
        sb.rx_missed
    );
    Ok(())
}
