//! Runs the one-bottleneck model and prints a summary; optionally writes the CSV time
//! series.
//!
//! `cargo run -p sim --release --example bottleneck -- --cc hpcc --flows 8 --ms 5 --csv out.csv`
//!
//! Options: `--cc none|dcqcn|hpcc|rx-hpcc|ldcp`, `--flows N`, `--ms DURATION`,
//! `--gbps B`, `--stagger-us S` (flow i starts at i*S), `--probe` (HPCC++ probe mode),
//! `--ack-every M` (delayed ACK), `--seed S` (WRED RNG), `--expected-flows N` (HPCC++ `N`,
//! default = flows), `--buf-kb K` (switch buffer), `--csv PATH`.

use std::str::FromStr;

use cc::{CcConfig, CcKind, TelemetryMode};
use sim::bottleneck::{run, ModelConfig};

fn main() {
    let mut kind = CcKind::Hpcc;
    let mut flows = 8usize;
    let mut ms = 5.0f64;
    let mut gbps = 100.0f64;
    let mut stagger_us = 0.0f64;
    let mut probe = false;
    let mut ack_every = 1u32;
    let mut seed = 1u64;
    let mut expected_flows: Option<u32> = None;
    let mut buf: Option<u64> = None;
    let mut csv: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| die(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--cc" => kind = CcKind::from_str(&val()).unwrap_or_else(|e| die(&e.to_string())),
            "--flows" => flows = num(&val()),
            "--ms" => ms = num(&val()),
            "--gbps" => gbps = num(&val()),
            "--stagger-us" => stagger_us = num(&val()),
            "--probe" => probe = true,
            "--ack-every" => ack_every = num(&val()),
            "--seed" => seed = num(&val()),
            "--expected-flows" => expected_flows = Some(num(&val())),
            "--buf-kb" => buf = Some(num::<u64>(&val()) * 1000),
            "--csv" => csv = Some(val()),
            "-h" | "--help" => {
                println!("usage: bottleneck [--cc KIND] [--flows N] [--ms T] [--gbps B] [--stagger-us S] [--probe] [--ack-every M] [--seed S] [--expected-flows N] [--buf-kb K] [--csv PATH]");
                return;
            }
            other => die(&format!("unknown argument {other}")),
        }
    }
    let mut m = ModelConfig::new(kind, flows.max(1));
    m.link_bps = (gbps * 1e9) as u64;
    m.host_bps = m.link_bps;
    m.duration_ns = (ms * 1e6) as u64;
    m.flow_start_ns = (0..flows)
        .map(|i| (i as f64 * stagger_us * 1e3) as u64)
        .collect();
    m.ack_every = ack_every.max(1);
    m.seed = seed;
    if let Some(b) = buf {
        m.buf_bytes = b;
    }
    m.cc = kind.default_config(m.path());
    if let CcConfig::Hpcc(h) | CcConfig::RxHpcc(h) = &mut m.cc {
        h.expected_flows = expected_flows.unwrap_or(flows.max(1) as u32);
        if probe {
            h.mode = TelemetryMode::Probe;
        }
    }
    let t0 = std::time::Instant::now();
    let r = run(&m);
    let wall = t0.elapsed();
    let from = m.duration_ns / 2;
    let to = m.duration_ns;
    println!(
        "cc={kind} flows={flows} B={gbps}G T={}ns sim={ms}ms wall={:.3}s",
        m.base_rtt_ns(),
        wall.as_secs_f64()
    );
    println!(
        "second half: util={:.3} jain={:.3} mean_q={:.0}B max_q={}B | drops={} marks={} acks={} max_q_all={}B",
        r.utilization(from, to),
        r.jain(from, to),
        r.mean_queue(from, to),
        r.max_queue(from, to),
        r.drops,
        r.marks,
        r.acks,
        r.max_qlen_bytes
    );
    if let Some(p) = csv {
        let f = std::fs::File::create(&p).unwrap_or_else(|e| die(&format!("{p}: {e}")));
        r.write_csv(std::io::BufWriter::new(f))
            .unwrap_or_else(|e| die(&format!("{p}: {e}")));
        println!("wrote {p}");
    }
}

fn num<T: FromStr>(s: &str) -> T {
    s.parse()
        .unwrap_or_else(|_| die(&format!("not a number: {s}")))
}

fn die(msg: &str) -> ! {
    eprintln!("bottleneck: {msg}");
    std::process::exit(2)
}
