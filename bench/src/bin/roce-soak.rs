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

use bench::chaos::{
    mbufs_in_use, message_seed, pattern_fill, pattern_mismatch, rss_bytes, ImpairedLink,
};
use cc::CcKind;
use clap::Parser;
use dpdk::Eal;
use impair::Impairment;
use nic::verbs::{DeviceConfig, MemoryRegion, QpOptions, QueuePair};
use rdma::transport::{Access, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

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

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    WriteImm,
    SendImm,
    Read,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::WriteImm => "WRITE_IMM",
            Op::SendImm => "SEND_IMM",
            Op::Read => "READ",
        }
    }
}

/// One message in flight.
#[derive(Debug, Clone, Copy)]
struct Msg {
    seq: u64,
    op: Op,
    slot: usize,
    len: usize,
    seed: u64,
    /// Waiting for the sender's completion.
    sent: bool,
    /// Waiting for the receiver's check (WRITE_IMM, SEND_IMM).
    received: bool,
}

/// Receive buffers per QP (posted, reposted after each receive).
const RECV_BUFS: usize = 32;

/// Memory layout: per QP, `window` slots of `max_msg` in each area.
/// A: [send source | READ landing]; B: [WRITE landing | READ source | receive buffers].
struct Layout {
    max_msg: usize,
    window: usize,
    qps: usize,
}

impl Layout {
    fn a_len(&self) -> usize {
        2 * self.qps * self.window * self.max_msg
    }
    fn b_len(&self) -> usize {
        self.qps * (2 * self.window + RECV_BUFS) * self.max_msg
    }
    fn a_src(&self, qp: usize, slot: usize) -> usize {
        (qp * self.window + slot) * self.max_msg
    }
    fn a_read(&self, qp: usize, slot: usize) -> usize {
        ((self.qps + qp) * self.window + slot) * self.max_msg
    }
    fn b_write(&self, qp: usize, slot: usize) -> usize {
        (qp * self.window + slot) * self.max_msg
    }
    fn b_read_src(&self, qp: usize, slot: usize) -> usize {
        ((self.qps + qp) * self.window + slot) * self.max_msg
    }
    fn b_recv(&self, qp: usize, buf: usize) -> usize {
        (2 * self.qps * self.window + qp * RECV_BUFS + buf) * self.max_msg
    }
}

/// One QP pair under test and its bookkeeping.
struct Flow {
    cc: CcKind,
    qa: QueuePair,
    qb: QueuePair,
    next_seq: u64,
    /// Receiver-visible messages posted / checked (the immediates).
    next_imm: u32,
    want_imm: u32,
    inflight: VecDeque<Msg>,
    slot_busy: Vec<bool>,
    done: [u64; 3],
    bytes: u64,
}

