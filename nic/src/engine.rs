//! The poll-mode engine: one loop that owns a port, the QPs, their
//! congestion control and the registered memory (DESIGN.md §5; HPCC++ 000
//! §6.3.1 fig. 7: RX pipeline, TX pipeline, flow scheduler, CC module).
//!
//! Each turn of the loop reads the clock once and then
//! 1. takes doorbells (posted work requests) from the QPs that rang,
//! 2. receives a burst: parse (INT skipped, ICRC checked), dispatch to the
//!    QP's responder or requester, feed the CC (receiver side: CE marks,
//!    telemetry; sender side: ACKs, NAKs, CNPs, timeouts), move completions
//!    to the completion queues,
//! 3. fires due timers (transport retransmit/RNR, CC timers),
//! 4. transmits a burst: ACK/NAK/CNP first, then round robin over QPs with
//!    something to send, each paced at its CC rate and gated by its CC
//!    window in LSN bytes,
//!
//! and every 256 turns serves the slow path (registration, QP creation and
//! connection) and publishes the counters. Nothing on the per-packet path
//! allocates, locks or makes a system call.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cc::{
    AckEvent, AnyCc, CcKind, CongestionControl, IntHop, NakEvent, PathConfig, RxDataEvent,
    SendEvent, TimerKind,
};
use crossbeam_channel::{Receiver, Sender};
use crossbeam_queue::ArrayQueue;
use dpdk::{
    Burst, Eal, ExtBuf, Mempool, Port, RingConsumer, RingProducer, RxQueue, TscClock, TxQueue,
};
use rdma::transport::qp::{Payload as QpPayload, QpEvent};
use rdma::transport::{
    Access, MemorySpace, MrTable, Qp, QpConfig, QpError, QpState, RecvWr, SendWr, TxPacket,
    WcOpcode, WcStatus, WorkCompletion,
};
use rdma::wire::frame::{FrameBuilder, IntInsert, NetHeaders, RoceRepr};
use rdma::wire::int::HopRecord;
use rdma::wire::transport_hdrs::{AethSyndrome, NakCode};
use rdma::wire::{
    bth, BthRepr, Ecn, EthernetAddress, HeaderTemplate, Ipv4Address, Opcode, ParseOptions,
    WireError,
};

use crate::counters::{Counters, SharedCounters};
use crate::io::{build_frame, build_frame_tpl, parse_rx, Payload, TxPools, MAX_FRAME};
use crate::pcapng::CaptureProducer;
use crate::scheduler::{Decision, Scheduler};
use crate::timer_wheel::{TimerHandle, TimerKey, TimerKind as WheelKind, TimerWheel};
use crate::verbs::{stopping, DeviceConfig, QpOptions, RemoteQp, VerbsError};

/// QP numbers start here (0 and 1 are special in the IBA).
pub const QPN_BASE: u32 = 0x11;
/// Most QPs one device holds (DESIGN.md §5: the scheduler and the timers
/// are O(1) per decision at this many).
pub const MAX_QPS: usize = 16384;
/// Timer wheel of the transport and CC timers: 1 us ticks, 4096 slots (one
/// rotation is 4 ms; the 67 ms retransmit timer waits in the overflow list).
const TIMER_TICK_NS: u64 = 1_000;
const TIMER_SLOTS: usize = 4096;
/// Timers per QP on the wheel: the transport's (retransmit or RNR) and the
/// four CC timers.
const TIMERS_PER_QP: usize = 5;
/// Token-bucket depth of the pacer: a QP paced below line rate may send at
/// most this many bytes back to back after being idle. Deep enough that a
/// poll turn of ~5 us does not cap a QP paced at 100 Gbit/s (with 16 KiB,
/// DCQCN at line rate got 17 Gbit/s on a ring pair, 23 with 64 KiB).
const PACING_BURST_BYTES: u32 = 64 << 10;
/// Idle poll turns (no packet in or out, no doorbell) before an engine with
/// `DeviceConfig::idle_yield` yields its core once.
const IDLE_TURNS_BEFORE_YIELD: u32 = 64;
/// The IP MTU the engine asks of its port: jumbo, room for a 4 KiB RoCE MTU
/// with INT and extension headers.
const PORT_MTU: u16 = 9000;
/// Ethernet preamble, inter-frame gap and FCS: what the wire adds to a frame.
const WIRE_OVERHEAD: u64 = 24;
/// Most hop records taken from one packet's INT container.
pub(crate) const MAX_HOPS: usize = 8;
/// DSCP of RoCEv2 data and control traffic.
const ROCE_DSCP: u8 = 26;
/// Bytes of each frame kept by the optional capture (every header, the
/// start of the payload).
pub const CAPTURE_SNAP: usize = 512;
/// Capture interface ids: received and sent frames.
const CAPTURE_RX: u32 = 0;
const CAPTURE_TX: u32 = 1;

/// A posted work request on its way to the engine.
#[derive(Debug, Clone, Copy)]
pub enum Doorbell {
    /// `post_send`.
    Send(SendWr),
    /// `post_recv`.
    Recv(RecvWr),
}

type Reply<T> = Sender<Result<T, String>>;

/// Slow-path requests.
pub enum Command {
    /// Register memory.
    RegMr {
        /// Its protection domain.
        pd: u32,
        /// The memory.
        mem: Arc<ExtBuf>,
        /// Access flags.
        access: Access,
        /// (lkey, rkey).
        reply: Reply<(u32, u32)>,
    },
    /// Deregister memory.
    DeregMr {
        /// Its key.
        lkey: u32,
        /// Done.
        reply: Reply<()>,
    },
    /// Create a completion queue around a ring.
    CreateCq {
        /// Producer end of its ring.
        ring: rtrb::Producer<WorkCompletion>,
        /// CQ id.
        reply: Reply<u32>,
    },
    /// Create a QP.
    CreateQp {
        /// Its protection domain.
        pd: u32,
        /// Send CQ id.
        send_cq: u32,
        /// Receive CQ id.
        recv_cq: u32,
        /// Options.
        opts: QpOptions,
        /// Consumer end of its doorbell ring.
        ring: rtrb::Consumer<Doorbell>,
        /// (QPN, initial PSN).
        reply: Reply<(u32, u32)>,
    },
    /// Connect a QP to its peer (INIT -> RTR -> RTS).
    Connect {
        /// Local QPN.
        qpn: u32,
        /// The peer.
        remote: RemoteQp,
        /// Done.
        reply: Reply<()>,
    },
    /// Query a QP's state.
    QueryQp {
        /// QPN.
        qpn: u32,
        /// Its state.
        reply: Reply<QpState>,
    },
    /// Describe a QP's transport, scheduler and timer state in one line of
    /// text (like `rdma resource show qp -d`; for diagnosing a stall).
    DescribeQp {
        /// QPN.
        qpn: u32,
        /// The description.
        reply: Reply<String>,
    },
}

/// What the engine shares with the API handles.
pub struct EngineShared {
    pub(crate) stop: AtomicBool,
    /// Set once the engine has been dropped (engines run by [`run_group`]).
    pub(crate) done: AtomicBool,
    pub(crate) counters: SharedCounters,
    doorbells: ArrayQueue<u32>,
    rung: Vec<AtomicBool>,
    /// The engine's first QPN (each shard of a device has its own range).
    qpn_base: u32,
}

