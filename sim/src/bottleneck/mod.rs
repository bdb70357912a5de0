//! A one-bottleneck packet-level model in virtual time, to prove the congestion-control
//! algorithms of the `cc` crate in isolation (no DPDK, no clock): N senders -> one switch egress queue of rate B with
//! WRED/ECN (004 §2.1, eq. 3 for Not-ECT) and INT (qlen, txBytes, ts, B at dequeue) ->
//! receiver (per-packet ACK echoing CE and telemetry, NAK on a gap, go-back-N) -> ACK
//! back to the sender after the return propagation delay.
//!
//! It is a discrete-event simulation with one event per packet hop. It drives the same
//! [`AnyCc`] the NIC uses: one instance per flow at the sender and one at the receiver
//! (for receiver-side roles: Rx-HPCC feedback, DCQCN notification point).
//!
//! Deterministic: the only randomness is the WRED marking, drawn from a seeded
//! SplitMix64 generator.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

mod result;

pub use result::{jain, ModelResult, Sample};

use cc::{
    AckEvent, Actions, AnyCc, CcConfig, CcKind, CongestionControl, IntHop, NakEvent, PathConfig,
    RxDataEvent, SendEvent, TimerKind,
};

/// Model parameters.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// Algorithm configuration; its `path` is overwritten with the model's (line rate =
    /// `host_bps`, T = [`ModelConfig::base_rtt_ns`], MTU = `pkt_bytes`).
    pub cc: CcConfig,
    /// Number of senders.
    pub flows: usize,
    /// Bottleneck capacity B (bit/s). Default 100 Gbit/s.
    pub link_bps: u64,
    /// Sender NIC line rate (bit/s). Default = `link_bps`.
    pub host_bps: u64,
    /// Data packet size in bytes (all counted as LSN payload). Default 1000.
    pub pkt_bytes: u32,
    /// Propagation sender -> switch (ns). Default 2000.
    pub prop_up_ns: u64,
    /// Propagation switch -> receiver (ns). Default 2000.
    pub prop_down_ns: u64,
    /// Propagation receiver -> sender for ACK/NAK/CNP/probe responses (ns), not queued
    /// (high priority). Default 3840 (base RTT 8 us with 1000 B at 100G).
    pub prop_ack_ns: u64,
    /// Start time of each flow (ns); missing entries start at 0.
    pub flow_start_ns: Vec<u64>,
    /// Simulated time (ns).
    pub duration_ns: u64,
    /// WRED K_min (bytes). Default 10 kB.
    pub k_min_bytes: u64,
    /// WRED K_max (bytes). Default 60 kB.
    pub k_max_bytes: u64,
    /// WRED P_max. Default 0.2 (HPCC ns-3 `PMAX_MAP`).
    pub p_max: f64,
    /// Not-ECT packets are dropped when the queue is at or above this (004 eq. 3 `K`).
    /// Default = K_min.
    pub k_drop_bytes: u64,
    /// Buffer (bytes); everything is dropped above it. Default 2 MB.
    pub buf_bytes: u64,
    /// Attach INT to every data packet and echo it on ACKs. Default true.
    pub int_enabled: bool,
    /// Delayed ACK (004 §2.2): acknowledge every `ack_every` in-order packets (an ACK
    /// covering `n` packets drives LDCP eq. 2), but at once for a CE-marked packet
    /// (first flushing the unmarked ones). Default 1 (per-packet ACK).
    pub ack_every: u32,
    /// Delayed ACK: longest time a received packet waits for its ACK (ns). Default 2 us.
    pub ack_delay_ns: u64,
    /// Retransmission timeout (ns) for losses no NAK reports. Default 200 us.
    pub rto_ns: u64,
    /// Sampling period of the time series (ns). Default 5 us.
    pub sample_ns: u64,
    /// RNG seed for WRED.
    pub seed: u64,
    /// The switch's INT clock and txBytes counter start this close below 2^32 (ns and
    /// bytes), so that every run longer than about 0.4 ms exercises the mod-2^32
    /// wrap-around of both. Default 400 000 ns / 5 000 000 B.
    pub int_wrap_offsets: (u32, u32),
}

