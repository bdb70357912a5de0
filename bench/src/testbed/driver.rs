//! The switch thread of a testbed run (see [`super::fabric`]): it polls the switch
//! dataplane, samples the bottleneck queue, takes the senders' completions and posts
//! the WRITEs their flows ask for, until every flow ended, one failed or the run
//! timed out.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use nic::verbs::{CompletionQueue, MemoryRegion, QueuePair};
use rdma::transport::{SendOp, SendWr, Sge, WcStatus};
use switch::dataplane::Dataplane;
use switch::PortCounters;

use super::{FlowSpec, Stop};

/// A gap between two switch loop turns longer than this is counted as the
/// thread being descheduled (a busy turn takes well under 100 us; a CFS
/// preemption takes milliseconds).
pub const STALL_NS: u64 = 500_000;

/// Queue histogram bucket width (bytes).
pub const QUEUE_BUCKET: u64 = 64;

/// A `queue_series` bin in which the switch loop took no sample (it was descheduled).
pub const NO_SAMPLE: u32 = u32::MAX;

/// One WRITE completion.
#[derive(Debug, Clone, Copy)]
pub struct Completion {
    /// Index of the flow in the workload.
    pub flow: u32,
    /// Time (ns after the workload's start).
    pub t_ns: u64,
    /// Bytes.
    pub bytes: u32,
}

pub(super) struct SenderIo {
    pub(super) qp: QueuePair,
    pub(super) cq: CompletionQueue,
    pub(super) src: MemoryRegion,
    pub(super) dst_va: u64,
    pub(super) rkey: u32,
    /// Flow indices of this sender, in start order.
    pub(super) flows: Vec<usize>,
    pub(super) cursor: usize,
    pub(super) inflight: VecDeque<(usize, u32)>,
    pub(super) stride: usize,
    pub(super) slots: usize,
    pub(super) msgs: u64,
    /// Longest write per slot (for the verification).
    pub(super) slot_len: Vec<u32>,
}

pub(super) struct FlowState {
    pub(super) spec: FlowSpec,
    pub(super) posted: u64,
    pub(super) done: u64,
    pub(super) posting_done: bool,
    pub(super) first_post: Option<u64>,
    pub(super) end: Option<u64>,
}

/// What the driver thread hands back.
pub(super) struct DriverOut {
    pub(super) dp: Dataplane,
    pub(super) senders: Vec<SenderIo>,
    pub(super) flows: Vec<FlowState>,
    pub(super) completions: Vec<Completion>,
    pub(super) hist: Vec<u64>,
    pub(super) series: Vec<u32>,
    pub(super) series_bin_ns: u64,
    pub(super) queue_max: u64,
    pub(super) duration_ns: u64,
    pub(super) turns: u64,
    pub(super) stall_ns: u64,
    pub(super) timed_out: bool,
    pub(super) errors: Vec<String>,
    pub(super) bn0: PortCounters,
    pub(super) offered0: u64,
}

pub(super) struct DriveParams {
    pub(super) rx_port: u16,
    pub(super) sender_ports: Vec<u16>,
    pub(super) sample_ns: u64,
    pub(super) series_bin_ns: u64,
    pub(super) hist_len: usize,
    pub(super) timeout: u64,
    pub(super) outstanding: usize,
    pub(super) total_bytes: Option<u64>,
    pub(super) planned: u64,
}

