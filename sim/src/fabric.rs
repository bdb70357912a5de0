//! The simulated fabric and its event loop: NICs ([`crate::nic::Nic`]) and switch cores
//! (`switch::Switch`) joined by links with a rate and a propagation delay.
//!
//! A link direction is a FIFO of frames in flight, each with its arrival time; the event
//! [`Event::LinkArrive`] hands the first one to the far end. A switch egress port sends
//! when its shaper (the switch core's, at the port speed) lets it: [`Event::PortTx`]
//! calls `Switch::dequeue` (which pushes the INT hop record) and puts the frame on the
//! link, arriving after the frame's serialisation plus the propagation delay
//! (store-and-forward). A NIC sends one frame at a time as its scheduler decides,
//! serialised by its own shaper at the host link rate.
//!
//! Optional PFC (IEEE 802.1Qbb, one lossless priority for data; ACK/NAK/CNP are never
//! paused) is modelled here, on the links, because it is a link protocol the switch
//! core does not have: a switch counts the data bytes each ingress link has queued
//! (until they leave their egress port); above XOFF it sends PAUSE upstream, below XON
//! a resume, each arriving after the link's propagation delay. A paused switch port
//! still sends its control class; a paused NIC sends only control packets.
//!
//! The event loop is parallel and deterministic (conservative synchronous windows, as
//! YAWNS): the fabric is split into logical partitions ([`Topology::partition`]), each
//! with its own event queue, NICs, switches, frame pool and its ends of the links. A
//! partition's effect on another is a message: a frame put on a link into it, a PFC
//! PAUSE or resume for a link out of it, the close of a flow's responder QP. A frame
//! or PFC frame arrives at least the link's propagation delay after it was sent, so
//! with the lookahead L the smallest delay of a link between partitions, every
//! partition runs the events of [t, t + L) alone; at the barrier the messages go into
//! their partitions in a fixed order (time, kind, link or host, the sender's sequence)
//! and the next window starts. Flow starts, which touch two NICs and the run's random
//! source, are set up between windows. The results depend on the inputs, the seed
//! and the number of partitions, never on the number of threads that run them.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::panic::resume_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Barrier, Mutex};

use switch::{PacketBuf, PortSettings, SharedBuffer, Switch, SwitchSettings};

use crate::event::{Event, EventQueue};
use crate::frame::{FramePool, SimFrame};
use crate::nic::{Nic, NicConfig, Tx};
use crate::topo::{End, Topology};
use crate::workload::Flow;

mod window;

pub use window::thread_cpu_seconds;
use window::{Coord, Shared};

/// Settings of a run that are not the topology's.
#[derive(Debug, Clone, Copy)]
pub struct RunConfig {
    /// NIC settings (rate, T, MTU, CC).
    pub nic: NicConfig,
    /// Run seed (WRED, ECMP, PSNs, UDP source ports).
    pub seed: u64,
    /// Messages a flow is written as: at most this many bytes each.
    pub msg_bytes: u32,
    /// Messages a flow keeps outstanding (its send queue depth).
    pub outstanding: u16,
    /// Queue sampling interval, ns (0: no samples).
    pub sample_ns: u64,
    /// Stop at this simulated time even if flows are unfinished, ns.
    pub max_time_ns: u64,
    /// Control-class buffer per switch port, bytes.
    pub ctrl_buf: u64,
    /// PFC thresholds (XOFF, XON) in bytes per ingress link; `None`: no PFC.
    pub pfc: Option<(u64, u64)>,
    /// A shared buffer per switch `(bytes, alpha_log2)` (`switch::SharedBuffer`);
    /// `None`: each port only has its own `buf_max`.
    pub shared_buffer: Option<(u64, i8)>,
    /// Logical partitions of the event loop (0: [`Topology::auto_partitions`]). The
    /// results depend on it.
    pub partitions: u32,
    /// Threads that run the partitions (0: as many as partitions and cores allow).
    /// The results do not depend on it.
    pub threads: u32,
}

/// One direction of a link. The sending end's partition owns `tx_pending`, `paused*`
/// and `sources`; the receiving end's owns `inflight`, `ingress_bytes` and
/// `pause_sent` (every partition holds a copy of every link and uses its ends).
struct Link {
    from: End,
    to: End,
    prop_ns: u64,
    /// Frames in flight with their arrival times (FIFO: a link never reorders).
    inflight: VecDeque<(u64, SimFrame)>,
    /// For a switch egress port: a PortTx event is pending.
    tx_pending: bool,
    /// PFC: the far end paused this link's sender (since `paused_at`).
    paused: bool,
    paused_at: u64,
    /// PFC: time this link's sender spent paused, ns.
    pause_ns: u64,
    /// PFC, links into a switch: data bytes from this link queued in the switch.
    ingress_bytes: u64,
    /// PFC, links into a switch: a PAUSE was sent upstream and not yet resumed.
    pause_sent: bool,
    /// PFC, switch egress links: (ingress link, bytes) of each queued data frame.
    sources: VecDeque<(u32, u32)>,
}