impl ModelConfig {
    /// Defaults for `flows` flows of `kind` (algorithm defaults, then the model's path).
    pub fn new(kind: CcKind, flows: usize) -> Self {
        let mut m = ModelConfig {
            cc: kind.default_config(PathConfig::default()),
            flows,
            link_bps: 100_000_000_000,
            host_bps: 100_000_000_000,
            pkt_bytes: 1000,
            prop_up_ns: 2_000,
            prop_down_ns: 2_000,
            prop_ack_ns: 3_840,
            flow_start_ns: Vec::new(),
            duration_ns: 2_000_000,
            k_min_bytes: 10_000,
            k_max_bytes: 60_000,
            p_max: 0.2,
            k_drop_bytes: 10_000,
            buf_bytes: 2_000_000,
            int_enabled: true,
            ack_every: 1,
            ack_delay_ns: 2_000,
            rto_ns: 200_000,
            sample_ns: 5_000,
            seed: 1,
            int_wrap_offsets: (400_000, 5_000_000),
        };
        m.cc = kind.default_config(m.path());
        m
    }

    /// Base RTT: propagation plus one serialisation at the host and at the switch.
    pub fn base_rtt_ns(&self) -> u64 {
        self.prop_up_ns
            + self.prop_down_ns
            + self.prop_ack_ns
            + ser_ns(self.pkt_bytes, self.host_bps)
            + ser_ns(self.pkt_bytes, self.link_bps)
    }

    /// The path the algorithms see.
    pub fn path(&self) -> PathConfig {
        PathConfig {
            line_rate_bps: self.host_bps,
            base_rtt_ns: self.base_rtt_ns(),
            mtu_bytes: self.pkt_bytes,
        }
    }

    /// The CC configuration with the model's path filled in.
    pub fn cc_config(&self) -> CcConfig {
        let p = self.path();
        let mut c = self.cc;
        match &mut c {
            CcConfig::None(x) => x.path = p,
            CcConfig::Dcqcn(x) => x.path = p,
            CcConfig::Hpcc(x) | CcConfig::RxHpcc(x) => x.path = p,
            CcConfig::Ldcp(x) => x.path = p,
        }
        c
    }
}

fn ser_ns(bytes: u32, bps: u64) -> u64 {
    (bytes as u64 * 8_000_000_000).div_ceil(bps.max(1))
}

#[derive(Clone, Copy, Debug)]
struct Pkt {
    flow: u32,
    lsn: u64,
    bytes: u32,
    ect: bool,
    ce: bool,
    probe: bool,
    sent_ns: u64,
    hop: IntHop,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Wake(u32),
    ArriveSwitch(Pkt),
    Departure,
    ArriveReceiver(Pkt),
    Ack {
        flow: u32,
        acked_lsn: u64,
        pkts: u32,
        ece: bool,
        sent_ns: u64,
        hop: Option<IntHop>,
        rx_window: Option<u64>,
    },
    Nak {
        flow: u32,
        expected: u64,
    },
    Cnp(u32),
    ProbeResponse {
        flow: u32,
        hop: IntHop,
    },
    Timer {
        flow: u32,
        kind: TimerKind,
    },
    AckFlush {
        flow: u32,
        generation: u64,
    },
    RtoCheck,
    Sample,
}

