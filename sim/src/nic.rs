//! A simulated host NIC: the NIC engine's per-QP core (`qpcore::QpCore`, docs/design.md
//! "The per-QP core") over the same pure parts the engine runs — `rdma::transport::Qp`
//! for reliability, one `cc::AnyCc` per QP, `sched::scheduler::Scheduler` for
//! control-first round robin with pacing credit, `sched::timer_wheel::TimerWheel` for
//! the retransmit and CC timers — with simulated time passed in and frames handed to
//! the fabric instead of a DPDK port.
//!
//! What this file adds is the simulator's own: a table of QPs whose QPNs carry a
//! generation (a late frame never reaches the QP that reuses a slot), flows that post
//! WRITEs and complete, frames built headers-only into the fabric's buffers, the
//! timer hint the fabric wakes the NIC for, and the counters of the report. The
//! engine's DPDK parts (mbufs, rings, doorbells, CQ rings, slow path) have no
//! counterpart: work is posted directly.

use cc::{CcKind, PathConfig};
use qpcore::gbn_backoff::GoBackNBackoff;
use qpcore::{qp_cc, Completions, FrameSink, QpCore};
use rdma::transport::{
    Access, LossRecovery, MrTable, Qp, QpConfig, QpState, SendOp, SendWr, Sge, SrParams, TxPacket,
    WcStatus, WorkCompletion,
};
use rdma::wire::frame::{IntInsert, NetHeaders};
use rdma::wire::{parse_frame, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, ParseOptions};
use sched::scheduler::{Decision, Scheduler};
use sched::timer_wheel::{TimerKey, TimerKind as WheelKind, TimerWheel};
use switch::{wire_bytes, Shaper};

use crate::frame::{FramePool, NullMemory, SimFrame};

/// Hop records a data packet's INT container has room for (the engine's `MAX_HOPS`).
pub const INT_MAX_HOPS: usize = qp_cc::MAX_HOPS;
/// First QPN (0 and 1 are special in the IBA), as in the engine.
const QPN_BASE: u32 = 0x11;
/// QP slot index bits of a QPN; the bits above carry the slot's generation so that a
/// late frame for a closed QP never reaches the QP that reuses its slot.
const SLOT_BITS: u32 = 12;
/// Most QPs (requester and responder) a simulated NIC holds at once.
pub const MAX_QPS: u32 = 1 << SLOT_BITS;
/// Base of the single registered region every NIC exposes to its peers.
const MR_BASE: u64 = 0x1000;
/// Length of that region: larger than any flow.
const MR_LEN: u64 = 1 << 40;

/// Per-NIC settings.
#[derive(Debug, Clone, Copy)]
pub struct NicConfig {
    /// Line rate as the CC and pacer know it, bit/s.
    pub line_rate_bps: u64,
    /// Rate of the host's link, bit/s (the NIC serialises frames at it).
    pub link_bps: u64,
    /// The CCs' base RTT T, ns.
    pub base_rtt_ns: u64,
    /// RoCE path MTU (256..4096).
    pub mtu: u32,
    /// Congestion control of every QP.
    pub cc: CcKind,
    /// DSCP announcing an INT container.
    pub int_dscp: u8,
    /// Retransmit timeout, ns.
    pub timeout_ns: u64,
    /// Bytes a QP without CC sends per visit of the flow scheduler's round
    /// robin (`sched::Scheduler::with_quantum`; QPs under CC always send one
    /// packet per visit, the HPCC++ prototype's scheduler, 002 §7.2): 0 is one
    /// packet, as the paper's simulator; [`sched::scheduler::NIC_QUANTUM_BYTES`]
    /// is what the DPDK NIC uses.
    pub sched_quantum: u32,
    /// Loss recovery of every QP (`rdma::transport::sack`): selective repeat
    /// gets IRN's parameters for this path ([`SR_MIN_RTO_NS`]), and no
    /// go-back-N backoff.
    pub loss_recovery: LossRecovery,
}

