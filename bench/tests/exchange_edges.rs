//! A roce-perf server facing clients that misbehave at the out-of-band
//! exchange (issue 14 item 4; issue 12: bad perftest input): each ends in
//! one clear error line and a non-zero exit within a few seconds, never a
//! panic or a hang. The server runs on a `net_null` port (no traffic
//! needed); the clients are raw TCP sockets.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_roce-perf");

fn server(port: u16, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(["write_bw", "--dev", "net_null0", "--ip", "10.0.0.1", "-p"])
        .arg(port.to_string())
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn roce-perf")
}

/// Connects once the server listens.
fn client(port: u16) -> TcpStream {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("server on {port} never listened: {e}"),
        }
    }
}

/// Waits for the server's exit (at most `limit`); its output and how long
/// it took from `since`.
fn finish(mut c: Child, limit: Duration, since: Instant) -> (Output, Duration) {
    loop {
        if c.try_wait().unwrap().is_some() {
            return (c.wait_with_output().unwrap(), since.elapsed());
        }
        if since.elapsed() > limit {
            let _ = c.kill();
            let o = c.wait_with_output().unwrap();
            panic!(
                "roce-perf hung for {limit:?}:\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The server's error: exactly one `roce-perf:` line, no panic, status 1.
fn one_error(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("roce-perf:"))
        .collect();
    assert!(!o.status.success(), "exit 0 on bad input:\n{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(lines.len(), 1, "one error line expected:\n{err}");
    lines[0].to_string()
}

/// Runs a server on `port`, lets `act` play the client, and returns the
/// server's error line and how long it took after the client connected.
fn case(port: u16, act: impl FnOnce(TcpStream) + Send + 'static) -> (String, Duration) {
    let srv = server(port, &[]);
    let s = client(port);
    let t = Instant::now();
    let client = std::thread::spawn(move || act(s));
    let (o, took) = finish(srv, Duration::from_secs(30), t);
    client.join().unwrap();
    (one_error(&o), took)
}

#[test]
fn half_a_line_times_out_in_seconds() {
    let (e, took) = case(18611, |mut s| {
        s.write_all(b"RSNIC1 qpn=0x000011 psn=").unwrap();
        std::thread::sleep(Duration::from_secs(12));
    });
    assert!(e.contains("half a line"), "{e}");
    assert!(took < Duration::from_secs(10), "held for {took:?}");
}

#[test]
fn a_silent_client_times_out_in_seconds() {
    let (e, took) = case(18612, |_s| std::thread::sleep(Duration::from_secs(12)));
    assert!(e.contains("sent nothing within the timeout"), "{e}");
    assert!(took < Duration::from_secs(10), "held for {took:?}");
}

#[test]
fn garbage_and_early_close_are_clear_errors() {
    let (e, _) = case(18613, |mut s| {
        s.write_all(b"\xff\xfe garbage\n").unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    assert!(
        e.contains("speaks neither our exchange nor perftest's"),
        "{e}"
    );
    let (e, _) = case(18614, |mut s| {
        s.write_all(b"RSNIC1 this is not a connection line\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    assert!(e.contains("roce-perf: "), "{e}");
    let (e, _) = case(18615, drop);
    assert!(e.contains("closed the connection"), "{e}");
}

#[test]
fn bad_perftest_input_is_a_clear_error() {
    // A perftest version we do not speak.
    let (e, _) = case(18616, |mut s| {
        s.write_all(b"5.60\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        std::thread::sleep(Duration::from_millis(500));
    });
    assert!(e.contains("perftest version 5.60"), "{e}");
    // A good opening, then a garbage key message.
    let (e, _) = case(18617, |mut s| {
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        s.write_all(&v).unwrap();
        s.write_all(&4096u32.to_be_bytes()).unwrap();
        s.write_all(&64u32.to_be_bytes()).unwrap();
        s.write_all(b"3\0").unwrap();
        s.write_all(&[b'z'; 108]).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
    });
    assert!(e.contains("key message is malformed"), "{e}");
    // A perftest peer that closes after its version.
    let (e, _) = case(18618, |mut s| {
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.06");
        s.write_all(&v).unwrap();
    });
    assert!(e.contains("closed the connection"), "{e}");
}

#[test]
fn accept_waits_unless_timeout_and_a_second_client_is_refused() {
    // --timeout bounds the wait for a client.
    let t = Instant::now();
    let (o, took) = finish(
        server(18619, &["--timeout", "1"]),
        Duration::from_secs(20),
        t,
    );
    assert!(one_error(&o).contains("no client connected within 1 s"));
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Without it the server waits (3 s here, then we connect a client that
    // stays silent), and a second client is refused while the first is
    // served.
    let mut srv = server(18620, &[]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        srv.try_wait().unwrap().is_none(),
        "the server gave up waiting"
    );
    let first = client(18620);
    std::thread::sleep(Duration::from_millis(300));
    let second = TcpStream::connect(("127.0.0.1", 18620));
    assert!(second.is_err(), "a second client was accepted");
    // Our client gets one clear line for it too.
    let o = Command::new(BIN)
        .args([
            "write_bw",
            "--dev",
            "net_null1",
            "--ip",
            "10.0.0.2",
            "-p",
            "18620",
            "--timeout",
            "1",
            "127.0.0.1",
        ])
        .output()
        .unwrap();
    assert!(one_error(&o).contains("serving another client"));
    drop(first);
    let _ = finish_kill(&mut srv);
}

fn finish_kill(c: &mut Child) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    c.wait().ok()
}
