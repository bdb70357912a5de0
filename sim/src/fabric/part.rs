//! One logical partition of the fabric (see [`super`]): its event queue, NICs,
//! switches, frame pool and its ends of the links, the handlers of its events, PFC on
//! its links, and the messages it exchanges with the other partitions at a barrier.

use std::collections::VecDeque;

use switch::{PacketBuf, Switch};

use super::{RunConfig, RunTotals};
use crate::event::{Event, EventQueue};
use crate::frame::{FramePool, SimFrame};
use crate::nic::{Nic, Tx};
use crate::topo::End;

/// One direction of a link. The sending end's partition owns `tx_pending`, `paused*`
/// and `sources`; the receiving end's owns `inflight`, `ingress_bytes` and
/// `pause_sent` (every partition holds a copy of every link and uses its ends).
pub(super) struct Link {
    pub(super) from: End,
    pub(super) to: End,
    pub(super) prop_ns: u64,
    /// Frames in flight with their arrival times (FIFO: a link never reorders).
    pub(super) inflight: VecDeque<(u64, SimFrame)>,
    /// For a switch egress port: a PortTx event is pending.
    pub(super) tx_pending: bool,
    /// PFC: the far end paused this link's sender (since `paused_at`).
    pub(super) paused: bool,
    pub(super) paused_at: u64,
    /// PFC: time this link's sender spent paused, ns.
    pub(super) pause_ns: u64,
    /// PFC, links into a switch: data bytes from this link queued in the switch.
    pub(super) ingress_bytes: u64,
    /// PFC, links into a switch: a PAUSE was sent upstream and not yet resumed.
    pub(super) pause_sent: bool,
    /// PFC, switch egress links: (ingress link, bytes) of each queued data frame.
    pub(super) sources: VecDeque<(u32, u32)>,
}

impl Link {
    pub(super) fn new(from: End, to: End, prop_ns: u64) -> Self {
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

/// Where things are: read-only maps every partition shares.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// Egress link of each host.
    pub(super) host_link: Vec<u32>,
    /// Egress link of each switch port.
    pub(super) port_link: Vec<Vec<u32>>,
    /// Partition of each host.
    pub(super) host_part: Vec<u16>,
    /// Partition of each link's sending and receiving end.
    pub(super) link_part: Vec<(u16, u16)>,
    pub(super) host_ips: Vec<[u8; 4]>,
    /// The remote key of each host's region.
    pub(super) rkeys: Vec<u32>,
}

/// A flow's connection, chosen between windows and read by both ends' partitions.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FlowSetup {
    pub(super) src: u32,
    pub(super) dst: u32,
    pub(super) bytes: u64,
    pub(super) sq: u32,
    pub(super) spsn: u32,
    pub(super) rq: u32,
    pub(super) rpsn: u32,
    pub(super) sport: u16,
}

/// What one partition tells another at the next barrier.
pub(super) enum MsgKind {
    /// A frame reaches the far end of link `id` at the message's time.
    Frame(SimFrame),
    /// A PFC PAUSE reaches the sending end of link `id`.
    Pause,
    /// A PFC resume reaches the sending end of link `id`.
    Resume,
    /// The flow finished: close the responder QP `id` names on host `host`.
    Close { host: u32 },
}

pub(super) struct Msg {
    pub(super) at: u64,
    pub(super) id: u32,
    /// The sender's sequence number (the sending partition is fixed per kind and id).
    pub(super) seq: u64,
    pub(super) kind: MsgKind,
}

