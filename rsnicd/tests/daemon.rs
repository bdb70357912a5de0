//! rsnicd as a program runs it: a real daemon process on a DPDK ring port,
//! rsnicctl and raw clients on its socket, SIGTERM at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rsnicd::proto::{Message, QpService, VERSION};
use rsnicd::sock::{self, Client};

struct Daemon {
    child: Child,
    socket: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    /// Starts rsnicd on `net_ring0` with its socket in a fresh directory
    /// (which it makes), and waits until it answers.
    fn start(tag: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("rsnicd-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let socket = dir.join("sub/rsnicd.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_rsnicd"))
            .args(["--dev", "net_ring0", "--ip", "10.0.0.9", "--socket"])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("rsnicd starts");
        let d = Daemon { child, socket, dir };
        let t0 = Instant::now();
        while Client::connect(&d.socket, "probe", Duration::from_secs(5)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rsnicd never answered"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn ctl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_rsnicctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("rsnicctl runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }

    fn counter(&self, name: &str) -> u64 {
        let (ok, out) = self.ctl(&["--json", "counters"]);
        assert!(ok, "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        v[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {name} in {out}"))
    }

    /// SIGTERM, then the exit status (within 30 s).
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = self.child.kill();
                panic!("rsnicd did not stop on SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn raw(socket: &Path, bytes: &[u8]) -> Message {
    let fd = sock::connect(socket).expect("connect");
    sock::send_raw(&fd, bytes).expect("send");
    let mut buf = Vec::new();
    sock::recv(&fd, &mut buf).expect("an answer").0
}

#[test]
fn rsnicd_serves_status_counters_and_programs_and_stops_on_sigterm() {
    let d = Daemon::start("serve");
    let meta = std::fs::metadata(&d.socket).expect("socket file");
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);

    let (ok, out) = d.ctl(&["--json", "status"]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["dev"], "net_ring0");
    assert_eq!(v["ip"], serde_json::json!([10, 0, 0, 9]));
    assert_eq!(v["daemon_pid"], d.child.id());
    let (ok, out) = d.ctl(&["status"]);
    assert!(ok && out.contains("ip 10.0.0.9"), "{out}");

    // A program attached is listed with the kernel's PID for it, not a
    // number it could make up.
    let (_held, w) =
        Client::connect(&d.socket, "held-open", Duration::from_secs(5)).expect("attach");
    assert_eq!(w.dev, "net_ring0");
    let (ok, out) = d.ctl(&["--json", "programs"]);
    assert!(ok, "{out}");
    let list: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    let held = list
        .iter()
        .find(|p| p["name"] == "held-open")
        .expect("listed");
    assert_eq!(held["pid"], std::process::id());
    assert!(d.counter("programs") >= 1);
    assert!(d.counter("ctl_connections") >= 3);

    let st = d.stop();
    assert!(st.success(), "rsnicd exited {st:?}");
}

#[test]
fn malformed_messages_are_refused_and_counted() {
    let d = Daemon::start("malformed");
    let before = d.counter("ctl_malformed");
    // Not this protocol at all.
    let r = raw(&d.socket, b"GET / HTTP/1.0\r\n\r\n");
    assert!(
        matches!(r, Message::Error { errno, .. } if errno == libc::EINVAL),
        "{r:?}"
    );
    // A valid header whose body is cut short.
    let mut b = Message::Hello {
        version: VERSION,
        name: "cut".into(),
    }
    .encode(1)
    .unwrap();
    b.truncate(b.len() - 1);
    let r = raw(&d.socket, &b);
    assert!(matches!(r, Message::Error { .. }), "{r:?}");
    // Well-formed, but not a request.
    let b = Message::Counters(vec![]).encode(2).unwrap();
    let r = raw(&d.socket, &b);
    assert!(matches!(r, Message::Error { .. }), "{r:?}");
    // Another protocol version: refused, not counted as malformed.
    let b = Message::Hello {
        version: VERSION + 1,
        name: "future".into(),
    }
    .encode(3)
    .unwrap();
    let r = raw(&d.socket, &b);
    assert!(
        matches!(r, Message::Error { errno, .. } if errno == libc::EPROTO),
        "{r:?}"
    );
    assert_eq!(d.counter("ctl_malformed"), before + 3);
    // The daemon still serves.
    assert!(d.ctl(&["status"]).0);
    assert!(d.stop().success());
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_a_stale_file_replaced() {
    let d = Daemon::start("second");
    let out = Command::new(env!("CARGO_BIN_EXE_rsnicd"))
        .args(["--dev", "net_ring1", "--ip", "10.0.0.8", "--socket"])
        .arg(&d.socket)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another rsnicd listens"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let socket = d.socket.clone();
    let dir = d.dir.clone();
    assert!(d.stop().success());
    assert!(!socket.exists(), "the socket file stays after SIGTERM");
    // A file left by a daemon that died (SIGKILL) does not stop the next.
    let mut d = Daemon::start("second");
    assert_eq!(d.socket, socket);
    let _ = d.child.kill();
    let _ = d.child.wait();
    assert!(socket.exists());
    let d2 = Daemon::start("second");
    assert!(d2.ctl(&["status"]).0);
    assert!(d2.stop().success());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_port_that_does_not_open_leaves_no_socket_behind() {
    let dir = std::env::temp_dir().join(format!("rsnicd-test-badport-{}", std::process::id()));
    let socket = dir.join("rsnicd.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_rsnicd"))
        .args(["--dev", "net_nosuchpmd0", "--ip", "10.0.0.7", "--socket"])
        .arg(&socket)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(!socket.exists(), "the socket file stays");
    let _ = std::fs::remove_dir_all(dir);
}

/// Not a test on its own: the child process of
/// `a_program_killed_has_its_qps_reclaimed` (the test binary run again with
/// RSNICD_TEST_HOLD set): attaches, creates three QPs, says so, and waits to
/// be killed.
#[test]
fn child_holding_qps() {
    let Some(socket) = std::env::var_os("RSNICD_TEST_HOLD") else {
        return;
    };
    let (mut c, _) = Client::connect(Path::new(&socket), "holder", Duration::from_secs(5)).unwrap();
    for service in [QpService::Rc, QpService::Uc, QpService::Ud] {
        let r = c
            .request(&Message::CreateQp {
                service,
                sq_depth: 16,
                rq_depth: 16,
            })
            .unwrap();
        assert!(matches!(r, Message::QpCreated { .. }), "{r:?}");
    }
    println!("HOLDING");
    std::thread::sleep(Duration::from_secs(120));
}

/// Runs `child_holding_qps` in a new process against `d` and returns once it
/// holds its three QPs.
fn spawn_holder(d: &Daemon) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holding_qps",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RSNICD_TEST_HOLD", &d.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    use std::io::BufRead;
    while !line.contains("HOLDING") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended first"
        );
    }
    child
}

