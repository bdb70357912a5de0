//! Bandwidth tests, as perftest's `write_bw.c`, `read_bw.c`, `send_bw.c`:
//! the client posts `-n` messages per QP keeping `-t` in flight, QPs in
//! turn, messages cycling through the peer's unit ([`crate::link::Layout::slot`]).
//! WRITE and READ: the server waits for the client's end and prints the
//! client's report. SEND: the server receives (its own table), with a
//! barrier before each size.

use std::time::{Duration, Instant};

use bench::perftest::{self, BwRow};
use oob::perftest::BwReport;
use rdma::transport::{RecvWr, SendOp, SendWr, Sge, WorkCompletion};

use crate::cli::Test;
use crate::setup::{completion_timeout, wait_wcs, Session};
use crate::Res;

/// Runs every size; returns the rows this side prints.
pub fn run(test: &Test, s: &mut Session, quiet: bool) -> Res<Vec<BwRow>> {
    let (_, o) = test.parts();
    let gbits = o.report_gbits;
    let mut rows = Vec::new();
    let show = |r: &BwRow| {
        if !quiet {
            print!("{}", perftest::bw_row(r, gbits));
        }
    };
    let sizes = test.sizes();
    if test.is_send() {
        for &size in &sizes {
            if s.server {
                let per_qp = receive_total(test);
                let posted = post_receives(s, size, per_qp)?;
                s.link.handshake()?;
                let row = receive(test, s, size, posted, per_qp)?;
                show(&row);
                rows.push(row);
            } else {
                s.link.handshake()?;
                let row = send(test, s, size)?;
                show(&row);
                rows.push(row);
            }
            if o.all {
                s.link.handshake()?;
            }
        }
        s.link.close()?;
        return Ok(rows);
    }
    if s.server {
        // The client runs; we wait for its end, then print its report.
        s.link.handshake()?;
        let r = s.link.report(&to_report(None, gbits))?;
        let row = from_report(&r, gbits);
        show(&row);
        rows.push(row);
    } else {
        let mut last = None;
        for &size in &sizes {
            let row = send(test, s, size)?;
            show(&row);
            rows.push(row);
            last = Some(row);
        }
        s.link.handshake()?;
        s.link.report(&to_report(last.as_ref(), gbits))?;
    }
    s.link.close()?;
    Ok(rows)
}

/// A row as perftest's report carries it (its units: MB/s or Gb/s, Mpps).
fn to_report(r: Option<&BwRow>, gbits: bool) -> BwReport {
    let unit = |bps: f64| {
        if gbits {
            bps * 8.0 / 1e9
        } else {
            bps / 1_048_576.0
        }
    };
    r.map_or(
        BwReport {
            size: 0,
            iters: 0,
            bw_peak: 0.0,
            bw_avg: 0.0,
            msg_rate: 0.0,
        },
        |r| BwReport {
            size: r.bytes,
            iters: r.iterations,
            bw_peak: unit(r.peak_bps),
            bw_avg: unit(r.avg_bps),
            msg_rate: r.msg_rate / 1e6,
        },
    )
}

fn from_report(r: &BwReport, gbits: bool) -> BwRow {
    let bps = |v: f64| {
        if gbits {
            v * 1e9 / 8.0
        } else {
            v * 1_048_576.0
        }
    };
    BwRow {
        bytes: r.size,
        iterations: r.iters,
        peak_bps: bps(r.bw_peak),
        avg_bps: bps(r.bw_avg),
        msg_rate: r.msg_rate * 1e6,
    }
}

/// Messages each QP receives for one size: `-n` (unbounded with `-D`).
fn receive_total(test: &Test) -> u64 {
    let (_, o) = test.parts();
    if o.duration.is_some() {
        u64::MAX
    } else {
        test.iters()
    }
}

/// Receives posted per QP, and the next slot of each.
type Posted = Vec<u64>;

/// Posts the first receives of every QP: up to the receive queue's depth
/// (512) or `per_qp`.
fn post_receives(s: &mut Session, size: u32, per_qp: u64) -> Res<Posted> {
    let nq = s.qps.len();
    let mut posted = vec![0u64; nq];
    for q in 0..nq {
        while posted[q] < per_qp.min(512) {
            post_receive(s, size, q, &mut posted)?;
        }
    }
    Ok(posted)
}

