//! Two `roce-perf` processes in two network namespaces, each NIC on a TAP
//! interface (scripts/netns.sh makes the topology), complete WRITE and READ
//! bandwidth tests and a latency test, and refuse a mismatched test with a
//! clear error. Needs root (namespaces, TAP devices), as CI has.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_roce-perf");

/// The namespaces' prefix: `$RSNIC_NETNS-a` and `-b` (default `rsnic`),
/// so that scripts/netns-flake.sh can run this test beside others'.
fn ns(side: &str) -> String {
    format!(
        "{}-{side}",
        std::env::var("RSNIC_NETNS").unwrap_or_else(|_| "rsnic".into())
    )
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/netns.sh")
}

struct Topology;

impl Topology {
    fn up() -> Topology {
        let st = Command::new(script())
            .arg("up")
            .status()
            .expect("run scripts/netns.sh");
        assert!(st.success(), "scripts/netns.sh up failed (root needed)");
        Topology
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("down").status();
    }
}

fn spawn(ns: &str, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", ns, BIN])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce-perf")
}

fn finish(mut c: Child, limit: Duration) -> Output {
    let end = Instant::now() + limit;
    loop {
        if c.try_wait().expect("wait").is_some() {
            return c.wait_with_output().expect("output");
        }
        if Instant::now() > end {
            let _ = c.kill();
            let o = c.wait_with_output().expect("output");
            panic!(
                "roce-perf did not finish in {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one test on both sides; returns (server, client) outputs.
fn pair(server_test: &str, client_test: &str, extra: &[&str]) -> (Output, Output) {
    pair_with(server_test, client_test, extra, &[])
}

/// As [`pair`], with arguments for the client only.
fn pair_with(
    server_test: &str,
    client_test: &str,
    extra: &[&str],
    client_only: &[&str],
) -> (Output, Output) {
    let mut sargs = vec![
        server_test,
        "--dev",
        "net_tap0,iface=rt-a",
        "--ip",
        "10.0.0.1",
        "-m",
        "1024",
    ];
    sargs.extend_from_slice(extra);
    let server = spawn(&ns("a"), &sargs);
    std::thread::sleep(Duration::from_millis(300));
    let mut cargs = vec![
        client_test,
        "--dev",
        "net_tap0,iface=rt-b",
        "--ip",
        "10.0.0.2",
        "-m",
        "1024",
    ];
    cargs.extend_from_slice(extra);
    cargs.extend_from_slice(client_only);
    cargs.push("10.99.0.1");
    let client = spawn(&ns("b"), &cargs);
    let c = finish(client, Duration::from_secs(120));
    let s = finish(server, Duration::from_secs(30));
    (s, c)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn roce_perf_between_two_namespaces_over_tap() {
    dpdk::Eal::require_root("network namespaces and TAP ports");
    let _topo = Topology::up();
    let dir = std::env::temp_dir();
    for test in ["write_bw", "read_bw", "send_bw"] {
        let json = dir.join(format!("rsnic-netns-{test}-{}.json", std::process::id()));
        let json_s = json.to_string_lossy().to_string();
        let (s, c) = pair_with(
            test,
            test,
            &["-n", "200", "-s", "16384"],
            &["--out_json", &json_s],
        );
        assert!(
            s.status.success() && c.status.success(),
            "{test}\n--- server:\n{}\n--- client:\n{}",
            text(&s),
            text(&c)
        );
        let out = String::from_utf8_lossy(&c.stdout);
        assert!(out.contains(" local address: LID 0000 QPN 0x"), "{out}");
        assert!(out.contains(" remote address: LID 0000 QPN 0x"), "{out}");
        assert!(
            out.contains(
                "#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
            ),
            "{out}"
        );
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("16384"))
            .expect("result row");
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1], "200", "{row}");
        let avg: f64 = cols[3].parse().unwrap();
        assert!(avg > 0.0, "{row}");
        let j = std::fs::read_to_string(&json).expect("--out_json written");
        assert!(j.contains(&format!("\"test\":\"{test}\"")), "{j}");
        assert!(j.contains("\"role\":\"client\""), "{j}");
        assert!(j.contains("\"iterations\":200"), "{j}");
        let _ = std::fs::remove_file(&json);
    }

    let (s, c) = pair("read_lat", "read_lat", &["-n", "50"]);
    assert!(
        s.status.success() && c.status.success(),
        "{}\n{}",
        text(&s),
        text(&c)
    );
    let out = String::from_utf8_lossy(&c.stdout);
    assert!(
        out.contains("t_typical[usec]") && out.contains("99.9% percentile[usec]"),
        "{out}"
    );

    // A TAP in DPDK 22.11 takes no jumbo frames: a 4 KiB path MTU is refused
    // up front (as ibverbs' active_mtu follows the netdev), and by default
    // roce-perf takes the largest the port carries.
    let o = finish(
        spawn(
            &ns("a"),
            &[
                "write_bw",
                "--dev",
                "net_tap0,iface=rt-a",
                "--ip",
                "10.0.0.1",
                "-m",
                "4096",
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(!o.status.success());
    assert!(
        text(&o).contains("carries RoCE MTUs up to 1024"),
        "{}",
        text(&o)
    );

    // A different number of QPs is a different test: refused on both sides.
    let (s, c) = pair_with("write_bw", "write_bw", &["-n", "10"], &["-q", "2"]);
    assert!(!s.status.success() && !c.status.success());
    for o in [&s, &c] {
        assert!(
            text(o).contains("server runs write_bw, client asked for write_bw-q2"),
            "{}",
            text(o)
        );
    }

    // A mismatched test is refused on both sides with the same clear error.
    let (s, c) = pair("write_bw", "read_bw", &["-n", "10"]);
    assert!(!s.status.success() && !c.status.success());
    for o in [&s, &c] {
        assert!(
            text(o).contains("server runs write_bw, client asked for read_bw"),
            "{}",
            text(o)
        );
    }
}

#[test]
fn bad_flags_are_refused_clearly() {
    let o = Command::new(BIN)
        .args([
            "write_bw",
            "--ip",
            "10.0.0.1",
            "-m",
            "1000",
            "--dev",
            "net_null0",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("MTU must be 256, 512, 1024, 2048 or 4096"),
        "{}",
        text(&o)
    );
    let o = Command::new(BIN)
        .args(["write_bw", "--ip", "not-an-ip"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("invalid value 'not-an-ip'"),
        "{}",
        text(&o)
    );
}
