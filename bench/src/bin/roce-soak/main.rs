//! roce-soak: the chaos soak. Two NICs joined through the impairment stage
//! (loss, duplication, reordering and corruption in both directions), QPs of
//! every congestion control at once, each running a mix of RDMA WRITE with
//! immediate, SEND with immediate and READ for `--secs`. Every message has
//! its own seed and its bytes are checked at the receiver by offset; the
//! immediates number the receiver-visible messages of a QP, so a lost or
//! twice-delivered message is caught at once. Each second it samples RSS,
//! the mbufs in use over every mempool and the QP count, and fails if any
//! of them grows after the warm-up. Exit status 0 only if nothing failed.
//!
//! `scripts/soak.sh [MINUTES]` runs it; CI runs 30 s.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bench::chaos::{mbufs_in_use, rss_bytes, ImpairedLink};
use cc::CcKind;
use clap::Parser;

mod report;
mod traffic;

use dpdk::Eal;
use impair::Impairment;
use nic::verbs::{CompletionQueue, DeviceConfig, MemoryRegion, QpOptions};
use rdma::transport::LossRecovery;
use rdma::transport::{Access, WcOpcode, WcStatus, WorkCompletion};
use traffic::{
    on_receive, on_send_completion, post_more, post_recv, Flow, Layout, Totals, RECV_BUFS,
};

#[derive(Parser, Debug)]
#[command(
    about = "Chaos soak: every CC over an impaired link, WRITE/READ/SEND checked byte by byte"
)]
struct Opts {
    /// How long to run, seconds.
    #[arg(long, default_value_t = 30)]
    secs: u64,
    /// Congestion controls (comma-separated, or `all`).
    #[arg(long, default_value = "all")]
    cc: String,
    /// QPs per congestion control.
    #[arg(long, default_value_t = 2)]
    qps_per_cc: usize,
    /// Loss recovery of the QPs: `gbn`, `sr` or `both` (the QPs of each CC
    /// take turns: the first gbn, the second sr, ...).
    #[arg(long = "loss-recovery", default_value = "both")]
    loss_recovery: String,
    /// Largest message, bytes (sizes are drawn from 1 ..= this).
    #[arg(long, default_value_t = 16384)]
    max_msg: usize,
    /// Messages in flight per QP (slots of each buffer area).
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Path MTU.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Probability of dropping a frame, each direction.
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Probability of duplicating a frame.
    #[arg(long, default_value_t = 0.01)]
    dup: f64,
    /// Probability of reordering a frame.
    #[arg(long, default_value_t = 0.01)]
    reorder: f64,
    /// Probability of flipping one bit of a frame.
    #[arg(long, default_value_t = 0.01)]
    corrupt: f64,
    /// Seed of the stage and of the message mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Warm-up, seconds (default: a fifth of the run, at least 5 s).
    #[arg(long)]
    warmup_secs: Option<u64>,
    /// RSS may exceed its warm-up maximum by this much, MiB.
    #[arg(long, default_value_t = 8)]
    rss_slack_mib: u64,
    /// Print a sample line every N seconds.
    #[arg(long, default_value_t = 10)]
    print_every: u64,
    /// EAL arguments (default: --no-huge -m 1024 --no-pci ...).
    #[arg(last = true)]
    eal: Vec<String>,
}

