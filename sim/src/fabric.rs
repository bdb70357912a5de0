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

use std::collections::VecDeque;

use switch::{PacketBuf, PortSettings, SharedBuffer, Switch, SwitchSettings};

use crate::event::{Event, EventQueue};
use crate::frame::{FramePool, SimFrame};
use crate::nic::{Nic, NicConfig, Tx};
use crate::topo::{End, Topology};
use crate::workload::Flow;

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
}

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
}

/// The simulator: build it with [`Sim::new`], then [`Sim::run`].
pub struct Sim {
    now: u64,
    q: EventQueue,
    links: Vec<Link>,
    /// Egress link of each host.
    host_link: Vec<u32>,
    /// Egress link of each switch port.
    port_link: Vec<Vec<u32>>,
    nics: Vec<Nic>,
    switches: Vec<Switch<SimFrame>>,
    host_wake: Vec<u64>,
    pool: FramePool,
    flows: Vec<Flow>,
    results: Vec<FlowResult>,
    done: usize,
    started: usize,
    cfg: RunConfig,
    monitored: Vec<(u32, u16)>,
    /// Queue samples (bytes) of the monitored ports.
    pub samples: Vec<u32>,
    rng: switch::Rng,
    pfc_pauses: u64,
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
        let mut links = Vec::new();
        let mut host_link = vec![u32::MAX; n_hosts];
        let mut port_link: Vec<Vec<u32>> = topo
            .switches
            .iter()
            .map(|s| vec![u32::MAX; s.ports.len()])
            .collect();
        for l in &topo.links {
            for (from, to) in [(l.a, l.b), (l.b, l.a)] {
                let id = links.len() as u32;
                match from {
                    End::Host(h) => host_link[h as usize] = id,
                    End::Switch(s, p) => port_link[s as usize][p as usize] = id,
                }
                links.push(Link {
                    from,
                    to,
                    prop_ns: l.prop_ns,
                    inflight: VecDeque::new(),
                    tx_pending: false,
                    paused: false,
                    paused_at: 0,
                    pause_ns: 0,
                    ingress_bytes: 0,
                    pause_sent: false,
                    sources: VecDeque::new(),
                });
            }
        }
        if host_link.contains(&u32::MAX) {
            return Err("a host has no link".into());
        }
        let nics = topo
            .host_ips
            .iter()
            .enumerate()
            .map(|(h, ip)| {
                let mac = [0x02, 0x52, ip[0], ip[1], ip[2], ip[3]];
                Nic::new(*ip, mac, cfg.nic, cfg.seed ^ ((h as u64 + 1) << 20))
            })
            .collect();
        let switches = topo
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
                sw
            })
            .collect();
        let mut q = EventQueue::with_capacity(1 << 16);
        for (i, f) in flows.iter().enumerate() {
            q.push(f.start_ns, Event::FlowStart(i as u32));
        }
        if cfg.sample_ns > 0 {
            q.push(0, Event::Sample);
        }
        Ok(Self {
            now: 0,
            q,
            links,
            host_link,
            port_link,
            nics,
            switches,
            host_wake: vec![u64::MAX; n_hosts],
            pool: FramePool::default(),
            results: flows
                .iter()
                .map(|f| FlowResult {
                    start: f.start_ns,
                    ..Default::default()
                })
                .collect(),
            flows,
            done: 0,
            started: 0,
            cfg,
            monitored: topo.monitored.clone(),
            samples: Vec::new(),
            rng: switch::Rng::new(cfg.seed ^ 0x5EED_F10E),
            pfc_pauses: 0,
        })
    }

    /// Flows and their results.
    pub fn flows(&self) -> (&[Flow], &[FlowResult]) {
        (&self.flows, &self.results)
    }

    /// Counters of switch `s`'s port `p`.
    pub fn port_counters(&self, s: u32, p: u16) -> Option<&switch::PortCounters> {
        self.switches.get(s as usize)?.counters(p)
    }

    /// Payload bytes the receivers' transports wrote.
    pub fn delivered(&self) -> u64 {
        self.nics.iter().map(|n| n.mem.written).sum()
    }

    /// Simulated time, ns.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Flows finished.
    pub fn finished(&self) -> usize {
        self.done
    }

    /// Runs until every flow finished (or `max_time_ns`); `progress` is called every
    /// 2^20 events with (now, flows done, flows total).
    pub fn run(&mut self, mut progress: impl FnMut(u64, usize, usize)) -> RunTotals {
        let total = self.flows.len();
        let mut n: u64 = 0;
        while self.done < total {
            let Some((t, ev)) = self.q.pop() else { break };
            if t > self.cfg.max_time_ns {
                break;
            }
            self.now = t;
            n += 1;
            if n & 0xF_FFFF == 0 {
                progress(t, self.done, total);
            }
            match ev {
                Event::LinkArrive(l) => self.link_arrive(l as usize),
                Event::PortTx(l) => self.port_tx(l as usize),
                Event::HostWake(h) => self.host_wake(h as usize),
                Event::FlowStart(f) => self.flow_start(f as usize),
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
        progress(self.now, self.done, total);
        self.totals()
    }

    fn totals(&self) -> RunTotals {
        let mut t = RunTotals {
            events: self.q.popped(),
            end_ns: self.now,
            frame_buffers: self.pool.allocated() as u64,
            ..Default::default()
        };
        for sw in &self.switches {
            for p in sw.port_ids() {
                let c = sw.counters(p).expect("own port");
                t.switch_drops += c.drops();
                t.tail_drops += c.tail_drops;
                t.ce_marks += c.ce_marked;
                t.int_pushed += c.int_pushed;
            }
        }
        for n in &self.nics {
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
        t.pfc_pause_ns = self
            .links
            .iter()
            .map(|k| k.pause_ns + if k.paused { self.now - k.paused_at } else { 0 })
            .sum();
        t.pfc_pauses = self.pfc_pauses;
        t.monitored_tx_wire = self
            .monitored
            .iter()
            .map(|&(s, p)| {
                self.switches[s as usize]
                    .counters(p)
                    .map_or(0, |c| c.tx_wire_bytes)
            })
            .collect();
        t
    }

    fn sample(&mut self) {
        for &(s, p) in &self.monitored {
            let b = self.switches[s as usize].queue_bytes(p).unwrap_or(0);
            self.samples.push(b.min(u64::from(u32::MAX)) as u32);
        }
        if self.done < self.flows.len() {
            self.q.push(self.now + self.cfg.sample_ns, Event::Sample);
        }
    }

    fn link_arrive(&mut self, l: usize) {
        let Some((_, frame)) = self.links[l].inflight.pop_front() else {
            return;
        };
        match self.links[l].to {
            End::Host(h) => {
                let h = h as usize;
                self.nics[h].receive(frame.bytes(), self.now);
                self.pool.put(frame);
                self.after_nic(h);
            }
            End::Switch(s, p) => {
                let len = frame.len() as u32;
                match self.switches[s as usize].receive(p, frame, self.now) {
                    Ok(e) => {
                        let out = self.port_link[s as usize][usize::from(e.port)] as usize;
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
            self.q
                .push(self.now + k.prop_ns, Event::PfcPause(inl as u32));
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
            self.q.push(self.now + k.prop_ns, Event::PfcResume(inl));
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
        let sw = &self.switches[s as usize];
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
        let sw = &mut self.switches[s as usize];
        let (_, ctrl) = sw.class_bytes(p).unwrap_or((0, 0));
        if self.links[l].paused && ctrl == 0 {
            // PFC: only the control class may go; the resume kicks the port again.
            return;
        }
        if let Some(f) = sw.dequeue(p, self.now) {
            let end = sw.port_free_at(p).unwrap_or(self.now);
            let at = end + self.links[l].prop_ns;
            self.links[l].inflight.push_back((at, f));
            self.q.push(at, Event::LinkArrive(l as u32));
            if ctrl == 0 {
                // Strict priority: with no control frame queued, that was data.
                self.pfc_dequeued(l);
            }
        }
        let sw = &self.switches[s as usize];
        if let Some(next) = sw.next_departure(p) {
            self.links[l].tx_pending = true;
            self.q.push(next.max(self.now), Event::PortTx(l as u32));
        }
    }

    fn flow_start(&mut self, f: usize) {
        let Flow {
            src, dst, bytes, ..
        } = self.flows[f];
        let (s, d) = (src as usize, dst as usize);
        let (Some((rq, rpsn)), Some((sq, spsn))) = (
            self.nics[d].open_qp(),
            if self.nics[s].open_qps() < crate::nic::MAX_QPS as usize {
                self.nics[s].open_qp()
            } else {
                None
            },
        ) else {
            // No QP free at one end: try again in 10 us (counted).
            self.q.push(self.now + 10_000, Event::FlowStart(f as u32));
            return;
        };
        // The UDP source port is the ECMP key: random per flow, in RoCEv2's range.
        let sport = 0xC000 | (self.rng.next_u32() as u16 & 0x3FFF);
        let (sip, dip) = (self.nics[s].ip(), self.nics[d].ip());
        let now = self.now;
        let depth = self.cfg.outstanding;
        let ok = self.nics[d]
            .connect(rq, rpsn, sq, spsn, sip, sport, depth, now)
            .and_then(|()| self.nics[s].connect(sq, spsn, rq, rpsn, dip, sport, depth, now));
        if let Err(e) = ok {
            // Never expected (valid MTU and depths were checked when the run was set up).
            panic!("connecting flow {f}: {e}");
        }
        self.results[f].sqpn = sq;
        self.results[f].rqpn = rq;
        self.results[f].start = now;
        self.started += 1;
        let rkey = self.nics[d].rkey();
        self.nics[s].start_flow(sq, f as u32, bytes, self.cfg.msg_bytes, rkey, now);
        self.after_nic(s);
    }

    /// After a NIC worked: close finished flows, transmit, and ask for a wake-up.
    fn after_nic(&mut self, h: usize) {
        while let Some((f, t)) = self.nics[h].finished.pop() {
            let f = f as usize;
            if self.results[f].end == 0 {
                self.results[f].end = t.max(1);
                self.done += 1;
                let (sq, rq) = (self.results[f].sqpn, self.results[f].rqpn);
                let dst = self.flows[f].dst as usize;
                self.nics[h].close_qp(sq);
                self.nics[dst].close_qp(rq);
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
        self.nics[h].timers(self.now);
        self.after_nic(h);
    }

    fn host_tx(&mut self, h: usize) {
        let now = self.now;
        let free = self.nics[h].shaper.next_free();
        let mut wake = self.nics[h].next_timer();
        let paused = self.links[self.host_link[h] as usize].paused;
        if free > now {
            wake = Some(wake.map_or(free, |w| w.min(free)));
        } else if paused && !self.nics[h].control_pending() {
            // PFC: data waits for the resume, which calls this again.
        } else {
            match self.nics[h].transmit(now, &mut self.pool) {
                Tx::Frame(f, wire) => {
                    let end = self.nics[h].shaper.send(now, wire);
                    let l = self.host_link[h] as usize;
                    let at = end + self.links[l].prop_ns;
                    self.links[l].inflight.push_back((at, f));
                    self.q.push(at, Event::LinkArrive(l as u32));
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
}
