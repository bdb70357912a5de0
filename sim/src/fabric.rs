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
use std::panic::resume_unwind;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Barrier, Mutex};

use switch::{PortSettings, SharedBuffer, Switch, SwitchSettings};

use crate::event::{Event, EventQueue};
use crate::frame::SimFrame;
use crate::nic::{Nic, NicConfig};
use crate::topo::{End, Topology};
use crate::workload::Flow;

mod part;
mod window;

use part::{own, FlowSetup, Layout, Link, Part, PartParts};

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
    /// QPs still open at the end (0 once every flow has completed).
    pub qps_open_at_end: u64,
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
        check_flows(topo, &flows)?;
        let n_hosts = topo.hosts() as usize;
        let n_parts = if cfg.partitions == 0 {
            topo.auto_partitions()
        } else {
            cfg.partitions
        };
        let (host_part, sw_part) = topo.partition(n_parts)?;
        let w = Wiring::of(topo, &host_part, &sw_part, n_parts)?;
        let mut nics = nics(topo, &cfg);
        let mut switches = switches(topo, &cfg);
        let layout = std::sync::Arc::new(Layout {
            host_link: w.host_link,
            port_link: w.port_link,
            host_part: host_part.clone(),
            link_part: w.link_part,
            host_ips: topo.host_ips.clone(),
            rkeys: nics.iter().flatten().map(Nic::rkey).collect(),
        });
        let monitored_part: Vec<u16> = topo
            .monitored
            .iter()
            .map(|&(s, _)| sw_part[s as usize])
            .collect();
        let mut parts = Vec::new();
        for id in 0..n_parts as u16 {
            let monitored: Vec<(u32, u16)> = topo
                .monitored
                .iter()
                .zip(&monitored_part)
                .filter(|&(_, &mp)| mp == id)
                .map(|(&m, _)| m)
                .collect();
            let mut q = EventQueue::with_capacity(1 << 12);
            if cfg.sample_ns > 0 && !monitored.is_empty() {
                q.push(0, Event::Sample);
            }
            let nics = (0..n_hosts)
                .map(|h| (host_part[h] == id).then(|| nics[h].take()).flatten())
                .collect();
            let switches = (0..switches.len())
                .map(|s| (sw_part[s] == id).then(|| switches[s].take()).flatten())
                .collect();
            parts.push(Part::new(PartParts {
                id,
                n_parts,
                q,
                links: &w.links,
                layout: layout.clone(),
                nics,
                switches,
                n_flows: flows.len(),
                cfg,
                monitored,
            }));
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
                lookahead: w.lookahead,
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

/// Checks that every flow joins two different hosts of the topology and that event
/// ids can name every flow.
fn check_flows(topo: &Topology, flows: &[Flow]) -> Result<(), String> {
    let n_hosts = topo.hosts() as usize;
    for f in flows {
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
    Ok(())
}

/// The links of a topology, one per direction, and where each end is.
struct Wiring {
    links: Vec<Link>,
    /// Partition of each link's sending and receiving end.
    link_part: Vec<(u16, u16)>,
    /// Egress link of each host.
    host_link: Vec<u32>,
    /// Egress link of each switch port.
    port_link: Vec<Vec<u32>>,
    /// The window: the smallest propagation delay of a link between partitions.
    lookahead: u64,
}

impl Wiring {
    /// Both directions of every link of `topo`, with hosts and switches in the
    /// partitions `host_part` and `sw_part`.
    fn of(
        topo: &Topology,
        host_part: &[u16],
        sw_part: &[u16],
        n_parts: u32,
    ) -> Result<Wiring, String> {
        let part_of = |e: End| match e {
            End::Host(h) => host_part[h as usize],
            End::Switch(s, _) => sw_part[s as usize],
        };
        let mut w = Wiring {
            links: Vec::new(),
            link_part: Vec::new(),
            host_link: vec![u32::MAX; topo.hosts() as usize],
            port_link: topo
                .switches
                .iter()
                .map(|s| vec![u32::MAX; s.ports.len()])
                .collect(),
            lookahead: u64::MAX,
        };
        for l in &topo.links {
            for (from, to) in [(l.a, l.b), (l.b, l.a)] {
                let id = w.links.len() as u32;
                match from {
                    End::Host(h) => w.host_link[h as usize] = id,
                    End::Switch(s, p) => w.port_link[s as usize][p as usize] = id,
                }
                if part_of(from) != part_of(to) {
                    w.lookahead = w.lookahead.min(l.prop_ns);
                }
                w.link_part.push((part_of(from), part_of(to)));
                w.links.push(Link::new(from, to, l.prop_ns));
            }
        }
        if w.host_link.contains(&u32::MAX) {
            return Err("a host has no link".into());
        }
        if w.lookahead == 0 {
            return Err(format!(
                "{n_parts} partitions need links between them with a propagation delay (--partitions 1)"
            ));
        }
        // One partition: no messages, so any window is correct; a window only paces
        // flow set-up and the end-of-run check, and a long one costs no barriers.
        if w.lookahead == u64::MAX {
            w.lookahead = 100_000;
        }
        Ok(w)
    }
}

/// One NIC per host of `topo`, its initial PSNs varied by the run's seed.
fn nics(topo: &Topology, cfg: &RunConfig) -> Vec<Option<Nic>> {
    topo.host_ips
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
        .collect()
}

/// One switch core per switch of `topo`, with its ports, routes and shared buffer.
fn switches(topo: &Topology, cfg: &RunConfig) -> Vec<Option<Switch<SimFrame>>> {
    topo.switches
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
        .collect()
}
