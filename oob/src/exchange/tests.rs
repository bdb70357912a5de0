//! Tests of the connection exchange: the documented example, round trips,
//! every parse error, and proptests that no input panics.

use super::*;
use proptest::prelude::*;

const EXAMPLE: &str = "RSNIC1 qpn=0x000011 psn=0x00abcd ip=10.0.0.1 mac=02:00:00:00:00:01 rkey=0x00001234 va=0x00007f0000000000 len=1048576 mtu=4096 cc=hpcc ext=cc,int udp_sport=49152 test=write_bw\n";

fn example() -> ConnInfo {
    ConnInfo {
        qpn: 0x11,
        psn: 0xabcd,
        ip: Ipv4Addr::new(10, 0, 0, 1),
        mac: [2, 0, 0, 0, 0, 1],
        rkey: 0x1234,
        va: 0x7f00_0000_0000,
        len: 1 << 20,
        mtu: 4096,
        cc: CcName::Hpcc,
        ext: vec!["cc".into(), "int".into()],
        udp_sport: 49152,
        test: "write_bw".into(),
    }
}

#[test]
fn documented_example_round_trips() {
    assert_eq!(ConnInfo::parse(EXAMPLE), Ok(example()));
    assert_eq!(example().format().unwrap(), EXAMPLE);
    let mut c = example();
    c.ext.clear();
    c.cc = CcName::RxHpcc;
    let line = c.format().unwrap();
    assert!(line.contains(" cc=rx-hpcc ext=none "));
    assert_eq!(ConnInfo::parse(&line), Ok(c));
}

fn with(key: &str, val: &str) -> String {
    EXAMPLE
        .trim_end()
        .split(' ')
        .map(|w| match w.split_once('=') {
            Some((k, _)) if k == key => format!("{k}={val}"),
            _ => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
        + "\n"
}

#[test]
fn strict_errors() {
    use ParseError::*;
    let p = |s: &str| ConnInfo::parse(s).unwrap_err();
    assert_eq!(
        p(&EXAMPLE.replace("RSNIC1", "RSNIC2")),
        BadMagic("RSNIC2".into())
    );
    assert_eq!(p(EXAMPLE.trim_end()), NoNewline);
    assert_eq!(
        p(&EXAMPLE.replace(" test=write_bw", "")),
        MissingKey("test")
    );
    assert_eq!(
        p(&EXAMPLE.replace(" test=write_bw", " test=write_bw test=read_bw")),
        DuplicateKey("test")
    );
    assert_eq!(
        p(&EXAMPLE.replace(" test=", " color=red test=")),
        UnknownKey("color".into())
    );
    assert_eq!(
        p(&EXAMPLE.replace(" test=", "  test=")),
        Malformed("".into())
    );
    // One bad value per key: refused, naming the key.
    for (key, bad) in [
        ("qpn", "0x1000000"),
        ("qpn", "17"),
        ("psn", "0x"),
        ("ip", "10.0.0.256"),
        ("mac", "02:00:00:00:00"),
        ("mac", "02:00:00:00:00:+1"),
        ("rkey", "0x123456789"),
        ("len", "-1"),
        ("len", "99999999999999999999"),
        ("mtu", "1500"),
        ("mtu", "04096"),
        ("cc", "cubic"),
        ("ext", "cc,cc"),
        ("ext", ""),
        ("udp_sport", "0"),
        ("udp_sport", "65536"),
        ("test", "Write_BW"),
    ] {
        assert!(
            matches!(p(&with(key, bad)), BadValue { key: k, .. } if k == key),
            "{key}={bad}"
        );
    }
    assert_eq!(p(&"x".repeat(2000)), TooLong);
    let msg = p(&with("mtu", "1500")).to_string();
    assert!(
        msg.contains("mtu") && msg.contains("1500") && msg.contains("4096"),
        "{msg}"
    );
    // Local validation catches out-of-range fields before sending.
    let mut c = example();
    c.qpn = 1 << 24;
    assert!(c.format().is_err());
}

#[test]
fn compatibility() {
    let s = example();
    assert_eq!(check_compatible(&s, &s.clone()), Ok(()));
    let mut c = s.clone();
    c.ext = vec!["int".into(), "cc".into()];
    assert_eq!(
        check_compatible(&s, &c),
        Ok(()),
        "extensions compare as sets"
    );
    c.test = "read_bw".into();
    assert_eq!(
        check_compatible(&s, &c).unwrap_err().to_string(),
        "server runs write_bw, client asked for read_bw"
    );
    let mut c = s.clone();
    c.mtu = 1024;
    assert!(matches!(
        check_compatible(&s, &c),
        Err(Mismatch::Mtu {
            server: 4096,
            client: 1024
        })
    ));
    let mut c = s.clone();
    c.cc = CcName::Dcqcn;
    assert!(check_compatible(&s, &c)
        .unwrap_err()
        .to_string()
        .contains("server uses hpcc, client uses dcqcn"));
    let mut c = s.clone();
    c.ext.pop();
    assert!(matches!(
        check_compatible(&s, &c),
        Err(Mismatch::Extensions { .. })
    ));
}

fn server_client(
    server: ConnInfo,
    client: ConnInfo,
) -> (
    Result<(ConnInfo, SocketAddr), ExchangeError>,
    Result<ConnInfo, ExchangeError>,
) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || serve(&l, &server, Duration::from_secs(5)));
    let c = connect(addr, &client, Duration::from_secs(5));
    (t.join().unwrap(), c)
}