impl Link {
    fn new(from: End, to: End, prop_ns: u64) -> Self {
        Self {
            from,
            to,
            prop_ns,
            inflight: VecDeque::new(),
            tx_pending: false,
            paused: false,
            paused_at: 0,
            pause_ns: 0,
            ingress_bytes: 0,
            pause_sent: false,
            sources: VecDeque::new(),
        }
    }
}

/// What became of one flow.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowResult {
    /// Start time, ns.
    pub start: u64,
    /// Completion time at the sender (last message completed), ns; 0 = unfinished.
    pub end: u64,
    sqpn: u32,
    rqpn: u32,
}

/// Totals of a run.
#[derive(Debug, Clone, Default)]
pub struct RunTotals {
    /// Frames dropped by switches (tail, WRED Not-ECT, malformed, ...).
    pub switch_drops: u64,
    /// Of which: tail drops of the data class.
    pub tail_drops: u64,
    /// CE marks.
    pub ce_marks: u64,
    /// INT hop records pushed.
    pub int_pushed: u64,
    /// Data frames retransmitted by NICs.
    pub retransmits: u64,
    /// Retransmit timeouts.
    pub timeouts: u64,
    /// CNPs sent.
    pub cnps: u64,
    /// Frames sent by NICs.
    pub nic_tx_frames: u64,
    /// Frames received by NICs.
    pub nic_rx_frames: u64,
    /// Frames the NICs dropped (late duplicates for closed QPs).
    pub nic_rx_dropped: u64,
    /// Flow starts delayed because a NIC had no free QP.
    pub qp_exhausted: u64,
    /// Completions in error.
    pub completion_errors: u64,
    /// Frames the NICs could not build.
    pub tx_build_errors: u64,
    /// Events processed.
    pub events: u64,
    /// Simulated time at the end, ns.
    pub end_ns: u64,
    /// Frame buffers allocated (peak frames alive).
    pub frame_buffers: u64,
    /// Wire bytes sent on each monitored port, in `Topology::monitored` order.
    pub monitored_tx_wire: Vec<u64>,
    /// PFC: time senders spent paused, summed over links, ns.
    pub pfc_pause_ns: u64,
    /// PFC: PAUSE frames sent.
    pub pfc_pauses: u64,
    /// CPU seconds of the run summed over its threads (`None`: not measurable).
    pub cpu_s: Option<f64>,
    /// Logical partitions of the event loop.
    pub partitions: u32,
    /// Threads that ran them.
    pub threads: u32,
    /// The window length: the smallest propagation delay between partitions, ns.
    pub lookahead_ns: u64,
    /// Windows run.
    pub windows: u64,
    /// Messages between partitions (frames, PFC frames, QP closes).
    pub cross_messages: u64,
    /// Messages that would have taken effect before the barrier they crossed: always
    /// 0 unless the window is longer than the lookahead (a broken run).
    pub late_messages: u64,
}

/// Where things are: read-only maps every partition shares.
#[derive(Debug, Clone)]
struct Layout {
    /// Egress link of each host.
    host_link: Vec<u32>,
    /// Egress link of each switch port.
    port_link: Vec<Vec<u32>>,
    /// Partition of each host.
    host_part: Vec<u16>,
    /// Partition of each link's sending and receiving end.
    link_part: Vec<(u16, u16)>,
    host_ips: Vec<[u8; 4]>,
    /// The remote key of each host's region.
    rkeys: Vec<u32>,
}

/// A flow's connection, chosen between windows and read by both ends' partitions.
#[derive(Debug, Clone, Copy, Default)]
struct FlowSetup {
    src: u32,
    dst: u32,
    bytes: u64,
    sq: u32,
    spsn: u32,
    rq: u32,
    rpsn: u32,
    sport: u16,
}

/// What one partition tells another at the next barrier.
enum MsgKind {
    /// A frame reaches the far end of link `id` at the message's time.
    Frame(SimFrame),
    /// A PFC PAUSE reaches the sending end of link `id`.
    Pause,
    /// A PFC resume reaches the sending end of link `id`.
    Resume,
    /// The flow finished: close the responder QP `id` names on host `host`.
    Close { host: u32 },
}

struct Msg {
    at: u64,
    id: u32,
    /// The sender's sequence number (the sending partition is fixed per kind and id).
    seq: u64,
    kind: MsgKind,
}

