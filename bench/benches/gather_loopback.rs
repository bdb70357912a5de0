//! Issue 40's two ratios, each measured in one run, rounds alternating:
//!
//! 1. **Scatter/gather**: single-QP 64 KiB RDMA WRITE goodput with the
//!    message in 1 SGE, and the same bytes in 4 and 16 SGEs (gathered
//!    zero-copy, an external mbuf segment per SGE window), between two
//!    engines on a ring pair (both engines on one poll-mode core, as
//!    `nic_goodput`).
//! 2. **Loopback**: the same WRITE between two QPs of one NIC (frames
//!    looped back inside the engine, never on the wire) against two NICs
//!    on two TAPs joined by a Linux bridge (through the kernel), RoCE MTU
//!    1024 on both.
//!
//! `cargo bench -p bench --bench gather_loopback` (GL_SECS per measurement,
//! default 2; GL_ROUNDS, default 3; GL_PARTS: `sge`, `loopback` or both,
//! the default). Part 2 needs root (TAP devices, a bridge).

use std::process::Command;
use std::time::{Duration, Instant};

use dpdk::{lcore, Eal, Port};
use nic::verbs::{CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

const MSG: usize = 65536;
const OUTSTANDING: u64 = 64;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A sender QP with its CQ and buffers, WRITEs into `dst`.
struct Flow {
    qa: QueuePair,
    cq: CompletionQueue,
    src: MemoryRegion,
    dst: MemoryRegion,
    _keep: (QueuePair, CompletionQueue),
}

fn flow(a: &Device, b: &Device, sges: u8, mtu: u32) -> Flow {
    let cq = a.create_cq(1024).unwrap();
    let cqb = b.create_cq(1024).unwrap();
    let opts = QpOptions {
        max_send_sge: sges,
        mtu,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&cq, &cq, opts).unwrap();
    let mut qb = b.create_qp(&cqb, &cqb, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let buf = 16 << 20;
    Flow {
        qa,
        cq,
        src: a.reg_mr(buf, Access::LOCAL_WRITE).unwrap(),
        dst: b
            .reg_mr(buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap(),
        _keep: (qb, cqb),
    }
}

/// Goodput in Gbit/s of 64 KiB WRITEs, each gathered from `sges` equal SGEs
/// of its window, 64 outstanding, over `secs` (after 0.3 s of warm-up).
fn goodput(f: &mut Flow, sges: u8, secs: f64) -> f64 {
    let slots = (16 << 20) / MSG;
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let mut warm: Option<(Instant, u64)> = None;
    let n = u32::from(sges);
    loop {
        while posted - done < OUTSTANDING {
            let off = (posted as usize % slots * MSG) as u64;
            let wr = SendWr::signaled(
                posted,
                SendOp::Write {
                    remote_va: f.dst.va() + off,
                    rkey: f.dst.rkey(),
                },
                Sge::default(),
            );
            let part = MSG as u32 / n;
            let mut sgl = [Sge::default(); 16];
            for (k, s) in sgl[..n as usize].iter_mut().enumerate() {
                *s = f.src.sge(off + u64::from(k as u32 * part), part);
            }
            f.qa.post_send_sges(wr, &sgl[..n as usize]).unwrap();
            posted += 1;
        }
        match f.cq.poll_one() {
            Some(wc) => {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done += 1;
            }
            None => std::thread::sleep(Duration::from_micros(20)),
        }
        let el = start.elapsed().as_secs_f64();
        if warm.is_none() && el > 0.3 {
            warm = Some((Instant::now(), done));
        }
        if el > secs + 0.3 {
            break;
        }
    }
    // Drain what is in flight, so the next measurement starts clean.
    while done < posted {
        if let Some(wc) = f.cq.wait(Duration::from_secs(10)) {
            assert_eq!(wc.status, WcStatus::Success);
            done += 1;
        } else {
            panic!("no completion within 10 s");
        }
    }
    let (t0, d0) = warm.unwrap();
    (done - d0) as f64 * MSG as f64 * 8.0 / t0.elapsed().as_secs_f64() / 1e9
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn sge_part(eal: &'static Eal, rounds: usize, secs: f64) {
    let cores = lcore::available_cores();
    let (pa, pb) = Port::ring_pair(eal, "gl_sge", 4096).unwrap();
    let mut devs = Device::open_group(
        eal,
        vec![
            (pa, DeviceConfig::new([10, 0, 0, 1])),
            (pb, DeviceConfig::new([10, 0, 0, 2])),
        ],
        cores.last().copied(),
    )
    .unwrap();
    let b = devs.pop().unwrap();
    let a = devs.pop().unwrap();
    let counts = [1u8, 4, 16];
    let mut flows: Vec<Flow> = counts.iter().map(|&n| flow(&a, &b, n, 4096)).collect();
    let mut figs = vec![vec![]; counts.len()];
    for _ in 0..rounds {
        for (k, &n) in counts.iter().enumerate() {
            figs[k].push(goodput(&mut flows[k], n, secs));
        }
    }
    println!("64 KiB RDMA WRITE, one QP, ring pair, RoCE MTU 4096, {rounds} rounds of {secs} s:");
    let base = median(&mut figs[0].clone());
    for (k, &n) in counts.iter().enumerate() {
        let m = median(&mut figs[k]);
        println!(
            "  {n:>2} SGE{} {m:7.2} Gbit/s (median; rounds {:?})  ratio to 1 SGE {:.3}",
            if n == 1 { " " } else { "s" },
            figs[k]
                .iter()
                .map(|g| (g * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            m / base
        );
    }
    drop(flows);
    a.close();
    b.close();
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn loopback_part(eal: &'static Eal, rounds: usize, secs: f64) {
    Eal::require_root("TAP ports and a bridge");
    let (ta, tb, br) = ("rsgl0", "rsgl1", "br-rsgl");
    let _ = Command::new("ip").args(["link", "del", br]).output();
    let pa = Port::open(eal, &format!("net_tap_gl0,iface={ta}")).unwrap();
    let pb = Port::open(eal, &format!("net_tap_gl1,iface={tb}")).unwrap();
    let links = [pa.link_watch(), pb.link_watch()];
    // Distinct MACs (the TAP PMD may give both ports the same one, which a
    // bridge cannot forward between).
    let cfg = |last: u8| DeviceConfig {
        mac: Some([0x02, 0x52, 0x47, 0, 0, last]),
        ..DeviceConfig::new([10, 215, 0, last])
    };
    let a = Device::open(eal, pa, cfg(1)).unwrap();
    let b = Device::open(eal, pb, cfg(2)).unwrap();
    ip(&[
        "link",
        "add",
        br,
        "type",
        "bridge",
        "stp_state",
        "0",
        "forward_delay",
        "0",
    ]);
    for t in [ta, tb] {
        // No IPv6 link-local traffic from the kernel into the NICs.
        let _ = Command::new("sysctl")
            .args(["-qw", &format!("net.ipv6.conf.{t}.disable_ipv6=1")])
            .status();
        ip(&["link", "set", t, "master", br]);
        ip(&["link", "set", t, "up"]);
    }
    ip(&["link", "set", br, "up"]);
    // Until both bridge ports forward (brport state 3).
    let until = Instant::now() + Duration::from_secs(5);
    while [ta, tb].iter().any(|t| {
        std::fs::read_to_string(format!("/sys/class/net/{t}/brport/state"))
            .map_or(true, |s| s.trim() != "3")
    }) && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for l in &links {
        assert!(
            l.wait_up(Duration::from_secs(5)),
            "a TAP's link stayed down"
        );
    }
    let mut tap = flow(&a, &b, 1, 1024);
    let mut lo = flow(&a, &a, 1, 1024);
    let (mut t, mut l) = (vec![], vec![]);
    let lo_before = a.counters().tx_loopback;
    for _ in 0..rounds {
        t.push(goodput(&mut tap, 1, secs));
        l.push(goodput(&mut lo, 1, secs));
    }
    let looped = a.counters().tx_loopback - lo_before;
    println!(
        "64 KiB RDMA WRITE, one QP, RoCE MTU 1024, {rounds} rounds of {secs} s ({looped} frames looped back):"
    );
    let (mt, ml) = (median(&mut t), median(&mut l));
    println!("  two NICs over two TAPs and a bridge {mt:7.2} Gbit/s (median; rounds {t:.2?})");
    println!("  two QPs of one NIC, loopback      {ml:7.2} Gbit/s (median; rounds {l:.2?})");
    println!("  ratio loopback / TAP pair {:.2}", ml / mt);
    assert!(looped > 0, "the loopback flow never looped back");
    drop((tap, lo));
    a.close();
    b.close();
    let _ = Command::new("ip").args(["link", "del", br]).output();
}

fn main() {
    let secs: f64 = env("GL_SECS", 2.0);
    let rounds: usize = env("GL_ROUNDS", 3);
    let parts: String = env("GL_PARTS", "sge,loopback".to_string());
    let (eal, mem) = bench::memory::init_eal("gather_loopback", 256, 1024);
    println!("gather_loopback: memory {mem}");
    let cores = lcore::available_cores();
    if cores.len() > 1 {
        lcore::pin_current(cores[0]);
    }
    if parts.contains("sge") {
        sge_part(eal, rounds, secs);
    }
    if parts.contains("loopback") {
        loopback_part(eal, rounds, secs);
    }
}
