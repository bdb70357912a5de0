//! Latency tests, as perftest's `write_lat.c`, `read_lat.c`, `send_lat.c`
//! (`run_iter_lat_write`, `run_iter_lat`, `run_iter_lat_send`):
//!
//! - write_lat: a ping-pong of WRITEs; the server sends first. Each side
//!   writes `size` bytes from its send unit into the peer's receive unit,
//!   the last byte carrying the iteration number as a `char` (1, 2, ...,
//!   wrapping), and polls the last byte of its own receive unit for the
//!   peer's. No barrier between sizes and no close (perftest has none).
//! - send_lat: a ping-pong of SENDs; the client sends first; receives are
//!   posted before a barrier at each size.
//! - read_lat: the client READs, one at a time; the server only waits for
//!   the close.
//!
//! Both sides time their posts; a sample is the gap between two posts,
//! halved for the ping-pongs (perftest's `print_report_lat`).

use std::time::{Duration, Instant};

use bench::perftest::{self, LatStats};
use oob::perftest::Protocol;
use rdma::transport::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

use crate::cli::Test;
use crate::setup::{wait_wc, Session};
use crate::Res;

/// One printed row: size, iterations, statistics.
pub type LatRow = (u32, u64, LatStats);

/// Runs every size; returns the rows this side prints.
pub fn run(test: &Test, s: &mut Session, quiet: bool) -> Res<Vec<LatRow>> {
    let (_, o) = test.parts();
    let mut rows = Vec::new();
    if matches!(test, Test::read_lat(_)) && s.server {
        s.link.close()?;
        return Ok(rows);
    }
    for size in test.sizes() {
        let deadline = o.duration.map(|d| Instant::now() + Duration::from_secs(d));
        let iters = if deadline.is_some() {
            u64::MAX
        } else {
            test.iters()
        };
        let (posts, factor) = match test {
            Test::write_lat(_) => (write_pingpong(s, size, iters, deadline)?, 2),
            Test::send_lat(_) => {
                post_receives(s, size, iters.min(512))?;
                s.link.handshake()?;
                (send_pingpong(s, size, iters, deadline)?, 2)
            }
            _ => (reads(s, size, iters, deadline)?, 1),
        };
        let mut samples: Vec<u64> = posts
            .windows(2)
            .map(|w| (w[1] - w[0]).as_nanos() as u64 / factor)
            .collect();
        // read_lat's last stamp is its last completion, not a post.
        let done = posts.len() as u64 - u64::from(factor == 1 && !posts.is_empty());
        if let Some(st) = LatStats::from_ns(&mut samples) {
            if !quiet {
                print!("{}", perftest::lat_row(u64::from(size), done, &st));
            }
            rows.push((size, done, st));
        }
    }
    // write_lat has no close in perftest; between two roce-perf a last
    // barrier keeps one side from leaving before the other's last ACK.
    if !matches!(test, Test::write_lat(_)) || s.link.protocol() == Protocol::Rsnic {
        s.link.close()?;
    }
    Ok(rows)
}

/// Waits until `ready()` holds (a byte of memory the peer WRITEs: nothing
/// wakes a waiter on it), spinning, then sleeping briefly between polls,
/// and only sleeping on an engine's CPU ([`nic::verbs::wait_until`]);
/// `false` at the deadline or after 10 s without it.
fn poll_until(deadline: Option<Instant>, mut ready: impl FnMut() -> bool) -> bool {
    let end = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(10));
    let left = end.saturating_duration_since(Instant::now());
    nic::verbs::wait_until(left, || ready().then_some(())).is_some()
}