impl Msg {
    fn key(&self) -> (u64, u8, u32, u64) {
        let rank = match self.kind {
            MsgKind::Frame(_) => 0,
            MsgKind::Pause => 1,
            MsgKind::Resume => 2,
            MsgKind::Close { .. } => 3,
        };
        (self.at, rank, self.id, self.seq)
    }
}

/// `v[i]`, an element this partition owns.
#[inline]
fn own<T>(v: &mut [Option<T>], i: usize) -> &mut T {
    v[i].as_mut().expect("an element of this partition")
}

/// One logical partition: its event queue, NICs, switches, frame pool and link ends.
struct Part {
    id: u16,
    now: u64,
    q: EventQueue,
    links: Vec<Link>,
    layout: std::sync::Arc<Layout>,
    nics: Vec<Option<Nic>>,
    switches: Vec<Option<Switch<SimFrame>>>,
    host_wake: Vec<u64>,
    pool: FramePool,
    /// Connections of the flows with an end here (written between windows).
    setup: Vec<FlowSetup>,
    /// Completion time of the flows sent from here (0: not yet).
    end: Vec<u64>,
    done: usize,
    cfg: RunConfig,
    /// Monitored ports of this partition, in `Topology::monitored` order.
    monitored: Vec<(u32, u16)>,
    /// Queue samples of `monitored`, one row per sample time.
    samples: Vec<u32>,
    pfc_pauses: u64,
    /// Messages for each partition, sent at the next barrier.
    outbox: Vec<Vec<Msg>>,
    msg_seq: u64,
    /// Messages from each partition, delivered at the start of the next window.
    inbox: Vec<Vec<Msg>>,
    /// Buffers of frames copied out of `inbox`, for the pool of each sender.
    give_back: Vec<Vec<SimFrame>>,
    /// Buffers each partition gave back, for this pool.
    taken_back: Vec<Vec<SimFrame>>,
    /// All of `inbox` in delivery order (kept for its capacity).
    sorted: Vec<(u16, Msg)>,
    /// Messages delivered here, and those of them that arrived late.
    msgs_in: u64,
    late_in: u64,
}

impl Part {
    /// Delivers the messages of the last window at the start of the window that
    /// starts at `start`, in the order of [`Msg::key`]: the frames into copies from
    /// this partition's pool (their buffers go back to their senders), PFC frames and
    /// QP closes into the queue and the NICs. Takes back the buffers other partitions
    /// returned.
    fn deliver(&mut self, start: u64) {
        for v in &mut self.taken_back {
            for f in v.drain(..) {
                self.pool.put(f);
            }
        }
        let mut sorted = std::mem::take(&mut self.sorted);
        for (from, v) in self.inbox.iter_mut().enumerate() {
            sorted.extend(v.drain(..).map(|m| (from as u16, m)));
        }
        sorted.sort_unstable_by_key(|(_, m)| m.key());
        self.msgs_in += sorted.len() as u64;
        for (from, m) in sorted.drain(..) {
            if m.at < start && !matches!(m.kind, MsgKind::Close { .. }) {
                // Sent less than the lookahead before it takes effect: a bug. (A
                // QP close is out of band: it takes effect at the barrier.)
                self.late_in += 1;
            }
            let at = m.at;
            match m.kind {
                MsgKind::Frame(f) => {
                    let mut copy = self.pool.get();
                    copy.copy_from(&f);
                    self.give_back[usize::from(from)].push(f);
                    self.links[m.id as usize].inflight.push_back((at, copy));
                    self.q.push(at, Event::LinkArrive(m.id));
                }
                MsgKind::Pause => self.q.push(at, Event::PfcPause(m.id)),
                MsgKind::Resume => self.q.push(at, Event::PfcResume(m.id)),
                MsgKind::Close { host } => own(&mut self.nics, host as usize).close_qp(m.id),
            }
        }
        self.sorted = sorted;
    }

    /// Runs the events before `limit`.
    fn run_until(&mut self, limit: u64) {
        while let Some((t, ev)) = self.q.pop_before(limit) {
            self.now = t;
            match ev {
                Event::LinkArrive(l) => self.link_arrive(l as usize),
                Event::PortTx(l) => self.port_tx(l as usize),
                Event::HostWake(h) => self.host_wake(h as usize),
                Event::FlowStart(f) => self.flow_start(f as usize),
                Event::FlowAccept(f) => self.flow_accept(f as usize),
                Event::Sample => self.sample(),
                Event::PfcPause(l) => {
                    let k = &mut self.links[l as usize];
                    if !k.paused {
                        k.paused = true;
                        k.paused_at = self.now;
                    }
                }
                Event::PfcResume(l) => self.pfc_resume(l as usize),
            }
        }
    }

