//! perftest's out-of-band exchange, so that the real `ib_write_bw`,
//! `ib_read_lat`, ... (perftest 4.5, which calls itself version 6.06) and
//! this NIC's tools can set up RC QPs with each other. Facts from perftest's
//! `src/perftest_communication.c` (`ethernet_write_keys`, `ctx_hand_shake`,
//! `ctx_xchg_data_ethernet`, `exchange_versions`, `check_sys_data`,
//! `check_mtu`, `xchg_bw_reports`, `ctx_close_connection`):
//!
//! - Every exchange is symmetric and the client writes first: the client
//!   writes its item and reads the server's; the server reads, then writes.
//! - After the TCP connect (the client then sleeps 1 s): a 16-byte version
//!   string (`"6.06"`, NUL-padded; perftest refuses peers below 5.70), a
//!   4-byte cycle buffer (the page size, network order), a 4-byte cache line
//!   size, a 2-byte MTU: the `ibv_mtu` enum as text (`"3\0"` is 1024); each
//!   side then uses the smaller MTU and the larger cycle buffer.
//! - Key messages of 108 bytes, one per QP and handshake:
//!   `%04x:%04x:%06x:%06x:%08x:%016llx:` (LID, outstanding READs, QPN, PSN,
//!   rkey, VA), 16 GID bytes as `%02x:`, `%08x:` (SRQ number), NUL. The GID
//!   of a RoCEv2 port is `::ffff:<IPv4>`. No MAC and no buffer length: the
//!   peer's MAC is found by ARP.
//! - Bandwidth tests end with 5 reports of 8 bytes (size, iterations, peak
//!   and average bandwidth, message rate; integers and IEEE doubles in
//!   network order).
//! - The close is one more key message each way, then `"done\0"` from both
//!   sides, which neither reads.
//!
//! perftest reads each item with a single `read()` of its exact size, so each
//! item goes out in one `write`. Parsing is strict and never panics: every
//! failure is a [`PerftestError`] that names what was expected. This is the
//! slow path: it blocks (under the stream's timeouts) and allocates freely.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;

/// The version string we announce (perftest 4.5's own).
pub const OUR_VERSION: &str = "6.06";
/// Length of the version item.
pub const VERSION_LEN: usize = 16;
/// Length of a key message (with a GID).
pub const KEY_MSG_LEN: usize = 108;
/// The close marker both sides write last.
pub const DONE: &[u8; 5] = b"done\0";
/// The versions whose exchange this module speaks: perftest refuses
/// anything below 5.70; 7 and above may change the protocol.
pub const SPOKEN_VERSIONS: std::ops::Range<f64> = 5.70..7.0;

/// Which side of the exchange we are: the client (it connected) writes
/// first in every exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connected to the server; writes first.
    Client,
    /// Accepted the connection; reads first.
    Server,
}

/// Why an exchange with a perftest peer failed.
#[derive(Debug, thiserror::Error)]
pub enum PerftestError {
    /// The peer closed the connection while we waited for an item.
    #[error("the perftest peer closed the connection while we waited for its {0}")]
    Closed(&'static str),
    /// The peer sent nothing within the stream's read timeout.
    #[error("the perftest peer sent no {0} within the timeout")]
    Timeout(&'static str),
    /// Socket error.
    #[error("perftest exchange I/O error while exchanging the {what}: {err}")]
    Io {
        /// The item being exchanged.
        what: &'static str,
        /// The error.
        err: io::Error,
    },
    /// A version string that is not a number.
    #[error("the peer's version string {0:?} is not a perftest version")]
    BadVersion(String),
    /// A perftest version whose exchange we do not speak.
    #[error("the peer speaks perftest version {0}; this tool speaks versions 5.70 to 6.x")]
    UnsupportedVersion(String),
    /// The peer's MTU item is not an `ibv_mtu` value.
    #[error("the peer's MTU item {0:?} is not an ibv_mtu value (1..5)")]
    BadMtu(String),
    /// A key message that does not follow perftest's layout.
    #[error("the peer's key message is malformed ({why}): {text:?}")]
    BadKeyMsg {
        /// What is wrong.
        why: &'static str,
        /// The message as text (lossy).
        text: String,
    },
}

/// One side's QP parameters as perftest exchanges them (`struct
/// pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMsg {
    /// InfiniBand LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READs the sender accepts as responder
    /// (`max_dest_rd_atomic`); the peer uses it as its `max_rd_atomic`.
    pub out_reads: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN (24 bits).
    pub psn: u32,
    /// Remote key of the buffer.
    pub rkey: u32,
    /// Address the peer writes to / reads from.
    pub vaddr: u64,
    /// Port GID (`::ffff:<IPv4>` for RoCEv2).
    pub gid: [u8; 16],
    /// SRQ number (0 without SRQ).
    pub srqn: u32,
}

impl KeyMsg {
    /// The RoCEv2 GID of an IPv4 address (`::ffff:a.b.c.d`).
    pub fn gid_of(ip: Ipv4Addr) -> [u8; 16] {
        ip.to_ipv6_mapped().octets()
    }