struct Totals {
    msgs: u64,
    bytes: u64,
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
    if o.max_msg == 0 || o.window == 0 || o.qps_per_cc == 0 {
        return Err(SoakError::Usage(
            "--max-msg, --window and --qps-per-cc must be at least 1".into(),
        ));
    }
    let eal = start_eal(&o.eal)?;
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
    let mut a_cq = link.a().create_cq(cq_depth)?;
    let mut b_cq = link.b().create_cq(cq_depth)?;
    let mut flows = Vec::new();
    for (i, &cc) in ccs.iter().cycle().take(lay.qps).enumerate() {
        let opts = QpOptions {
            mtu: o.mtu,
            cc,
            sq_depth: 256,
            rq_depth: 256,
            ..QpOptions::default()
        };
        let mut qa = link.a().create_qp(&a_cq, &a_cq, opts)?;
        let mut qb = link.b().create_qp(&b_cq, &b_cq, opts)?;
        qa.connect(&qb.remote_info())?;
        qb.connect(&qa.remote_info())?;
        for buf in 0..RECV_BUFS {
            post_recv(&mut qb, &b_mr, &lay, i, buf)?;
        }
        flows.push(Flow {
            cc,
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
    let qp_count = flows.len() as u64 * 2;
    println!(
        "roce-soak: {} s, {} QP pairs ({} per CC: {}), WRITE_IMM/SEND_IMM/READ of 1..={} B, window {}, MTU {}; stage loss {} dup {} reorder {} corrupt {} (both directions), seed {}",
        o.secs,
        flows.len(),
        o.qps_per_cc,
        ccs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        o.max_msg,
        o.window,
        o.mtu,
        o.loss,
        o.dup,
        o.reorder,
        o.corrupt,
        o.seed
    );

    let warmup = Duration::from_secs(o.warmup_secs.unwrap_or((o.secs / 5).max(5)));
    let run = Duration::from_secs(o.secs);
    let start = Instant::now();
    let mut mix = Mix(o.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut scratch = vec![0u8; o.max_msg];
    let mut wcs = [WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
    }; 64];
    let qpn_index_a: Vec<u32> = flows.iter().map(|f| f.qa.qpn()).collect();
    let qpn_index_b: Vec<u32> = flows.iter().map(|f| f.qb.qpn()).collect();
    let mut next_sample = start + Duration::from_secs(1);
    let (mut warm_rss, mut warm_mbufs) = (0u64, 0u64);
    let (mut peak_rss, mut peak_mbufs) = (0u64, 0u64);
    let mut quiet_mbufs: Option<u64> = None;
    let mut totals = Totals { msgs: 0, bytes: 0 };
    let mut posting = true;
    let mut last_print = start;

    loop {
        let now = Instant::now();
        let elapsed = now - start;
        // At the end of the warm-up, and at the end of the run, stop posting
        // until every message is done: the mbufs in use when nothing is in
        // flight, compared, are the leak check.
        let draining = elapsed >= run || (quiet_mbufs.is_none() && elapsed >= warmup);
        if draining && posting {
            posting = false;
        }
        if posting {
            for (i, f) in flows.iter_mut().enumerate() {
                post_more(f, i, &lay, &a_mr, &b_mr, &mut mix, &mut scratch)?;
            }
        }
        let n = a_cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            let i = qpn_index_a.iter().position(|&q| q == wc.qp_num);
            let i = i.ok_or(SoakError::Unexpected {
                qp: usize::MAX,
                cc: CcKind::None,
                opcode: wc.opcode,
                wr_id: wc.wr_id,
            })?;
            on_send_completion(&mut flows[i], i, wc, &lay, &a_mr, &mut scratch, &mut totals)?;
        }
        let n = b_cq.poll(&mut wcs);
        for wc in &wcs[..n] {
            let i = qpn_index_b.iter().position(|&q| q == wc.qp_num);
            let i = i.ok_or(SoakError::Unexpected {
                qp: usize::MAX,
                cc: CcKind::None,
                opcode: wc.opcode,
                wr_id: wc.wr_id,
            })?;
            on_receive(&mut flows[i], i, wc, &lay, &b_mr, &mut scratch, &mut totals)?;
        }
        let outstanding: usize = flows.iter().map(|f| f.inflight.len()).sum();
        if !posting && outstanding == 0 {
            // Let the stage and the engines settle (ACKs of duplicates,
            // held frames), then count the mbufs in use.
            std::thread::sleep(Duration::from_millis(300));
            let m = mbufs_in_use(eal);
            match quiet_mbufs {
                None => {
                    println!(
                        "{:>5.0} s  warm-up over, drained: {} mbufs in use, RSS {:.1} MiB",
                        start.elapsed().as_secs_f64(),
                        m,
                        rss_bytes() as f64 / 1048576.0
                    );
                    quiet_mbufs = Some(m);
                    posting = elapsed < run;
                }
                Some(q) => {
                    // The end: in use must be back to the warm-up's quiet level
                    // (per-lcore caches may hold up to a cache's worth).
                    let limit = q + 512;
                    if m > limit {
                        return Err(SoakError::Growth {
                            what: "mbufs in use when idle",
                            after: m,
                            limit,
                            base: q,
                        });
                    }
                    println!(
                        "{:>5.0} s  drained: {} mbufs in use (after warm-up: {q})",
                        start.elapsed().as_secs_f64(),
                        m
                    );
                    break;
                }
            }
        } else if !posting && elapsed > run.max(warmup) + Duration::from_secs(30) {
            return Err(SoakError::Drain(outstanding, Duration::from_secs(30)));
        }
        if now >= next_sample {
            next_sample += Duration::from_secs(1);
            let rss = rss_bytes();
            let mbufs = mbufs_in_use(eal);
            let t = now - start;
            if t < warmup {
                warm_rss = warm_rss.max(rss);
                warm_mbufs = warm_mbufs.max(mbufs);
            } else {
                peak_rss = peak_rss.max(rss);
                peak_mbufs = peak_mbufs.max(mbufs);
                let rss_limit = warm_rss + (o.rss_slack_mib << 20);
                if rss > rss_limit {
                    return Err(SoakError::Growth {
                        what: "RSS (bytes)",
                        after: rss,
                        limit: rss_limit,
                        base: warm_rss,
                    });
                }
                // In flight varies with the load (frames queued while an
                // engine is descheduled): allow twice the warm-up's maximum,
                // or 2048 more. A leak of one mbuf per lost frame passes that
                // within a minute; the drained count at the end is exact.
                let mbuf_limit = (2 * warm_mbufs).max(warm_mbufs + 2048);
                if mbufs > mbuf_limit {
                    return Err(SoakError::Growth {
                        what: "mbufs in use",
                        after: mbufs,
                        limit: mbuf_limit,
                        base: warm_mbufs,
                    });
                }
            }
            if now - last_print >= Duration::from_secs(o.print_every) {
                last_print = now;
                let c = &link.counters;
                println!(
                    "{:>5.0} s  msgs {:>9}  MiB {:>8.1}  RSS {:>6.1} MiB  mbufs {:>6}  QPs {}  stage: dropped {} dup {} reordered {} corrupted {}",
                    t.as_secs_f64(),
                    totals.msgs,
                    totals.bytes as f64 / 1048576.0,
                    rss as f64 / 1048576.0,
                    mbufs,
                    qp_count,
                    c.dropped.load(std::sync::atomic::Ordering::Relaxed),
                    c.duplicated.load(std::sync::atomic::Ordering::Relaxed),
                    c.reordered.load(std::sync::atomic::Ordering::Relaxed),
                    c.corrupted.load(std::sync::atomic::Ordering::Relaxed),
                );
            }
        }
        if n == 0 {
            std::thread::yield_now();
        }
    }

    let secs = start.elapsed().as_secs_f64();
    let (ca, cb) = (link.a().counters(), link.b().counters());
    let c = &link.counters;
    let ld = |x: &std::sync::atomic::AtomicU64| x.load(std::sync::atomic::Ordering::Relaxed);
    println!("\ncc        msgs    WRITE_IMM   SEND_IMM       READ        MiB");
    for &cc in &ccs {
        let (mut m, mut d, mut b) = (0, [0u64; 3], 0);
        for f in flows.iter().filter(|f| f.cc == cc) {
            m += f.done.iter().sum::<u64>();
            for (dk, fk) in d.iter_mut().zip(f.done) {
                *dk += fk;
            }
            b += f.bytes;
        }
        println!(
            "{:<8} {:>6} {:>12} {:>10} {:>10} {:>10.1}",
            cc.to_string(),
            m,
            d[0],
            d[1],
            d[2],
            b as f64 / 1048576.0
        );
    }
    println!(
        "stage: forwarded {} dropped {} duplicated {} reordered {} corrupted {}",
        ld(&c.forwarded),
        ld(&c.dropped),
        ld(&c.duplicated),
        ld(&c.reordered),
        ld(&c.corrupted)
    );
    for (name, k) in [("A", &ca), ("B", &cb)] {
        println!(
            "NIC {name}: retransmits {} timeouts {} duplicates {} out-of-sequence {} ICRC drops {} malformed {} not-RoCE {} unknown-QP {} seq NAKs {}",
            k.retransmits,
            k.timeouts,
            k.rx_duplicates,
            k.rx_out_of_sequence,
            k.rx_drop_icrc,
            k.rx_drop_malformed,
            k.rx_drop_not_roce,
            k.rx_drop_unknown_qp,
            k.tx_seq_naks
        );
    }
    println!(
        "memory: RSS warm-up max {:.1} MiB, after {:.1} MiB; mbufs in use warm-up max {}, after {}; QPs {} throughout",
        warm_rss as f64 / 1048576.0,
        peak_rss as f64 / 1048576.0,
        warm_mbufs,
        peak_mbufs,
        qp_count
    );
    println!(
        "roce-soak: PASS: {} messages, {:.1} MiB in {:.0} s, every byte checked, none lost or delivered twice",
        totals.msgs,
        totals.bytes as f64 / 1048576.0,
        secs
    );
    let impaired = [
        (o.loss, ld(&c.dropped), "dropped a frame"),
        (o.dup, ld(&c.duplicated), "duplicated a frame"),
        (o.reorder, ld(&c.reordered), "reordered a frame"),
        (o.corrupt, ld(&c.corrupted), "corrupted a frame"),
    ];
    for (p, n, what) in impaired {
        if p > 0.0 && n == 0 {
            return Err(SoakError::Untested(what));
        }
    }
    if o.corrupt > 0.0 && ca.rx_drop_icrc + cb.rx_drop_icrc == 0 {
        return Err(SoakError::Untested(
            "had a corrupted frame caught by the ICRC",
        ));
    }
    Ok(())
}

fn post_recv(
    qb: &mut QueuePair,
    b_mr: &MemoryRegion,
    lay: &Layout,
    qp: usize,
    buf: usize,
) -> Result<(), SoakError> {
    qb.post_recv(RecvWr {
        wr_id: buf as u64,
        sge: Sge {
            addr: b_mr.va() + lay.b_recv(qp, buf) as u64,
            len: lay.max_msg as u32,
            lkey: b_mr.lkey(),
        },
    })?;
    Ok(())
}

/// Posts messages while the QP has a free slot.
fn post_more(
    f: &mut Flow,
    i: usize,
    lay: &Layout,
    a_mr: &MemoryRegion,
    b_mr: &MemoryRegion,
    mix: &mut Mix,
    scratch: &mut [u8],
) -> Result<(), SoakError> {
    loop {
        let slot = (f.next_seq % lay.window as u64) as usize;
        if f.slot_busy[slot] || f.qa.free_slots() == 0 {
            return Ok(());
        }
        let r = mix.next();
        let op = match r % 3 {
            0 => Op::WriteImm,
            1 => Op::SendImm,
            _ => Op::Read,
        };
        let len = 1 + ((r >> 8) as usize % lay.max_msg);
        let seq = f.next_seq;
        let seed = message_seed(i as u32, seq);
        pattern_fill(seed, &mut scratch[..len]);
        let (sop, local) = match op {
            Op::WriteImm | Op::SendImm => {
                a_mr.write(lay.a_src(i, slot), &scratch[..len]);
                let imm = f.next_imm;
                let sop = if op == Op::WriteImm {
                    SendOp::WriteImm {
                        remote_va: b_mr.va() + lay.b_write(i, slot) as u64,
                        rkey: b_mr.rkey(),
                        imm,
                    }
                } else {
                    SendOp::SendImm(imm)
                };
                (sop, lay.a_src(i, slot))
            }
            Op::Read => {
                // The responder's memory holds this message's pattern; the
                // landing slot is cleared so that a READ that writes nothing fails.
                b_mr.write(lay.b_read_src(i, slot), &scratch[..len]);
                scratch[..len].fill(0);
                a_mr.write(lay.a_read(i, slot), &scratch[..len]);
                (
                    SendOp::Read {
                        remote_va: b_mr.va() + lay.b_read_src(i, slot) as u64,
                        rkey: b_mr.rkey(),
                    },
                    lay.a_read(i, slot),
                )
            }
        };
        f.qa.post_send(SendWr {
            wr_id: seq,
            op: sop,
            sge: Sge {
                addr: a_mr.va() + local as u64,
                len: len as u32,
                lkey: a_mr.lkey(),
            },
            signaled: true,
            solicited: false,
        })?;
        let visible = op != Op::Read;
        if visible {
            f.next_imm = f.next_imm.wrapping_add(1);
        }
        f.inflight.push_back(Msg {
            seq,
            op,
            slot,
            len,
            seed,
            sent: true,
            received: visible,
        });
        f.slot_busy[slot] = true;
        f.next_seq += 1;
    }
}

fn retire(f: &mut Flow, totals: &mut Totals) {
    while let Some(m) = f.inflight.front() {
        if m.sent || m.received {
            break;
        }
        let m = f.inflight.pop_front().expect("front");
        f.slot_busy[m.slot] = false;
        f.done[m.op as usize] += 1;
        f.bytes += m.len as u64;
        totals.msgs += 1;
        totals.bytes += m.len as u64;
    }
}

fn on_send_completion(
    f: &mut Flow,
    i: usize,
    wc: &WorkCompletion,
    lay: &Layout,
    a_mr: &MemoryRegion,
    scratch: &mut [u8],
    totals: &mut Totals,
) -> Result<(), SoakError> {
    let cc = f.cc;
    let Some(m) = f.inflight.iter_mut().find(|m| m.seq == wc.wr_id && m.sent) else {
        return Err(SoakError::Unexpected {
            qp: i,
            cc,
            opcode: wc.opcode,
            wr_id: wc.wr_id,
        });
    };
    if wc.status != WcStatus::Success {
        return Err(SoakError::Status {
            qp: i,
            cc,
            what: m.op.name(),
            status: wc.status,
        });
    }
    m.sent = false;
    if m.op == Op::Read {
        let data = &mut scratch[..m.len];
        a_mr.read(lay.a_read(i, m.slot), data);
        if let Some(at) = pattern_mismatch(m.seed, data) {
            return Err(SoakError::Bytes {
                qp: i,
                cc,
                seq: m.seq,
                op: m.op.name(),
                at,
                len: m.len,
            });
        }
    }
    retire(f, totals);
    Ok(())
}

fn on_receive(
    f: &mut Flow,
    i: usize,
    wc: &WorkCompletion,
    lay: &Layout,
    b_mr: &MemoryRegion,
    scratch: &mut [u8],
    totals: &mut Totals,
) -> Result<(), SoakError> {
    let cc = f.cc;
    if wc.status != WcStatus::Success {
        return Err(SoakError::Status {
            qp: i,
            cc,
            what: "receive",
            status: wc.status,
        });
    }
    let got = wc.imm.ok_or(SoakError::Unexpected {
        qp: i,
        cc,
        opcode: wc.opcode,
        wr_id: wc.wr_id,
    })?;
    if got != f.want_imm {
        return Err(SoakError::Order {
            qp: i,
            cc,
            got,
            want: f.want_imm,
        });
    }
    f.want_imm = f.want_imm.wrapping_add(1);
    // The oldest message still waiting for its receiver is this one.
    let m = f
        .inflight
        .iter_mut()
        .find(|m| m.received)
        .ok_or(SoakError::Order {
            qp: i,
            cc,
            got,
            want: u32::MAX,
        })?;
    m.received = false;
    let (at, expect_op) = match m.op {
        Op::WriteImm => (lay.b_write(i, m.slot), WcOpcode::RecvRdmaWithImm),
        Op::SendImm => (lay.b_recv(i, wc.wr_id as usize), WcOpcode::Recv),
        Op::Read => unreachable!("READs are not receiver-visible"),
    };
    if wc.opcode != expect_op {
        return Err(SoakError::Unexpected {
            qp: i,
            cc,
            opcode: wc.opcode,
            wr_id: wc.wr_id,
        });
    }
    if m.op == Op::SendImm && wc.byte_len as usize != m.len {
        return Err(SoakError::Length {
            qp: i,
            cc,
            seq: m.seq,
            got: wc.byte_len,
            want: m.len,
        });
    }
    let data = &mut scratch[..m.len];
    b_mr.read(at, data);
    if let Some(off) = pattern_mismatch(m.seed, data) {
        return Err(SoakError::Bytes {
            qp: i,
            cc,
            seq: m.seq,
            op: m.op.name(),
            at: off,
            len: m.len,
        });
    }
    // Every receive consumed a buffer: post it again.
    post_recv(&mut f.qb, b_mr, lay, i, wc.wr_id as usize)?;
    retire(f, totals);
    Ok(())
}