/// The shortest selective-repeat timeout in the simulator: IRN's RTO_low
/// (100 us; RTO_high at least 3x), whatever the base RTT.
pub const SR_MIN_RTO_NS: u64 = 100_000;

/// NIC counters (summed over hosts in the report).
#[derive(Debug, Clone, Copy, Default)]
pub struct NicCounters {
    /// Frames sent.
    pub tx_frames: u64,
    /// Data frames retransmitted (go-back-N or timeout).
    pub retransmits: u64,
    /// Retransmit timeouts.
    pub timeouts: u64,
    /// CNPs sent.
    pub tx_cnps: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Frames for no open QP (late duplicates after a flow closed), or unparsable.
    pub rx_dropped: u64,
    /// Flows that could not open a QP (all slots busy): counted, started later.
    pub qp_exhausted: u64,
    /// Completions with an error status.
    pub completion_errors: u64,
    /// Packets whose frame could not be built (never expected; the transport goes on
    /// as if sent, and retransmits).
    pub tx_build_errors: u64,
}

/// A requester QP's flow: bytes to write as messages of at most `msg` bytes, with at
/// most the send-queue depth of them outstanding.
#[derive(Debug, Clone, Copy)]
struct FlowWork {
    flow: u32,
    rkey: u32,
    to_post: u64,
    outstanding: u32,
    msg: u32,
}

/// One QP: the engine's per-QP core and the flow it writes, if it is a requester.
struct QpSlot {
    core: QpCore,
    work: Option<FlowWork>,
}

/// What [`Nic::transmit`] produced.
pub enum Tx {
    /// A frame to put on the link, with its wire size (preamble, IFG, FCS included).
    Frame(SimFrame, u64),
    /// Nothing to send now; the scheduler's pacing wake-up, if any.
    Idle(Option<u64>),
}

/// One simulated NIC.
pub struct Nic {
    ip: [u8; 4],
    mac: [u8; 6],
    cfg: NicConfig,
    path: PathConfig,
    slots: Vec<Option<Box<QpSlot>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    sched: Scheduler<u32>,
    wheel: TimerWheel<TimerKey>,
    /// Never later than the wheel's next deadline (lowered when a timer is armed,
    /// recomputed after timers fire): what the fabric wakes the NIC for, without a
    /// scan of the wheel per packet.
    timer_hint: u64,
    mrs: MrTable,
    rkey: u32,
    lkey: u32,
    psn_seed: u64,
    /// Serialisation on the host's link.
    pub shaper: Shaper,
    /// Counters.
    pub counters: NicCounters,
    /// Flows whose last message completed: `(flow, time)`, taken by the fabric.
    pub finished: Vec<(u32, u64)>,
    /// The registered memory (counts the bytes written into it).
    pub mem: NullMemory,
}

