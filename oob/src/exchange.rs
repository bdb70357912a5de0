//! Out-of-band connection setup over TCP, like perftest (docs/design.md §5:
//! "Connection setup out of band over TCP, like perftest (QPN, PSN, IP, MAC,
//! rkey, VA, CC)"; docs/design.md §4: extensions are used only when both ends
//! agreed to them at connection setup).
//!
//! Each side sends exactly one line of ASCII text and reads the peer's; the
//! format is documented byte by byte in `docs/connection.md` so that other
//! tools (a Python script, `nc`) can speak it:
//!
//! ```text
//! RSNIC1 qpn=0x000011 psn=0x00abcd ip=10.0.0.1 mac=02:00:00:00:00:01 rkey=0x00001234 va=0x00007f0000000000 len=1048576 mtu=4096 cc=hpcc ext=cc,int udp_sport=49152 test=write_bw\n
//! ```
//!
//! Parsing is strict: the magic/version word first, then every key exactly
//! once in any order, separated by single spaces, no unknown keys, values in
//! the documented syntax and range. Every failure is a typed [`ParseError`]
//! whose message names the key and the offending value; nothing panics on any
//! input. The client connects and sends first, the server answers; then both
//! sides run [`check_compatible`] on the same (server, client) pair, so both
//! report the same mismatch.
//!
//! This module is the slow path: it allocates and blocks freely.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first word of every message: protocol name and version.
pub const MAGIC: &str = "RSNIC1";

/// Longest accepted line, newline included (a valid line is ~200 bytes).
pub const MAX_LINE: usize = 1024;

/// MTUs RoCE allows (IBA path MTU values), in bytes.
pub const MTUS: [u16; 5] = [256, 512, 1024, 2048, 4096];

/// Congestion control of the QP, as negotiated (docs/design.md §7): the
/// project's one CC enum, spelt on the wire by [`cc::CcKind::as_str`].
pub use cc::CcKind as CcName;

/// What one side tells the other (see the module docs and
/// `docs/connection.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// IPv4 address of the RoCE port.
    pub ip: Ipv4Addr,
    /// MAC address of the RoCE port.
    pub mac: [u8; 6],
    /// Remote key of the buffer the peer may READ/WRITE.
    pub rkey: u32,
    /// Virtual address of that buffer.
    pub va: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Path MTU in bytes, one of [`MTUS`].
    pub mtu: u16,
    /// Congestion control.
    pub cc: CcName,
    /// Extensions this side uses (docs/design.md §4: `cc` = CC extension header,
    /// `int` = INT container, ...): lower-case tokens, no duplicates, kept in
    /// the order given; compared as sets.
    pub ext: Vec<String>,
    /// UDP source port of the QP's packets (RoCEv2 entropy), non-zero.
    pub udp_sport: u16,
    /// The test this side runs (`write_bw`, `read_lat`, ...; a token).
    pub test: String,
}

/// Why a message was rejected. The `Display` text names the key and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The line is not UTF-8 text.
    #[error("connection message is not UTF-8 text")]
    NotText,
    /// The line is longer than [`MAX_LINE`].
    #[error("connection message longer than {MAX_LINE} bytes")]
    TooLong,
    /// No terminating newline.
    #[error("connection message does not end with a newline")]
    NoNewline,
    /// The first word is not [`MAGIC`].
    #[error("not an {MAGIC} connection message (starts with {0:?})")]
    BadMagic(String),
    /// A word is not `key=value` (or has an empty key, or extra spaces).
    #[error("malformed field {0:?} (expected key=value separated by single spaces)")]
    Malformed(String),
    /// A key this version does not know.
    #[error("unknown key {0:?}")]
    UnknownKey(String),
    /// A key given twice.
    #[error("duplicate key {0:?}")]
    DuplicateKey(&'static str),
    /// A required key is absent.
    #[error("missing key {0:?}")]
    MissingKey(&'static str),
    /// A value out of syntax or range.
    #[error("bad value {value:?} for {key}: {why}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as received.
        value: String,
        /// What was expected.
        why: &'static str,
    },
}