    fn send_msg(&mut self, to: u16, at: u64, id: u32, kind: MsgKind) {
        let seq = self.msg_seq;
        self.msg_seq += 1;
        self.outbox[usize::from(to)].push(Msg { at, id, seq, kind });
    }

    /// Puts `f` on link `l`, arriving at `at`.
    fn put_on_link(&mut self, l: usize, at: u64, f: SimFrame) {
        let to = self.layout.link_part[l].1;
        if to == self.id {
            self.links[l].inflight.push_back((at, f));
            self.q.push(at, Event::LinkArrive(l as u32));
        } else {
            self.send_msg(to, at, l as u32, MsgKind::Frame(f));
        }
    }

    /// A PFC PAUSE (or resume) for link `l`'s sender, arriving at `at`.
    fn pfc_signal(&mut self, l: usize, at: u64, pause: bool) {
        let from = self.layout.link_part[l].0;
        if from == self.id {
            let ev = if pause {
                Event::PfcPause(l as u32)
            } else {
                Event::PfcResume(l as u32)
            };
            self.q.push(at, ev);
        } else {
            let kind = if pause {
                MsgKind::Pause
            } else {
                MsgKind::Resume
            };
            self.send_msg(from, at, l as u32, kind);
        }
    }

    fn sample(&mut self) {
        for &(s, p) in &self.monitored {
            let sw = self.switches[s as usize].as_ref();
            let b = sw.and_then(|sw| sw.queue_bytes(p)).unwrap_or(0);
            self.samples.push(b.min(u64::from(u32::MAX)) as u32);
        }
        // The coordinator keeps the rows up to the run's end.
        self.q.push(self.now + self.cfg.sample_ns, Event::Sample);
    }

    fn link_arrive(&mut self, l: usize) {
        let Some((_, frame)) = self.links[l].inflight.pop_front() else {
            return;
        };
        match self.links[l].to {
            End::Host(h) => {
                let h = h as usize;
                own(&mut self.nics, h).receive(frame.bytes(), self.now);
                self.pool.put(frame);
                self.after_nic(h);
            }
            End::Switch(s, p) => {
                let len = frame.len() as u32;
                match own(&mut self.switches, s as usize).receive(p, frame, self.now) {
                    Ok(e) => {
                        let out = self.layout.port_link[s as usize][usize::from(e.port)] as usize;
                        if e.class == switch::Class::Data {
                            self.pfc_enqueued(l, out, len);
                        }
                        self.kick_port(s, e.port, out);
                    }
                    Err(r) => self.pool.put(r.pkt),
                }
            }
        }
    }

    /// PFC accounting of a data frame from link `inl` queued for egress link `out`.
    fn pfc_enqueued(&mut self, inl: usize, out: usize, len: u32) {
        let Some((xoff, _)) = self.cfg.pfc else {
            return;
        };
        self.links[out].sources.push_back((inl as u32, len));
        let k = &mut self.links[inl];
        k.ingress_bytes += u64::from(len);
        if k.ingress_bytes > xoff && !k.pause_sent {
            k.pause_sent = true;
            self.pfc_pauses += 1;
            let at = self.now + k.prop_ns;
            self.pfc_signal(inl, at, true);
        }
    }

    /// PFC accounting of a data frame that left egress link `out`.
    fn pfc_dequeued(&mut self, out: usize) {
        let Some((_, xon)) = self.cfg.pfc else {
            return;
        };
        let Some((inl, len)) = self.links[out].sources.pop_front() else {
            return;
        };
        let k = &mut self.links[inl as usize];
        k.ingress_bytes -= u64::from(len);
        if k.pause_sent && k.ingress_bytes <= xon {
            k.pause_sent = false;
            let at = self.now + k.prop_ns;
            self.pfc_signal(inl as usize, at, false);
        }
    }

    fn pfc_resume(&mut self, l: usize) {
        let k = &mut self.links[l];
        if !k.paused {
            return;
        }
        k.paused = false;
        k.pause_ns += self.now - k.paused_at;
        match k.from {
            End::Switch(s, p) => self.kick_port(s, p, l),
            End::Host(h) => self.host_tx(h as usize),
        }
    }

    /// Makes switch `s`'s port `p` (egress link `out`) send when its link is free.
    fn kick_port(&mut self, s: u32, p: u16, out: usize) {
        if self.links[out].tx_pending {
            return;
        }
        let sw = own(&mut self.switches, s as usize);
        if sw.next_departure(p).is_none() {
            return;
        }
        let free = sw.port_free_at(p).unwrap_or(0);
        if free <= self.now {
            // An idle port sends at once (one event less per hop).
            self.port_tx(out);
        } else {
            self.links[out].tx_pending = true;
            self.q.push(free, Event::PortTx(out as u32));
        }
    }