/// One receive on QP `q` into the next slot of its unit; `wr_id` is `q`.
fn post_receive(s: &mut Session, size: u32, q: usize, posted: &mut Posted) -> Res<()> {
    let off = s.layout.incoming(q) + s.layout.slot(posted[q], size);
    s.qps[q].post_recv(RecvWr {
        wr_id: q as u64,
        sge: Sge {
            addr: s.mr.va() + off,
            len: size,
            lkey: s.mr.lkey(),
        },
    })?;
    posted[q] += 1;
    Ok(())
}

/// The SEND server: receives `per_qp` messages on every QP (or until `-D`
/// ends), reposting each receive on its QP.
fn receive(test: &Test, s: &mut Session, size: u32, mut posted: Posted, per_qp: u64) -> Res<BwRow> {
    let (_, o) = test.parts();
    let deadline = o.duration.map(|d| Instant::now() + Duration::from_secs(d));
    let nq = s.qps.len() as u64;
    let total = per_qp.saturating_mul(nq);
    let mut done = 0u64;
    let mut start = None;
    while done < total {
        let wc = match deadline {
            None => match s.cq.wait(Duration::from_secs(30)) {
                Some(wc) => wc,
                None => {
                    return Err(format!(
                        "received {done} of {total} messages; nothing for 30 s (peer gone?)"
                    )
                    .into())
                }
            },
            Some(d) => match s.cq.wait(Duration::from_millis(100)) {
                Some(wc) => wc,
                None if Instant::now() >= d => break,
                None => continue,
            },
        };
        if wc.status != rdma::transport::WcStatus::Success {
            return Err(format!("receive failed: {:?}", wc.status).into());
        }
        start.get_or_insert_with(Instant::now);
        done += 1;
        let q = wc.wr_id as usize;
        if q < posted.len() && posted[q] < per_qp {
            post_receive(s, size, q, &mut posted)?;
        }
    }
    let secs = start.map_or(1e-9, |t| t.elapsed().as_secs_f64().max(1e-9));
    let avg = done as f64 * f64::from(size) / secs;
    Ok(BwRow {
        bytes: u64::from(size),
        iterations: done / nq.max(1),
        peak_bps: avg,
        avg_bps: avg,
        msg_rate: done as f64 / secs,
    })
}