/// Why the two sides cannot run together (see [`check_compatible`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// Different tests.
    #[error("server runs {server}, client asked for {client}")]
    Test {
        /// The server's test.
        server: String,
        /// The client's test.
        client: String,
    },
    /// Different MTUs.
    #[error("MTU mismatch: server uses {server}, client uses {client}")]
    Mtu {
        /// Server MTU.
        server: u16,
        /// Client MTU.
        client: u16,
    },
    /// Different congestion control.
    #[error("congestion control mismatch: server uses {server}, client uses {client}")]
    Cc {
        /// Server CC.
        server: CcName,
        /// Client CC.
        client: CcName,
    },
    /// Different extension sets.
    #[error("extension mismatch: server uses [{server}], client uses [{client}]")]
    Extensions {
        /// Server extensions, comma-separated.
        server: String,
        /// Client extensions, comma-separated.
        client: String,
    },
}

/// Errors of [`serve`] / [`connect`].
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Socket error.
    #[error("connection exchange I/O error: {0}")]
    Io(#[from] io::Error),
    /// The peer did not connect / answer in time.
    #[error("connection exchange timed out after {0:?}")]
    Timeout(Duration),
    /// The peer closed the connection before a full line.
    #[error("peer closed the connection before sending its line")]
    Closed,
    /// The peer's line is invalid.
    #[error("peer sent an invalid connection message: {0}")]
    Parse(#[from] ParseError),
}

fn fmt_mac(mac: &[u8; 6]) -> String {
    let m = mac;
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

fn valid_token(s: &str, max: usize, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || extra.contains(&b))
}

fn ext_joined(ext: &[String]) -> String {
    if ext.is_empty() {
        "none".to_string()
    } else {
        ext.join(",")
    }
}

impl ConnInfo {
    /// Checks the fields that [`Self::format`] cannot express (the same rules
    /// [`Self::parse`] enforces), so a local mistake is caught before sending.
    pub fn validate(&self) -> Result<(), ParseError> {
        let line = self.format_unchecked();
        Self::parse(&line).map(|_| ())
    }

    fn format_unchecked(&self) -> String {
        format!(
            "{MAGIC} qpn=0x{:06x} psn=0x{:06x} ip={} mac={} rkey=0x{:08x} va=0x{:016x} len={} mtu={} cc={} ext={} udp_sport={} test={}\n",
            self.qpn,
            self.psn,
            self.ip,
            fmt_mac(&self.mac),
            self.rkey,
            self.va,
            self.len,
            self.mtu,
            self.cc,
            ext_joined(&self.ext),
            self.udp_sport,
            self.test
        )
    }

    /// The message line, newline included. Fails if a field is out of range
    /// (e.g. a 25-bit QPN, an MTU of 1500, an empty test name).
    pub fn format(&self) -> Result<String, ParseError> {
        let line = self.format_unchecked();
        Self::parse(&line)?;
        Ok(line)
    }

    /// Parses one message line (with its trailing `\n`; a `\r\n` is accepted
    /// too). Strict; see the module docs and `docs/connection.md`.
    pub fn parse(line: &str) -> Result<ConnInfo, ParseError> {
        let v = split_keys(line)?;
        let qpn = hex(
            "qpn",
            v[0],
            6,
            0xff_ffff,
            "expected 0x and 1-6 hex digits (24-bit QPN)",
        )?;
        let psn = hex(
            "psn",
            v[1],
            6,
            0xff_ffff,
            "expected 0x and 1-6 hex digits (24-bit PSN)",
        )?;
        // Ipv4Addr's parser is strict dotted-quad (no leading zeros, 4 parts).
        let ip: Ipv4Addr = v[2]
            .parse()
            .map_err(|_| bad("ip", v[2], "expected a dotted-quad IPv4 address"))?;
        let mac = parse_mac(v[3])?;
        let rkey = hex(
            "rkey",
            v[4],
            8,
            u32::MAX as u64,
            "expected 0x and 1-8 hex digits (32-bit rkey)",
        )?;
        let va = hex(
            "va",
            v[5],
            16,
            u64::MAX,
            "expected 0x and 1-16 hex digits (64-bit address)",
        )?;
        let len = dec("len", v[6], u64::MAX, "expected a decimal byte count")?;
        let mtu_why = "expected one of 256, 512, 1024, 2048, 4096";
        let mtu = dec("mtu", v[7], 4096, mtu_why)?;
        if !MTUS.contains(&(mtu as u16)) {
            return Err(bad("mtu", v[7], mtu_why));
        }
        let cc = CcName::from_wire(v[8])
            .ok_or_else(|| bad("cc", v[8], "expected none, dcqcn, hpcc, rx-hpcc or ldcp"))?;
        let ext = parse_ext(v[9])?;
        let sport_why = "expected a UDP port 1-65535";
        let udp_sport = dec("udp_sport", v[10], 65535, sport_why)? as u16;
        if udp_sport == 0 {
            return Err(bad("udp_sport", v[10], sport_why));
        }
        if !valid_token(v[11], 32, b"_-") {
            return Err(bad(
                "test",
                v[11],
                "expected a lower-case token of at most 32 characters",
            ));
        }
        Ok(ConnInfo {
            qpn: qpn as u32,
            psn: psn as u32,
            ip,
            mac,
            rkey: rkey as u32,
            va,
            len,
            mtu: mtu as u16,
            cc,
            ext,
            udp_sport,
            test: v[11].to_string(),
        })
    }
}

/// The keys of a message line, in the order of [`split_keys`]' answer.
const KEYS: [&str; 12] = [
    "qpn",
    "psn",
    "ip",
    "mac",
    "rkey",
    "va",
    "len",
    "mtu",
    "cc",
    "ext",
    "udp_sport",
    "test",
];

/// The value of every key of a message line, in [`KEYS`] order: the line bounded
/// and ended by a newline, the magic word first, then every key exactly once, in any
/// order, nothing unknown.
fn split_keys(line: &str) -> Result<[&str; 12], ParseError> {
    if line.len() > MAX_LINE {
        return Err(ParseError::TooLong);
    }
    let body = line.strip_suffix('\n').ok_or(ParseError::NoNewline)?;
    let body = body.strip_suffix('\r').unwrap_or(body);
    let mut words = body.split(' ');
    let magic = words.next().unwrap_or("");
    if magic != MAGIC {
        return Err(ParseError::BadMagic(magic.chars().take(32).collect()));
    }
    let mut vals: [Option<&str>; 12] = [None; 12];
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| ParseError::Malformed(w.chars().take(64).collect()))?;
        if k.is_empty() {
            return Err(ParseError::Malformed(w.chars().take(64).collect()));
        }
        let i = KEYS
            .iter()
            .position(|&key| key == k)
            .ok_or_else(|| ParseError::UnknownKey(k.chars().take(64).collect()))?;
        if vals[i].replace(v).is_some() {
            return Err(ParseError::DuplicateKey(KEYS[i]));
        }
    }
    let mut out = [""; 12];
    for (i, (o, v)) in out.iter_mut().zip(vals).enumerate() {
        *o = v.ok_or(ParseError::MissingKey(KEYS[i]))?;
    }
    Ok(out)
}