fn write_pingpong(
    s: &mut Session,
    size: u32,
    iters: u64,
    deadline: Option<Instant>,
) -> Res<Vec<Instant>> {
    let post_at = (s.layout.local(0) + u64::from(size) - 1) as usize;
    let poll_at = (s.layout.incoming(0) + u64::from(size) - 1) as usize;
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    let mut posts = Vec::with_capacity(iters.min(1 << 20) as usize);
    let over = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
    while scnt < iters || ccnt < scnt || rcnt < iters {
        if over(deadline) {
            break;
        }
        // The server sends first.
        if rcnt < iters && (!s.server || scnt > 0) {
            rcnt += 1;
            let want = rcnt as u8;
            let mut b = [0u8; 1];
            let mr = &s.mr;
            if !poll_until(deadline, || {
                mr.read(poll_at, &mut b);
                b[0] == want
            }) {
                if over(deadline) {
                    break;
                }
                return Err(format!(
                    "no message {rcnt} from the peer within 10 s (peer gone?); counters:\n{}",
                    s.dev.counters()
                )
                .into());
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            s.mr.write(post_at, &[scnt as u8]);
            let op = SendOp::Write {
                remote_va: s.remotes[0].va,
                rkey: s.remotes[0].rkey,
            };
            let sge = s.mr.sge(s.layout.local(0), size);
            s.qps[0].post_send(SendWr::signaled(scnt, op, sge))?;
        }
        if ccnt < scnt {
            wait_wc(&mut s.cq)?;
            ccnt += 1;
        }
    }
    Ok(posts)
}

fn post_receives(s: &mut Session, size: u32, n: u64) -> Res<()> {
    for k in 0..n {
        post_receive(s, size, k)?;
    }
    Ok(())
}

fn post_receive(s: &mut Session, size: u32, k: u64) -> Res<()> {
    s.qps[0].post_recv(RecvWr {
        wr_id: k,
        sge: Sge {
            addr: s.mr.va() + s.layout.incoming(0),
            len: size,
            lkey: s.mr.lkey(),
        },
    })?;
    Ok(())
}

fn send_pingpong(
    s: &mut Session,
    size: u32,
    iters: u64,
    deadline: Option<Instant>,
) -> Res<Vec<Instant>> {
    let (mut scnt, mut rcnt, mut sdone) = (0u64, 0u64, 0u64);
    let mut posted = iters.min(512);
    let mut posts = Vec::with_capacity(iters.min(1 << 20) as usize);
    let over = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
    while scnt < iters || rcnt < iters {
        if over(deadline) {
            break;
        }
        // The client sends first.
        if rcnt < iters && (s.server || scnt > 0) {
            // The next receive; our own send completions come on the same CQ.
            loop {
                let wc = match s.cq.wait(Duration::from_millis(100)) {
                    Some(wc) => wc,
                    None if over(deadline) => return Ok(posts),
                    None => continue,
                };
                if wc.status != WcStatus::Success {
                    return Err(format!("work request failed: {:?}", wc.status).into());
                }
                if wc.opcode == WcOpcode::Recv {
                    break;
                }
                sdone += 1;
            }
            rcnt += 1;
            if posted < iters {
                post_receive(s, size, posted)?;
                posted += 1;
            }
        }
        if scnt < iters {
            posts.push(Instant::now());
            scnt += 1;
            s.qps[0].post_send(SendWr {
                wr_id: scnt,
                op: SendOp::Send,
                sge: Sge {
                    addr: s.mr.va() + s.layout.local(0),
                    len: size,
                    lkey: s.mr.lkey(),
                },
                signaled: true,
                solicited: false,
            })?;
        }
    }
    // The rest of our send completions.
    while sdone < scnt {
        let wc = wait_wc(&mut s.cq)?;
        if wc.opcode != WcOpcode::Recv {
            sdone += 1;
        }
    }
    Ok(posts)
}

fn reads(s: &mut Session, size: u32, iters: u64, deadline: Option<Instant>) -> Res<Vec<Instant>> {
    let mut posts = Vec::with_capacity(iters.min(1 << 20) as usize);
    for i in 0..iters {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        posts.push(Instant::now());
        let op = SendOp::Read {
            remote_va: s.remotes[0].va,
            rkey: s.remotes[0].rkey,
        };
        let sge = s.mr.sge(s.layout.local(0), size);
        s.qps[0].post_send(SendWr::signaled(i, op, sge))?;
        wait_wc(&mut s.cq)?;
    }
    // The gap after the last READ: its completion.
    posts.push(Instant::now());
    Ok(posts)
}