/// The client's run of one size: WRITE, READ or SEND `-n` messages per QP
/// (or for `-D` seconds). As perftest, one work request in every `-Q` of a
/// QP is signaled; its completion (`wr_id`: how many requests it covers)
/// accounts for those before it on its QP, which completed in order
/// (IBA 10.8.3). With `-l L`, QPs take turns in lists of L requests, each
/// list posted with one doorbell. Peak is the best 10 ms window.
fn send(test: &Test, s: &mut Session, size: u32) -> Res<BwRow> {
    let (_, o) = test.parts();
    let depth = u64::from(o.tx_depth.max(1));
    let nq = s.qps.len() as u64;
    let list = u64::from(o.post_list.max(1)).min(depth);
    // Each QP's share of the requests in flight must hold a signaled one,
    // and three quarters of `-t` stay in flight while the client waits for
    // a completion (with `-Q` near `-t` the pipeline drained between two:
    // 64 KiB WRITEs went 25 % slower than with a completion per request).
    let cq_mod = u64::from(o.cq_mod).min(depth / (4 * nq)).max(1);
    let deadline = o.duration.map(|d| Instant::now() + Duration::from_secs(d));
    let total = if deadline.is_some() {
        u64::MAX
    } else {
        test.iters() * nq
    };
    if deadline.is_none() && !test.iters().is_multiple_of(list) {
        return Err(format!("-n {} must be a multiple of -l {list}", test.iters()).into());
    }
    // Requests posted on each QP since its last signaled one, and on each
    // QP in all.
    let mut unsignaled = vec![0u64; nq as usize];
    let mut per_qp = vec![0u64; nq as usize];
    let mut wrs = Vec::with_capacity(list as usize);
    let mut wcs = [WorkCompletion::BLANK; 64];
    // Signaled requests in flight (each completes once).
    let mut in_flight_signaled = 0u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let mut window = (start, 0u64);
    let mut peak = 0f64;
    let mut ended = false;
    while done < total {
        if !ended && deadline.is_some_and(|d| Instant::now() >= d) {
            ended = true;
            // A last signaled request on every QP with unsignaled ones, so
            // that every request posted is accounted for.
            for (q, u) in unsignaled.iter_mut().enumerate() {
                if *u > 0 {
                    wrs.push(work_request(test, s, size, q, per_qp[q], *u + 1));
                    post(s, q, &mut wrs)?;
                    in_flight_signaled += 1;
                    per_qp[q] += 1;
                    *u = 0;
                    posted += 1;
                }
            }
        }
        if ended && posted == done {
            break;
        }
        while !ended && posted < total && posted - done + list <= depth.max(list) {
            // Round robin over the QPs (-q) in lists of -l, each QP cycling
            // through its unit.
            let q = ((posted / list) % nq) as usize;
            for _ in 0..list.min(total - posted) {
                let last = deadline.is_none() && per_qp[q] + 1 >= test.iters();
                let covers = unsignaled[q] + 1;
                let signaled = covers >= cq_mod || last;
                let n = per_qp[q];
                wrs.push(work_request(
                    test,
                    s,
                    size,
                    q,
                    n,
                    if signaled { covers } else { 0 },
                ));
                unsignaled[q] = if signaled { 0 } else { covers };
                in_flight_signaled += u64::from(signaled);
                per_qp[q] += 1;
                posted += 1;
            }
            post(s, q, &mut wrs)?;
        }
        // Once the wait parks, it sleeps until half of the signaled
        // requests in flight have completed (CQ moderation): a wake-up per
        // half pipeline rather than per completion, with the other half
        // still queued at the engine while this thread runs again.
        let n = wait_wcs(
            &mut s.cq,
            &mut wcs,
            (in_flight_signaled / 2).max(1) as usize,
            completion_timeout((posted - done) * u64::from(size)),
        )?;
        in_flight_signaled -= n as u64;
        done += wcs[..n].iter().map(|wc| wc.wr_id).sum::<u64>();
        let el = window.0.elapsed();
        if el >= Duration::from_millis(10) {
            peak = peak.max((done - window.1) as f64 * f64::from(size) / el.as_secs_f64());
            window = (Instant::now(), done);
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let avg = done as f64 * f64::from(size) / secs;
    Ok(BwRow {
        bytes: u64::from(size),
        iterations: done / nq,
        peak_bps: peak.max(avg),
        avg_bps: avg,
        msg_rate: done as f64 / secs,
    })
}

/// Posts the requests in `wrs` on QP `q` with one doorbell, and empties it.
/// With `--sge N`, each goes alone with its buffer cut into N SGEs.
fn post(s: &mut Session, q: usize, wrs: &mut Vec<SendWr>) -> Res<()> {
    if s.sges > 1 {
        let n = u32::from(s.sges);
        let mut sgl = [Sge::default(); 32];
        for wr in wrs.drain(..) {
            let (len, mut at) = (wr.sge.len, 0);
            for (k, sge) in sgl[..n as usize].iter_mut().enumerate() {
                let part = len / n + u32::from((k as u32) < len % n);
                *sge = Sge {
                    addr: wr.sge.addr + u64::from(at),
                    len: part,
                    lkey: wr.sge.lkey,
                };
                at += part;
            }
            s.qps[q]
                .post_send_sges(wr, &sgl[..n as usize])
                .map_err(|e| format!("post_send_sges: {e}"))?;
        }
        return Ok(());
    }
    s.qps[q]
        .post_send_list(wrs)
        .map_err(|(n, e)| format!("post_send_list: {e} after {n} of {}", wrs.len()))?;
    wrs.clear();
    Ok(())
}

/// The `n`th request of QP `q` in the run; signaled if `covers` > 0 (the
/// requests its completion accounts for, its `wr_id`).
fn work_request(test: &Test, s: &Session, size: u32, q: usize, n: u64, covers: u64) -> SendWr {
    let off = s.layout.slot(n, size);
    let remote = &s.remotes[q];
    let op = match test {
        Test::read_bw(_) => SendOp::Read {
            remote_va: remote.va + off,
            rkey: remote.rkey,
        },
        Test::send_bw(_) => SendOp::Send,
        _ => SendOp::Write {
            remote_va: remote.va + off,
            rkey: remote.rkey,
        },
    };
    SendWr {
        wr_id: covers,
        op,
        sge: Sge {
            addr: s.mr.va() + s.layout.local(q) + off,
            len: size,
            lkey: s.mr.lkey(),
        },
        signaled: covers > 0,
        solicited: false,
    }
}