struct Item {
    t: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.t == o.t && self.seq == o.seq
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        // min-heap on (t, seq)
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

struct Sender {
    cc: AnyCc,
    snd_nxt: u64,
    snd_una: u64,
    max_sent: u64,
    next_tx_ns: u64,
    wake_at: Option<u64>,
    started: bool,
    last_progress_ns: u64,
}

struct Receiver {
    cc: AnyCc,
    expected: u64,
    nak_outstanding: bool,
    pending_fb: Option<u64>,
    /// Delayed ACK: in-order packets not yet acknowledged, and the newest one's data.
    unacked: u32,
    last_sent_ns: u64,
    last_hop: IntHop,
    ack_generation: u64,
}

struct Sim<'a> {
    cfg: &'a ModelConfig,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Item>,
    tx: Vec<Sender>,
    rx: Vec<Receiver>,
    queue: VecDeque<Pkt>,
    queue_bytes: u64,
    busy: bool,
    tx_bytes: u64,
    rng: u64,
    res: ModelResult,
}

/// Runs the model and returns its time series and counters.
pub fn run(cfg: &ModelConfig) -> ModelResult {
    let cc_cfg = cfg.cc_config();
    let n = cfg.flows;
    let mut sim = Sim {
        cfg,
        now: 0,
        seq: 0,
        heap: BinaryHeap::with_capacity(4 * n + 64),
        tx: (0..n)
            .map(|_| Sender {
                cc: AnyCc::new(&cc_cfg),
                snd_nxt: 0,
                snd_una: 0,
                max_sent: 0,
                next_tx_ns: 0,
                wake_at: None,
                started: false,
                last_progress_ns: 0,
            })
            .collect(),
        rx: (0..n)
            .map(|_| Receiver {
                cc: AnyCc::new(&cc_cfg),
                expected: 0,
                nak_outstanding: false,
                pending_fb: None,
                unacked: 0,
                last_sent_ns: 0,
                last_hop: IntHop::default(),
                ack_generation: 0,
            })
            .collect(),
        queue: VecDeque::new(),
        queue_bytes: 0,
        busy: false,
        tx_bytes: (u32::MAX - cfg.int_wrap_offsets.1) as u64,
        rng: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
        res: ModelResult {
            link_bps: cfg.link_bps,
            ..Default::default()
        },
    };
    for i in 0..n {
        let t = cfg.flow_start_ns.get(i).copied().unwrap_or(0);
        sim.push(t, Ev::Wake(i as u32));
        sim.tx[i].wake_at = Some(t);
    }
    sim.push(0, Ev::Sample);
    sim.push(cfg.rto_ns.max(1), Ev::RtoCheck);
    while let Some(it) = sim.heap.pop() {
        if it.t > cfg.duration_ns {
            break;
        }
        sim.now = it.t;
        sim.handle(it.ev);
    }
    sim.res
}