fn qps_of(d: &Daemon) -> Vec<serde_json::Value> {
    let (ok, out) = d.ctl(&["--json", "qps"]);
    assert!(ok, "{out}");
    serde_json::from_str(&out).expect("JSON")
}

#[test]
fn qps_are_the_program_s_own_and_go_with_it() {
    let d = Daemon::start("qps");
    let (mut a, _) = Client::connect(&d.socket, "a", Duration::from_secs(5)).unwrap();
    let (mut b, _) = Client::connect(&d.socket, "b", Duration::from_secs(5)).unwrap();
    let created = a
        .request(&Message::CreateQp {
            service: QpService::Rc,
            sq_depth: 32,
            rq_depth: 32,
        })
        .unwrap();
    let Message::QpCreated { handle, qpn } = created else {
        panic!("{created:?}")
    };
    let list = qps_of(&d);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["qpn"], qpn);
    assert_eq!(list[0]["pid"], std::process::id());
    // Another program naming a's handle: an error, counted; a's QP stays.
    let r = b.request(&Message::DestroyQp { handle }).unwrap();
    assert!(
        matches!(r, Message::Error { errno, .. } if errno == libc::EINVAL),
        "{r:?}"
    );
    assert_eq!(d.counter("ctl_bad_handle"), 1);
    assert_eq!(qps_of(&d).len(), 1);
    // Its owner destroys it.
    assert_eq!(
        a.request(&Message::DestroyQp { handle }).unwrap(),
        Message::Done
    );
    assert!(qps_of(&d).is_empty());
    let r = a.request(&Message::DestroyQp { handle }).unwrap();
    assert!(matches!(r, Message::Error { .. }), "destroyed twice: {r:?}");

    // A program killed with SIGKILL: its QPs are destroyed with its connection.
    let mut child = spawn_holder(&d);
    assert_eq!(qps_of(&d).len(), 3);
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    while !qps_of(&d).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "QPs of a dead program stay"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(d.counter("qps_reclaimed"), 3);
    drop((a, b));
    assert!(d.stop().success());
}

/// The daemon's resident memory, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Programs that attach, create QPs and are killed, again and again
/// (RSNICD_KILL_CYCLES, default 100; the 1000 with the env): the
/// daemon reclaims every QP and its memory stays flat after a warm-up.
#[test]
fn kill_cycles_leave_the_daemon_s_memory_flat() {
    let cycles: u64 = std::env::var("RSNICD_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let d = Daemon::start("cycles");
    let mut cycle = |_: u64| {
        let mut child = spawn_holder(&d);
        child.kill().unwrap();
        child.wait().unwrap();
    };
    let warm = (cycles / 5).max(10);
    (0..warm).for_each(&mut cycle);
    let t0 = Instant::now();
    while d.counter("qps_reclaimed") < 3 * warm {
        assert!(t0.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = rss_kib(d.child.id());
    (warm..cycles).for_each(&mut cycle);
    let t0 = Instant::now();
    while d.counter("qps_reclaimed") < 3 * cycles {
        assert!(t0.elapsed() < Duration::from_secs(30), "QPs not reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = rss_kib(d.child.id());
    eprintln!(
        "kill cycles: {cycles}, daemon RSS after {warm}: {before} KiB, after all: {after} KiB"
    );
    assert!(qps_of(&d).is_empty());
    assert!(
        after <= before + 4096,
        "the daemon grew by {} KiB over {} kill cycles",
        after - before,
        cycles - warm
    );
    assert!(d.stop().success());
}
