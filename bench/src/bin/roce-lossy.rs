//! `roce-lossy`: go-back-N against selective repeat (issue 43) on a lossy link. Two
//! NICs on one poll thread joined by ring pairs through the impairment stage
//! (`bench::chaos::ImpairedLink`, random or burst loss in both directions), one RC
//! QP pair without CC; for each combination of operation, message size, loss rate
//! and loss-recovery mode it keeps `--window` WRITEs (or READs) of one size in
//! flight for `--secs` seconds and prints the goodput, the frames the stage dropped
//! (`lost`: data, requests and ACKs, both directions), the payload packets sent
//! beyond the minimum (`resent`: a WRITE packet or a READ response sent again; from
//! the NICs' `tx_data_packets`), the READ requests beyond one per READ (`rereq`: a
//! READ request sent again, or a re-request of a missing run) and the IBA timeouts,
//! all in one process so that the modes compare in one run.
//!
//! ```text
//! roce-lossy --ops write,read --sizes 65536,1048576 --loss 0,0.0001,0.001,0.01,0.05 \
//!            --burst 1 --modes gbn,sr --secs 3
//! ```
//!
//! Every message's bytes are checked at the end (the last one of each slot).

use bench::lossy::{measure, Case, Op};
use clap::Parser;
use dpdk::Eal;
use rdma::transport::LossRecovery;

#[derive(Parser, Debug)]
#[command(about = "Goodput and resends of go-back-N and selective repeat on a lossy link")]
struct Opts {
    /// Operations: write, read (comma-separated).
    #[arg(long, default_value = "write,read")]
    ops: String,
    /// Message sizes in bytes (comma-separated).
    #[arg(long, default_value = "65536,1048576")]
    sizes: String,
    /// Drop probabilities per frame, each direction (comma-separated).
    #[arg(long, default_value = "0,0.0001,0.001,0.01,0.05")]
    loss: String,
    /// Frames each drop takes in a row (1: independent drops).
    #[arg(long, default_value_t = 1)]
    burst: u32,
    /// Loss-recovery modes (comma-separated).
    #[arg(long, default_value = "gbn,sr")]
    modes: String,
    /// Seconds per combination.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Messages in flight.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Path MTU.
    #[arg(long, default_value_t = 4096)]
    mtu: u32,
    /// Retransmit timeout of the QPs (the IBA timer), microseconds.
    #[arg(long, default_value_t = 67_109)]
    timeout_us: u64,
    /// Seed of the stage.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn list<T: std::str::FromStr>(s: &str, what: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<T>()
                .map_err(|_| format!("--{what}: cannot parse {x:?}"))
        })
        .collect()
}

fn main() {
    let o = Opts::parse();
    if let Err(e) = real_main(&o) {
        eprintln!("roce-lossy: {e}");
        std::process::exit(1);
    }
}

fn real_main(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let ops = list::<String>(&o.ops, "ops")?
        .iter()
        .map(|s| match s.as_str() {
            "write" => Ok(Op::Write),
            "read" => Ok(Op::Read),
            x => Err(format!("--ops: {x:?} is not write or read")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sizes = list::<usize>(&o.sizes, "sizes")?;
    let losses = list::<f64>(&o.loss, "loss")?;
    let modes = list::<LossRecovery>(&o.modes, "modes")?;
    if o.window == 0 || sizes.contains(&0) {
        return Err("--window and every size must be at least 1".into());
    }
    let args = [
        "roce-lossy".to_string(),
        "--no-huge".into(),
        "-m".into(),
        "1024".into(),
        "--no-pci".into(),
        "--no-shconf".into(),
        "--no-telemetry".into(),
        "--log-level=lib.eal:error".into(),
        format!("--file-prefix=roce-lossy-{}", std::process::id()),
    ];
    let eal = Eal::init(&args)?;
    println!(
        "roce-lossy: RC, no CC, MTU {}, window {}, {} s per row, burst {}, stage seed {}",
        o.mtu, o.window, o.secs, o.burst, o.seed
    );
    println!(
        "{:<5} {:>8} {:>7} {:<4} {:>7} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "op",
        "size",
        "loss",
        "mode",
        "msgs",
        "MiB/s",
        "lost",
        "resent",
        "res/lost",
        "rereq",
        "timeouts"
    );
    let mut n = 0;
    for &op in &ops {
        for &size in &sizes {
            for &loss in &losses {
                for &mode in &modes {
                    n += 1;
                    let case = Case {
                        op,
                        size,
                        loss,
                        burst: o.burst,
                        mode,
                        window: o.window,
                        mtu: o.mtu,
                        timeout_ns: o.timeout_us * 1000,
                        seed: o.seed,
                        secs: o.secs,
                        max_msgs: u64::MAX,
                    };
                    let r = measure(eal, &format!("ly{n}"), &case)?;
                    let ratio = if r.lost > 0 {
                        format!("{:.2}", r.resent as f64 / r.lost as f64)
                    } else {
                        "-".into()
                    };
                    println!(
                        "{:<5} {:>8} {:>7} {:<4} {:>7} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>8}",
                        format!("{op:?}").to_lowercase(),
                        size,
                        format!("{}%", loss * 100.0),
                        mode,
                        r.msgs,
                        r.mib_s(),
                        r.lost,
                        r.resent,
                        ratio,
                        r.rereq,
                        r.timeouts
                    );
                }
            }
        }
    }
    Ok(())
}