impl Nic {
    /// A NIC with address `ip`/`mac`; `seed` varies its initial PSNs.
    pub fn new(ip: [u8; 4], mac: [u8; 6], cfg: NicConfig, seed: u64) -> Self {
        let mut mrs = MrTable::new();
        let mr = mrs
            .register(
                MR_BASE,
                MR_LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .expect("an empty table registers");
        let path = PathConfig {
            line_rate_bps: cfg.line_rate_bps,
            base_rtt_ns: cfg.base_rtt_ns,
            mtu_bytes: cfg.mtu,
        };
        Self {
            ip,
            mac,
            cfg,
            path,
            slots: (0..MAX_QPS).map(|_| None).collect(),
            gens: vec![0; MAX_QPS as usize],
            free: (0..MAX_QPS).rev().collect(),
            sched: Scheduler::new(MAX_QPS, qpcore::PACING_BURST_BYTES, MAX_QPS as usize)
                .with_quantum(cfg.sched_quantum),
            wheel: TimerWheel::new(
                qpcore::TIMER_TICK_NS,
                qpcore::TIMER_SLOTS,
                qpcore::TIMERS_PER_QP * MAX_QPS as usize,
            ),
            timer_hint: u64::MAX,
            rkey: mr.rkey,
            lkey: mr.lkey,
            mrs,
            psn_seed: seed | 1,
            shaper: Shaper::new(cfg.link_bps, 0),
            counters: NicCounters::default(),
            finished: Vec::new(),
            mem: NullMemory::default(),
        }
    }

    /// The remote key peers write to.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// QPs open.
    pub fn open_qps(&self) -> usize {
        MAX_QPS as usize - self.free.len()
    }

    fn next_psn(&mut self) -> u32 {
        let mut x = self.psn_seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.psn_seed = x;
        (x as u32) & 0xFF_FFFF
    }

    /// The slot of QP `qpn` from [`Self::open_qp`] (a QPN that names one).
    fn slot_index(qpn: u32) -> usize {
        (qpn.wrapping_sub(QPN_BASE) & (MAX_QPS - 1)) as usize
    }

    fn slot_of(&self, qpn: u32) -> Option<usize> {
        let i = (qpn.checked_sub(QPN_BASE)? & (MAX_QPS - 1)) as usize;
        let s = self.slots.get(i)?.as_ref()?;
        (s.core.qp.as_ref()?.config().qpn == qpn).then_some(i)
    }

    /// Opens a QP: `(qpn, initial psn)`, or `None` when every slot is busy.
    pub fn open_qp(&mut self) -> Option<(u32, u32)> {
        let Some(i) = self.free.pop() else {
            self.counters.qp_exhausted += 1;
            return None;
        };
        self.gens[i as usize] = self.gens[i as usize].wrapping_add(1);
        let qpn = (QPN_BASE + i + (self.gens[i as usize] << SLOT_BITS)) & 0xFF_FFFF;
        Some((qpn, self.next_psn()))
    }

    /// Gives back QP `qpn` from [`Self::open_qp`] that was never connected (the
    /// other end of its flow had no QP free); its slot is reused by a later QP
    /// with another generation.
    pub fn give_back_unconnected_qp(&mut self, qpn: u32) {
        let i = Self::slot_index(qpn);
        if self.slots[i].is_none() {
            self.free.push(i as u32);
        }
    }

    /// Connects QP `qpn` (from [`Self::open_qp`]) to its peer and moves it to RTS.
    /// `sport` is the UDP source port (the ECMP entropy), `sq_depth` its send queue.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        qpn: u32,
        psn: u32,
        remote_qpn: u32,
        remote_psn: u32,
        remote_ip: [u8; 4],
        sport: u16,
        sq_depth: u16,
        now: u64,
    ) -> Result<(), String> {
        let i = Self::slot_index(qpn);
        let cc = self.cfg.cc.build(self.path);
        let cc_ext = self.cfg.cc.uses_extensions();
        let qcfg = QpConfig {
            qpn,
            dest_qpn: remote_qpn,
            pmtu: self.cfg.mtu,
            sq_depth: sq_depth.max(1),
            rq_depth: 4,
            max_rd_atomic: 4,
            timeout_ns: self.cfg.timeout_ns,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            sq_psn: psn,
            rq_psn: remote_psn,
            cc_ext,
            ack_read_responses: self.cfg.cc == CcKind::Ldcp,
            ack_events_without_progress: self.cfg.cc.counts_acks(),
            pd: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            srq: false,
            loss_recovery: self.cfg.loss_recovery,
            ..QpConfig::default()
        };
        let mut qp = Qp::new(qcfg).map_err(|e| e.to_string())?;
        let sr = self.cfg.loss_recovery == LossRecovery::Sr;
        if sr {
            let c = &self.cfg;
            let p = SrParams::for_path(c.line_rate_bps, c.base_rtt_ns, c.mtu, SR_MIN_RTO_NS);
            qp.set_sr_params(p).map_err(|e| e.to_string())?;
        }
        for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
            qp.modify(st).map_err(|e| e.to_string())?;
        }
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress(self.mac),
                dst_mac: EthernetAddress([0; 6]),
                src_ip: Ipv4Address(self.ip),
                dst_ip: Ipv4Address(remote_ip),
                udp_src_port: sport,
                dscp: qpcore::ROCE_DSCP,
                ttl: 64,
            },
            int: cc.int_on_data().then_some(IntInsert {
                int_dscp: self.cfg.int_dscp,
                max_hops: INT_MAX_HOPS as u8,
            }),
        };
        let probe_int = IntInsert {
            int_dscp: self.cfg.int_dscp,
            max_hops: INT_MAX_HOPS as u8,
        };
        let mut core = QpCore::new(cc, fb, probe_int, cc_ext, self.cfg.mtu);
        core.qp = Some(qp);
        core.backoff =
            (self.cfg.cc == CcKind::None && !sr).then(|| GoBackNBackoff::new(self.cfg.mtu));
        core.update_window();
        let s = Box::new(QpSlot { core, work: None });
        self.slots[i] = Some(s);
        let _ = self.sched.reset_qp(i as u32, now);
        // As the NIC: only a QP without CC takes the quantum.
        let _ = self
            .sched
            .set_uses_quantum(i as u32, self.cfg.cc == CcKind::None);
        Ok(())
    }

    /// Gives QP `qpn` a flow to write: `bytes` to the peer's region (`rkey`) as
    /// messages of at most `msg` bytes.
    pub fn start_flow(&mut self, qpn: u32, flow: u32, bytes: u64, msg: u32, rkey: u32, now: u64) {
        let Some(i) = self.slot_of(qpn) else { return };
        if let Some(s) = self.slots[i].as_mut() {
            s.work = Some(FlowWork {
                flow,
                rkey,
                to_post: bytes.max(1),
                outstanding: 0,
                msg: msg.max(1),
            });
        }
        self.post(i);
        self.after_qp_work(i, now);
    }

    /// Closes QP `qpn` (its slot is reused by a later QP with another generation).
    pub fn close_qp(&mut self, qpn: u32) {
        if let Some(i) = self.slot_of(qpn) {
            self.slots[i] = None;
            let _ = self.sched.mark_idle(i as u32);
            self.free.push(i as u32);
        }
    }

    fn post(&mut self, i: usize) {
        let lkey = self.lkey;
        let Some(s) = self.slots[i].as_mut() else {
            return;
        };
        let Some(w) = s.work.as_mut() else { return };
        let Some(qp) = s.core.qp.as_mut() else { return };
        let depth = u32::from(qp.config().sq_depth);
        while w.to_post > 0 && w.outstanding < depth {
            let len = w.to_post.min(u64::from(w.msg)) as u32;
            let wr = SendWr {
                wr_id: u64::from(w.flow),
                op: SendOp::Write {
                    remote_va: MR_BASE,
                    rkey: w.rkey,
                },
                sge: Sge {
                    addr: MR_BASE,
                    len,
                    lkey,
                },
                signaled: true,
                solicited: false,
            };
            if qp.post_send(wr, &self.mrs).is_err() {
                break;
            }
            w.to_post -= u64::from(len);
            w.outstanding += 1;
        }
    }

    /// Handles a frame the link delivered at `now`.
    pub fn receive(&mut self, bytes: &[u8], now: u64) {
        self.counters.rx_frames += 1;
        let opts = ParseOptions {
            int_dscp: Some(self.cfg.int_dscp),
            // Frames are never corrupted in the simulator: the ICRC (computed by the
            // sender's frame builder) is not checked again.
            verify_icrc: false,
        };
        let slots = &self.slots;
        let f = match parse_frame(bytes, &opts, |bth| {
            bth.dest_qp
                .checked_sub(QPN_BASE)
                .and_then(|i| slots.get((i & (MAX_QPS - 1)) as usize))
                .and_then(Option::as_ref)
                .is_some_and(|s| s.core.cc_ext)
        }) {
            Ok(f) => f,
            Err(_) => {
                self.counters.rx_dropped += 1;
                return;
            }
        };
        let Some(i) = self.slot_of(f.bth.dest_qp) else {
            self.counters.rx_dropped += 1;
            return;
        };
        let s = self.slots[i].as_mut().expect("slot_of checked it");
        s.core.receive(&f, now, &mut self.mrs, &mut self.mem);
        self.after_qp_work(i, now);
    }

    /// QP events into its CC, completions into the flow, the QP back to the wheel and
    /// the scheduler (the engine's `after_qp_work`, on the same core).
    fn after_qp_work(&mut self, i: usize, now: u64) {
        let Some(s) = self.slots[i].as_mut() else {
            return;
        };
        self.counters.timeouts += u64::from(s.core.feed_events(now).timeouts);
        let mut flows = FlowCompletions {
            work: s.work.as_mut(),
            counters: &mut self.counters,
            finished: &mut self.finished,
            now,
            repost: false,
        };
        s.core.move_completions(&mut flows);
        if flows.repost {
            self.post(i);
        }
        let key = self.timer_key(i);
        let Some(s) = self.slots[i].as_mut() else {
            return;
        };
        let armed = s.core.requeue(&mut self.sched, &mut self.wheel, key, now);
        self.timer_hint = self.timer_hint.min(armed);
    }

    /// The key of slot `i`'s timers, with its generation (a timer of a closed QP
    /// never reaches the QP that reuses the slot).
    fn timer_key(&self, i: usize) -> TimerKey {
        TimerKey {
            qp: i as u32,
            kind: WheelKind::Retransmit,
            gen: self.gens[i],
        }
    }

    /// Fires the timers due at `now`. Before the timer hint nothing can be due, and
    /// the wheel is left alone (most wake-ups are a frame's end of serialisation).
    pub fn timers(&mut self, now: u64) {
        if now < self.timer_hint {
            return;
        }
        self.wheel.expire(now);
        while let Some(key) = self.wheel.pop_ready() {
            let i = key.qp as usize;
            if self.gens.get(i) != Some(&key.gen) {
                continue;
            }
            let Some(s) = self.slots[i].as_mut() else {
                continue;
            };
            s.core.on_timer(key.kind, now);
            self.after_qp_work(i, now);
        }
        self.timer_hint = self.wheel.next_deadline().unwrap_or(u64::MAX);
    }

    /// A control packet (ACK, NAK, CNP, probe response) waits to be sent.
    pub fn control_pending(&self) -> bool {
        self.sched.control_len() > 0
    }

    /// The earliest time a timer may be due (never later than the real one), if any.
    pub fn next_timer(&self) -> Option<u64> {
        (self.timer_hint != u64::MAX).then_some(self.timer_hint)
    }

    /// The next frame the scheduler lets out at `now` (control first, then round robin
    /// with pacing credit and the CC window), built into a buffer from `pool`.
    pub fn transmit(&mut self, now: u64, pool: &mut FramePool) -> Tx {
        loop {
            match self.sched.next(now) {
                Decision::Idle { wake_at } => return Tx::Idle(wake_at),
                Decision::Control(q) => {
                    if let Some(f) = self.send_control(q as usize, now, pool) {
                        return f;
                    }
                }
                Decision::Qp { qp, .. } => {
                    if let Some(f) = self.send_data(qp as usize, now, pool) {
                        return f;
                    }
                }
            }
        }
    }

    fn send_control(&mut self, i: usize, now: u64, pool: &mut FramePool) -> Option<Tx> {
        let s = self.slots[i].as_mut()?;
        let mut out = SimFrames {
            pool,
            mem: &self.mem,
            counters: &mut self.counters,
            frame: None,
        };
        s.core
            .send_control(&mut self.sched, i as u32, now, &mut out);
        out.frame.map(|(f, wire)| Tx::Frame(f, wire))
    }

    fn send_data(&mut self, i: usize, now: u64, pool: &mut FramePool) -> Option<Tx> {
        let key = self.timer_key(i);
        let Some(s) = self.slots[i].as_mut() else {
            let _ = self.sched.mark_idle(i as u32);
            return None;
        };
        let mut out = SimFrames {
            pool,
            mem: &self.mem,
            counters: &mut self.counters,
            frame: None,
        };
        let armed = s
            .core
            .send_data(&mut self.sched, &mut self.wheel, key, now, &mut out);
        let frame = out.frame.take();
        self.timer_hint = self.timer_hint.min(armed);
        frame.map(|(f, wire)| Tx::Frame(f, wire))
    }
}

