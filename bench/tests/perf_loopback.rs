//! `roce-perf --loopback`: server and client in one process on a ring pair,
//! perftest's tables and units, for a bandwidth and a latency test of each
//! kind.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_roce-perf");

fn run(args: &[&str]) -> String {
    let o = Command::new(BIN)
        .args(args)
        .args(["--loopback", "--ip", "10.0.0.1", "-m", "1024"])
        .output()
        .expect("run roce-perf");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "roce-perf {args:?}:\n{text}");
    text
}

/// The numbers of the row that starts with `bytes`.
fn row(out: &str, bytes: &str) -> Vec<f64> {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(bytes))
        .unwrap_or_else(|| panic!("no {bytes} row in:\n{out}"));
    line.split_whitespace()
        .map(|c| c.parse().expect("a number"))
        .collect()
}

#[test]
fn bandwidth_tests_print_perftest_rows() {
    for test in ["write_bw", "read_bw", "send_bw"] {
        let out = run(&[test, "-n", "300", "-s", "16384", "--report_gbits"]);
        assert!(out.contains(" local address: LID 0000 QPN 0x"), "{out}");
        assert!(out.contains(" remote address: LID 0000 QPN 0x"), "{out}");
        assert!(
            out.contains(
                "#bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
            ),
            "{out}"
        );
        let r = row(&out, "16384");
        assert_eq!(r[1], 300.0, "{out}");
        assert!(r[3] > 0.0 && r[2] >= r[3] * 0.99, "peak >= average: {out}");
        // MsgRate is average bandwidth / message size, the bandwidth as
        // printed: to 0.01 Gbit/s (which is 3 % at 0.14 Gbit/s on a loaded
        // machine).
        let rate = r[3] * 1e9 / 8.0 / 16384.0 / 1e6;
        let printed = 0.005 * 1e9 / 8.0 / 16384.0 / 1e6;
        assert!((r[4] - rate).abs() <= rate * 0.02 + printed, "{out}");
        // Only the client's table is printed.
        assert_eq!(out.matches("#bytes").count(), 1, "{out}");
    }
}

#[test]
fn latency_tests_print_perftest_rows() {
    for test in ["write_lat", "read_lat", "send_lat"] {
        let out = run(&[test, "-n", "300"]);
        assert!(out.contains("t_typical[usec]"), "{out}");
        assert!(out.contains("99.9% percentile[usec]"), "{out}");
        let r = row(&out, "2");
        assert_eq!(r[1], 300.0, "{out}");
        let (min, max, typ, avg) = (r[2], r[3], r[4], r[5]);
        assert!(
            min > 0.0 && min <= typ && typ <= max && min <= avg && avg <= max,
            "{out}"
        );
    }
}