    fn port_tx(&mut self, l: usize) {
        self.links[l].tx_pending = false;
        let End::Switch(s, p) = self.links[l].from else {
            return;
        };
        let sw = own(&mut self.switches, s as usize);
        let (_, ctrl) = sw.class_bytes(p).unwrap_or((0, 0));
        if self.links[l].paused && ctrl == 0 {
            // PFC: only the control class may go; the resume kicks the port again.
            return;
        }
        if let Some(f) = sw.dequeue(p, self.now) {
            let end = sw.port_free_at(p).unwrap_or(self.now);
            let at = end + self.links[l].prop_ns;
            self.put_on_link(l, at, f);
            if ctrl == 0 {
                // Strict priority: with no control frame queued, that was data.
                self.pfc_dequeued(l);
            }
        }
        let sw = own(&mut self.switches, s as usize);
        if let Some(next) = sw.next_departure(p) {
            self.links[l].tx_pending = true;
            self.q.push(next.max(self.now), Event::PortTx(l as u32));
        }
    }

    /// The responder QP of flow `f` is connected (its receiver's side).
    fn flow_accept(&mut self, f: usize) {
        let s = self.setup[f];
        let sip = self.layout.host_ips[s.src as usize];
        let (now, depth) = (self.now, self.cfg.outstanding);
        let nic = own(&mut self.nics, s.dst as usize);
        if let Err(e) = nic.connect(s.rq, s.rpsn, s.sq, s.spsn, sip, s.sport, depth, now) {
            // Never expected (valid MTU and depths were checked when the run was set up).
            panic!("connecting flow {f}: {e}");
        }
    }

    /// Flow `f` starts at its sender: connect, post the first message, transmit.
    fn flow_start(&mut self, f: usize) {
        let s = self.setup[f];
        let dip = self.layout.host_ips[s.dst as usize];
        let rkey = self.layout.rkeys[s.dst as usize];
        let (now, depth, msg) = (self.now, self.cfg.outstanding, self.cfg.msg_bytes);
        let nic = own(&mut self.nics, s.src as usize);
        if let Err(e) = nic.connect(s.sq, s.spsn, s.rq, s.rpsn, dip, s.sport, depth, now) {
            panic!("connecting flow {f}: {e}");
        }
        nic.start_flow(s.sq, f as u32, s.bytes, msg, rkey, now);
        self.after_nic(s.src as usize);
    }

    /// After a NIC worked: close finished flows, transmit, and ask for a wake-up.
    fn after_nic(&mut self, h: usize) {
        while let Some((f, t)) = own(&mut self.nics, h).finished.pop() {
            let f = f as usize;
            if self.end[f] == 0 {
                self.end[f] = t.max(1);
                self.done += 1;
                let s = self.setup[f];
                own(&mut self.nics, h).close_qp(s.sq);
                let dp = self.layout.host_part[s.dst as usize];
                if dp == self.id {
                    own(&mut self.nics, s.dst as usize).close_qp(s.rq);
                } else {
                    self.send_msg(dp, t, s.rq, MsgKind::Close { host: s.dst });
                }
            }
        }
        self.host_tx(h);
    }

    fn want_wake(&mut self, h: usize, t: u64) {
        if t < self.host_wake[h] {
            self.host_wake[h] = t;
            self.q.push(t, Event::HostWake(h as u32));
        }
    }

    fn host_wake(&mut self, h: usize) {
        if self.host_wake[h] != self.now {
            return; // superseded by an earlier wake-up that already ran
        }
        self.host_wake[h] = u64::MAX;
        own(&mut self.nics, h).timers(self.now);
        self.after_nic(h);
    }

    fn host_tx(&mut self, h: usize) {
        let now = self.now;
        let l = self.layout.host_link[h] as usize;
        let paused = self.links[l].paused;
        let nic = own(&mut self.nics, h);
        let free = nic.shaper.next_free();
        let mut wake = nic.next_timer();
        if free > now {
            wake = Some(wake.map_or(free, |w| w.min(free)));
        } else if paused && !nic.control_pending() {
            // PFC: data waits for the resume, which calls this again.
        } else {
            match nic.transmit(now, &mut self.pool) {
                Tx::Frame(f, wire) => {
                    let end = nic.shaper.send(now, wire);
                    let at = end + self.links[l].prop_ns;
                    self.put_on_link(l, at, f);
                    wake = Some(wake.map_or(end, |w| w.min(end)));
                    // Anything the NIC finished while sending (never: completions come
                    // from received frames) is handled on the next wake.
                }
                Tx::Idle(w) => {
                    if let Some(w) = w {
                        wake = Some(wake.map_or(w, |x| x.min(w)));
                    }
                }
            }
        }
        if let Some(w) = wake {
            // Timer deadlines are tick-aligned and may lie in the past: never earlier
            // than now, never at now twice (the wheel fires them at the next call).
            self.want_wake(h, w.max(now + 1));
        }
    }