/// A value refused: which key, what it was (cut to 64 characters), why.
fn bad(key: &'static str, value: &str, why: &'static str) -> ParseError {
    ParseError::BadValue {
        key,
        value: value.chars().take(64).collect(),
        why,
    }
}

/// `0x` and 1 to `digits` hex digits, at most `max`.
fn hex(
    key: &'static str,
    v: &str,
    digits: usize,
    max: u64,
    why: &'static str,
) -> Result<u64, ParseError> {
    let h = v.strip_prefix("0x").ok_or_else(|| bad(key, v, why))?;
    if h.is_empty() || h.len() > digits || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad(key, v, why));
    }
    let n = u64::from_str_radix(h, 16).map_err(|_| bad(key, v, why))?;
    if n > max {
        return Err(bad(key, v, why));
    }
    Ok(n)
}

/// A decimal number without leading zeros, at most `max`.
fn dec(key: &'static str, v: &str, max: u64, why: &'static str) -> Result<u64, ParseError> {
    if v.is_empty()
        || v.len() > 20
        || !v.bytes().all(|b| b.is_ascii_digit())
        || (v.len() > 1 && v.starts_with('0'))
    {
        return Err(bad(key, v, why));
    }
    let n: u64 = v.parse().map_err(|_| bad(key, v, why))?;
    if n > max {
        return Err(bad(key, v, why));
    }
    Ok(n)
}