/// What a soak run found wrong: the first failure ends the run.
#[derive(Debug, thiserror::Error)]
enum SoakError {
    #[error("QP {qp} ({cc}) message {seq} ({op}): byte {at} of {len} differs from its pattern")]
    Bytes {
        qp: usize,
        cc: CcKind,
        seq: u64,
        op: &'static str,
        at: usize,
        len: usize,
    },
    #[error("QP {qp} ({cc}): receiver got message #{got}, expected #{want} ({})", if got < want { "delivered twice" } else { "a message was lost" })]
    Order {
        qp: usize,
        cc: CcKind,
        got: u32,
        want: u32,
    },
    #[error("QP {qp} ({cc}): {what} completed with {status:?}")]
    Status {
        qp: usize,
        cc: CcKind,
        what: &'static str,
        status: WcStatus,
    },
    #[error("QP {qp} ({cc}): a completion nobody waits for ({opcode:?}, wr_id {wr_id})")]
    Unexpected {
        qp: usize,
        cc: CcKind,
        opcode: WcOpcode,
        wr_id: u64,
    },
    #[error("QP {qp} ({cc}): receive of {got} bytes, message #{seq} has {want}")]
    Length {
        qp: usize,
        cc: CcKind,
        seq: u64,
        got: u32,
        want: usize,
    },
    #[error("{what} grew after warm-up: {after} > {limit} (warm-up maximum {base})")]
    Growth {
        what: &'static str,
        after: u64,
        limit: u64,
        base: u64,
    },
    #[error("{0} messages still outstanding {1:?} after the run (lost)")]
    Drain(usize, Duration),
    #[error("the stage never {0}: the soak did not test what it says")]
    Untested(&'static str),
    #[error(transparent)]
    Verbs(#[from] nic::verbs::VerbsError),
    #[error(transparent)]
    Dpdk(#[from] dpdk::Error),
    #[error("{0}")]
    Usage(String),
}

fn main() -> ExitCode {
    let o = Opts::parse();
    match soak(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("roce-soak: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--loss-recovery`: one mode, or `both` (gbn and sr in turn).
fn parse_modes(s: &str) -> Result<Vec<LossRecovery>, SoakError> {
    if s == "both" {
        return Ok(vec![LossRecovery::Gbn, LossRecovery::Sr]);
    }
    s.parse::<LossRecovery>()
        .map(|m| vec![m])
        .map_err(|e| SoakError::Usage(format!("--loss-recovery: {e} (or both)")))
}

fn parse_ccs(s: &str) -> Result<Vec<CcKind>, SoakError> {
    if s == "all" {
        return Ok(CcKind::ALL.to_vec());
    }
    s.split(',')
        .map(|c| {
            c.trim()
                .parse::<CcKind>()
                .map_err(|_| SoakError::Usage(format!("--cc: unknown congestion control {c:?}")))
        })
        .collect()
}

fn start_eal(args: &[String]) -> Result<&'static Eal, SoakError> {
    let mut all = vec!["roce-soak".to_string()];
    if args.is_empty() {
        all.extend(
            [
                "--no-huge",
                "-m",
                "1024",
                "--no-pci",
                "--no-shconf",
                "--no-telemetry",
                "--log-level=lib.eal:error",
            ]
            .map(String::from),
        );
        all.push(format!("--file-prefix=roce-soak-{}", std::process::id()));
    } else {
        all.extend(args.iter().cloned());
    }
    Ok(Eal::init(&all)?)
}

/// A small seeded generator for the message mix.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn soak(o: &Opts) -> Result<(), SoakError> {
    let ccs = parse_ccs(&o.cc)?;
    parse_modes(&o.loss_recovery)?;
    if o.max_msg == 0 || o.window == 0 || o.qps_per_cc == 0 {
        return Err(SoakError::Usage(
            "--max-msg, --window and --qps-per-cc must be at least 1".into(),
        ));
    }
    let eal = start_eal(&o.eal)?;
    let mut rig = Rig::build(o, &ccs, eal)?;
    print_banner(o, &ccs, rig.flows.len());
    let start = Instant::now();
    let (totals, census) = run(o, eal, &mut rig, start)?;
    report::print(&ccs, &rig, &census, &totals, start.elapsed().as_secs_f64());
    report::check_impairments(o, &rig)
}

/// The two NICs behind the impairment stage, their regions and CQs, and one flow
/// per QP pair. Fields drop in order: the QPs, the CQs and the regions before the
/// devices.
struct Rig {
    flows: Vec<Flow>,
    b_cq: CompletionQueue,
    a_cq: CompletionQueue,
    b_mr: MemoryRegion,
    a_mr: MemoryRegion,
    lay: Layout,
    link: ImpairedLink,
}

impl Rig {
    /// Opens the impaired link and connects `--qps-per-cc` QP pairs per CC, each
    /// receiver with its receive buffers posted.
    fn build(o: &Opts, ccs: &[CcKind], eal: &'static Eal) -> Result<Rig, SoakError> {
        let imp = Impairment {
            drop: o.loss,
            duplicate: o.dup,
            reorder: o.reorder,
            corrupt: o.corrupt,
            seed: o.seed,
        };
        let mut ca = DeviceConfig::new([10, 0, 0, 1]);
        let mut cb = DeviceConfig::new([10, 0, 0, 2]);
        ca.idle_yield = true;
        cb.idle_yield = true;
        let link = ImpairedLink::open(eal, "soak", imp, ca, cb)?;
        let lay = Layout {
            max_msg: o.max_msg,
            window: o.window,
            qps: ccs.len() * o.qps_per_cc,
        };
        let a_mr = link.a().reg_mr(lay.a_len(), Access::LOCAL_WRITE)?;
        let b_mr = link.b().reg_mr(
            lay.b_len(),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        let cq_depth = (lay.qps * (o.window + RECV_BUFS) * 2).max(256);
        let a_cq = link.a().create_cq(cq_depth)?;
        let b_cq = link.b().create_cq(cq_depth)?;
        let mut flows = Vec::new();
        let modes = parse_modes(&o.loss_recovery)?;
        for (i, &cc) in ccs.iter().cycle().take(lay.qps).enumerate() {
            let mode = modes[(i / ccs.len()) % modes.len()];
            let opts = QpOptions {
                mtu: o.mtu,
                cc,
                loss_recovery: mode,
                sq_depth: 256,
                rq_depth: 256,
                ..QpOptions::default()
            };
            let mut qa = link.a().create_qp(&a_cq, &a_cq, opts)?;
            let mut qb = link.b().create_qp(&b_cq, &b_cq, opts)?;
            // Both rsnic QPs of this process, configured alike.
            qa.set_peer_loss_recovery(mode);
            qb.set_peer_loss_recovery(mode);
            qa.connect(&qb.remote_info())?;
            qb.connect(&qa.remote_info())?;
            for buf in 0..RECV_BUFS {
                post_recv(&mut qb, &b_mr, &lay, i, buf)?;
            }
            flows.push(Flow {
                cc,
                mode,
                qa,
                qb,
                next_seq: 0,
                next_imm: 0,
                want_imm: 0,
                inflight: VecDeque::new(),
                slot_busy: vec![false; o.window],
                done: [0; 3],
                bytes: 0,
            });
        }
        Ok(Rig {
            flows,
            b_cq,
            a_cq,
            b_mr,
            a_mr,
            lay,
            link,
        })
    }

    /// QPs open on both NICs.
    fn qp_count(&self) -> u64 {
        self.flows.len() as u64 * 2
    }
}

fn print_banner(o: &Opts, ccs: &[CcKind], pairs: usize) {
    println!(
        "roce-soak: {} s, {} QP pairs ({} per CC: {}; loss recovery {}), WRITE_IMM/SEND_IMM/READ of 1..={} B, window {}, MTU {}; stage loss {} dup {} reorder {} corrupt {} (both directions), seed {}",
        o.secs,
        pairs,
        o.qps_per_cc,
        ccs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        o.loss_recovery,
        o.max_msg,
        o.window,
        o.mtu,
        o.loss,
        o.dup,
        o.reorder,
        o.corrupt,
        o.seed
    );
}

/// The process's memory over the run: the warm-up's maxima are the base, and
/// after the warm-up RSS and mbufs in use may not grow past them (a leak).
#[derive(Default)]
struct Census {
    warm_rss: u64,
    warm_mbufs: u64,
    peak_rss: u64,
    peak_mbufs: u64,
}

impl Census {
    /// One sample at `t` into the run.
    fn sample(
        &mut self,
        o: &Opts,
        t: Duration,
        warmup: Duration,
        rss: u64,
        mbufs: u64,
    ) -> Result<(), SoakError> {
        if t < warmup {
            self.warm_rss = self.warm_rss.max(rss);
            self.warm_mbufs = self.warm_mbufs.max(mbufs);
            return Ok(());
        }
        self.peak_rss = self.peak_rss.max(rss);
        self.peak_mbufs = self.peak_mbufs.max(mbufs);
        let rss_limit = self.warm_rss + (o.rss_slack_mib << 20);
        if rss > rss_limit {
            return Err(SoakError::Growth {
                what: "RSS (bytes)",
                after: rss,
                limit: rss_limit,
                base: self.warm_rss,
            });
        }
        // In flight varies with the load (frames queued while an engine is
        // descheduled): allow twice the warm-up's maximum, or 2048 more. A leak of
        // one mbuf per lost frame passes that within a minute; the drained count
        // at the end is exact.
        let mbuf_limit = (2 * self.warm_mbufs).max(self.warm_mbufs + 2048);
        if mbufs > mbuf_limit {
            return Err(SoakError::Growth {
                what: "mbufs in use",
                after: mbufs,
                limit: mbuf_limit,
                base: self.warm_mbufs,
            });
        }
        Ok(())
    }
}

/// Posts, polls and checks until the run is over and every message is done: at the
/// end of the warm-up and at the end of the run posting stops until nothing is in
/// flight, and the mbufs in use then, compared, are the leak check.
fn run(
    o: &Opts,
    eal: &'static Eal,
    rig: &mut Rig,
    start: Instant,
) -> Result<(Totals, Census), SoakError> {
    let warmup = Duration::from_secs(o.warmup_secs.unwrap_or((o.secs / 5).max(5)));
    let run = Duration::from_secs(o.secs);
    let mut mix = Mix(o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut scratch = vec![0u8; o.max_msg];
    let mut next_sample = start + Duration::from_secs(1);
    let mut census = Census::default();
    let mut quiet_mbufs: Option<u64> = None;
    let mut totals = Totals { msgs: 0, bytes: 0 };
    let mut posting = true;
    let mut last_print = start;
    loop {
        let now = Instant::now();
        let elapsed = now - start;
        let draining = elapsed >= run || (quiet_mbufs.is_none() && elapsed >= warmup);
        if draining && posting {
            posting = false;
        }
        if posting {
            for (i, f) in rig.flows.iter_mut().enumerate() {
                post_more(f, i, &rig.lay, &rig.a_mr, &rig.b_mr, &mut mix, &mut scratch)?;
            }
        }
        let n = poll_completions(rig, &mut scratch, &mut totals)?;
        let outstanding: usize = rig.flows.iter().map(|f| f.inflight.len()).sum();
        if !posting && outstanding == 0 {
            // Let the stage and the engines settle (ACKs of duplicates, held
            // frames), then count the mbufs in use.
            std::thread::sleep(Duration::from_millis(300));
            let m = mbufs_in_use(eal);
            if let Some(q) = quiet_mbufs {
                check_drained(m, q, start)?;
                break;
            }
            println!(
                "{:>5.0} s  warm-up over, drained: {} mbufs in use, RSS {:.1} MiB",
                start.elapsed().as_secs_f64(),
                m,
                rss_bytes() as f64 / 1048576.0
            );
            quiet_mbufs = Some(m);
            posting = elapsed < run;
        } else if !posting && elapsed > run.max(warmup) + Duration::from_secs(30) {
            return Err(SoakError::Drain(outstanding, Duration::from_secs(30)));
        }
        if now >= next_sample {
            next_sample += Duration::from_secs(1);
            let (rss, mbufs) = (rss_bytes(), mbufs_in_use(eal));
            census.sample(o, now - start, warmup, rss, mbufs)?;
            if now - last_print >= Duration::from_secs(o.print_every) {
                last_print = now;
                report::progress(now - start, &totals, rss, mbufs, rig);
            }
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }
    Ok((totals, census))
}

/// The end of the run: the mbufs in use when idle must be back to the warm-up's
/// quiet level `quiet` (per-lcore caches may hold up to a cache's worth).
fn check_drained(in_use: u64, quiet: u64, start: Instant) -> Result<(), SoakError> {
    let limit = quiet + 512;
    if in_use > limit {
        return Err(SoakError::Growth {
            what: "mbufs in use when idle",
            after: in_use,
            limit,
            base: quiet,
        });
    }
    println!(
        "{:>5.0} s  drained: {} mbufs in use (after warm-up: {quiet})",
        start.elapsed().as_secs_f64(),
        in_use
    );
    Ok(())
}

/// Takes the completions of both NICs: the sender's (sends, WRITEs, READs checked)
/// and the receiver's (messages checked, buffers reposted). The receiver's count.
fn poll_completions(
    rig: &mut Rig,
    scratch: &mut [u8],
    totals: &mut Totals,
) -> Result<usize, SoakError> {
    let mut wcs = [WorkCompletion::BLANK; 64];
    let unexpected = |wc: &WorkCompletion| SoakError::Unexpected {
        qp: usize::MAX,
        cc: CcKind::None,
        opcode: wc.opcode,
        wr_id: wc.wr_id,
    };
    let n = rig.a_cq.poll(&mut wcs);
    for wc in &wcs[..n] {
        let i = rig.flows.iter().position(|f| f.qa.qpn() == wc.qp_num);
        let i = i.ok_or_else(|| unexpected(wc))?;
        on_send_completion(
            &mut rig.flows[i],
            i,
            wc,
            &rig.lay,
            &rig.a_mr,
            scratch,
            totals,
        )?;
    }
    let n = rig.b_cq.poll(&mut wcs);
    for wc in &wcs[..n] {
        let i = rig.flows.iter().position(|f| f.qb.qpn() == wc.qp_num);
        let i = i.ok_or_else(|| unexpected(wc))?;
        on_receive(
            &mut rig.flows[i],
            i,
            wc,
            &rig.lay,
            &rig.b_mr,
            scratch,
            totals,
        )?;
    }
    Ok(n)
}