/// The switch thread: poll, sample, post, complete.
pub(super) fn drive(
    mut dp: Dataplane,
    mut senders: Vec<SenderIo>,
    mut flows: Vec<FlowState>,
    p: DriveParams,
    progress: &AtomicU64,
) -> DriverOut {
    let clock = *dp.clock();
    let bn0 = *dp
        .switch
        .counters(p.rx_port)
        .unwrap_or(&PortCounters::default());
    let offered0: u64 = p
        .sender_ports
        .iter()
        .filter_map(|&id| dp.switch.counters(id))
        .map(|c| c.rx_bytes)
        .sum();
    let t0 = clock.now_ns();
    let mut q = QueueSamples::new(&p, t0);
    let mut st = DriveState {
        completions: Vec::with_capacity(1 << 16),
        errors: Vec::new(),
        done_bytes: 0,
        ended: 0,
        failed: false,
        end_rel: 0,
    };
    let mut last = t0;
    let (mut turns, mut stall_ns) = (0u64, 0u64);
    let mut timed_out = false;
    loop {
        let now = clock.now_ns();
        let gap = now.saturating_sub(last);
        if gap > STALL_NS {
            stall_ns += gap;
        }
        last = now;
        dp.poll(now);
        turns += 1;
        if now >= q.next_sample {
            q.sample(now, dp.switch.queue_bytes(p.rx_port).unwrap_or(0));
        }
        if turns % 8 != 0 {
            continue;
        }
        let rel = now - t0;
        for io in senders.iter_mut() {
            take_completions(io, &mut flows, rel, &mut st);
            post_flows(io, &mut flows, rel, p.outstanding, &mut st);
        }
        if turns % 1024 == 0 {
            let frac = match p.total_bytes {
                Some(t) if t > 0 => st.done_bytes as f64 / t as f64,
                _ => rel as f64 / p.planned as f64,
            };
            progress.store((frac.min(0.999) * 1e6) as u64, Ordering::Relaxed);
        }
        if st.ended == flows.len() {
            break;
        }
        if st.failed {
            st.end_rel = rel;
            break;
        }
        if rel > p.timeout {
            timed_out = true;
            st.end_rel = rel;
            break;
        }
    }
    q.series
        .truncate(((st.end_rel / p.series_bin_ns) + 1) as usize);
    DriverOut {
        dp,
        senders,
        flows,
        completions: st.completions,
        hist: q.hist,
        series: q.series,
        series_bin_ns: p.series_bin_ns,
        queue_max: q.queue_max,
        duration_ns: st.end_rel,
        turns,
        stall_ns,
        timed_out,
        errors: st.errors,
        bn0,
        offered0,
    }
}

/// The bottleneck queue as sampled every `sample_ns`: a histogram in
/// [`QUEUE_BUCKET`] buckets, the largest sample per plot bin, the largest of all.
struct QueueSamples {
    hist: Vec<u64>,
    series: Vec<u32>,
    series_len: usize,
    queue_max: u64,
    next_sample: u64,
    t0: u64,
    sample_ns: u64,
    series_bin_ns: u64,
}

impl QueueSamples {
    fn new(p: &DriveParams, t0: u64) -> Self {
        Self {
            hist: vec![0u64; p.hist_len],
            series: Vec::with_capacity((p.planned / p.series_bin_ns + 16) as usize),
            series_len: (p.timeout / p.series_bin_ns + 2) as usize,
            queue_max: 0,
            next_sample: t0,
            t0,
            sample_ns: p.sample_ns,
            series_bin_ns: p.series_bin_ns,
        }
    }

    /// The queue is `q` bytes at `now` (at or after the next sample time): it counts
    /// for every sample time passed since.
    fn sample(&mut self, now: u64, q: u64) {
        let k = (now - self.next_sample) / self.sample_ns + 1;
        let b = ((q / QUEUE_BUCKET) as usize).min(self.hist.len() - 1);
        self.hist[b] += k;
        self.next_sample += k * self.sample_ns;
        self.queue_max = self.queue_max.max(q);
        let bin = ((now - self.t0) / self.series_bin_ns) as usize;
        if bin < self.series_len {
            if self.series.len() <= bin {
                self.series.resize(bin + 1, NO_SAMPLE);
            }
            let q32 = q.min(u64::from(NO_SAMPLE - 1)) as u32;
            self.series[bin] = if self.series[bin] == NO_SAMPLE {
                q32
            } else {
                self.series[bin].max(q32)
            };
        }
    }
}