impl EngineShared {
    pub(crate) fn new(max_qps: usize, qpn_base: u32) -> Self {
        EngineShared {
            qpn_base,
            stop: AtomicBool::new(false),
            done: AtomicBool::new(false),
            counters: SharedCounters::default(),
            doorbells: ArrayQueue::new(max_qps),
            rung: (0..max_qps).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Tells the engine that QP `qpn` has new work (each QP is queued at
    /// most once until the engine takes it, so the queue never overflows).
    pub(crate) fn ring_doorbell(&self, qpn: u32) {
        let i = qpn.wrapping_sub(self.qpn_base) as usize;
        if let Some(flag) = self.rung.get(i) {
            if !flag.swap(true, std::sync::atomic::Ordering::AcqRel) {
                let _ = self.doorbells.push(qpn);
            }
        }
    }

    /// The engine's half of [`Self::ring_doorbell`]: the next QP index with
    /// new work, its flag cleared so that the next post rings again.
    ///
    /// The flag is cleared with an RMW, not a store: a plain release store
    /// may sit in the store buffer while the engine then reads the QP's ring
    /// (x86 lets a later load pass an earlier store); a poster whose
    /// `swap(true)` still saw `true` would skip queuing the QP, and its work
    /// request would wait for the next doorbell, forever for the last one
    /// (this stalled `tests/engine.rs` at "255/256" about once in twenty
    /// runs). With RMWs on both sides, whichever comes second in the flag's
    /// order reads from the other, so the poster's ring push is visible to
    /// the engine's read of the ring.
    pub(crate) fn take_rung(&self) -> Option<usize> {
        let qpn = self.doorbells.pop()?;
        let i = (qpn - self.qpn_base) as usize;
        self.rung[i].swap(false, std::sync::atomic::Ordering::AcqRel);
        Some(i)
    }
}

/// Where an engine's frames come from and go to: a port's queues, or, for
/// one shard of a sharded device, the rings to and from the device's
/// dispatcher (crate::shard; DESIGN.md §5 "QPs sharded").
pub(crate) enum PacketIo {
    /// The port's RX and TX queue (an unsharded device).
    Port {
        /// RX queue.
        rx: RxQueue,
        /// TX queue.
        tx: TxQueue,
    },
    /// A shard: frames for its QPs from the dispatcher, frames to send back.
    Shard {
        /// Frames steered to this shard.
        rx: RingConsumer,
        /// Frames for the dispatcher to send.
        tx: RingProducer,
    },
}

impl PacketIo {
    #[inline]
    fn recv(&mut self, b: &mut Burst) -> usize {
        match self {
            PacketIo::Port { rx, .. } => rx.recv(b),
            PacketIo::Shard { rx, .. } => rx.dequeue(b),
        }
    }

    #[inline]
    fn send(&mut self, b: &mut Burst) -> usize {
        match self {
            PacketIo::Port { tx, .. } => tx.send(b),
            PacketIo::Shard { tx, .. } => tx.enqueue(b),
        }
    }
}

/// Registered memory seen as the process's address space: a region's
/// virtual address is its pointer. The transport only copies in or out of a
/// range after an [`MrTable`] check accepted it, and the engine keeps every
/// registered region alive, so each access lies in live memory (the same
/// contract a NIC's DMA engine has). The program may touch these bytes from
/// its own thread, so no reference to them is ever formed: copies go through
/// raw pointers only (DESIGN.md §5).
struct RawMemory;

impl MemorySpace for RawMemory {
    fn copy_out(&self, va: u64, dst: &mut [u8]) {
        if dst.is_empty() {
            return;
        }
        // SAFETY: see the type's docs; `dst` is ours and cannot overlap a region.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, dst.as_mut_ptr(), dst.len()) }
    }

    fn copy_in(&mut self, va: u64, src: &[u8]) {
        if src.is_empty() {
            return;
        }
        // SAFETY: see the type's docs.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), va as *mut u8, src.len()) }
    }
}

/// One QP's engine-side state.
struct QpSlot {
    opts: QpOptions,
    /// Its protection domain (0: the device's default one).
    pd: u32,
    send_cq: u32,
    recv_cq: u32,
    doorbell: rtrb::Consumer<Doorbell>,
    psn: u32,
    qp: Option<Qp>,
    cc: AnyCc,
    fb: FrameBuilder,
    /// The QP's header template (DESIGN.md §3, §9): built at connect time from `fb`
    /// and the peer's QPN; data packets (and ACKs, CNPs on the same headers) are
    /// built through it. None until connected.
    tpl: Option<HeaderTemplate>,
    int_on_data: bool,
    cc_ext: bool,
    /// Doorbells wait because the send queue was full.
    doorbell_blocked: bool,
    /// The QP index is in the scheduler's control ring.
    ctrl_queued: bool,
    /// The rate the scheduler paces the QP at (the CC's last rate).
    sched_rate: u64,
    /// Wire bytes of the QP's next data packet, as the pacer charges it
    /// (the last data packet's size).
    next_bytes: u32,
    /// The transport timer on the wheel and the deadline it is armed for.
    transport_timer: Option<(TimerHandle, u64)>,
    /// The CC timers on the wheel, by [`timer_index`].
    cc_armed: [Option<(TimerHandle, u64)>; 4],
    /// One RTT measurement at a time: (LSN end of the timed packet, sent at).
    rtt_probe: Option<(u32, u64)>,
    /// Deadlines of the CC timers, by [`timer_index`] (0 = not armed).
    cc_timers: [u64; 4],
    /// A CNP is owed to the peer (DCQCN notification point).
    cnp_pending: bool,
    /// The QP holds completions its full CQ could not take; it is in the
    /// engine's `cq_waiting` list.
    cq_waiting: bool,
}

fn timer_index(k: TimerKind) -> usize {
    match k {
        TimerKind::LdcpTick => 0,
        TimerKind::DcqcnAlpha => 1,
        TimerKind::DcqcnRateIncrease => 2,
        TimerKind::ProbeTimeout => 3,
    }
}

const TIMER_KINDS: [TimerKind; 4] = [
    TimerKind::LdcpTick,
    TimerKind::DcqcnAlpha,
    TimerKind::DcqcnRateIncrease,
    TimerKind::ProbeTimeout,
];

/// The wheel's name for each CC timer, by [`timer_index`].
const WHEEL_KINDS: [WheelKind; 4] = [
    WheelKind::LdcpTick,
    WheelKind::DcqcnAlpha,
    WheelKind::DcqcnRateIncrease,
    WheelKind::HpccProbe,
];

/// Makes sure one timer fires no later than `want`; O(1). Lazily: a timer
/// armed earlier than wanted is left alone (the retransmit deadline moves
/// later on every ACK), and one no longer wanted is left to fire; the
/// handler ([`Engine::timers`]) acts only on what is really due and re-arms
/// for the real deadline. So the wheel is touched about once per timeout,
/// not once per packet. (This variant was once suspected of stalling a QP;
/// the stall was a lost doorbell, see [`EngineShared::take_rung`].)
#[inline]
fn arm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    want: Option<u64>,
    key: TimerKey,
) {
    // `armed` is Some exactly while its entry is on the wheel: the handler
    // clears it when the entry fires, and nothing cancels one (so no wheel
    // lookup, a likely cache miss, on this per-packet path).
    match (*armed, want) {
        (Some((_, at)), Some(w)) if at <= w => {}
        (_, None) => {}
        (cur, Some(w)) => rearm(wheel, armed, cur, w, key),
    }
}

/// The rare half of [`arm`]: a deadline earlier than the armed one, or none
/// armed.
#[cold]
fn rearm(
    wheel: &mut TimerWheel<TimerKey>,
    armed: &mut Option<(TimerHandle, u64)>,
    cur: Option<(TimerHandle, u64)>,
    want: u64,
    key: TimerKey,
) {
    *armed = match cur {
        Some((h, _)) if wheel.reschedule(h, want).is_ok() => Some((h, want)),
        _ => wheel.schedule(want, key).ok().map(|h| (h, want)),
    };
}

/// Puts a QP's timers on the wheel where their deadlines changed: the
/// transport's next timer (retransmit or RNR) and each armed CC timer.
fn sync_timers(wheel: &mut TimerWheel<TimerKey>, i: usize, s: &mut QpSlot) {
    let key = |kind| TimerKey {
        qp: i as u32,
        kind,
        gen: 0,
    };
    let want = s.qp.as_ref().and_then(Qp::next_timer);
    arm(
        wheel,
        &mut s.transport_timer,
        want,
        key(WheelKind::Retransmit),
    );
    for ((armed, &d), &kind) in s.cc_armed.iter_mut().zip(&s.cc_timers).zip(&WHEEL_KINDS) {
        arm(wheel, armed, (d != 0).then_some(d), key(kind));
    }
}

/// Moves QP `s`'s completions into its CQs while both have room; whether
/// none is left in the QP.
fn move_completions(
    cqs: &mut [rtrb::Producer<WorkCompletion>],
    counters: &mut Counters,
    s: &mut QpSlot,
) -> bool {
    let Some(qp) = s.qp.as_mut() else {
        return true;
    };
    loop {
        let room = |c: u32| cqs.get(c as usize).is_some_and(|r| r.slots() > 0);
        if !(room(s.send_cq) && room(s.recv_cq)) {
            return qp.pending_completions() == 0;
        }
        let Some(wc) = qp.poll_cq() else { return true };
        if wc.status != WcStatus::Success {
            counters.completion_errors += 1;
        }
        let cq = if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            s.recv_cq
        } else {
            s.send_cq
        };
        let _ = cqs[cq as usize].push(wc);
    }
}

fn to_int_hop(h: &HopRecord) -> IntHop {
    IntHop {
        switch_id: h.switch_id,
        port_id: h.port_id,
        ts_ns: h.ts_ns,
        tx_bytes: h.tx_bytes,
        qlen_bytes: u32::from(h.qlen_64b) * 64,
        link_bps: u64::from(h.link_100m) * 100_000_000,
    }
}

impl QpSlot {
    fn apply(&mut self, a: cc::Actions) {
        for t in a.timers() {
            self.cc_timers[timer_index(t.kind)] = t.deadline_ns.max(1);
        }
        if a.send_cnp {
            self.cnp_pending = true;
        }
        if let Some(qp) = self.qp.as_mut() {
            if let Some(w) = a.feedback_window {
                qp.set_ack_window(w.min(u64::from(u32::MAX)) as u32);
            }
            if a.send_probe {
                qp.send_probe();
            }
        }
    }