/// Six two-digit hex bytes separated by `:`.
fn parse_mac(v: &str) -> Result<[u8; 6], ParseError> {
    let why = "expected six two-digit hex bytes separated by ':'";
    let parts: Vec<&str> = v.split(':').collect();
    if parts.len() != 6 {
        return Err(bad("mac", v, why));
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("mac", v, why));
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| bad("mac", v, why))?;
    }
    Ok(mac)
}

/// `none`, or up to 16 distinct comma-separated lower-case tokens.
fn parse_ext(v: &str) -> Result<Vec<String>, ParseError> {
    let mut ext: Vec<String> = Vec::new();
    if v == "none" {
        return Ok(ext);
    }
    for e in v.split(',') {
        if !valid_token(e, 16, b"-_") || e == "none" {
            return Err(bad(
                "ext",
                v,
                "expected 'none' or comma-separated lower-case tokens",
            ));
        }
        if ext.iter().any(|x| x == e) {
            return Err(bad("ext", v, "duplicate extension"));
        }
        if ext.len() == 16 {
            return Err(bad("ext", v, "at most 16 extensions"));
        }
        ext.push(e.to_string());
    }
    Ok(ext)
}

/// Whether a server and a client can run together: same test, MTU, CC and
/// extension set (as sets). Both sides call it with the same (server, client)
/// order, so both report the same error text, e.g.
/// "server runs write_bw, client asked for read_bw".
pub fn check_compatible(server: &ConnInfo, client: &ConnInfo) -> Result<(), Mismatch> {
    if server.test != client.test {
        return Err(Mismatch::Test {
            server: server.test.clone(),
            client: client.test.clone(),
        });
    }
    if server.mtu != client.mtu {
        return Err(Mismatch::Mtu {
            server: server.mtu,
            client: client.mtu,
        });
    }
    if server.cc != client.cc {
        return Err(Mismatch::Cc {
            server: server.cc,
            client: client.cc,
        });
    }
    let same =
        server.ext.len() == client.ext.len() && server.ext.iter().all(|e| client.ext.contains(e));
    if !same {
        return Err(Mismatch::Extensions {
            server: server.ext.join(","),
            client: client.ext.join(","),
        });
    }
    Ok(())
}

fn remaining(deadline: Instant, timeout: Duration) -> Result<Duration, ExchangeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(ExchangeError::Timeout(timeout))
    } else {
        Ok(left)
    }
}

fn map_timeout(e: io::Error, timeout: Duration) -> ExchangeError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ExchangeError::Timeout(timeout),
        _ => ExchangeError::Io(e),
    }
}