#[test]
fn exchange_over_tcp() {
    let s = example();
    let mut c = example();
    c.qpn = 0x22;
    c.ip = Ipv4Addr::new(10, 0, 0, 2);
    let (srv, cli) = server_client(s.clone(), c.clone());
    let (got_c, _peer) = srv.unwrap();
    let got_s = cli.unwrap();
    assert_eq!(got_c, c);
    assert_eq!(got_s, s);
    assert_eq!(check_compatible(&s, &got_c), Ok(()));
}

#[test]
fn exchange_mismatch_reported_on_both_sides() {
    let s = example();
    let mut c = example();
    c.test = "read_bw".into();
    let (srv, cli) = server_client(s.clone(), c.clone());
    let (got_c, _) = srv.unwrap();
    let got_s = cli.unwrap();
    let e1 = check_compatible(&s, &got_c).unwrap_err().to_string();
    let e2 = check_compatible(&got_s, &c).unwrap_err().to_string();
    assert_eq!(e1, "server runs write_bw, client asked for read_bw");
    assert_eq!(e1, e2);
}

#[test]
fn garbage_from_client_is_a_typed_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || serve(&l, &example(), Duration::from_secs(5)));
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET / HTTP/1.0\r\n").unwrap();
    let err = t.join().unwrap().unwrap_err();
    assert!(
        matches!(err, ExchangeError::Parse(ParseError::BadMagic(ref m)) if m == "GET"),
        "{err}"
    );
    assert!(
        err.to_string().contains("not an RSNIC1 connection message"),
        "{err}"
    );
}

#[test]
fn binary_garbage_and_silence() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || serve(&l, &example(), Duration::from_millis(300)));
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0xff, 0xfe, 0x00, b'\n']).unwrap();
    let err = t.join().unwrap().unwrap_err();
    assert!(
        matches!(err, ExchangeError::Parse(ParseError::NotText)),
        "{err}"
    );
    // A client that never speaks: the server times out.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || serve(&l, &example(), Duration::from_millis(200)));
    let _s = TcpStream::connect(addr).unwrap();
    assert!(matches!(t.join().unwrap(), Err(ExchangeError::Timeout(_))));
    // Nobody connects: timeout too.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    assert!(matches!(
        serve(&l, &example(), Duration::from_millis(50)),
        Err(ExchangeError::Timeout(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn parse_never_panics(s in "\\PC{0,300}") {
        let _ = ConnInfo::parse(&s);
        let _ = ConnInfo::parse(&(s + "\n"));
    }

    #[test]
    fn mutated_example_never_panics(i in 0usize..200, b in any::<u8>()) {
        let mut v = EXAMPLE.as_bytes().to_vec();
        let i = i % v.len();
        v[i] = b;
        if let Ok(s) = std::str::from_utf8(&v) { let _ = ConnInfo::parse(s); }
    }

    #[test]
    fn round_trip(qpn in 0u32..1 << 24, psn in 0u32..1 << 24, ip in any::<u32>(), mac in any::<[u8; 6]>(),
                  rkey in any::<u32>(), va in any::<u64>(), len in any::<u64>(), m in 0usize..5, c in 0usize..5,
                  sport in 1u16.., ext in proptest::sample::subsequence(vec!["cc", "int", "probe"], 0..=3)) {
        let ci = ConnInfo { qpn, psn, ip: Ipv4Addr::from(ip), mac, rkey, va, len, mtu: MTUS[m], cc: CcName::ALL[c],
            ext: ext.into_iter().map(String::from).collect(), udp_sport: sport, test: "read_lat".into() };
        let line = ci.format().unwrap();
        prop_assert_eq!(ConnInfo::parse(&line), Ok(ci));
    }
}

/// A server whose host does not answer at first is reached once it does:
/// its accept queue is full, so the kernel drops our SYN and the first
/// attempt times out (as when the server's guest is still booting or its
/// neighbour entry is unresolved); [`connect_until`] retries that failure
/// too, not only refusals, until the deadline.
#[test]
fn connect_retries_a_server_that_answers_late() {
    use std::os::fd::AsRawFd;
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen(2) on a socket this test owns; a backlog of 0 lets one
    // unaccepted connection fill the queue.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::listen(l.as_raw_fd(), 0) };
    assert_eq!(rc, 0);
    let addr = l.local_addr().unwrap();
    let filler = TcpStream::connect(addr).unwrap();
    let probe = TcpStream::connect_timeout(&addr, Duration::from_millis(300));
    assert_eq!(
        probe.map(|_| ()).unwrap_err().kind(),
        io::ErrorKind::TimedOut,
        "the server's host should not answer yet"
    );
    let late = CONNECT_ATTEMPT + Duration::from_millis(500);
    let server = std::thread::spawn(move || {
        std::thread::sleep(late);
        let first = l.accept().unwrap().0;
        let second = l.accept().unwrap().0;
        (first, second)
    });
    let t0 = Instant::now();
    let s = connect_until(&[addr], t0 + Duration::from_secs(30))
        .expect("connects once the server answers");
    assert!(
        t0.elapsed() >= CONNECT_ATTEMPT,
        "the first attempt cannot have succeeded"
    );
    let (_first, second) = server.join().unwrap();
    assert_eq!(second.peer_addr().unwrap(), s.local_addr().unwrap());
    drop(filler);
}

/// Past the deadline, the last failure comes back (here a refusal).
#[test]
fn connect_until_gives_up_at_the_deadline() {
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let t0 = Instant::now();
    let e = connect_until(&[addr], t0 + Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert!(connect_until(&[], t0).is_err());
}