    /// The IPv4 address in the GID, if it is an IPv4-mapped one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        std::net::Ipv6Addr::from(self.gid).to_ipv4_mapped()
    }

    /// The 108 bytes perftest's `sprintf(KEY_PRINT_FMT_GID)` makes. Values
    /// wider than their field (a QPN over 24 bits) are masked to it, as the
    /// wire cannot carry them.
    pub fn format(&self) -> [u8; KEY_MSG_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_MSG_LEN];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    /// Parses a key message: exactly perftest's layout (fixed-width hex
    /// fields separated by `:`, the last byte NUL).
    pub fn parse(msg: &[u8]) -> Result<KeyMsg, PerftestError> {
        let bad = |why| PerftestError::BadKeyMsg {
            why,
            text: String::from_utf8_lossy(msg)
                .trim_end_matches('\0')
                .to_string(),
        };
        if msg.len() != KEY_MSG_LEN {
            return Err(bad("not 108 bytes"));
        }
        if msg[KEY_MSG_LEN - 1] != 0 {
            return Err(bad("not NUL-terminated"));
        }
        // Field widths in order: lid, out_reads, qpn, psn, rkey, vaddr,
        // 16 GID bytes, srqn; each followed by ':'.
        const WIDTHS: [usize; 23] = [
            4, 4, 6, 6, 8, 16, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8,
        ];
        let mut vals = [0u64; 23];
        let mut at = 0;
        for (v, w) in vals.iter_mut().zip(WIDTHS) {
            let field = &msg[at..at + w];
            if !field.iter().all(u8::is_ascii_hexdigit) {
                return Err(bad("a field is not hexadecimal"));
            }
            // All hex digits, at most 16 of them: always fits a u64.
            *v = field
                .iter()
                .fold(0u64, |acc, &d| (acc << 4) | u64::from(hex_val(d)));
            if msg[at + w] != b':' {
                return Err(bad("a separator is not ':'"));
            }
            at += w + 1;
        }
        debug_assert_eq!(at, KEY_MSG_LEN - 1);
        let mut gid = [0u8; 16];
        for (g, v) in gid.iter_mut().zip(&vals[6..22]) {
            *g = *v as u8;
        }
        Ok(KeyMsg {
            lid: vals[0] as u16,
            out_reads: vals[1] as u16,
            qpn: vals[2] as u32,
            psn: vals[3] as u32,
            rkey: vals[4] as u32,
            vaddr: vals[5],
            gid,
            srqn: vals[22] as u32,
        })
    }
}

/// The value of a hex digit (the caller checked it is one).
fn hex_val(d: u8) -> u8 {
    char::from(d).to_digit(16).unwrap_or(0) as u8
}

/// The `ibv_mtu` enum: 1 = 256 ... 5 = 4096.
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// Bytes of an `ibv_mtu` value.
pub fn mtu_bytes(e: u8) -> Option<u32> {
    (1..=5).contains(&e).then(|| 128u32 << e)
}

/// Parses the version item: a NUL-terminated decimal like `"6.06"`; checks
/// that we speak it.
pub fn parse_version(item: &[u8]) -> Result<String, PerftestError> {
    let end = item.iter().position(|&b| b == 0).unwrap_or(item.len());
    let text = String::from_utf8_lossy(&item[..end]).to_string();
    let ok_chars = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && text.bytes().filter(|&b| b == b'.').count() <= 1
        && text.as_bytes()[0].is_ascii_digit();
    let v: f64 = match text.parse() {
        Ok(v) if ok_chars => v,
        _ => return Err(PerftestError::BadVersion(text)),
    };
    if !SPOKEN_VERSIONS.contains(&v) {
        return Err(PerftestError::UnsupportedVersion(text));
    }
    Ok(text)
}