#[test]
fn several_qps_share_the_work() {
    for test in ["write_bw", "send_bw"] {
        let out = run(&[test, "-q", "3", "-n", "300", "-s", "8192"]);
        assert!(out.contains(" Number of qps   : 3"), "{out}");
        assert_eq!(out.matches(" local address: LID").count(), 3, "{out}");
        assert_eq!(out.matches(" remote address: LID").count(), 3, "{out}");
        let r = row(&out, "8192");
        assert_eq!(r[1], 300.0, "{out}");
    }
    // Latency tests use one QP, as perftest's.
    let o = Command::new(BIN)
        .args(["write_lat", "-q", "2", "--loopback", "--ip", "10.0.0.1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("-q applies to the bandwidth tests"));
}

/// `--shared-buffer`: every QP on the one pair of units of `-q 1` (so only
/// the QPs' own state grows with `-q`); each test kind still runs every
/// message of every QP to completion.
#[test]
fn shared_buffer_runs_every_qp() {
    for test in ["write_bw", "read_bw", "send_bw"] {
        let out = run(&[
            test,
            "-q",
            "8",
            "-n",
            "200",
            "-s",
            "8192",
            "--shared-buffer",
        ]);
        assert!(out.contains(" Number of qps   : 8"), "{out}");
        assert_eq!(out.matches(" remote address: LID").count(), 8, "{out}");
        let r = row(&out, "8192");
        assert_eq!(r[1], 200.0, "{out}");
    }
}

#[test]
fn sharded_nics_run_every_test_kind() {
    // --shards 2: each NIC's QPs over two engines, each on its own queue
    // pair of the ring pair (or, --dispatcher, behind a dispatcher); the 4
    // QPs land on both shards (QPNs 16384 apart).
    for (test, layout) in [
        ("write_bw", None),
        ("read_bw", None),
        ("send_bw", None),
        ("write_bw", Some("--dispatcher")),
        ("read_bw", Some("--dispatcher")),
    ] {
        let mut args = vec![test, "-q", "4", "--shards", "2", "-n", "200", "-s", "8192"];
        args.extend(layout);
        let out = run(&args);
        let qpns: Vec<u32> = out
            .lines()
            .filter(|l| l.contains(" local address: LID"))
            .map(|l| {
                let h = l
                    .split("QPN 0x")
                    .nth(1)
                    .expect("QPN")
                    .split(' ')
                    .next()
                    .unwrap();
                u32::from_str_radix(h, 16).unwrap()
            })
            .collect();
        assert_eq!(qpns.len(), 4, "{out}");
        assert!(
            qpns.iter().max().unwrap() - qpns.iter().min().unwrap() >= 16384,
            "QPs on one shard only: {qpns:x?}\n{out}"
        );
        assert_eq!(row(&out, "8192")[1], 200.0, "{out}");
    }
    let out = run(&["write_lat", "--shards", "2", "-n", "200"]);
    assert!(row(&out, "2").len() >= 5, "{out}");
    // --shards 1: one engine per side on the port's one queue pair, with
    // no steering between shards (nothing to steer to).
    for test in ["write_bw", "read_bw"] {
        let out = run(&[test, "--shards", "1", "-n", "200", "-s", "65536"]);
        assert_eq!(row(&out, "65536")[1], 200.0, "{out}");
    }
}

#[test]
fn latency_tests_above_32_bytes() {
    // Each side's buffer holds its own message and the peer's: 64 B failed
    // (send_lat: LocProtErr; write_lat: a panic reading outside the region).
    for test in ["write_lat", "send_lat", "read_lat"] {
        for size in ["64", "4096", "65536"] {
            let out = run(&[test, "-n", "50", "-s", size]);
            let r = row(&out, size);
            assert_eq!(r[1], 50.0, "{test} -s {size}:\n{out}");
            assert!(r[2] > 0.0, "{test} -s {size}:\n{out}");
        }
    }
}

#[test]
fn all_sizes_as_perftest() {
    // -a: 2 B .. 8 MiB (2^1 .. 2^23), one row each, for both kinds.
    for test in ["write_bw", "write_lat"] {
        let out = run(&[test, "-a", "-n", "4"]);
        for p in 1..=23 {
            let size = (1u64 << p).to_string();
            assert_eq!(row(&out, &size)[1], 4.0, "{test} {size}:\n{out}");
        }
    }
}

#[test]
fn out_json_has_final_counters_and_loopback_captures() {
    let dir = std::env::temp_dir();
    let json = dir.join(format!("rsnic-loop-{}.json", std::process::id()));
    let pcap = dir.join(format!("rsnic-loop-{}.pcapng", std::process::id()));
    let json_s = json.to_string_lossy().to_string();
    let pcap_s = pcap.to_string_lossy().to_string();
    run(&[
        "write_bw",
        "-n",
        "300",
        "-s",
        "16384",
        "--out_json",
        &json_s,
        "--pcap",
        &pcap_s,
    ]);
    let j = std::fs::read_to_string(&json).expect("--out_json written");
    let counter = |k: &str| -> u64 {
        let at = j
            .find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} in {j}"));
        j[at + k.len() + 3..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    // 300 messages of 16 packets (MTU 1024), every one counted, and the
    // ACKs that completed them.
    assert!(counter("tx_data_packets") >= 300 * 16, "{j}");
    assert!(counter("rx_acks") >= 1, "{j}");
    assert!(j.contains("\"exchange\":\"rsnic\""), "{j}");
    // The capture holds the frames: at least the data packets' bytes.
    let cap = std::fs::metadata(&pcap)
        .expect("--loopback --pcap wrote a capture")
        .len();
    assert!(cap > 300 * 16 * 64, "capture of {cap} bytes");
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&pcap);
}

#[test]
fn post_lists_move_every_message_of_every_qp() {
    // -l 8: QPs take turns in lists of 8 requests, one doorbell each; every
    // QP still completes its -n (the row's iterations are per QP, counted
    // from the completions), with READ, WRITE and SEND.
    for test in ["write_bw", "read_bw", "send_bw"] {
        let out = run(&[test, "-q", "3", "-l", "8", "-n", "400", "-s", "256"]);
        assert_eq!(row(&out, "256")[1], 400.0, "{test}:\n{out}");
        // Every payload copied into one-segment frames (no attach).
        let out = run(&[test, "-n", "200", "-s", "8192", "--copy_threshold", "4096"]);
        assert_eq!(row(&out, "8192")[1], 200.0, "{test}:\n{out}");
    }
    let o = Command::new(BIN)
        .args([
            "write_bw",
            "-l",
            "8",
            "-n",
            "401",
            "--loopback",
            "--ip",
            "10.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be a multiple of -l 8"));
}

/// A thread's `Cpus_allowed_list` (as /proc prints it, e.g. `0-1`).
fn cpus_allowed(status: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|v| v.trim().to_string())
}

/// The CPUs the loopback's client thread may run on, and the process's
/// main thread's, read from /proc while a run of `extra` goes on. The
/// client's set is read until `settled` takes it (a thread pins itself a
/// moment after it is named) or the run is over.
fn client_and_process_cpus(extra: &[&str], settled: impl Fn(&str) -> bool) -> (String, String) {
    let mut child = Command::new(BIN)
        .args(["write_bw", "-s", "64", "-D", "2"])
        .args(["--loopback", "--ip", "10.0.0.1", "-m", "1024"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run roce-perf");
    let proc_dir = format!("/proc/{}", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let client = loop {
        let found = std::fs::read_dir(format!("{proc_dir}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "roce-perf-clien")
            })
            .and_then(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .and_then(|s| cpus_allowed(&s));
        let exited = child.try_wait().ok().flatten().is_some();
        match found {
            Some(c) if settled(&c) || exited => break c,
            None if exited => panic!("roce-perf {extra:?} ended before its client thread was seen"),
            _ => {}
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no client thread within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let process = std::fs::read_to_string(format!("{proc_dir}/status"))
        .ok()
        .and_then(|s| cpus_allowed(&s))
        .expect("the process's status");
    assert!(child.wait().expect("wait").success(), "roce-perf {extra:?}");
    (client, process)
}

/// The loopback's server and client threads park while they wait, so they
/// are left to the kernel (pinned beside a busy process, a woken client
/// waited out its slice); with `--busy_poll` they spin and keep CPU 0 away
/// from the engines (on a machine with more than one CPU).
#[test]
fn the_loopback_client_floats_unless_it_spins() {
    let (client, process) = client_and_process_cpus(&[], |_| true);
    assert_eq!(client, process, "a parking client is not pinned");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (client, process) = client_and_process_cpus(&["--busy_poll"], |c| cpus == 1 || c == "0");
    if cpus > 1 {
        assert_eq!(client, "0", "a spinning client keeps CPU 0");
    } else {
        assert_eq!(client, process);
    }
}

/// A run whose completions are far apart still completes: on a 1 Gbit/s
/// line, 40 MiB WRITEs signaled one in 32 (`-Q 32`) complete once per
/// 1.3 GB, about 11 s, more than a fixed 10 s wait allowed; the wait now
/// grows with the bytes in flight.
#[test]
fn completions_seconds_apart_do_not_end_the_run() {
    let out = run(&[
        "write_bw",
        "-s",
        "41943040",
        "-n",
        "33",
        "-Q",
        "32",
        "--line_rate_gbps",
        "1",
    ]);
    let r = row(&out, "41943040");
    assert_eq!(r[1], 33.0, "{out}");
}

/// Arguments no run can use are refused before anything starts, with the
/// flag and the range in the message: a message over IBA's 2^31 bytes, no
/// QP, a send queue of no entry.
#[test]
fn impossible_sizes_and_depths_are_refused() {
    for (flag, value) in [("-s", "2147483649"), ("-q", "0"), ("-t", "0")] {
        let o = Command::new(BIN)
            .args(["write_bw", "--loopback", "--ip", "10.0.0.1", flag, value])
            .output()
            .expect("run roce-perf");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(&format!("invalid value '{value}'")), "{err}");
    }
}