impl Msg {
    pub(super) fn key(&self) -> (u64, u8, u32, u64) {
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
pub(super) fn own<T>(v: &mut [Option<T>], i: usize) -> &mut T {
    v[i].as_mut().expect("an element of this partition")
}

/// One logical partition: its event queue, NICs, switches, frame pool and link ends.
pub(super) struct Part {
    pub(super) id: u16,
    pub(super) now: u64,
    pub(super) q: EventQueue,
    pub(super) links: Vec<Link>,
    pub(super) layout: std::sync::Arc<Layout>,
    pub(super) nics: Vec<Option<Nic>>,
    pub(super) switches: Vec<Option<Switch<SimFrame>>>,
    pub(super) host_wake: Vec<u64>,
    pub(super) pool: FramePool,
    /// Connections of the flows with an end here (written between windows).
    pub(super) setup: Vec<FlowSetup>,
    /// Completion time of the flows sent from here (0: not yet).
    pub(super) end: Vec<u64>,
    pub(super) done: usize,
    pub(super) cfg: RunConfig,
    /// Monitored ports of this partition, in `Topology::monitored` order.
    pub(super) monitored: Vec<(u32, u16)>,
    /// Queue samples of `monitored`, one row per sample time.
    pub(super) samples: Vec<u32>,
    pub(super) pfc_pauses: u64,
    /// Messages for each partition, sent at the next barrier.
    pub(super) outbox: Vec<Vec<Msg>>,
    pub(super) msg_seq: u64,
    /// Messages from each partition, delivered at the start of the next window.
    pub(super) inbox: Vec<Vec<Msg>>,
    /// Buffers of frames copied out of `inbox`, for the pool of each sender.
    pub(super) give_back: Vec<Vec<SimFrame>>,
    /// Buffers each partition gave back, for this pool.
    pub(super) taken_back: Vec<Vec<SimFrame>>,
    /// All of `inbox` in delivery order (kept for its capacity).
    pub(super) sorted: Vec<(u16, Msg)>,
    /// Messages delivered here, and those of them that arrived late.
    pub(super) msgs_in: u64,
    pub(super) late_in: u64,
}

/// What a partition is built from.
pub(super) struct PartParts<'a> {
    pub(super) id: u16,
    pub(super) n_parts: u32,
    /// Its event queue (with the first queue sample, if it samples).
    pub(super) q: EventQueue,
    /// Every link (the partition keeps its own copy of each).
    pub(super) links: &'a [Link],
    pub(super) layout: std::sync::Arc<Layout>,
    /// Its NICs and switches (`None` for another partition's).
    pub(super) nics: Vec<Option<Nic>>,
    pub(super) switches: Vec<Option<Switch<SimFrame>>>,
    pub(super) n_flows: usize,
    pub(super) cfg: RunConfig,
    /// Its monitored ports, in `Topology::monitored` order.
    pub(super) monitored: Vec<(u32, u16)>,
}

impl Part {
    /// A partition at time 0 with nothing in flight.
    pub(super) fn new(p: PartParts<'_>) -> Self {
        let n_hosts = p.nics.len();
        let n_parts = p.n_parts as usize;
        Part {
            id: p.id,
            now: 0,
            q: p.q,
            links: p
                .links
                .iter()
                .map(|k| Link::new(k.from, k.to, k.prop_ns))
                .collect(),
            layout: p.layout,
            nics: p.nics,
            switches: p.switches,
            host_wake: vec![u64::MAX; n_hosts],
            pool: FramePool::default(),
            setup: vec![FlowSetup::default(); p.n_flows],
            end: vec![0; p.n_flows],
            done: 0,
            cfg: p.cfg,
            monitored: p.monitored,
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
        }
    }

    /// Delivers the messages of the last window at the start of the window that
    /// starts at `start`, in the order of [`Msg::key`]: the frames into copies from
    /// this partition's pool (their buffers go back to their senders), PFC frames and
    /// QP closes into the queue and the NICs. Takes back the buffers other partitions
    /// returned.
    pub(super) fn deliver(&mut self, start: u64) {
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
    pub(super) fn run_until(&mut self, limit: u64) {
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

    pub(super) fn send_msg(&mut self, to: u16, at: u64, id: u32, kind: MsgKind) {
        let seq = self.msg_seq;
        self.msg_seq += 1;
        self.outbox[usize::from(to)].push(Msg { at, id, seq, kind });
    }

    /// Puts `f` on link `l`, arriving at `at`.
    pub(super) fn put_on_link(&mut self, l: usize, at: u64, f: SimFrame) {
        let to = self.layout.link_part[l].1;
        if to == self.id {
            self.links[l].inflight.push_back((at, f));
            self.q.push(at, Event::LinkArrive(l as u32));
        } else {
            self.send_msg(to, at, l as u32, MsgKind::Frame(f));
        }
    }

    /// A PFC PAUSE (or resume) for link `l`'s sender, arriving at `at`.
    pub(super) fn pfc_signal(&mut self, l: usize, at: u64, pause: bool) {
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

    pub(super) fn sample(&mut self) {
        for &(s, p) in &self.monitored {
            let sw = self.switches[s as usize].as_ref();
            let b = sw.and_then(|sw| sw.queue_bytes(p)).unwrap_or(0);
            self.samples.push(b.min(u64::from(u32::MAX)) as u32);
        }
        // The coordinator keeps the rows up to the run's end.
        self.q.push(self.now + self.cfg.sample_ns, Event::Sample);
    }

    pub(super) fn link_arrive(&mut self, l: usize) {
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
    pub(super) fn pfc_enqueued(&mut self, inl: usize, out: usize, len: u32) {
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
    pub(super) fn pfc_dequeued(&mut self, out: usize) {
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

    pub(super) fn pfc_resume(&mut self, l: usize) {
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
    pub(super) fn kick_port(&mut self, s: u32, p: u16, out: usize) {
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

    pub(super) fn port_tx(&mut self, l: usize) {
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
    pub(super) fn flow_accept(&mut self, f: usize) {
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
    pub(super) fn flow_start(&mut self, f: usize) {
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
    pub(super) fn after_nic(&mut self, h: usize) {
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

    pub(super) fn want_wake(&mut self, h: usize, t: u64) {
        if t < self.host_wake[h] {
            self.host_wake[h] = t;
            self.q.push(t, Event::HostWake(h as u32));
        }
    }

    pub(super) fn host_wake(&mut self, h: usize) {
        if self.host_wake[h] != self.now {
            return; // superseded by an earlier wake-up that already ran
        }
        self.host_wake[h] = u64::MAX;
        own(&mut self.nics, h).timers(self.now);
        self.after_nic(h);
    }

    pub(super) fn host_tx(&mut self, h: usize) {
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
    pub(super) fn add_totals(&self, t: &mut RunTotals, end_ns: u64) {
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
            t.qps_open_at_end += n.open_qps() as u64;
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