    fn update_window(&mut self) {
        if let Some(qp) = self.qp.as_mut() {
            qp.set_window(self.cc.window_bytes().min(u64::from(u32::MAX)) as u32);
        }
    }
}

/// The engine. Built on the caller's thread, then moved to its poll-mode
/// thread by [`Engine::run`].
pub struct Engine {
    _port: Option<Port>,
    /// Yield the core after [`IDLE_TURNS_BEFORE_YIELD`] idle turns.
    idle_yield: bool,
    /// Consecutive turns without a packet or a doorbell.
    idle_turns: u32,
    /// The longest frame the port carries (its driver's limit, at most
    /// [`MAX_FRAME`]).
    max_frame: usize,
    io: PacketIo,
    /// The first QPN of this engine's range (QP index `i` is QPN
    /// `qpn_base + i`).
    qpn_base: u32,
    pools: TxPools,
    _rx_pool: Arc<Mempool>,
    clock: TscClock,
    mac: [u8; 6],
    ip: [u8; 4],
    line_rate_bps: u64,
    base_rtt_ns: u64,
    int_dscp: u8,
    parse: ParseOptions,
    shared: Arc<EngineShared>,
    cmd: Receiver<Command>,
    mrs: MrTable,
    mr_mem: Vec<Option<Arc<ExtBuf>>>,
    cqs: Vec<rtrb::Producer<WorkCompletion>>,
    qps: Vec<Option<Box<QpSlot>>>,
    /// Indices of connected QPs (whose counters are published).
    connected: Vec<usize>,
    /// QPs holding completions that a full CQ could not take, retried every
    /// turn until the program polls room free (preallocated: MAX_QPS).
    cq_waiting: Vec<u32>,
    /// The flow scheduler: control first, then round robin over QPs with
    /// data, paced by credit (crate::scheduler).
    sched: Scheduler<u32>,
    /// The transport and CC timers of every QP.
    wheel: TimerWheel<TimerKey>,
    counters: Counters,
    scratch: Vec<u8>,
    rxb: Burst,
    txb: Burst,
    psn_seed: u64,
    turn: u64,
    last_publish_ns: u64,
    capture: Option<CaptureProducer<CAPTURE_SNAP>>,
}

impl Engine {
    /// A unique name for one of this process's DPDK objects (mempools,
    /// rings: their names share one namespace).
    pub(crate) fn unique_name(kind: &str) -> String {
        static POOL_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("nic{}_{id}_{kind}", std::process::id())
    }

    /// The pool a port receives into.
    pub(crate) fn rx_pool(
        eal: &'static Eal,
        cfg: &DeviceConfig,
    ) -> Result<Arc<Mempool>, VerbsError> {
        Ok(Mempool::new(
            eal,
            &Self::unique_name("rx"),
            cfg.pool_size,
            256,
            Mempool::DEFAULT_DATA_ROOM,
        )?)
    }

    /// Configures `port` with one RX and one TX queue receiving into
    /// `rx_pool`; returns the queues and the longest frame the port carries.
    pub(crate) fn open_port(
        port: &mut Port,
        rx_pool: &Arc<Mempool>,
    ) -> Result<(RxQueue, TxQueue, usize), VerbsError> {
        // Jumbo frames where the port allows them, so that a 4 KiB RoCE MTU
        // (plus INT and extension headers) fits (e.g. a TAP, whose kernel side
        // would otherwise drop frames above 1500 bytes of IP).
        let port_cfg = dpdk::PortConfig {
            mtu: Some(PORT_MTU),
            ..dpdk::PortConfig::default()
        };
        let (mut rxs, mut txs) = port.configure(&port_cfg, rx_pool)?;
        let (Some(rx), Some(tx)) = (rxs.pop(), txs.pop()) else {
            return Err(VerbsError::Refused("the port has no queue".into()));
        };
        let max_frame = port
            .max_frame_len()
            .map_or(MAX_FRAME, |n| (n as usize).min(MAX_FRAME));
        Ok((rx, tx, max_frame))
    }

    /// An engine on its own port (configured here).
    pub(crate) fn new(
        eal: &'static Eal,
        mut port: Port,
        cfg: &DeviceConfig,
        mac: [u8; 6],
        shared: Arc<EngineShared>,
        cmd: Receiver<Command>,
        capture: Option<CaptureProducer<CAPTURE_SNAP>>,
    ) -> Result<Engine, VerbsError> {
        let rx_pool = Self::rx_pool(eal, cfg)?;
        let (rx, tx, max_frame) = Self::open_port(&mut port, &rx_pool)?;
        Self::build(
            eal,
            Some(port),
            PacketIo::Port { rx, tx },
            rx_pool,
            max_frame,
            cfg,
            mac,
            shared,
            cmd,
            capture,
        )
    }

    /// An engine for one shard of a sharded device: its frames come from and
    /// go to the device's dispatcher over `io` (crate::shard); `rx_pool` is
    /// the pool those frames were received into (kept alive while frames
    /// from it may still wait in the rings).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_shard(
        eal: &'static Eal,
        io: PacketIo,
        rx_pool: Arc<Mempool>,
        max_frame: usize,
        cfg: &DeviceConfig,
        mac: [u8; 6],
        shared: Arc<EngineShared>,
        cmd: Receiver<Command>,
    ) -> Result<Engine, VerbsError> {
        Self::build(
            eal, None, io, rx_pool, max_frame, cfg, mac, shared, cmd, None,
        )
    }