/// Parses the MTU item (`"3\0"`): the `ibv_mtu` value as text.
pub fn parse_mtu(item: &[u8]) -> Result<u8, PerftestError> {
    let end = item.iter().position(|&b| b == 0).unwrap_or(item.len());
    let text = String::from_utf8_lossy(&item[..end]).to_string();
    match text.parse::<u8>() {
        Ok(e) if mtu_bytes(e).is_some() => Ok(e),
        _ => Err(PerftestError::BadMtu(text)),
    }
}

/// What the opening exchange settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// The peer's version string.
    pub peer_version: String,
    /// The larger of the two cycle buffers (perftest's per-QP buffer unit).
    pub cycle_buffer: u32,
    /// The larger of the two cache line sizes.
    pub cache_line: u32,
    /// The path MTU both use: the smaller of the two, in bytes.
    pub mtu: u32,
}

/// A bandwidth test's result as perftest sends it to the peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations completed.
    pub iters: u64,
    /// Peak bandwidth (perftest's unit: MB/s, or Gb/s with --report_gbits).
    pub bw_peak: f64,
    /// Average bandwidth (same unit).
    pub bw_avg: f64,
    /// Messages per second, in millions.
    pub msg_rate: f64,
}

/// A perftest exchange over a connected stream (with its read and write
/// timeouts already set).
pub struct PerftestConn<S> {
    s: S,
    role: Role,
}

impl<S: Read + Write> PerftestConn<S> {
    /// Wraps a connected stream.
    pub fn new(s: S, role: Role) -> Self {
        PerftestConn { s, role }
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.s
    }

    fn read_item(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), PerftestError> {
        self.s.read_exact(buf).map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => PerftestError::Closed(what),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PerftestError::Timeout(what),
            _ => PerftestError::Io { what, err: e },
        })
    }

    fn write_item(&mut self, buf: &[u8], what: &'static str) -> Result<(), PerftestError> {
        self.s
            .write_all(buf)
            .and_then(|_| self.s.flush())
            .map_err(|e| match e.kind() {
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => PerftestError::Closed(what),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => PerftestError::Timeout(what),
                _ => PerftestError::Io { what, err: e },
            })
    }

    /// One symmetric exchange: the client writes first.
    fn xchg(
        &mut self,
        mine: &[u8],
        theirs: &mut [u8],
        what: &'static str,
    ) -> Result<(), PerftestError> {
        match self.role {
            Role::Client => {
                self.write_item(mine, what)?;
                self.read_item(theirs, what)
            }
            Role::Server => {
                self.read_item(theirs, what)?;
                self.write_item(mine, what)
            }
        }
    }

    /// The opening exchange: versions, cycle buffer, cache line, MTU
    /// (`exchange_versions`, `check_sys_data`, `check_mtu`).
    pub fn hello(
        &mut self,
        cycle_buffer: u32,
        cache_line: u32,
        mtu: u32,
    ) -> Result<Hello, PerftestError> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..OUR_VERSION.len()].copy_from_slice(OUR_VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(&mine, &mut theirs, "version string")?;
        let peer_version = parse_version(&theirs)?;
        let mut rem = [0u8; 4];
        self.xchg(&cycle_buffer.to_be_bytes(), &mut rem, "cycle buffer size")?;
        let peer_cycle = u32::from_be_bytes(rem);
        self.xchg(&cache_line.to_be_bytes(), &mut rem, "cache line size")?;
        let peer_cache = u32::from_be_bytes(rem);
        let my_mtu = mtu_enum(mtu).unwrap_or(3);
        let mut rem_mtu = [0u8; 2];
        self.xchg(&[b'0' + my_mtu, 0], &mut rem_mtu, "MTU")?;
        let peer_mtu = parse_mtu(&rem_mtu)?;
        Ok(Hello {
            peer_version,
            // perftest takes the larger of the two; a zero or absurd value
            // from the peer leaves ours.
            cycle_buffer: if (1..=1 << 30).contains(&peer_cycle) {
                cycle_buffer.max(peer_cycle)
            } else {
                cycle_buffer
            },
            cache_line: if (1..=4096).contains(&peer_cache) {
                cache_line.max(peer_cache)
            } else {
                cache_line
            },
            mtu: mtu_bytes(my_mtu.min(peer_mtu)).unwrap_or(1024),
        })
    }

    /// One key-message handshake (`ctx_hand_shake`).
    pub fn handshake(&mut self, mine: &KeyMsg) -> Result<KeyMsg, PerftestError> {
        let mut theirs = [0u8; KEY_MSG_LEN];
        self.xchg(&mine.format(), &mut theirs, "key message")?;
        KeyMsg::parse(&theirs)
    }

    /// The bandwidth reports (`xchg_bw_reports`, peers from version 5.33:
    /// 8-byte iterations; no per-port reports).
    pub fn xchg_report(&mut self, mine: &BwReport) -> Result<BwReport, PerftestError> {
        let mut r = [0u8; 8];
        self.xchg(&mine.size.to_be_bytes(), &mut r, "report (size)")?;
        let size = u64::from_be_bytes(r);
        self.xchg(&mine.iters.to_be_bytes(), &mut r, "report (iterations)")?;
        let iters = u64::from_be_bytes(r);
        let mut f = |v: f64, what| -> Result<f64, PerftestError> {
            self.xchg(&v.to_bits().to_be_bytes(), &mut r, what)?;
            Ok(f64::from_bits(u64::from_be_bytes(r)))
        };
        let bw_peak = f(mine.bw_peak, "report (peak bandwidth)")?;
        let bw_avg = f(mine.bw_avg, "report (average bandwidth)")?;
        let msg_rate = f(mine.msg_rate, "report (message rate)")?;
        Ok(BwReport {
            size,
            iters,
            bw_peak,
            bw_avg,
            msg_rate,
        })
    }

    /// The close (`ctx_close_connection`): a last handshake, then
    /// `"done\0"`. The peer's `done` is read if it comes (perftest writes it
    /// and closes); its absence is not an error.
    pub fn close(&mut self, mine: &KeyMsg) -> Result<(), PerftestError> {
        self.handshake(mine)?;
        self.write_item(DONE, "close")?;
        let mut done = [0u8; 5];
        let _ = self.read_item(&mut done, "close");
        Ok(())
    }
}