    /// Adds this partition's counters to `t`; links paused at the end count to `end_ns`.
    fn add_totals(&self, t: &mut RunTotals, end_ns: u64) {
        t.events += self.q.popped();
        t.frame_buffers += self.pool.allocated() as u64;
        for sw in self.switches.iter().flatten() {
            for p in sw.port_ids() {
                let c = sw.counters(p).expect("own port");
                t.switch_drops += c.drops();
                t.tail_drops += c.tail_drops;
                t.ce_marks += c.ce_marked;
                t.int_pushed += c.int_pushed;
            }
        }
        for n in self.nics.iter().flatten() {
            let c = &n.counters;
            t.retransmits += c.retransmits;
            t.timeouts += c.timeouts;
            t.cnps += c.tx_cnps;
            t.nic_tx_frames += c.tx_frames;
            t.nic_rx_frames += c.rx_frames;
            t.nic_rx_dropped += c.rx_dropped;
            t.qp_exhausted += c.qp_exhausted;
            t.completion_errors += c.completion_errors;
            t.tx_build_errors += c.tx_build_errors;
        }
        for (k, parts) in self.links.iter().zip(&self.layout.link_part) {
            if parts.0 == self.id {
                let open = if k.paused {
                    end_ns.saturating_sub(k.paused_at)
                } else {
                    0
                };
                t.pfc_pause_ns += k.pause_ns + open;
            }
        }
        t.pfc_pauses += self.pfc_pauses;
    }
}

/// The simulator: build it with [`Sim::new`], then [`Sim::run`].
pub struct Sim {
    parts: Vec<Part>,
    coord: Coord,
    threads: usize,
    end_ns: u64,
    monitored: Vec<(u32, u16)>,
    /// Partition of each monitored port.
    monitored_part: Vec<u16>,
    /// Queue samples (bytes) of the monitored ports, one row per sample time, filled
    /// by [`Sim::run`].
    pub samples: Vec<u32>,
}