    /// The TX pools of an engine.
    pub(crate) fn tx_pools(&self) -> &TxPools {
        &self.pools
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        eal: &'static Eal,
        port: Option<Port>,
        io: PacketIo,
        rx_pool: Arc<Mempool>,
        max_frame: usize,
        cfg: &DeviceConfig,
        mac: [u8; 6],
        shared: Arc<EngineShared>,
        cmd: Receiver<Command>,
        capture: Option<CaptureProducer<CAPTURE_SNAP>>,
    ) -> Result<Engine, VerbsError> {
        let pools = TxPools {
            hdr: Mempool::new(
                eal,
                &Self::unique_name("hdr"),
                cfg.pool_size,
                256,
                Mempool::DEFAULT_DATA_ROOM,
            )?,
            bare: Mempool::new(eal, &Self::unique_name("ext"), cfg.pool_size, 256, 0)?,
            copy_threshold: cfg.copy_threshold,
        };
        let clock = TscClock::new(eal);
        Ok(Engine {
            idle_yield: cfg.idle_yield,
            idle_turns: 0,
            max_frame,
            _port: port,
            io,
            qpn_base: shared.qpn_base,
            pools,
            _rx_pool: rx_pool,
            psn_seed: clock.cycles() | 1,
            clock,
            mac,
            ip: cfg.ip,
            line_rate_bps: cfg.line_rate_bps,
            base_rtt_ns: cfg.base_rtt_ns,
            int_dscp: cfg.int_dscp,
            parse: ParseOptions {
                int_dscp: Some(cfg.int_dscp),
                verify_icrc: true,
            },
            shared,
            cmd,
            mrs: MrTable::with_key_seed(cfg.mr_key_seed),
            mr_mem: Vec::new(),
            cqs: Vec::new(),
            qps: (0..MAX_QPS).map(|_| None).collect(),
            connected: Vec::with_capacity(MAX_QPS),
            cq_waiting: Vec::with_capacity(MAX_QPS),
            sched: Scheduler::new(MAX_QPS as u32, PACING_BURST_BYTES, MAX_QPS),
            wheel: TimerWheel::with_start(
                TIMER_TICK_NS,
                TIMER_SLOTS,
                MAX_QPS * TIMERS_PER_QP,
                clock.now_ns(),
            ),
            counters: Counters::default(),
            scratch: vec![0u8; MAX_FRAME],
            rxb: Burst::new(),
            txb: Burst::new(),
            turn: 0,
            last_publish_ns: 0,
            capture,
        })
    }

    /// The longest frame the port carries (what bounds the RoCE path MTU).
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Runs the poll loop until the device is asked to stop; the engine is
    /// then published, dropped and marked done (as one engine of a group).
    pub fn run(self) {
        run_group(vec![self]);
    }

    /// One turn of the poll loop (module docs); `false` once the device
    /// has been asked to stop (the caller then drops the engine, which
    /// releases the port). [`run_group`] turns several engines on one core.
    pub fn poll_turn(&mut self) -> bool {
        if self.turn.is_multiple_of(256) {
            if stopping(&self.shared.stop) {
                return false;
            }
            self.slow_path();
        }
        self.turn = self.turn.wrapping_add(1);
        let now = self.clock.now_ns();
        let work = (self.counters.rx_packets, self.counters.tx_packets);
        let rung = self.doorbells();
        self.receive(now);
        self.timers(now);
        if !self.cq_waiting.is_empty() {
            self.retry_completions();
        }
        self.transmit(now);
        if rung || work != (self.counters.rx_packets, self.counters.tx_packets) {
            self.idle_turns = 0;
        } else if self.idle_yield {
            // Idle: after a while, let a thread that shares this core run
            // (DeviceConfig::idle_yield); never while there is work.
            self.idle_turns += 1;
            if self.idle_turns >= IDLE_TURNS_BEFORE_YIELD && self.txb.is_empty() {
                self.idle_turns = 0;
                std::thread::yield_now();
            }
        }
        if now.saturating_sub(self.last_publish_ns) > 1_000_000 {
            self.publish();
            self.last_publish_ns = now;
        }
        true
    }

    fn publish(&mut self) {
        let mut c = self.counters;
        c.capture_drops = self.capture.as_ref().map_or(0, |p| p.drops());
        for &i in &self.connected {
            if let Some(qp) = self.qps[i].as_ref().and_then(|s| s.qp.as_ref()) {
                let q = qp.counters();
                c.retransmits += q.tx_retransmits;
                c.timeouts += q.timeouts;
                c.rx_duplicates += q.rx_duplicates;
                c.rx_out_of_sequence += q.rx_out_of_sequence;
                c.tx_seq_naks += q.nak_seq_sent;
                c.tx_rnr_naks += q.rnr_nak_sent;
                c.tx_access_naks += q.nak_error_sent;
                c.rx_drop_qp_state += q.rx_dropped_state;
            }
        }
        self.shared.counters.publish(&c);
    }

    // ------------------------------------------------------------------ slow path

    fn slow_path(&mut self) {
        while let Ok(cmd) = self.cmd.try_recv() {
            match cmd {
                Command::RegMr {
                    pd,
                    mem,
                    access,
                    reply,
                } => {
                    let r = match self.mrs.register_in(
                        pd,
                        mem.base_ptr() as u64,
                        mem.len() as u64,
                        access,
                    ) {
                        Some(mr) => {
                            let i = ((mr.lkey >> 8) - 1) as usize;
                            if self.mr_mem.len() <= i {
                                self.mr_mem.resize(i + 1, None);
                            }
                            self.mr_mem[i] = Some(mem);
                            Ok((mr.lkey, mr.rkey))
                        }
                        None => Err("memory region table full".to_string()),
                    };
                    let _ = reply.send(r);
                }
                Command::DeregMr { lkey, reply } => {
                    let r = match self.mrs.deregister(lkey) {
                        Some(_) => {
                            self.mr_mem[((lkey >> 8) - 1) as usize] = None;
                            Ok(())
                        }
                        None => Err(format!("no memory region with key {lkey:#x}")),
                    };
                    let _ = reply.send(r);
                }
                Command::CreateCq { ring, reply } => {
                    self.cqs.push(ring);
                    let _ = reply.send(Ok(self.cqs.len() as u32 - 1));
                }
                Command::CreateQp {
                    pd,
                    send_cq,
                    recv_cq,
                    opts,
                    ring,
                    reply,
                } => {
                    let _ = reply.send(self.create_qp(pd, send_cq, recv_cq, opts, ring));
                }
                Command::Connect { qpn, remote, reply } => {
                    let r = self.connect(qpn, &remote);
                    let _ = reply.send(r);
                }
                Command::QueryQp { qpn, reply } => {
                    let r = match self.slot(qpn) {
                        Some(s) => Ok(s.qp.as_ref().map_or(QpState::Init, |q| q.state())),
                        None => Err(format!("no QP {qpn:#x}")),
                    };
                    let _ = reply.send(r);
                }
                Command::DescribeQp { qpn, reply } => {
                    let _ = reply.send(self.describe_qp(qpn, self.clock.now_ns()));
                }
            }
        }
    }

