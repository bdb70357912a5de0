//! The `roce-switch` binary as a user runs it: errors are one clear line and a non-zero
//! exit status (never a panic); a run on two `net_null` ports prints periodic stats
//! lines and, after SIGINT, the final counters, and exits 0.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_roce-switch");
const EAL: &[&str] = &[
    "--no-huge",
    "--no-pci",
    "--no-shconf",
    "--no-telemetry",
    "-m",
    "512",
];
const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/two-port.toml");

fn temp_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("roce-switch-cli-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("write temp config");
    p
}

/// Runs the binary to completion (it must fail fast: 60 s is a hang).
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .arg("--")
        .args(EAL)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce-switch");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("roce-switch {args:?} did not exit within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// Asserts a clean failure: exit status 1, a `roce-switch: error:` line on stderr that
/// contains every one of `needles`, no panic.
fn assert_clear_error(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status; stderr:\n{err}");
    assert!(!err.contains("panicked"), "panic:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("roce-switch: error:"))
        .unwrap_or_else(|| panic!("no error line in:\n{err}"));
    for n in needles {
        assert!(line.contains(n), "{n:?} missing from {line:?}");
    }
}

#[test]
fn bad_configs_are_clear_errors() {
    // K_min above K_max: a typed config error naming the port and both values.
    let kbad = temp_file(
        "kbad.toml",
        "switch_id = 1\n[defaults]\nspeed = \"10Gbps\"\nk_min = \"300KiB\"\nk_max = \"200KiB\"\n\
         [[port]]\nid = 0\nmac = \"02:00:00:00:00:01\"\n",
    );
    let out = run(&["--config", kbad.to_str().unwrap(), "--port", "net_null0"]);
    assert_clear_error(
        &out,
        &["kbad.toml", "port 0", "k_min 307200 > k_max 204800"],
    );

    // Not TOML at all.
    let syntax = temp_file("syntax.toml", "switch_id = [\n");
    let out = run(&["--config", syntax.to_str().unwrap(), "--port", "net_null0"]);
    assert_clear_error(&out, &["syntax.toml", "TOML"]);

    // A file that does not exist.
    let out = run(&[
        "--config",
        "/nonexistent/roce-switch.toml",
        "--port",
        "net_null0",
    ]);
    assert_clear_error(&out, &["/nonexistent/roce-switch.toml"]);

    // A flag override that breaks the configuration is reported as such.
    let out = run(&[
        "--config",
        EXAMPLE,
        "--port",
        "net_null0",
        "--port",
        "net_null1",
        "--k-min",
        "900KiB",
    ]);
    assert_clear_error(&out, &["command-line overrides", "k_min"]);

    // Port count does not match the configuration.
    let out = run(&["--config", EXAMPLE, "--port", "net_null0"]);
    assert_clear_error(&out, &["2 port(s)", "1 --port"]);

    for p in [kbad, syntax] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn unknown_ports_are_clear_errors() {
    // A driver that does not exist.
    let out = run(&[
        "--config",
        EXAMPLE,
        "--port",
        "net_bogus0",
        "--port",
        "net_null1",
    ]);
    assert_clear_error(&out, &["net_bogus0"]);
    // Bad devargs for a real driver.
    let out = run(&[
        "--config",
        EXAMPLE,
        "--port",
        "net_null0,size=notanumber",
        "--port",
        "net_null1",
    ]);
    assert_clear_error(&out, &["net_null0,size=notanumber"]);
    // A PCI address with no device behind it.
    let out = run(&[
        "--config",
        EXAMPLE,
        "--port",
        "0000:99:1f.7",
        "--port",
        "net_null1",
    ]);
    assert_clear_error(&out, &["0000:99:1f.7"]);
}

#[test]
fn runs_prints_stats_and_stops_cleanly_on_sigint() {
    run_until(libc::SIGINT);
}

#[test]
fn stops_cleanly_on_sigterm() {
    run_until(libc::SIGTERM);
}

/// Runs on two `net_null` ports until two stats rounds are out, sends `sig`, and checks
/// the exit and the final counters.
fn run_until(sig: libc::c_int) {
    let mut child = Command::new(BIN)
        .args([
            "--config",
            EXAMPLE,
            "--port",
            "net_null0",
            "--port",
            "net_null1",
            "--stats-interval",
            "0.2",
            "--speed",
            "1=5Gbps",
        ])
        .arg("--")
        .args(EAL)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce-switch");
    let pid = child.id() as libc::pid_t;
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    // Wait for two stats rounds (EAL start-up without hugepages takes a moment).
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines
        .iter()
        .filter(|l: &&String| l.starts_with("port 1: rx "))
        .count()
        < 2
    {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("no stats lines within 30 s; got {lines:?}");
            }
        }
    }
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("roce-switch did not stop within 20 s of signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().expect("reader");
    lines.extend(rx.try_iter());
    let err = err_reader.join().expect("stderr reader");
    let text = lines.join("\n");
    assert_eq!(status.code(), Some(0), "stdout:\n{text}\nstderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");

    // The periodic line has every field the issue asks for.
    let stats = lines
        .iter()
        .find(|l| l.starts_with("port 0: rx "))
        .expect("stats line for port 0");
    for f in [
        "Mpps", "Gb/s", "| tx ", "| q ", " max ", "ce ", "wred ", "tail ", "int ",
    ] {
        assert!(stats.contains(f), "{f:?} missing from {stats:?}");
    }
    // Final counters after the signal, per port, with net_null's frames counted as
    // dropped (they are not IPv4), never forwarded.
    let fin = lines
        .iter()
        .position(|l| l.starts_with("final counters"))
        .unwrap_or_else(|| panic!("no final counters in:\n{text}"));
    for id in [0, 1] {
        let line = lines[fin..]
            .iter()
            .find(|l| {
                l.trim_start()
                    .starts_with(&format!("port {id}: rx_packets="))
            })
            .unwrap_or_else(|| panic!("no final counters for port {id}:\n{text}"));
        let field = |k: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{k} missing from {line:?}"))
        };
        assert!(field("rx_packets") > 0, "{line}");
        assert_eq!(field("rx_not_ipv4"), field("rx_packets"), "{line}");
        assert_eq!(field("tx_packets"), 0, "{line}");
    }
}