impl Sim {
    /// Builds the fabric of `topo` and schedules `flows` (sorted by start or not).
    pub fn new(topo: &Topology, flows: Vec<Flow>, cfg: RunConfig) -> Result<Self, String> {
        let n_hosts = topo.hosts() as usize;
        for f in &flows {
            if f.src as usize >= n_hosts || f.dst as usize >= n_hosts || f.src == f.dst {
                return Err(format!(
                    "flow {} -> {}: hosts are 0..{} and a flow needs two different ones",
                    f.src, f.dst, n_hosts
                ));
            }
        }
        if flows.len() > Event::MAX_ID as usize {
            return Err(format!("{} flows: at most {}", flows.len(), Event::MAX_ID));
        }
        let n_parts = if cfg.partitions == 0 {
            topo.auto_partitions()
        } else {
            cfg.partitions
        };
        let (host_part, sw_part) = topo.partition(n_parts)?;
        let part_of = |e: End| match e {
            End::Host(h) => host_part[h as usize],
            End::Switch(s, _) => sw_part[s as usize],
        };
        let mut links = Vec::new();
        let mut link_part = Vec::new();
        let mut host_link = vec![u32::MAX; n_hosts];
        let mut port_link: Vec<Vec<u32>> = topo
            .switches
            .iter()
            .map(|s| vec![u32::MAX; s.ports.len()])
            .collect();
        let mut lookahead = u64::MAX;
        for l in &topo.links {
            for (from, to) in [(l.a, l.b), (l.b, l.a)] {
                let id = links.len() as u32;
                match from {
                    End::Host(h) => host_link[h as usize] = id,
                    End::Switch(s, p) => port_link[s as usize][p as usize] = id,
                }
                if part_of(from) != part_of(to) {
                    lookahead = lookahead.min(l.prop_ns);
                }
                link_part.push((part_of(from), part_of(to)));
                links.push(Link::new(from, to, l.prop_ns));
            }
        }
        if host_link.contains(&u32::MAX) {
            return Err("a host has no link".into());
        }
        if lookahead == 0 {
            return Err(format!(
                "{n_parts} partitions need links between them with a propagation delay (--partitions 1)"
            ));
        }
        // One partition: no messages, so any window is correct; a window only paces
        // flow set-up and the end-of-run check, and a long one costs no barriers.
        let lookahead = if lookahead == u64::MAX {
            100_000
        } else {
            lookahead
        };
        let mut nics: Vec<Option<Nic>> = topo
            .host_ips
            .iter()
            .enumerate()
            .map(|(h, ip)| {
                let mac = [0x02, 0x52, ip[0], ip[1], ip[2], ip[3]];
                Some(Nic::new(
                    *ip,
                    mac,
                    cfg.nic,
                    cfg.seed ^ ((h as u64 + 1) << 20),
                ))
            })
            .collect();
        let rkeys = nics.iter().flatten().map(Nic::rkey).collect();
        let mut switches: Vec<Option<Switch<SimFrame>>> = topo
            .switches
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let ports = s
                    .ports
                    .iter()
                    .enumerate()
                    .map(|(p, pp)| PortSettings {
                        id: p as u16,
                        mac: [0x02, 0x53, (i >> 8) as u8, i as u8, 0, p as u8],
                        speed_bps: pp.speed_bps,
                        buf_max: pp.buf_max,
                        k_min: pp.k_min,
                        k_max: pp.k_max,
                        p_max: pp.p_max,
                        k_drop: pp.k_max,
                        ctrl_buf_max: cfg.ctrl_buf,
                        // The simulator calls dequeue exactly when the link is free:
                        // no idle credit is needed.
                        burst: 0,
                    })
                    .collect();
                let mut sw = Switch::new(&SwitchSettings {
                    switch_id: i as u16,
                    int_dscp: cfg.nic.int_dscp,
                    seed: cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64 + 1),
                    fcs_in_frame: false,
                    ports,
                    routes: s.routes.clone(),
                });
                sw.set_shared_buffer(cfg.shared_buffer.map(|(b, a)| SharedBuffer::new(b, a)));
                Some(sw)
            })
            .collect();
        let layout = std::sync::Arc::new(Layout {
            host_link,
            port_link,
            host_part: host_part.clone(),
            link_part,
            host_ips: topo.host_ips.clone(),
            rkeys,
        });
        let monitored_part: Vec<u16> = topo
            .monitored
            .iter()
            .map(|&(s, _)| sw_part[s as usize])
            .collect();
        let mut parts = Vec::new();
        for id in 0..n_parts as u16 {
            let mut q = EventQueue::with_capacity(1 << 12);
            let monitored: Vec<(u32, u16)> = topo
                .monitored
                .iter()
                .zip(&monitored_part)
                .filter(|&(_, &mp)| mp == id)
                .map(|(&m, _)| m)
                .collect();
            if cfg.sample_ns > 0 && !monitored.is_empty() {
                q.push(0, Event::Sample);
            }
            let mine_h = |h: usize| host_part[h] == id;
            parts.push(Part {
                id,
                now: 0,
                q,
                links: links
                    .iter()
                    .map(|k: &Link| Link::new(k.from, k.to, k.prop_ns))
                    .collect(),
                layout: layout.clone(),
                nics: (0..n_hosts)
                    .map(|h| if mine_h(h) { nics[h].take() } else { None })
                    .collect(),
                switches: (0..switches.len())
                    .map(|s| {
                        if sw_part[s] == id {
                            switches[s].take()
                        } else {
                            None
                        }
                    })
                    .collect(),
                host_wake: vec![u64::MAX; n_hosts],
                pool: FramePool::default(),
                setup: vec![FlowSetup::default(); flows.len()],
                end: vec![0; flows.len()],
                done: 0,
                cfg,
                monitored,
                samples: Vec::new(),
                pfc_pauses: 0,
                outbox: (0..n_parts).map(|_| Vec::new()).collect(),
                msg_seq: 0,
                inbox: (0..n_parts).map(|_| Vec::new()).collect(),
                give_back: (0..n_parts).map(|_| Vec::new()).collect(),
                taken_back: (0..n_parts).map(|_| Vec::new()).collect(),
                sorted: Vec::new(),
                msgs_in: 0,
                late_in: 0,
            });
        }
        let threads = if cfg.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cfg.threads as usize
        }
        .clamp(1, n_parts as usize);
        Ok(Self {
            coord: Coord {
                pending: flows
                    .iter()
                    .enumerate()
                    .map(|(i, f)| Reverse((f.start_ns, i as u32)))
                    .collect(),
                results: flows
                    .iter()
                    .map(|f| FlowResult {
                        start: f.start_ns,
                        ..Default::default()
                    })
                    .collect(),
                flows,
                rng: switch::Rng::new(cfg.seed ^ 0x5EED_F10E),
                cfg,
                layout,
                lookahead,
                done: 0,
                windows: 0,
                next_progress: 1 << 20,
            },
            parts,
            threads,
            end_ns: 0,
            monitored: topo.monitored.clone(),
            monitored_part,
            samples: Vec::new(),
        })
    }

    /// Flows and their results.
    pub fn flows(&self) -> (&[Flow], &[FlowResult]) {
        (&self.coord.flows, &self.coord.results)
    }

    /// Counters of switch `s`'s port `p`.
    pub fn port_counters(&self, s: u32, p: u16) -> Option<&switch::PortCounters> {
        self.parts
            .iter()
            .find_map(|x| x.switches.get(s as usize)?.as_ref())?
            .counters(p)
    }

    /// Payload bytes the receivers' transports wrote.
    pub fn delivered(&self) -> u64 {
        self.parts
            .iter()
            .flat_map(|p| p.nics.iter().flatten())
            .map(|n| n.mem.written)
            .sum()
    }

    /// Simulated time at the end of the run, ns.
    pub fn now(&self) -> u64 {
        self.end_ns
    }

    /// Flows finished.
    pub fn finished(&self) -> usize {
        self.coord.done
    }

    /// Logical partitions and the threads that run them.
    pub fn partitions(&self) -> (usize, usize) {
        (self.parts.len(), self.threads)
    }

    /// Runs until every flow finished (or `max_time_ns`); `progress` is called about
    /// every 2^20 events with (now, flows done, flows total).
    pub fn run(&mut self, mut progress: impl FnMut(u64, usize, usize)) -> RunTotals {
        let threads = self.threads;
        let parts: Vec<Mutex<Part>> = std::mem::take(&mut self.parts)
            .into_iter()
            .map(Mutex::new)
            .collect();
        let sh = Shared {
            parts: &parts,
            barrier: Barrier::new(threads),
            window_start: AtomicU64::new(0),
            window_end: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            threads,
        };
        let coord = &mut self.coord;
        let mut outcomes = Vec::new();
        std::thread::scope(|s| {
            let sh = &sh;
            let handles: Vec<_> = (1..threads)
                .map(|tid| s.spawn(move || sh.worker(tid, None)))
                .collect();
            outcomes.push(sh.worker(0, Some((coord, &mut progress))));
            for h in handles {
                outcomes.push(h.join().unwrap_or_else(|e| (None, Some(e))));
            }
        });
        self.parts = parts
            .into_iter()
            .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let mut cpu_s = Some(0.0);
        for (cpu, panic) in outcomes {
            if let Some(p) = panic {
                resume_unwind(p);
            }
            cpu_s = cpu_s.zip(cpu).map(|(a, b)| a + b);
        }
        self.finish(cpu_s, &mut progress)
    }

    /// Merges the partitions' results after the last window.
    fn finish(
        &mut self,
        cpu_s: Option<f64>,
        progress: &mut dyn FnMut(u64, usize, usize),
    ) -> RunTotals {
        let c = &mut self.coord;
        for (f, r) in c.results.iter_mut().enumerate() {
            let sp = c.layout.host_part[c.flows[f].src as usize];
            r.end = self.parts[usize::from(sp)].end[f];
        }
        c.done = self.parts.iter().map(|p| p.done).sum();
        // The run ends at the last completion, or where the partitions stopped.
        self.end_ns = if c.done == c.flows.len() {
            c.results.iter().map(|r| r.end).max().unwrap_or(0)
        } else {
            self.parts.iter().map(|p| p.now).max().unwrap_or(0)
        };
        progress(self.end_ns, c.done, c.flows.len());
        // Sample rows up to the end, in `Topology::monitored` order.
        let rows = self
            .parts
            .iter()
            .filter(|p| !p.monitored.is_empty())
            .map(|p| p.samples.len() / p.monitored.len())
            .min()
            .unwrap_or(0);
        let rows = match self.end_ns.checked_div(c.cfg.sample_ns) {
            Some(k) => rows.min(k as usize + 1),
            None => 0,
        };
        let mut col = vec![0usize; self.parts.len()];
        let index: Vec<usize> = self
            .monitored_part
            .iter()
            .map(|&mp| {
                let i = col[usize::from(mp)];
                col[usize::from(mp)] += 1;
                i
            })
            .collect();
        self.samples = Vec::with_capacity(rows * self.monitored.len());
        for r in 0..rows {
            for (m, &mp) in self.monitored_part.iter().enumerate() {
                let p = &self.parts[usize::from(mp)];
                self.samples
                    .push(p.samples[r * p.monitored.len() + index[m]]);
            }
        }
        let mut t = RunTotals {
            end_ns: self.end_ns,
            cpu_s,
            partitions: self.parts.len() as u32,
            threads: self.threads as u32,
            lookahead_ns: c.lookahead,
            windows: c.windows,
            cross_messages: self.parts.iter().map(|p| p.msgs_in).sum(),
            late_messages: self.parts.iter().map(|p| p.late_in).sum(),
            ..Default::default()
        };
        for p in &self.parts {
            p.add_totals(&mut t, self.end_ns);
        }
        t.monitored_tx_wire = self
            .monitored
            .iter()
            .map(|&(s, p)| self.port_counters(s, p).map_or(0, |c| c.tx_wire_bytes))
            .collect();
        t
    }
}