    /// One line of a QP's state for [`Command::DescribeQp`].
    fn describe_qp(&self, qpn: u32, now: u64) -> Result<String, String> {
        let s = self.slot(qpn).ok_or_else(|| format!("no QP {qpn:#x}"))?;
        let i = qpn - self.qpn_base;
        let timer = |t: Option<(TimerHandle, u64)>| match t {
            Some((h, at)) => format!(
                "{}@{:+}ns(wheel {:?})",
                if self.wheel.is_pending(h) {
                    "armed"
                } else {
                    "LOST"
                },
                at as i64 - now as i64,
                self.wheel.expiry_ns(h).map(|e| e as i64 - now as i64)
            ),
            None => "none".into(),
        };
        let mut out = format!(
            "qp {qpn:#x}: sched {:?} credit {}B rate {} next_bytes {} ctrl_queued {} \
             cnp_pending {} doorbell_blocked {} transport_timer {} cc_timers [",
            self.sched.state(i),
            self.sched.credit_bytes(i).unwrap_or(0),
            s.sched_rate,
            s.next_bytes,
            s.ctrl_queued,
            s.cnp_pending,
            s.doorbell_blocked,
            timer(s.transport_timer),
        );
        for (k, t) in s.cc_armed.iter().enumerate() {
            out += &format!(" {}:{}", s.cc_timers[k], timer(*t));
        }
        out += " ]";
        if let Some(qp) = s.qp.as_ref() {
            out += &format!(
                " | {:?} next_timer {:?} has_control {} next_lsn {} acked_lsn {} next_psn {} \
                 una_psn {} expected_psn {} sq_outstanding {} in_flight {} cc_window {:?} {:?}",
                qp.state(),
                qp.next_timer().map(|t| t as i64 - now as i64),
                qp.has_control(),
                qp.next_lsn(),
                qp.acked_lsn(),
                qp.next_psn(),
                qp.una_psn(),
                qp.expected_psn(),
                qp.sq_outstanding(),
                qp.in_flight(),
                s.cc.window_bytes(),
                qp.counters(),
            );
        }
        out += &format!(
            " | wheel len {} now {:+}ns | sched active {} control {}",
            self.wheel.len(),
            self.wheel.now_ns() as i64 - now as i64,
            self.sched.active_len(),
            self.sched.control_len()
        );
        Ok(out)
    }

    fn slot(&self, qpn: u32) -> Option<&QpSlot> {
        let i = qpn.checked_sub(self.qpn_base)? as usize;
        self.qps.get(i)?.as_deref()
    }

    fn next_psn(&mut self) -> u32 {
        // xorshift64: initial PSNs are not predictable, as IBA recommends.
        let mut x = self.psn_seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.psn_seed = x;
        (x as u32) & 0xFF_FFFF
    }