/// Reads one line (up to and including `\n`, at most [`MAX_LINE`] bytes).
fn read_line(
    s: &mut TcpStream,
    deadline: Instant,
    timeout: Duration,
) -> Result<String, ExchangeError> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 256];
    loop {
        s.set_read_timeout(Some(remaining(deadline, timeout)?))?;
        // Read at most what fits and never past a newline of the one line we
        // expect: the peer sends nothing else before it has our line.
        let want = (MAX_LINE + 1 - buf.len()).min(chunk.len());
        let n = match s.read(&mut chunk[..want]) {
            Ok(0) => return Err(ExchangeError::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(map_timeout(e, timeout)),
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.iter().position(|&b| b == b'\n') {
            if p + 1 != buf.len() {
                return Err(ParseError::Malformed("data after the newline".into()).into());
            }
            return String::from_utf8(buf).map_err(|_| ParseError::NotText.into());
        }
        if buf.len() > MAX_LINE {
            return Err(ParseError::TooLong.into());
        }
    }
}

fn write_line(
    s: &mut TcpStream,
    line: &str,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ExchangeError> {
    s.set_write_timeout(Some(remaining(deadline, timeout)?))?;
    s.write_all(line.as_bytes())
        .map_err(|e| map_timeout(e, timeout))?;
    s.flush()?;
    Ok(())
}

/// Server side: waits (at most `timeout` in all) for one client on
/// `listener`, reads its line, answers with `local`'s line, and returns the
/// client's [`ConnInfo`] and address. The caller then runs
/// `check_compatible(local, &remote)`.
pub fn serve(
    listener: &TcpListener,
    local: &ConnInfo,
    timeout: Duration,
) -> Result<(ConnInfo, SocketAddr), ExchangeError> {
    let line = local.format()?;
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    let accepted = loop {
        match listener.accept() {
            Ok(x) => break Ok(x),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                if let Err(e) = remaining(deadline, timeout) {
                    break Err(e);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => break Err(e.into()),
        }
    };
    listener.set_nonblocking(false)?;
    let (mut s, peer) = accepted?;
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    let remote = ConnInfo::parse(&read_line(&mut s, deadline, timeout)?)?;
    write_line(&mut s, &line, deadline, timeout)?;
    Ok((remote, peer))
}

/// How long one connection attempt waits for the server's host to answer
/// before [`connect_until`] tries again.
pub const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// Connects to one of `addrs`, retrying every failure until `deadline`: a
/// refused connection (no server yet), a timed-out one (the server's host
/// does not answer yet: a guest still booting, a neighbour entry not
/// resolved) and an unreachable host alike. Each attempt waits at most
/// [`CONNECT_ATTEMPT`]. Returns the last attempt's error once the deadline
/// has passed.
pub fn connect_until(addrs: &[SocketAddr], deadline: Instant) -> io::Result<TcpStream> {
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no address to connect to",
        ));
    }
    let mut last = None;
    loop {
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left.min(CONNECT_ATTEMPT)) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(last
                .take()
                .unwrap_or_else(|| io::ErrorKind::TimedOut.into()));
        }
        // A refusal comes back at once: do not spin on it.
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

/// Client side: connects to `addr` (retrying every connection failure until
/// `timeout`, so scripts may start both sides at once and a server's host
/// may still be coming up), sends `local`'s line, and returns the server's
/// [`ConnInfo`]. The caller then runs `check_compatible(&remote, local)`.
pub fn connect(
    addr: impl ToSocketAddrs,
    local: &ConnInfo,
    timeout: Duration,
) -> Result<ConnInfo, ExchangeError> {
    let line = local.format()?;
    let deadline = Instant::now() + timeout;
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let mut s = connect_until(&addrs, deadline).map_err(|e| match e.kind() {
        io::ErrorKind::ConnectionRefused => ExchangeError::Timeout(timeout),
        _ => map_timeout(e, timeout),
    })?;
    s.set_nodelay(true)?;
    write_line(&mut s, &line, deadline, timeout)?;
    let remote = ConnInfo::parse(&read_line(&mut s, deadline, timeout)?)?;
    Ok(remote)
}

#[cfg(test)]
mod tests;
