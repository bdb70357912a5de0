//! What a session keeps of the out-of-band connection once the QPs are set up
//! (see [`crate::setup`]): the link to the peer for the barriers, the bandwidth
//! report and the close, in our exchange or perftest's; the peer's QPs; and
//! perftest's buffer layout that both ends agree on.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

use oob::perftest::{BwReport, KeyMsg, PerftestConn, Protocol};

use crate::Res;

/// perftest's buffer layout (`perftest_resources.c`, `alloc_ctx`,
/// `set_up_connection`): per QP a unit of `max(size, cycle buffer)` rounded
/// up to the cache line; the first `nq` units are what we send from, the
/// next `nq` what the peer writes into, reads from, or sends into.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub unit: u64,
    pub cycle: u64,
    pub cache_line: u64,
    /// Units of each direction: one per QP (perftest's layout), or one that
    /// every QP shares (`--shared-buffer`).
    pub units: u64,
}

impl Layout {
    /// The buffer of `nq` QPs: a send and a receive unit per QP, or, if
    /// `shared`, one of each for all of them (so that only the QPs' own
    /// state grows with `-q`, not the memory the messages touch).
    pub(crate) fn new(
        max_size: u32,
        cycle: u32,
        cache_line: u32,
        nq: usize,
        shared: bool,
    ) -> Layout {
        let cl = u64::from(cache_line.max(1));
        let unit = u64::from(max_size).max(u64::from(cycle));
        Layout {
            unit: unit.div_ceil(cl) * cl,
            cycle: u64::from(cycle),
            cache_line: cl,
            units: if shared { 1 } else { nq as u64 },
        }
    }
    pub fn bytes(&self) -> usize {
        (2 * self.units * self.unit) as usize
    }
    /// Unit index of QP `q`.
    fn unit_of(&self, q: usize) -> u64 {
        q as u64 % self.units.max(1)
    }
    /// Offset of QP `q`'s send unit.
    pub fn local(&self, q: usize) -> u64 {
        self.unit_of(q) * self.unit
    }
    /// Offset of QP `q`'s receive unit (what the peer is told).
    pub fn incoming(&self, q: usize) -> u64 {
        (self.units + self.unit_of(q)) * self.unit
    }
    /// Offset of the `k`th message of a bandwidth run inside a unit: perftest
    /// cycles messages of up to half the cycle buffer through it, in steps of
    /// the size rounded up to the cache line (`increase_rem_addr`).
    pub fn slot(&self, k: u64, size: u32) -> u64 {
        let size = u64::from(size);
        if size > self.cycle / 2 {
            return 0;
        }
        let step = size.div_ceil(self.cache_line).max(1) * self.cache_line;
        (k % (self.cycle / step).max(1)) * step
    }
}

/// The peer's parameters of one QP, from either exchange.
#[derive(Debug, Clone)]
pub struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub ip: Ipv4Addr,
    pub rkey: u32,
    pub va: u64,
}

/// The exchange connection after the key exchange.
pub enum Link {
    Rsnic {
        s: TcpStream,
        /// We connected (and write first).
        client: bool,
    },
    Perftest {
        conn: PerftestConn<TcpStream>,
        /// Our key message of QP 0, sent at every barrier.
        mine: KeyMsg,
    },
}

impl Link {
    fn stream(&self) -> &TcpStream {
        match self {
            Link::Rsnic { s, .. } => s,
            Link::Perftest { conn, .. } => conn.get_ref(),
        }
    }

    pub fn protocol(&self) -> Protocol {
        match self {
            Link::Rsnic { .. } => Protocol::Rsnic,
            Link::Perftest { .. } => Protocol::Perftest,
        }
    }

    /// Bounds the reads of what follows: the waits for the peer's end of a
    /// test (`None`: unbounded, as perftest).
    pub fn set_wait(&self, limit: Option<Duration>) -> Res<()> {
        self.stream().set_read_timeout(limit)?;
        Ok(())
    }

    /// One barrier (perftest's `ctx_hand_shake` of QP 0; our `SYNC` line).
    pub fn handshake(&mut self) -> Res<()> {
        match self {
            Link::Rsnic { s, client } => {
                if *client {
                    s.write_all(b"SYNC\n")?;
                    expect_line(s, "SYNC")
                } else {
                    expect_line(s, "SYNC")?;
                    s.write_all(b"SYNC\n")?;
                    Ok(())
                }
            }
            Link::Perftest { conn, mine } => {
                conn.handshake(mine)?;
                Ok(())
            }
        }
    }