    fn create_qp(
        &mut self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        opts: QpOptions,
        ring: rtrb::Consumer<Doorbell>,
    ) -> Result<(u32, u32), String> {
        if send_cq as usize >= self.cqs.len() || recv_cq as usize >= self.cqs.len() {
            return Err("unknown completion queue".into());
        }
        if !matches!(opts.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(format!(
                "MTU {} is not one of 256, 512, 1024, 2048, 4096",
                opts.mtu
            ));
        }
        let i = self
            .qps
            .iter()
            .position(Option::is_none)
            .ok_or("too many QPs")?;
        let psn = self.next_psn();
        let path = PathConfig {
            line_rate_bps: self.line_rate_bps,
            base_rtt_ns: self.base_rtt_ns,
            mtu_bytes: opts.mtu,
        };
        let cc = opts.cc.build(path);
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress(self.mac),
                dst_mac: EthernetAddress([0; 6]),
                src_ip: Ipv4Address(self.ip),
                dst_ip: Ipv4Address([0; 4]),
                udp_src_port: 0xC000 | ((self.qpn_base + i as u32) & 0x3FFF) as u16,
                dscp: ROCE_DSCP,
                ttl: 64,
            },
            int: None,
        };
        self.qps[i] = Some(Box::new(QpSlot {
            opts,
            pd,
            send_cq,
            recv_cq,
            doorbell: ring,
            psn,
            qp: None,
            int_on_data: cc.int_on_data(),
            cc_ext: opts.cc.uses_extensions(),
            cc,
            fb,
            tpl: None,
            doorbell_blocked: false,
            ctrl_queued: false,
            cq_waiting: false,
            sched_rate: u64::MAX,
            next_bytes: opts.mtu + 100,
            transport_timer: None,
            cc_armed: [None; 4],
            rtt_probe: None,
            cc_timers: [0; 4],
            cnp_pending: false,
        }));
        let now = self.clock.now_ns();
        let _ = self.sched.reset_qp(i as u32, now);
        Ok((self.qpn_base + i as u32, psn))
    }

    fn connect(&mut self, qpn: u32, remote: &RemoteQp) -> Result<(), String> {
        let int_dscp = self.int_dscp;
        let i = qpn.checked_sub(self.qpn_base).ok_or("bad QPN")? as usize;
        let s = self
            .qps
            .get_mut(i)
            .and_then(Option::as_mut)
            .ok_or(format!("no QP {qpn:#x}"))?;
        if s.qp.is_some() {
            return Err(format!("QP {qpn:#x} is already connected"));
        }
        let cfg = QpConfig {
            qpn,
            dest_qpn: remote.qpn,
            pmtu: s.opts.mtu.min(remote.mtu),
            sq_depth: s.opts.sq_depth,
            rq_depth: s.opts.rq_depth,
            max_rd_atomic: s.opts.max_rd_atomic,
            timeout_ns: s.opts.timeout_ns,
            retry_cnt: s.opts.retry_cnt,
            rnr_retry: s.opts.rnr_retry,
            min_rnr_timer: 1,
            sq_psn: s.psn,
            rq_psn: remote.psn,
            cc_ext: s.cc_ext,
            ack_read_responses: s.opts.cc == CcKind::Ldcp,
            pd: s.pd,
        };
        let mut qp = Qp::new(cfg).map_err(|e| e.to_string())?;
        qp.set_peer_ip(remote.ip);
        for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
            qp.modify(st).map_err(|e| e.to_string())?;
        }
        s.fb.net.dst_mac = EthernetAddress(remote.mac);
        s.fb.net.dst_ip = Ipv4Address(remote.ip);
        if s.int_on_data {
            s.fb.int = Some(IntInsert {
                int_dscp,
                max_hops: MAX_HOPS as u8,
            });
        }
        // A template that cannot be built (never expected: the QPN was checked by
        // the QP above) leaves the QP on the general build_frame path.
        s.tpl = HeaderTemplate::new(s.fb, remote.qpn, bth::DEFAULT_PKEY).ok();
        s.qp = Some(qp);
        s.update_window();
        self.connected.push(i);
        // Work posted before the connection is taken now.
        self.shared.ring_doorbell(qpn);
        Ok(())
    }

    // ------------------------------------------------------------------ doorbells

    /// Takes the work requests of every QP that rang; whether any did.
    fn doorbells(&mut self) -> bool {
        let mut rung = false;
        while let Some(i) = self.shared.take_rung() {
            rung = true;
            self.take_doorbells(i);
        }
        rung
    }

    fn take_doorbells(&mut self, i: usize) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        let Some(qp) = s.qp.as_mut() else { return };
        s.doorbell_blocked = false;
        while let Ok(d) = s.doorbell.peek() {
            let d = *d;
            let r = match d {
                Doorbell::Send(wr) => qp
                    .post_send(wr, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, wr.op.wc_opcode(), s.send_cq)),
                Doorbell::Recv(wr) => qp
                    .post_recv(wr, &self.mrs)
                    .map_err(|e| (e, wr.wr_id, WcOpcode::Recv, s.recv_cq)),
            };
            match r {
                Ok(()) => {}
                Err((QpError::QueueFull, ..)) => {
                    // Retried when completions free the queue.
                    s.doorbell_blocked = true;
                    break;
                }
                Err((e, wr_id, opcode, cq)) => {
                    let status = match e {
                        QpError::LocalProtection(_) => WcStatus::LocProtErr,
                        QpError::LocalLength => WcStatus::LocLenErr,
                        _ => WcStatus::LocQpOpErr,
                    };
                    self.counters.completion_errors += 1;
                    let wc = WorkCompletion {
                        wr_id,
                        status,
                        opcode,
                        byte_len: 0,
                        imm: None,
                        qp_num: qp.config().qpn,
                    };
                    if let Some(ring) = self.cqs.get_mut(cq as usize) {
                        if ring.push(wc).is_err() {
                            // CQ overrun: the completion is counted, not silently lost.
                            self.counters.completion_errors += 1;
                        }
                    }
                }
            }
            let _ = s.doorbell.pop();
        }
        let _ = self.sched.mark_ready(i as u32, s.next_bytes);
    }

    // ------------------------------------------------------------------ RX

    fn receive(&mut self, now: u64) {
        if self.io.recv(&mut self.rxb) == 0 {
            return;
        }
        let mut burst = std::mem::take(&mut self.rxb);
        let mut scratch = std::mem::take(&mut self.scratch);
        for mut m in burst.drain() {
            self.counters.rx_packets += 1;
            let len = m.pkt_len();
            self.counters.rx_bytes += len as u64;
            if m.nb_segs() > 1
                && self.capture.is_none()
                && self.receive_chained(&m, &mut scratch, now)
            {
                continue;
            }
            // The frame, contiguous and writable: the mbuf's own data, or a
            // copy of a chained frame in `scratch`.
            let bytes: &mut [u8] = if m.nb_segs() == 1 {
                m.data_mut()
            } else if len <= scratch.len() && m.read(0, &mut scratch[..len]).is_ok() {
                &mut scratch[..len]
            } else {
                self.counters.rx_drop_too_long += 1;
                continue;
            };
            if let Some(cap) = self.capture.as_mut() {
                cap.capture(CAPTURE_RX, now, bytes);
            }
            match self.check_icrc(bytes) {
                Ok(verified) => self.dispatch(bytes, verified, now),
                Err(e) => self.count_rx_error(&e),
            }
        }
        self.scratch = scratch;
        self.rxb = burst;
    }

    /// Checks the ICRC in place, at raw CRC speed, for a RoCEv2 frame without
    /// an INT container (`Ok(true)`); frames with a container, and anything
    /// that is not RoCEv2, are left to the parser (`Ok(false)`), which then
    /// classifies them and skips the container.
    fn check_icrc(&self, f: &mut [u8]) -> Result<bool, WireError> {
        const L3: usize = rdma::wire::ethernet::HEADER_LEN;
        let rocev2 = f.len() >= L3 + 20 + 8
            && f[12..14] == [0x08, 0x00]
            && f[L3] >> 4 == 4
            && f[L3 + 9] == 17
            && {
                let ihl = usize::from(f[L3] & 0xF) * 4;
                f.len() >= L3 + ihl + 8 && f[L3 + ihl + 2..L3 + ihl + 4] == 4791u16.to_be_bytes()
            };
        if !rocev2 || Some(f[L3 + 1] >> 2) == self.parse.int_dscp {
            return Ok(false);
        }
        rdma::wire::verify_icrc_in_place(f, L3, 0)?;
        Ok(true)
    }

    fn count_rx_error(&mut self, e: &WireError) {
        match e {
            WireError::BadIcrc { .. } => self.counters.rx_drop_icrc += 1,
            WireError::UnsupportedEtherType(_)
            | WireError::NotUdp(_)
            | WireError::NotRoce(_)
            | WireError::IpFragment => self.counters.rx_drop_not_roce += 1,
            _ => self.counters.rx_drop_malformed += 1,
        }
    }

    fn dispatch(&mut self, bytes: &[u8], icrc_checked: bool, now: u64) {
        match self.parse_frame(bytes, !icrc_checked) {
            Ok(f) => self.deliver(&f, now),
            Err(e) => self.count_rx_error(&e),
        }
    }

    /// Parses a contiguous frame (the CC extension where the QP negotiated
    /// it), verifying its ICRC if `verify_icrc`.
    fn parse_frame<'b>(
        &self,
        bytes: &'b [u8],
        verify_icrc: bool,
    ) -> Result<rdma::wire::RoceFrame<'b>, WireError> {
        let qps = &self.qps;
        let opts = ParseOptions {
            verify_icrc,
            ..self.parse
        };
        parse_rx(bytes, &opts, |bth| {
            bth.dest_qp
                .checked_sub(self.qpn_base)
                .and_then(|i| qps.get(i as usize))
                .and_then(Option::as_ref)
                .is_some_and(|s| s.cc_ext)
        })
    }

    /// A frame chained as the sender built it (or as a NIC scatters it):
    /// every header in the first segment, then the payload, then the pad
    /// and ICRC, in at most two more segments. Parsed without copying the
    /// payload: the headers and the last bytes go to `scratch` where the
    /// parser reads them, the ICRC is computed over the segments, and the
    /// QP copies the payload straight from its segment into the region.
    /// `false`: not of that shape (the caller linearises it).
    fn receive_chained(&mut self, m: &dpdk::Mbuf, scratch: &mut [u8], now: u64) -> bool {
        let mut segs = m.segments();
        let (Some(head), Some(body)) = (segs.next(), segs.next()) else {
            return false;
        };
        let tail = segs.next().unwrap_or(&[]);
        let (h, b) = (head.len(), body.len());
        let total = h + b + tail.len();
        if segs.next().is_some() || total > scratch.len() || b < 8 || tail.len() > 7 {
            return false;
        }
        scratch[..h].copy_from_slice(head);
        scratch[h + b - 8..h + b].copy_from_slice(&body[b - 8..]);
        scratch[h + b..total].copy_from_slice(tail);
        let mut f = match self.parse_frame(&scratch[..total], false) {
            Ok(f) => f,
            Err(e) => {
                self.count_rx_error(&e);
                return true;
            }
        };
        let n = f.payload.len();
        if f.payload_offset != h || n > b {
            return false;
        }
        // ICRC: masked headers (INT container skipped), then every byte up
        // to the ICRC (payload, pad), from the segments.
        let Ok(mut icrc) = rdma::wire::icrc::IcrcHasher::start_headers(
            head,
            rdma::wire::ethernet::HEADER_LEN,
            f.int_len,
        ) else {
            self.counters.rx_drop_malformed += 1;
            return true;
        };
        let upto = total - 4 - h;
        icrc.update(&body[..upto.min(b)]);
        if upto > b {
            icrc.update(&tail[..upto - b]);
        }
        let computed = icrc.finalize();
        if computed != f.icrc {
            self.count_rx_error(&WireError::BadIcrc {
                found: f.icrc,
                computed,
            });
            return true;
        }
        f.payload = &body[..n];
        self.deliver(&f, now);
        true
    }

    /// Hands a parsed, verified frame to its QP (and the receiver side of
    /// its CC), counting it.
    fn deliver(&mut self, f: &rdma::wire::RoceFrame<'_>, now: u64) {
        let Some(i) = f
            .bth
            .dest_qp
            .checked_sub(self.qpn_base)
            .map(|i| i as usize)
            .filter(|&i| i < MAX_QPS)
        else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        let Some(s) = self.qps[i].as_mut() else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        if s.qp.is_none() {
            self.counters.rx_drop_qp_state += 1;
            return;
        }
        let op = f.bth.opcode;
        let ce = f.ip.ecn == Ecn::Ce;
        match op {
            Opcode::Acknowledge => match f.aeth.map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => self.counters.rx_acks += 1,
                _ => self.counters.rx_naks += 1,
            },
            Opcode::Cnp => self.counters.rx_cnps += 1,
            _ => {
                self.counters.rx_data_packets += 1;
                if ce {
                    self.counters.rx_ce_marked += 1;
                }
            }
        }
        // Receiver side of the CC (DCQCN notification point, Rx-HPCC NewINT).
        if op.is_request() {
            let mut hops = [HopRecord::default(); MAX_HOPS];
            let n = f.int.as_ref().map_or(0, |c| c.copy_hops(&mut hops));
            let mut th = [IntHop::default(); MAX_HOPS];
            for (d, h) in th.iter_mut().zip(&hops[..n]) {
                *d = to_int_hop(h);
            }
            let a = s.cc.on_rx_data(&RxDataEvent {
                now_ns: now,
                lsn: f.ccext.map_or(0, |c| u64::from(c.lsn)),
                bytes: f.payload.len() as u32,
                ce,
                telemetry: &th[..n],
            });
            s.apply(a);
        }
        if let Some(qp) = s.qp.as_mut() {
            qp.on_rx(f, now, &self.mrs, &mut RawMemory);
        }
        self.after_qp_work(i, now);
    }

    /// Moves a QP's events into its CC and its completions into the CQs.
    fn after_qp_work(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        if s.qp.is_none() {
            return;
        }
        let mut events = 0;
        while let Some(ev) = s.qp.as_mut().and_then(Qp::poll_event) {
            events += 1;
            let a = match ev {
                QpEvent::Ack {
                    acked_lsn,
                    newly_acked,
                    ce_count,
                    window,
                    n_hops,
                    hops,
                    ..
                } => {
                    let mut rtt_ns = 0;
                    if let Some((end, t)) = s.rtt_probe {
                        if (acked_lsn.wrapping_sub(end) as i32) >= 0 {
                            rtt_ns = now.saturating_sub(t);
                            s.rtt_probe = None;
                        }
                    }
                    let n = (n_hops as usize).min(MAX_HOPS);
                    let mut th = [IntHop::default(); MAX_HOPS];
                    for (d, h) in th.iter_mut().zip(&hops[..n]) {
                        *d = to_int_hop(h);
                    }
                    s.cc.on_ack(&AckEvent {
                        now_ns: now,
                        acked_lsn: u64::from(acked_lsn),
                        acked_bytes: newly_acked,
                        acked_pkts: 1,
                        rtt_ns,
                        ecn_echo: ce_count > 0,
                        telemetry: &th[..n],
                        rx_window: window.map(u64::from),
                    })
                }
                QpEvent::Nak { syndrome, .. } => {
                    if syndrome == AethSyndrome::Nak(NakCode::PsnSequenceError) {
                        s.rtt_probe = None;
                        s.cc.on_nak(&NakEvent {
                            now_ns: now,
                            expected_lsn: 0,
                        })
                    } else {
                        cc::Actions::NONE
                    }
                }
                QpEvent::Timeout { .. } => {
                    s.rtt_probe = None;
                    s.cc.on_rto(now)
                }
                QpEvent::CnpReceived => s.cc.on_cnp(now),
                QpEvent::ProbeResponse { n_hops, hops } => {
                    let n = (n_hops as usize).min(MAX_HOPS);
                    let mut th = [IntHop::default(); MAX_HOPS];
                    for (d, h) in th.iter_mut().zip(&hops[..n]) {
                        *d = to_int_hop(h);
                    }
                    s.cc.on_probe_response(now, &th[..n])
                }
                QpEvent::CeMarked { .. } | QpEvent::ReadRespAck { .. } | QpEvent::Error => {
                    cc::Actions::NONE
                }
            };
            s.apply(a);
        }
        if events > 0 {
            s.update_window();
        }
        // Completions, as long as both CQs have room (a full CQ holds them
        // in the QP instead of losing them, and the QP waits in `cq_waiting`
        // until the program makes room).
        if !move_completions(&mut self.cqs, &mut self.counters, s) && !s.cq_waiting {
            s.cq_waiting = true;
            self.cq_waiting.push(i as u32);
        }
        let Some(qp) = s.qp.as_mut() else { return };
        let control = s.cnp_pending || qp.has_control();
        sync_timers(&mut self.wheel, i, s);
        let q = i as u32;
        if control && !s.ctrl_queued {
            // One entry per QP at most, in a ring of MAX_QPS: never full.
            s.ctrl_queued = self.sched.push_control(q).is_ok();
        }
        let rate = s.cc.rate_bps();
        if rate != s.sched_rate {
            s.sched_rate = rate;
            let _ = self.sched.set_rate(q, rate, now);
        }
        // New work may have become sendable (window opened, RNR wait over,
        // a READ to answer): back on the round robin; the QP leaves it again
        // when `poll_tx` finds nothing.
        let _ = self.sched.mark_ready(q, s.next_bytes);
        if s.doorbell_blocked {
            self.take_doorbells(i);
        }
    }

    /// Gives the QPs whose CQ was full their held completions, now that the
    /// program may have polled room free; those drained leave the list.
    #[cold]
    fn retry_completions(&mut self) {
        let (qps, cqs, counters) = (&mut self.qps, &mut self.cqs, &mut self.counters);
        self.cq_waiting.retain(|&i| {
            let Some(s) = qps[i as usize].as_deref_mut() else {
                return false;
            };
            let drained = move_completions(cqs, counters, s);
            s.cq_waiting = !drained;
            !drained
        });
    }

    // ------------------------------------------------------------------ timers

    /// Fires the timers due on the wheel (O(1) per timer, whatever the
    /// number of QPs): the transport's retransmit/RNR timer and the CC timers.
    fn timers(&mut self, now: u64) {
        self.wheel.expire(now);
        while let Some(key) = self.wheel.pop_ready() {
            let i = key.qp as usize;
            let Some(s) = self.qps.get_mut(i).and_then(Option::as_deref_mut) else {
                continue;
            };
            let Some(qp) = s.qp.as_mut() else { continue };
            if key.kind == WheelKind::Retransmit {
                s.transport_timer = None;
                if qp.next_timer().is_some_and(|t| t <= now) {
                    qp.on_timer(now);
                }
            } else if let Some(k) = WHEEL_KINDS.iter().position(|&w| w == key.kind) {
                s.cc_armed[k] = None;
                let d = s.cc_timers[k];
                if d != 0 && d <= now {
                    s.cc_timers[k] = 0;
                    let a = s.cc.on_timer(now, TIMER_KINDS[k]);
                    s.apply(a);
                    s.update_window();
                }
            }
            // Moves events and completions on and re-arms what is still due.
            self.after_qp_work(i, now);
        }
    }

    // ------------------------------------------------------------------ TX

    /// Fills a TX burst as the flow scheduler decides: control packets
    /// (ACK/NAK/CNP, probe responses) first, then round robin over QPs with
    /// data, each charged its packet against its pacing credit; the QP's
    /// transport applies the CC window in LSN bytes. Amortised O(1) per
    /// packet whatever the number of QPs (crate::scheduler).
    fn transmit(&mut self, now: u64) {
        // What the port did not take last time goes first.
        if !self.txb.is_empty() {
            self.io.send(&mut self.txb);
            if !self.txb.is_empty() {
                return;
            }
        }
        while !self.txb.is_full() {
            match self.sched.next(now) {
                Decision::Idle { .. } => break,
                Decision::Control(q) => self.send_control(q as usize, now),
                Decision::Qp { qp, .. } => self.send_data(qp as usize, now),
            }
        }
        if let Some(cap) = self.capture.as_mut() {
            let mut head = [0u8; CAPTURE_SNAP];
            for m in self.txb.as_slice() {
                let n = m.pkt_len().min(CAPTURE_SNAP);
                if m.read(0, &mut head[..n]).is_ok() {
                    cap.capture(CAPTURE_TX, now, &head[..n]);
                }
            }
        }
        if !self.txb.is_empty() {
            self.io.send(&mut self.txb);
        }
    }

    /// One control packet of QP `i`: a CNP it owes, else its transport's
    /// next ACK/NAK or probe response. Not charged to the QP's credit.
    fn send_control(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        s.ctrl_queued = false;
        let Some(qp) = s.qp.as_mut() else { return };
        // Control packets carry no INT container (probe responses echo
        // telemetry in their CC extension header, HPCC++ 000 §6.2).
        let mut fb = s.fb;
        fb.int = None;
        let pkt = if s.cnp_pending {
            s.cnp_pending = false;
            self.counters.tx_cnps += 1;
            TxPacket {
                repr: RoceRepr::new(BthRepr::new(Opcode::Cnp, qp.config().dest_qpn, 0)),
                payload: QpPayload::None,
                ecn: Ecn::NotEct,
                priority: true,
                lsn: 0,
                lsn_len: 0,
                retransmit: false,
            }
        } else if let Some(p) = qp.poll_tx_control(now) {
            p
        } else {
            return;
        };
        if s.cnp_pending || qp.has_control() {
            s.ctrl_queued = self.sched.push_control(i as u32).is_ok();
        }
        self.emit(i, &fb, &pkt);
    }

    /// The next packet of QP `i`'s transport (data, a READ request, a probe,
    /// or an ACK that was due), with the CC told of data sent; a QP with
    /// nothing sendable leaves the round robin.
    fn send_data(&mut self, i: usize, now: u64) {
        let q = i as u32;
        let Some(s) = self.qps[i].as_deref_mut() else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let Some(qp) = s.qp.as_mut() else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let Some(mut pkt) = qp.poll_tx(now) else {
            let _ = self.sched.mark_idle(q);
            return;
        };
        let data = !pkt.priority && pkt.lsn_len > 0 && pkt.repr.bth.opcode != Opcode::Acknowledge;
        let mut fb = s.fb;
        if data {
            let op = pkt.repr.bth.opcode;
            let a = s.cc.on_send(&SendEvent {
                now_ns: now,
                lsn: u64::from(pkt.lsn),
                bytes: pkt.lsn_len,
                last_of_message: !op.is_first() && !op.is_middle(),
                retransmit: pkt.retransmit,
            });
            if a.fast_start {
                pkt.ecn = Ecn::NotEct;
            }
            s.apply(a);
            if s.rtt_probe.is_none() && !pkt.retransmit {
                s.rtt_probe = Some((pkt.lsn.wrapping_add(pkt.lsn_len), now));
            }
        } else if pkt.repr.bth.opcode == Opcode::Probe {
            // Probes always collect telemetry (HPCC++ 000 §6.2).
            fb.int = Some(IntInsert {
                int_dscp: self.int_dscp,
                max_hops: MAX_HOPS as u8,
            });
        } else {
            fb.int = None;
        }
        let built = self.emit(i, &fb, &pkt);
        let Some(s) = self.qps[i].as_deref_mut() else {
            return;
        };
        // Even when the frame could not be built (counted in `emit`), the
        // transport has taken the packet as sent: its retransmit timer must
        // still go on the wheel below, or a lost tail would never be resent.
        if let Some(bytes) = built {
            let wire = (bytes + WIRE_OVERHEAD) as u32;
            let _ = self.sched.on_sent(q, wire, now);
            if data {
                s.next_bytes = wire;
            }
        }
        let rate = s.cc.rate_bps();
        if rate != s.sched_rate {
            s.sched_rate = rate;
            let _ = self.sched.set_rate(q, rate, now);
        }
        let _ = self.sched.mark_ready(q, s.next_bytes);
        if (s.cnp_pending || s.qp.as_ref().is_some_and(Qp::has_control)) && !s.ctrl_queued {
            s.ctrl_queued = self.sched.push_control(q).is_ok();
        }
        sync_timers(&mut self.wheel, i, s);
    }

    /// Builds `pkt` of QP `i` into an mbuf, counts it and puts it in the TX
    /// burst: its frame length, or `None` if it could not be built (counted).
    fn emit(&mut self, i: usize, fb: &FrameBuilder, pkt: &TxPacket) -> Option<u64> {
        let payload = match pkt.payload {
            QpPayload::None => Payload::None,
            QpPayload::Local { lkey: key, va, len } | QpPayload::Remote { rkey: key, va, len } => {
                match key
                    .checked_shr(8)
                    .and_then(|k| k.checked_sub(1))
                    .and_then(|k| self.mr_mem.get(k as usize))
                    .and_then(Option::as_ref)
                {
                    Some(mem) => Payload::Ext {
                        mem,
                        offset: (va - mem.base_ptr() as u64) as usize,
                        len: len as usize,
                    },
                    None => {
                        // Deregistered while in flight: not sendable.
                        self.counters.tx_drop_no_mbuf += 1;
                        return None;
                    }
                }
            }
        };
        // The QP's template when the packet uses the QP's own headers (a probe
        // adds INT, a CNP or ACK may drop it: those take the general path);
        // same bytes either way.
        let tpl = self.qps[i].as_deref().and_then(|s| s.tpl.as_ref());
        let built = match tpl {
            Some(t) if t.frame_builder() == fb => {
                build_frame_tpl(t, &pkt.repr, pkt.ecn, payload, &self.pools)
            }
            _ => build_frame(fb, &pkt.repr, pkt.ecn, payload, &self.pools),
        };
        match built {
            Ok(m) => {
                let bytes = m.pkt_len() as u64;
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += bytes;
                match pkt.repr.bth.opcode {
                    Opcode::Acknowledge => match pkt.repr.aeth.map(|a| a.syndrome) {
                        Some(AethSyndrome::Ack { .. }) => self.counters.tx_acks += 1,
                        _ => self.counters.tx_naks += 1,
                    },
                    Opcode::Cnp => {}
                    _ => self.counters.tx_data_packets += 1,
                }
                let _ = self.txb.push(m);
                Some(bytes)
            }
            Err(_) => {
                self.counters.tx_drop_no_mbuf += 1;
                None
            }
        }
    }
}