/// What the driver has seen of the flows so far.
struct DriveState {
    completions: Vec<Completion>,
    errors: Vec<String>,
    done_bytes: u64,
    /// Flows that ended.
    ended: usize,
    /// A completion or a post failed: the run stops.
    failed: bool,
    /// When the last flow ended (or the run stopped), from the start.
    end_rel: u64,
}

/// Takes one sender's completions at `rel` ns into the run: each WRITE done counts
/// for its flow, which ends with its last.
fn take_completions(io: &mut SenderIo, flows: &mut [FlowState], rel: u64, st: &mut DriveState) {
    while let Some(wc) = io.cq.poll_one() {
        let Some((fi, len)) = io.inflight.pop_front() else {
            st.errors.push(format!("unexpected completion {wc:?}"));
            st.failed = true;
            continue;
        };
        if wc.status != WcStatus::Success {
            if st.errors.len() < 16 {
                st.errors
                    .push(format!("sender {}: {:?}", flows[fi].spec.sender, wc.status));
            }
            st.failed = true;
            continue;
        }
        let f = &mut flows[fi];
        f.done += u64::from(len);
        st.done_bytes += u64::from(len);
        st.completions.push(Completion {
            flow: fi as u32,
            t_ns: rel,
            bytes: len,
        });
        if f.posting_done && f.done == f.posted && f.end.is_none() {
            f.end = Some(rel);
            st.end_rel = st.end_rel.max(rel);
            st.ended += 1;
        }
    }
}

/// Posts what the flows of one sender ask for at `rel` ns into the run, one flow at
/// a time, up to `outstanding` WRITEs in flight.
fn post_flows(
    io: &mut SenderIo,
    flows: &mut [FlowState],
    rel: u64,
    outstanding: usize,
    st: &mut DriveState,
) {
    while io.inflight.len() < outstanding && !st.failed {
        let Some(&fi) = io.flows.get(io.cursor) else {
            break;
        };
        let f = &mut flows[fi];
        if rel < f.spec.start_ns {
            break;
        }
        let len = match f.spec.stop {
            Stop::Bytes(b) => (b - f.posted).min(u64::from(f.spec.msg)) as u32,
            Stop::At(t) if rel < t => f.spec.msg,
            Stop::At(_) => 0,
        };
        if len == 0 {
            f.posting_done = true;
            io.cursor += 1;
            if f.done == f.posted && f.end.is_none() {
                // Nothing in flight (or a zero-byte flow).
                let e = match f.spec.stop {
                    Stop::At(t) => rel.max(t),
                    Stop::Bytes(_) => rel,
                };
                f.end = Some(e);
                st.end_rel = st.end_rel.max(e);
                st.ended += 1;
            }
            continue;
        }
        let slot = (io.msgs % io.slots as u64) as usize;
        let off = (slot * io.stride) as u64;
        let wr = SendWr {
            wr_id: io.msgs,
            op: SendOp::Write {
                remote_va: io.dst_va + off,
                rkey: io.rkey,
            },
            sge: Sge {
                addr: io.src.va() + off,
                len,
                lkey: io.src.lkey(),
            },
            signaled: true,
            solicited: false,
        };
        match io.qp.post_send(wr) {
            Ok(()) => {}
            Err(nic::verbs::VerbsError::QueueFull) => break,
            Err(e) => {
                st.errors
                    .push(format!("sender {}: post_send: {e}", f.spec.sender));
                st.failed = true;
                break;
            }
        }
        io.slot_len[slot] = io.slot_len[slot].max(len);
        io.msgs += 1;
        io.inflight.push_back((fi, len));
        f.first_post.get_or_insert(rel);
        f.posted += u64::from(len);
        if matches!(f.spec.stop, Stop::Bytes(b) if f.posted >= b) {
            f.posting_done = true;
            io.cursor += 1;
        }
    }
}