impl Sim<'_> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn rand(&mut self) -> f64 {
        // SplitMix64
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn apply(&mut self, flow: u32, a: &Actions) {
        for t in a.timers() {
            self.push(
                t.deadline_ns.max(self.now),
                Ev::Timer { flow, kind: t.kind },
            );
        }
        if a.send_probe {
            let s = &self.tx[flow as usize];
            let p = Pkt {
                flow,
                lsn: s.snd_nxt,
                bytes: 64,
                ect: true,
                ce: false,
                probe: true,
                sent_ns: self.now,
                hop: IntHop::default(),
            };
            let t = self.now + ser_ns(64, self.cfg.host_bps) + self.cfg.prop_up_ns;
            self.push(t, Ev::ArriveSwitch(p));
        }
    }

    fn schedule_wake(&mut self, flow: u32, t: u64) {
        let s = &mut self.tx[flow as usize];
        if s.wake_at.map_or(true, |w| t < w) {
            s.wake_at = Some(t);
            self.push(t, Ev::Wake(flow));
        }
    }

    fn try_send(&mut self, flow: u32) {
        let now = self.now;
        let pkt_bytes = self.cfg.pkt_bytes;
        let s = &mut self.tx[flow as usize];
        if !s.started {
            return;
        }
        if now < s.next_tx_ns {
            let t = s.next_tx_ns;
            self.schedule_wake(flow, t);
            return;
        }
        let inflight = s.snd_nxt - s.snd_una;
        if inflight >= s.cc.window_bytes() {
            return; // woken again by an ACK or a CC timer
        }
        let lsn = s.snd_nxt;
        let a = s.cc.on_send(&SendEvent {
            now_ns: now,
            lsn,
            bytes: pkt_bytes,
            last_of_message: false,
            retransmit: lsn < s.max_sent,
        });
        s.snd_nxt += pkt_bytes as u64;
        s.max_sent = s.max_sent.max(s.snd_nxt);
        let rate = s.cc.rate_bps().clamp(1, self.cfg.host_bps);
        let ser = ser_ns(pkt_bytes, self.cfg.host_bps);
        s.next_tx_ns = now + ser.max(ser_ns(pkt_bytes, rate));
        let next = s.next_tx_ns;
        let p = Pkt {
            flow,
            lsn,
            bytes: pkt_bytes,
            ect: !a.fast_start,
            ce: false,
            probe: false,
            sent_ns: now,
            hop: IntHop::default(),
        };
        self.push(now + ser + self.cfg.prop_up_ns, Ev::ArriveSwitch(p));
        self.apply(flow, &a);
        self.schedule_wake(flow, next);
    }

    /// Sends an ACK for everything received in order, covering `pkts` packets.
    fn send_ack(&mut self, flow: u32, pkts: u32, ece: bool, sent_ns: u64, hop: IntHop) {
        let acked = self.rx[flow as usize].expected;
        self.send_ack_at(flow, pkts, ece, sent_ns, hop, acked);
    }

    fn send_ack_at(
        &mut self,
        flow: u32,
        pkts: u32,
        ece: bool,
        sent_ns: u64,
        hop: IntHop,
        acked_lsn: u64,
    ) {
        self.res.acks += 1;
        let r = &mut self.rx[flow as usize];
        r.unacked = 0;
        r.ack_generation += 1;
        let ev = Ev::Ack {
            flow,
            acked_lsn,
            pkts,
            ece,
            sent_ns,
            hop: self.cfg.int_enabled.then_some(hop),
            rx_window: r.pending_fb.take(),
        };
        self.push(self.now + self.cfg.prop_ack_ns, ev);
    }

    fn start_service(&mut self) {
        if let Some(p) = self.queue.front() {
            self.busy = true;
            let t = self.now + ser_ns(p.bytes, self.cfg.link_bps);
            self.push(t, Ev::Departure);
        } else {
            self.busy = false;
        }
    }

    /// Handles one event at `self.now`.
    fn handle(&mut self, ev: Ev) {
        let cfg = self.cfg;
        let now = self.now;
        match ev {
            Ev::Wake(f) => self.on_wake(f),
            Ev::ArriveSwitch(p) => self.on_arrive_switch(p),
            Ev::Departure => self.on_departure(),
            Ev::ArriveReceiver(p) => self.on_arrive_receiver(p),
            Ev::AckFlush { flow, generation } => {
                let r = &self.rx[flow as usize];
                if r.ack_generation == generation && r.unacked > 0 {
                    let (n, sent, hop) = (r.unacked, r.last_sent_ns, r.last_hop);
                    self.send_ack(flow, n, false, sent, hop);
                }
            }
            Ev::Ack {
                flow,
                acked_lsn,
                pkts,
                ece,
                sent_ns,
                hop,
                rx_window,
            } => {
                let s = &mut self.tx[flow as usize];
                let newly = acked_lsn.saturating_sub(s.snd_una);
                if acked_lsn > s.snd_una {
                    s.snd_una = acked_lsn;
                    s.last_progress_ns = now;
                }
                s.snd_nxt = s.snd_nxt.max(s.snd_una);
                let tel = hop.map(|h| [h]);
                let a = s.cc.on_ack(&AckEvent {
                    now_ns: now,
                    acked_lsn,
                    acked_bytes: newly.min(u32::MAX as u64) as u32,
                    acked_pkts: pkts,
                    rtt_ns: now.saturating_sub(sent_ns),
                    ecn_echo: ece,
                    telemetry: tel.as_ref().map_or(&[], |t| &t[..]),
                    rx_window,
                });
                self.apply(flow, &a);
                self.try_send(flow);
            }
            Ev::Nak { flow, expected } => {
                let s = &mut self.tx[flow as usize];
                if expected >= s.snd_una && expected < s.snd_nxt {
                    s.snd_una = expected;
                    s.snd_nxt = expected; // go-back-N
                    s.last_progress_ns = now;
                }
                let a = s.cc.on_nak(&NakEvent {
                    now_ns: now,
                    expected_lsn: expected,
                });
                self.apply(flow, &a);
                self.try_send(flow);
            }
            Ev::Cnp(flow) => {
                let a = self.tx[flow as usize].cc.on_cnp(now);
                self.apply(flow, &a);
                self.try_send(flow);
            }
            Ev::ProbeResponse { flow, hop } => {
                let a = self.tx[flow as usize].cc.on_probe_response(now, &[hop]);
                self.apply(flow, &a);
                self.try_send(flow);
            }
            Ev::Timer { flow, kind } => {
                let a = self.tx[flow as usize].cc.on_timer(now, kind);
                self.apply(flow, &a);
                self.try_send(flow);
            }
            Ev::RtoCheck => self.on_rto_check(),
            Ev::Sample => {
                let s = Sample {
                    t_ns: now,
                    qlen_bytes: self.queue_bytes,
                    delivered: self.rx.iter().map(|r| r.expected).collect(),
                    window: self.tx.iter().map(|s| s.cc.window_bytes()).collect(),
                    rate_bps: self.tx.iter().map(|s| s.cc.rate_bps()).collect(),
                };
                self.res.samples.push(s);
                self.push(now + cfg.sample_ns.max(1), Ev::Sample);
            }
        }
    }

    /// A sender's wake-up (its start, or its pacing): it sends what it may.
    fn on_wake(&mut self, f: u32) {
        let now = self.now;
        let s = &mut self.tx[f as usize];
        if s.wake_at != Some(now) {
            return; // superseded
        }
        s.wake_at = None;
        if !s.started {
            s.started = true;
            s.last_progress_ns = now;
        }
        self.try_send(f);
    }

    /// A packet reaches the switch: tail drop (or Not-ECT drop at K), WRED/ECN marking,
    /// then the egress queue.
    fn on_arrive_switch(&mut self, mut p: Pkt) {
        let cfg = self.cfg;
        let q = self.queue_bytes;
        if q + p.bytes as u64 > cfg.buf_bytes || (!p.ect && q >= cfg.k_drop_bytes) {
            self.res.drops += 1;
            return;
        }
        if p.ect && !p.probe {
            let prob = if q < cfg.k_min_bytes {
                0.0
            } else if q < cfg.k_max_bytes {
                (q - cfg.k_min_bytes) as f64 / (cfg.k_max_bytes - cfg.k_min_bytes) as f64
                    * cfg.p_max
            } else {
                1.0
            };
            if prob > 0.0 && self.rand() < prob {
                p.ce = true;
                self.res.marks += 1;
            }
        }
        self.queue_bytes += p.bytes as u64;
        self.res.max_qlen_bytes = self.res.max_qlen_bytes.max(self.queue_bytes);
        self.queue.push_back(p);
        if !self.busy {
            self.start_service();
        }
    }

    /// The head of the egress queue leaves at the bottleneck rate, with its INT hop
    /// record.
    fn on_departure(&mut self) {
        let cfg = self.cfg;
        let now = self.now;
        let Some(mut p) = self.queue.pop_front() else {
            self.busy = false;
            return;
        };
        self.queue_bytes -= p.bytes as u64;
        self.tx_bytes += p.bytes as u64;
        if cfg.int_enabled || p.probe {
            p.hop = IntHop {
                switch_id: 1,
                port_id: 1,
                ts_ns: (now as u32).wrapping_add(u32::MAX - cfg.int_wrap_offsets.0),
                tx_bytes: self.tx_bytes as u32,
                qlen_bytes: self.queue_bytes.min(u32::MAX as u64) as u32,
                link_bps: cfg.link_bps,
            };
        }
        self.push(now + cfg.prop_down_ns, Ev::ArriveReceiver(p));
        self.start_service();
    }

    /// A packet reaches the receiver: its CC's receiver side, then an ACK (per packet,
    /// coalesced, or at once with ECE), a NAK on a gap, or a probe response.
    fn on_arrive_receiver(&mut self, p: Pkt) {
        let cfg = self.cfg;
        let now = self.now;
        let back = now + cfg.prop_ack_ns;
        if p.probe {
            self.push(
                back,
                Ev::ProbeResponse {
                    flow: p.flow,
                    hop: p.hop,
                },
            );
            return;
        }
        let r = &mut self.rx[p.flow as usize];
        let tel = [p.hop];
        let a = r.cc.on_rx_data(&RxDataEvent {
            now_ns: now,
            lsn: p.lsn,
            bytes: p.bytes,
            ce: p.ce,
            telemetry: if cfg.int_enabled { &tel } else { &[] },
        });
        if a.feedback_window.is_some() {
            r.pending_fb = a.feedback_window;
        }
        if a.send_cnp {
            self.push(back, Ev::Cnp(p.flow));
        }
        let r = &mut self.rx[p.flow as usize];
        let fresh = p.lsn == r.expected;
        if fresh {
            r.expected += p.bytes as u64;
            r.nak_outstanding = false;
        } else if p.lsn > r.expected {
            if !r.nak_outstanding {
                r.nak_outstanding = true;
                let expected = r.expected;
                self.push(
                    back,
                    Ev::Nak {
                        flow: p.flow,
                        expected,
                    },
                );
            }
            return;
        }
        if cfg.ack_every <= 1 || !fresh {
            // per-packet ACK, or a duplicate: acknowledge at once
            self.send_ack(p.flow, 1, p.ce, p.sent_ns, p.hop);
            return;
        }
        let r = &mut self.rx[p.flow as usize];
        if p.ce {
            // ECE at once (004 §2.2); unmarked packets before it get their own ACK
            if r.unacked > 0 {
                let (n, sent, hop) = (r.unacked, r.last_sent_ns, r.last_hop);
                let before = r.expected - p.bytes as u64;
                self.send_ack_at(p.flow, n, false, sent, hop, before);
            }
            self.send_ack(p.flow, 1, true, p.sent_ns, p.hop);
            return;
        }
        r.unacked += 1;
        r.last_sent_ns = p.sent_ns;
        r.last_hop = p.hop;
        if r.unacked >= cfg.ack_every {
            let n = r.unacked;
            self.send_ack(p.flow, n, false, p.sent_ns, p.hop);
        } else if r.unacked == 1 {
            r.ack_generation += 1;
            let generation = r.ack_generation;
            self.push(
                now + cfg.ack_delay_ns,
                Ev::AckFlush {
                    flow: p.flow,
                    generation,
                },
            );
        }
    }

    /// The retransmit check: a sender without progress for an RTO goes back N.
    fn on_rto_check(&mut self) {
        let cfg = self.cfg;
        let now = self.now;
        for f in 0..self.tx.len() {
            let s = &mut self.tx[f];
            if s.snd_nxt > s.snd_una && now - s.last_progress_ns >= cfg.rto_ns {
                s.snd_nxt = s.snd_una; // go-back-N from the oldest unacked byte
                s.last_progress_ns = now;
                self.rx[f].nak_outstanding = false;
                let a = s.cc.on_rto(now);
                self.apply(f as u32, &a);
                self.try_send(f as u32);
            }
        }
        self.push(now + cfg.rto_ns.max(1) / 2, Ev::RtoCheck);
    }
}