/// Where a simulated NIC's completions go: the flow of the QP (one WRITE fewer
/// outstanding, the flow finished with its last one) and the error counter.
struct FlowCompletions<'a> {
    work: Option<&'a mut FlowWork>,
    counters: &'a mut NicCounters,
    finished: &'a mut Vec<(u32, u64)>,
    now: u64,
    /// A WRITE completed: the flow may post more.
    repost: bool,
}

impl Completions for FlowCompletions<'_> {
    fn has_room(&self) -> bool {
        true
    }

    fn complete(&mut self, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.counters.completion_errors += 1;
        }
        if let Some(w) = self.work.as_deref_mut() {
            w.outstanding = w.outstanding.saturating_sub(1);
            self.repost = true;
            if w.to_post == 0 && w.outstanding == 0 {
                self.finished.push((w.flow, self.now));
            }
        }
    }
}

/// Where a simulated NIC's frames go: one buffer from the fabric's pool, built
/// headers-only for a packet with payload (see [`emit_headers_only`]), counted.
struct SimFrames<'a> {
    pool: &'a mut FramePool,
    mem: &'a NullMemory,
    counters: &'a mut NicCounters,
    /// The frame built, with its wire size.
    frame: Option<(SimFrame, u64)>,
}

impl FrameSink for SimFrames<'_> {
    /// Builds `pkt` into a buffer from the pool. A packet with payload gets only its
    /// headers written (IPv4 and UDP lengths, BTH pad count for the whole frame): the
    /// payload is [`NullMemory`]'s zeros that no receiver reads, so its bytes and the
    /// ICRC are left unwritten (see [`SimFrame`]); header-only packets are built whole.
    fn emit(&mut self, fb: &FrameBuilder, pkt: &TxPacket, _gather: &[Sge]) -> Option<u32> {
        if pkt.repr.bth.opcode == Opcode::Cnp {
            self.counters.tx_cnps += 1;
        } else if pkt.retransmit && qpcore::is_data(pkt) {
            self.counters.retransmits += 1;
        }
        let mut f = self.pool.get();
        let built = if pkt.payload.is_empty() {
            pkt.build_frame(fb, self.mem, f.build_area())
                .map(|n| (n, n))
        } else {
            emit_headers_only(fb, pkt, f.build_area())
        };
        match built {
            Ok((n, written)) => {
                f.set_built(n, written);
                self.counters.tx_frames += 1;
                let wire = wire_bytes(n, false);
                self.frame = Some((f, wire));
                Some(wire as u32)
            }
            Err(_) => {
                self.counters.tx_build_errors += 1;
                self.pool.put(f);
                None
            }
        }
    }
}

/// Writes `pkt`'s headers for its whole frame into `buf` and returns the frame length
/// (headers, payload, pad, ICRC) once the buffer is checked to span it, and the
/// length of the headers written; the bytes after the headers are not written.
fn emit_headers_only(
    fb: &FrameBuilder,
    pkt: &TxPacket,
    buf: &mut [u8],
) -> Result<(usize, usize), rdma::wire::WireError> {
    let l = fb.emit_headers(&pkt.repr, pkt.payload.len() as usize, pkt.ecn, buf)?;
    if buf.len() < l.frame_len {
        return Err(rdma::wire::WireError::BufferTooSmall {
            what: "RoCEv2 frame",
            need: l.frame_len,
            have: buf.len(),
        });
    }
    Ok((l.frame_len, l.len))
}