    /// The bandwidth reports (the server sends zeros, the client its row).
    pub fn report(&mut self, mine: &BwReport) -> Res<BwReport> {
        match self {
            Link::Perftest { conn, .. } => Ok(conn.xchg_report(mine)?),
            Link::Rsnic { s, client } => {
                let line = format!(
                    "REPORT {} {} {} {} {}\n",
                    mine.size, mine.iters, mine.bw_peak, mine.bw_avg, mine.msg_rate
                );
                let theirs = if *client {
                    s.write_all(line.as_bytes())?;
                    read_line(s)?
                } else {
                    let l = read_line(s)?;
                    s.write_all(line.as_bytes())?;
                    l
                };
                parse_report(&theirs).ok_or_else(|| format!("bad report line {theirs:?}").into())
            }
        }
    }

    /// The close: a last barrier (perftest then sends `done`).
    pub fn close(&mut self) -> Res<()> {
        match self {
            Link::Perftest { conn, mine } => Ok(conn.close(mine)?),
            Link::Rsnic { .. } => self.handshake(),
        }
    }
}

fn parse_report(l: &str) -> Option<BwReport> {
    let mut w = l.split_whitespace();
    if w.next()? != "REPORT" {
        return None;
    }
    let mut n = || w.next().and_then(|x| x.parse::<f64>().ok());
    Some(BwReport {
        size: n()? as u64,
        iters: n()? as u64,
        bw_peak: n()?,
        bw_avg: n()?,
        msg_rate: n()?,
    })
}

/// One line of at most 1 KiB, read a byte at a time so that nothing after
/// it is consumed.
pub fn read_line(s: &mut TcpStream) -> Res<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => {
                return Err(if line.is_empty() {
                    "the peer closed the connection".into()
                } else {
                    "the peer closed the connection in the middle of a line".into()
                })
            }
            Ok(_) => {
                line.push(b[0]);
                if b[0] == b'\n' {
                    return Ok(String::from_utf8_lossy(&line).into_owned());
                }
                if line.len() > 1024 {
                    return Err("the peer's line is longer than 1024 bytes".into());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return Err(if line.is_empty() {
                    "the peer sent nothing within the timeout".into()
                } else {
                    "the peer sent half a line and then nothing within the timeout".into()
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn expect_line(s: &mut TcpStream, word: &str) -> Res<()> {
    let l = read_line(s)?;
    if l.trim_end() != word {
        return Err(format!("expected {word:?} from the peer, got {l:?}").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_perftest() {
        // 64 KiB messages, 4 KiB pages, 2 QPs: units of 64 KiB.
        let l = Layout::new(65536, 4096, 64, 2, false);
        assert_eq!(l.bytes(), 4 * 65536);
        assert_eq!(
            (l.local(1), l.incoming(0), l.incoming(1)),
            (65536, 131072, 196608)
        );
        // --shared-buffer: every QP on the one pair of units of -q 1.
        let l = Layout::new(65536, 4096, 64, 16384, true);
        assert_eq!(l.bytes(), 2 * 65536);
        assert_eq!((l.local(9999), l.incoming(9999)), (0, 65536));
        assert_eq!(l.slot(7, 65536), 0);
        // Small messages cycle through the page in cache-line steps.
        let l = Layout::new(2, 4096, 64, 1, false);
        assert_eq!(l.unit, 4096);
        assert_eq!(l.slot(1, 2), 64);
        assert_eq!(l.slot(64, 2), 0);
        assert_eq!(l.slot(3, 100), 384);
        // A latency buffer holds the message twice (ours and the peer's).
        let l = Layout::new(64, 32, 64, 1, false);
        assert!(l.bytes() >= 2 * 64 && l.incoming(0) >= 64);
    }

    #[test]
    fn report_lines_round_trip() {
        let r = parse_report("REPORT 65536 100 1.5 1.25 0.002\n").unwrap();
        assert_eq!(
            (r.size, r.iters, r.bw_peak, r.bw_avg),
            (65536, 100, 1.5, 1.25)
        );
        assert!(parse_report("REPORT 1 2 x 4 5").is_none());
        assert!(parse_report("SYNC").is_none());
    }
}