/// The two exchange protocols a server may hear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// This project's one-line exchange (docs/connection.md): `RSNIC1 ...`.
    Rsnic,
    /// perftest's: a version string such as `6.06`.
    Perftest,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Rsnic => "rsnic",
            Protocol::Perftest => "perftest",
        })
    }
}

/// Tells the protocol from the first bytes a client sent: ours starts with
/// `R`, perftest's with the digit of its version. `None`: neither.
pub fn detect(first: &[u8]) -> Option<Protocol> {
    match first.first()? {
        b'R' => Some(Protocol::Rsnic),
        b'0'..=b'9' => Some(Protocol::Perftest),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::time::Duration;

    fn example() -> KeyMsg {
        KeyMsg {
            lid: 0,
            out_reads: 0x10,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x7f00_dead_beef,
            gid: KeyMsg::gid_of(Ipv4Addr::new(10, 0, 0, 2)),
            srqn: 0,
        }
    }

    /// The bytes perftest's sprintf makes for `example()`, written out.
    const EXAMPLE: &[u8] = b"0000:0010:000011:abcdef:12345678:00007f00deadbeef:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02:00000000:\0";

    #[test]
    fn key_message_matches_perftest_layout() {
        assert_eq!(EXAMPLE.len(), KEY_MSG_LEN);
        assert_eq!(&example().format()[..], EXAMPLE);
        assert_eq!(KeyMsg::parse(EXAMPLE).unwrap(), example());
        assert_eq!(example().ipv4(), Some(Ipv4Addr::new(10, 0, 0, 2)));
        // Upper-case hex (another printf) is still hex.
        let upper = String::from_utf8_lossy(EXAMPLE).to_uppercase();
        assert_eq!(KeyMsg::parse(upper.as_bytes()).unwrap(), example());
    }

    #[test]
    fn bad_key_messages_are_typed_errors() {
        let why = |m: &[u8]| match KeyMsg::parse(m) {
            Err(PerftestError::BadKeyMsg { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(why(&EXAMPLE[..50]), "not 108 bytes");
        let mut m = EXAMPLE.to_vec();
        m[107] = b'x';
        assert_eq!(why(&m), "not NUL-terminated");
        let mut m = EXAMPLE.to_vec();
        m[3] = b'g';
        assert_eq!(why(&m), "a field is not hexadecimal");
        let mut m = EXAMPLE.to_vec();
        m[4] = b'-';
        assert_eq!(why(&m), "a separator is not ':'");
        let garbage = [b'x'; KEY_MSG_LEN];
        assert!(KeyMsg::parse(&garbage).is_err());
    }

    #[test]
    fn versions_and_mtus() {
        let item = |s: &str| {
            let mut b = [0u8; VERSION_LEN];
            b[..s.len()].copy_from_slice(s.as_bytes());
            b
        };
        assert_eq!(parse_version(&item("6.06")).unwrap(), "6.06");
        assert_eq!(parse_version(&item("5.70")).unwrap(), "5.70");
        assert!(matches!(
            parse_version(&item("5.60")),
            Err(PerftestError::UnsupportedVersion(v)) if v == "5.60"
        ));
        assert!(matches!(
            parse_version(&item("7.1")),
            Err(PerftestError::UnsupportedVersion(_))
        ));
        for bad in ["", "x.1", "6.0.6", "-6", ".5", "6e2"] {
            assert!(
                matches!(parse_version(&item(bad)), Err(PerftestError::BadVersion(_))),
                "{bad:?}"
            );
        }
        assert_eq!(parse_mtu(b"3\0").unwrap(), 3);
        assert!(parse_mtu(b"9\0").is_err());
        assert!(parse_mtu(b"\0\0").is_err());
        assert_eq!(mtu_bytes(3), Some(1024));
        assert_eq!(mtu_enum(4096), Some(5));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(detect(b"6.06"), Some(Protocol::Perftest));
        assert_eq!(detect(b"RSNIC1 "), Some(Protocol::Rsnic));
        assert_eq!(detect(b"\xff"), None);
        assert_eq!(detect(b""), None);
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        for t in [&c, &s] {
            t.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        }
        (c, s)
    }

    #[test]
    fn full_session_between_both_roles() {
        let (c, s) = pair();
        let server = std::thread::spawn(move || {
            let mut p = PerftestConn::new(s, Role::Server);
            let h = p.hello(4096, 64, 1024).unwrap();
            let mut me = example();
            me.qpn = 0x22;
            let peer = p.handshake(&me).unwrap();
            let rep = p
                .xchg_report(&BwReport {
                    size: 0,
                    iters: 0,
                    bw_peak: 0.0,
                    bw_avg: 0.0,
                    msg_rate: 0.0,
                })
                .unwrap();
            p.close(&me).unwrap();
            (h, peer, rep)
        });
        let mut p = PerftestConn::new(c, Role::Client);
        let h = p.hello(8192, 128, 4096).unwrap();
        let peer = p.handshake(&example()).unwrap();
        let mine = BwReport {
            size: 65536,
            iters: 1000,
            bw_peak: 25.5,
            bw_avg: 24.25,
            msg_rate: 0.046,
        };
        p.xchg_report(&mine).unwrap();
        p.close(&example()).unwrap();
        let (sh, speer, srep) = server.join().unwrap();
        assert_eq!(peer.qpn, 0x22);
        assert_eq!(speer, example());
        assert_eq!(srep, mine);
        // Both settle on the larger cycle buffer and cache line, the smaller MTU.
        for x in [&h, &sh] {
            assert_eq!((x.cycle_buffer, x.cache_line, x.mtu), (8192, 128, 1024));
            assert_eq!(x.peer_version, "6.06");
        }
    }

    #[test]
    fn peer_closing_early_or_silent_or_old_is_one_clear_error() {
        // Closes after half a version string.
        let (mut c, s) = pair();
        c.write_all(b"6.0").unwrap();
        drop(c);
        let e = PerftestConn::new(s, Role::Server)
            .hello(4096, 64, 1024)
            .unwrap_err();
        assert!(matches!(e, PerftestError::Closed("version string")), "{e}");
        // Says nothing.
        let (_c, s) = pair();
        let e = PerftestConn::new(s, Role::Server)
            .hello(4096, 64, 1024)
            .unwrap_err();
        assert!(matches!(e, PerftestError::Timeout("version string")), "{e}");
        // An old perftest.
        let (mut c, s) = pair();
        let mut v = [0u8; VERSION_LEN];
        v[..4].copy_from_slice(b"5.60");
        c.write_all(&v).unwrap();
        let e = PerftestConn::new(s, Role::Server)
            .hello(4096, 64, 1024)
            .unwrap_err();
        assert!(e.to_string().contains("version 5.60"), "{e}");
        // A garbage key message after a good opening.
        let (c, s) = pair();
        let t = std::thread::spawn(move || {
            let mut p = PerftestConn::new(c, Role::Client);
            p.hello(4096, 64, 1024).unwrap();
            let mut s = p.s;
            s.write_all(&[b'z'; KEY_MSG_LEN]).unwrap();
        });
        let mut p = PerftestConn::new(s, Role::Server);
        p.hello(4096, 64, 1024).unwrap();
        let e = p.handshake(&example()).unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
        t.join().unwrap();
    }
}