/// Several engines on one poll-mode thread, turned round robin (one
/// [`Engine::poll_turn`] each), so that many NICs share few cores (a testbed
/// with N hosts on a 2-core machine). An engine asked to stop is published,
/// dropped (its port released) and marked done; the loop ends with the last.
pub fn run_group(engines: Vec<Engine>) {
    /// Marks an engine done once it is dropped, also when the thread unwinds,
    /// so that `Device::close` never waits for an engine that is gone.
    struct Hosted(Option<Engine>);
    impl Drop for Hosted {
        fn drop(&mut self) {
            if let Some(e) = self.0.take() {
                let shared = e.shared.clone();
                drop(e);
                shared
                    .done
                    .store(true, std::sync::atomic::Ordering::Release);
            }
        }
    }
    let mut live: Vec<Hosted> = engines.into_iter().map(|e| Hosted(Some(e))).collect();
    while !live.is_empty() {
        live.retain_mut(|h| match h.0.as_mut() {
            Some(e) => {
                if e.poll_turn() {
                    return true;
                }
                e.publish();
                false
            }
            None => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    /// The doorbell protocol between a poster and the engine never loses a
    /// post: the poster posts two work requests back to back (the second
    /// races with the engine taking the first) and waits for both to be
    /// taken; a lost doorbell leaves one in the ring with nobody to take it.
    #[test]
    fn doorbells_are_never_lost() {
        let shared = Arc::new(EngineShared::new(4, QPN_BASE));
        let taken = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (mut post, mut ring) = rtrb::RingBuffer::<u64>::new(64);
        let engine = {
            let (shared, taken, stop) = (shared.clone(), taken.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut next = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    while let Some(i) = shared.take_rung() {
                        assert_eq!(i, 2);
                        while let Ok(v) = ring.pop() {
                            assert_eq!(v, next, "work requests in order");
                            next += 1;
                        }
                        taken.store(next, Ordering::Release);
                    }
                    std::hint::spin_loop();
                }
            })
        };
        let rounds = if cfg!(debug_assertions) {
            20_000
        } else {
            200_000
        };
        let mut posted = 0u64;
        for round in 0..rounds {
            for _ in 0..2 {
                post.push(posted).unwrap();
                posted += 1;
                shared.ring_doorbell(QPN_BASE + 2);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while taken.load(Ordering::Acquire) != posted {
                if Instant::now() > deadline {
                    stop.store(true, Ordering::Relaxed);
                    panic!(
                        "round {round}: a doorbell was lost ({} of {posted} taken)",
                        taken.load(Ordering::Acquire)
                    );
                }
                std::hint::spin_loop();
            }
        }
        stop.store(true, Ordering::Relaxed);
        engine.join().unwrap();
    }
}
