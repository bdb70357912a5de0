//! The poll-mode engine: one loop that owns a port, the QPs, their
//! congestion control and the registered memory (docs/design.md §5; HPCC++ 000
//! §6.3.1 fig. 7: RX pipeline, TX pipeline, flow scheduler, CC module).
//!
//! Each turn of the loop ([`Engine::poll_turn`], in `poll.rs`) reads the
//! clock once and then
//! 1. takes doorbells (posted work requests) from the QPs that rang
//!    (`doorbells.rs`),
//! 2. receives a burst: parse (INT skipped, ICRC checked), dispatch to the
//!    QP's responder or requester (`rx.rs`; ARP and ICMP echo go to the
//!    port's control plane, `control.rs`), feed the CC (receiver side: CE
//!    marks, telemetry; sender side: ACKs, NAKs, CNPs, timeouts) and move
//!    completions to the completion queues (`qp_work.rs`, on the per-QP core
//!    `qpcore::QpCore` that roce-sim runs too),
//! 3. fires due timers (transport retransmit/RNR, CC timers; `timers.rs`),
//! 4. transmits a burst: ACK/NAK/CNP first, then round robin over QPs with
//!    something to send, each paced at its CC rate and gated by its CC
//!    window in LSN bytes (`tx.rs`),
//!
//! and every 256 turns serves the slow path (registration, QP creation and
//! connection, ARP resolution; `slow_path.rs`) and publishes the counters. Nothing on the
//! per-packet path allocates, locks or makes a system call.
//!
//! This file holds the engine's state ([`Engine`], one `QpSlot` per QP)
//! and how an engine is built from its parts (`EngineParts`); where its
//! frames come from is `port.rs`.

mod control;
mod cq;
mod doorbells;
mod gsi;
mod lifecycle;
mod poll;
mod port;
mod qp_work;
mod rx;
mod slow_path;
mod srq;
mod timers;
mod tx;

use std::sync::Arc;

use crossbeam_channel::Receiver;
use dpdk::{Burst, Eal, Mempool, Port, TscClock};
use qpcore::{QpCore, PACING_BURST_BYTES, ROCE_DSCP};
use rdma::transport::{MrTable, QpState};
use rdma::wire::{HeaderTemplate, ParseOptions};

use crate::counters::Counters;
use crate::error::VerbsError;
use crate::io::{TxPools, MAX_FRAME};
use crate::pcapng::CaptureProducer;
use crate::scheduler::Scheduler;
use crate::sys::RawMemory;
use crate::timer_wheel::{TimerKey, TimerWheel};

pub use crate::contract::{
    Command, Doorbell, EngineShared, CAPTURE_SNAP, MAX_HOPS, MAX_QPS, QPN_BASE,
};
use crate::contract::{DeviceConfig, DoorbellSlot, QpOptions, Reply};
use crate::control::ControlPlane;
use crate::port_shaper::{PortShaper, SharedLine};
pub use poll::run_group;
pub(crate) use port::PacketIo;

/// Frames for the port's own MAC that may wait for the receive path: a few
/// TX bursts (the receive path takes a burst of them each turn).
const LOOPBACK_DEPTH: usize = 256;

/// Time at line rate the port's shaper lets go back to back: longer than a
/// poll turn, so that a turn's TX burst is not cut at a fast line rate.
const SHAPER_BURST_NS: u64 = 20_000;

/// The depth of the port's shaper at `line_rate_bps`: [`SHAPER_BURST_NS`]
/// at line rate, at least [`PACING_BURST_BYTES`].
pub(crate) fn shaper_depth(line_rate_bps: u64) -> u32 {
    let bytes = u128::from(line_rate_bps) * u128::from(SHAPER_BURST_NS) / 8_000_000_000;
    u32::try_from(bytes)
        .unwrap_or(u32::MAX)
        .max(PACING_BURST_BYTES)
}

/// One QP's engine-side state.
///
/// In a set order (`repr(C)`), for thousands of QPs whose state is cold at
/// each visit: what every visit reads (the counter sync's mark, the doorbell
/// ring, the CQs, the flags and the header template) on the first three
/// lines, then the per-QP core (laid out the same way), then what only the
/// slow path and a counter sync that found a change read.
#[repr(C)]
struct QpSlot {
    /// The mark of the last sync (`poll.rs`): what a visit compares to see
    /// whether the counters in the sums moved.
    synced_mark: poll::SyncMark,
    doorbell: rtrb::Consumer<DoorbellSlot>,
    send_cq: u32,
    recv_cq: u32,
    /// Doorbells wait because the send queue was full.
    doorbell_blocked: bool,
    /// The QP holds completions its full CQ could not take; it is in the
    /// engine's `cq_waiting` list.
    cq_waiting: bool,
    /// The transport reported that it entered ERR (lifecycle.rs).
    fatal_pending: bool,
    /// The QP's header template (docs/design.md §3, §9): built at connect time
    /// from `core.fb` and the peer's QPN; data packets (and ACKs, CNPs on the
    /// same headers) are built through it. None until connected.
    tpl: Option<HeaderTemplate>,
    /// The transport, CC, scheduling and timers, shared with roce-sim
    /// (`qpcore::QpCore`); its `qp` is None until connected.
    core: QpCore,
    opts: QpOptions,
    /// Its protection domain (0: the device's default one).
    pd: u32,
    psn: u32,
    /// The transport counters as last added to the engine's sums
    /// (`poll.rs`); read only when the mark moved.
    synced: poll::QpSums,
    /// The state of a QP without a transport (`qp` None): RESET or INIT.
    idle_state: QpState,
    /// `connect` stops at RTR (`modify_qp` to RTR; RTS comes on its own).
    stop_at_rtr: bool,
    /// The program moved the QP to ERR (no `QpFatal` event for that).
    err_by_program: bool,
}

impl QpSlot {
    /// The byte offsets of the lines a visit reads (the struct's docs): the
    /// first three, then the core's ([`QpCore::HOT_LINES`]).
    const HOT_LINES: [usize; 3 + QpCore::HOT_LINES.len()] =
        rdma::transport::nest_hot_lines(3, core::mem::offset_of!(QpSlot, core), QpCore::HOT_LINES);

    /// Starts loading the lines a visit reads, ahead of the visit: with
    /// thousands of QPs they are cold by the time the QP's turn comes.
    #[inline]
    fn prefetch(&self) {
        let base = (self as *const QpSlot).cast::<u8>();
        for l in Self::HOT_LINES {
            dpdk::prefetch(base.wrapping_add(l));
        }
    }
}

/// Where an address handle's datagrams go (`ibv_ah`, resolved at its
/// creation as rxe does): the destination's IP and the next hop's MAC.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AhRoute {
    ip: [u8; 4],
    mac: [u8; 6],
}

/// The engine. Built on the caller's thread, then moved to its poll-mode
/// thread by [`Engine::run`].
pub struct Engine {
    _port: Option<Port>,
    /// Park the thread when idle (`DeviceConfig::idle_yield`; `poll.rs`).
    park_when_idle: bool,
    /// When the engine last had work (a packet in or out, a doorbell), ns.
    last_busy_ns: u64,
    /// When its last turn began, ns (on its own clock: the engines of a
    /// group were started one after another, each clock from its start).
    turn_ns: u64,
    /// The QPN whose state the RX path prefetched last (`rx.rs`): a
    /// message's frames come in a row and need it once.
    rx_prefetched_qpn: u32,
    /// Every frame the engine can receive comes from a thread that wakes
    /// it (the other end of its ring pair turns on the same thread), so it
    /// may sleep until its next timer; otherwise its parks are bounded
    /// (`poll.rs`). Set by `run_group`.
    rx_wakes: bool,
    /// Every frame the engine receives was written by another thread (the
    /// other end of its ring pair, a shard's peers, the dispatcher), whose
    /// core holds its mbufs' lines: the RX path then prefetches each
    /// frame's chain in stages (`rx.rs`). Set by `run_group`.
    rx_cross_core: bool,
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
    mr_mem: Vec<Option<crate::sys::MrMem>>,
    cqs: Vec<cq::CqRing>,
    /// Shared receive queues, by id (srq.rs).
    srqs: Vec<Option<srq::SrqSlot>>,
    /// The device's address handles, by [`rdma::transport::AhId`] - 1: where
    /// a UD datagram goes (`Command::CreateAh`).
    ahs: Vec<Option<AhRoute>>,
    /// Async events, the link state, slots of destroyed QPs (lifecycle.rs).
    life: lifecycle::Lifecycle,
    qps: Vec<Option<Box<QpSlot>>>,
    /// Where the search for a free QP slot starts (round robin).
    next_qp_slot: usize,
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
    /// Frames sent to the port's own MAC, waiting for the receive path
    /// (tx.rs `loop_back`, rx.rs `receive`).
    lo: Burst<LOOPBACK_DEPTH>,
    psn_seed: u64,
    turn: u64,
    last_publish_ns: u64,
    /// The QPs' transport counters summed as of their last sync, kept when
    /// a QP is destroyed (`poll.rs`).
    qp_sums: poll::QpSums,
    capture: Option<CaptureProducer<CAPTURE_SNAP>>,
    /// The port's ARP and ICMP echo (crate::control).
    control: ControlPlane,
    /// Where the control plane writes the frames it sends.
    control_out: Vec<u8>,
    /// Slow-path requests waiting for an ARP resolution.
    resolving: Vec<([u8; 4], Reply<[u8; 6]>)>,
    /// The gratuitous ARP went out.
    announced: bool,
    /// The port's line rate over every frame the TX burst takes.
    shaper: PortShaper,
    /// The communication manager behind QP 1 (gsi.rs).
    cm: rdma::cm::Cm,
    /// Its events, until the API takes them.
    cm_events: std::collections::VecDeque<rdma::cm::CmEvent>,
    /// Signalled when `cm_events` gets events (`CmOp::Notify`).
    cm_notify: Option<std::sync::Arc<crate::notify::EventNotify>>,
    /// MADs waiting for their destination's ARP resolution.
    gsi_waiting: Vec<([u8; 4], rdma::wire::CmMad)>,
    /// The PSN of QP 1's next datagram.
    gsi_psn: u32,
}

/// What an engine is built from besides the device's configuration: where
/// its frames come from and go to, and how the API reaches it.
pub(crate) struct EngineParts {
    /// The port it owns (None for a shard, whose dispatcher owns it).
    pub port: Option<Port>,
    /// Its RX and TX: the port's queues or a shard's rings.
    pub io: PacketIo,
    /// The pool frames are received into (kept alive while frames from it
    /// may still wait in the engine's bursts or a shard's rings).
    pub rx_pool: Arc<Mempool>,
    /// The longest frame the port carries.
    pub max_frame: usize,
    /// The device's MAC.
    pub mac: [u8; 6],
    /// Flags, counters and doorbells shared with the API handles.
    pub shared: Arc<EngineShared>,
    /// Slow-path requests.
    pub cmd: Receiver<Command>,
    /// Where sent and received frames are copied to, if capturing.
    pub capture: Option<CaptureProducer<CAPTURE_SNAP>>,
    /// The port's line, when other engines send on it too (a sharded
    /// device's shards: crate::port_shaper), with the clock the line's time
    /// is read on (the shards share one); None: the engine's own line and
    /// clock.
    pub line: Option<(Arc<SharedLine>, TscClock)>,
}

impl Engine {
    /// An engine on its own port, configured here.
    pub(crate) fn on_port(
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
            cfg,
            EngineParts {
                port: Some(port),
                io: PacketIo::Port { rx, tx },
                rx_pool,
                max_frame,
                mac,
                shared,
                cmd,
                capture,
                line: None,
            },
        )
    }

    /// An engine from its parts (for a shard: rings to the dispatcher,
    /// crate::shard).
    pub(crate) fn build(
        eal: &'static Eal,
        cfg: &DeviceConfig,
        parts: EngineParts,
    ) -> Result<Engine, VerbsError> {
        let pools = TxPools::new(
            Mempool::new(
                eal,
                &Self::unique_name("hdr"),
                cfg.pool_size,
                256,
                cfg.tx_data_room.max(Mempool::DEFAULT_DATA_ROOM),
            )?,
            Mempool::new(eal, &Self::unique_name("ext"), cfg.pool_size, 256, 0)?,
            cfg.copy_threshold,
        )?;
        let clock = parts
            .line
            .as_ref()
            .map_or_else(|| TscClock::new(eal), |l| l.1);
        Ok(Engine {
            park_when_idle: cfg.idle_yield,
            last_busy_ns: 0,
            turn_ns: 0,
            rx_prefetched_qpn: u32::MAX,
            rx_wakes: false,
            rx_cross_core: false,
            max_frame: parts.max_frame,
            _port: parts.port,
            io: parts.io,
            qpn_base: parts.shared.qpn_base(),
            pools,
            _rx_pool: parts.rx_pool,
            psn_seed: clock.cycles() | 1,
            clock,
            mac: parts.mac,
            ip: cfg.ip,
            line_rate_bps: cfg.line_rate_bps,
            base_rtt_ns: cfg.base_rtt_ns,
            int_dscp: cfg.int_dscp,
            parse: ParseOptions {
                int_dscp: Some(cfg.int_dscp),
                verify_icrc: true,
            },
            shared: parts.shared,
            cmd: parts.cmd,
            mrs: MrTable::with_key_seed(cfg.mr_key_seed),
            mr_mem: Vec::new(),
            cqs: Vec::new(),
            srqs: Vec::new(),
            ahs: Vec::new(),
            life: lifecycle::Lifecycle::new(),
            qps: (0..MAX_QPS).map(|_| None).collect(),
            next_qp_slot: 0,
            connected: Vec::with_capacity(MAX_QPS),
            cq_waiting: Vec::with_capacity(MAX_QPS),
            sched: Scheduler::new(MAX_QPS as u32, PACING_BURST_BYTES, MAX_QPS)
                .with_quantum(sched::scheduler::NIC_QUANTUM_BYTES),
            wheel: timers::wheel(clock.now_ns()),
            counters: Counters::default(),
            scratch: vec![0u8; MAX_FRAME],
            rxb: Burst::new(),
            txb: Burst::new(),
            lo: Burst::new(),
            turn: 0,
            last_publish_ns: 0,
            qp_sums: poll::QpSums::default(),
            capture: parts.capture,
            control: ControlPlane::new(parts.mac, cfg.ip, cfg.arp),
            control_out: vec![0u8; MAX_FRAME],
            resolving: Vec::new(),
            // Host mode: the kernel answers ARP for the interface; no
            // gratuitous ARP of ours (crate::host).
            announced: cfg.kernel_iface.is_some(),
            shaper: match parts.line {
                Some((line, _)) => PortShaper::on_line(line),
                None => PortShaper::new(
                    cfg.line_rate_bps,
                    shaper_depth(cfg.line_rate_bps),
                    clock.now_ns(),
                ),
            },
            cm: rdma::cm::Cm::new(rdma::cm::CmConfig {
                ip: cfg.ip,
                ca_guid: ca_guid(parts.mac),
                seed: (cfg.mr_key_seed >> 32) as u32 ^ cfg.mr_key_seed as u32,
                response_timeout: cfg.cm_timing.0,
                max_retries: cfg.cm_timing.1,
                ..rdma::cm::CmConfig::default()
            }),
            cm_events: std::collections::VecDeque::new(),
            cm_notify: None,
            gsi_waiting: Vec::new(),
            gsi_psn: (cfg.mr_key_seed as u32) & 0xFF_FFFF,
        })
    }

    /// The TX pools of an engine.
    pub(crate) fn tx_pools(&self) -> &TxPools {
        &self.pools
    }

    /// The parker the engine's thread sleeps on (what wakes it: crate::park).
    pub(crate) fn parker(&self) -> &Arc<crate::park::Parker> {
        &self.shared.parker
    }

    /// The longest frame the port carries (what bounds the RoCE path MTU).
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// QP index `i`'s slot, if the QP exists.
    fn slot_mut(&mut self, i: usize) -> Option<&mut QpSlot> {
        self.qps.get_mut(i).and_then(Option::as_deref_mut)
    }
}

/// The CA GUID of a port with MAC `mac`: its modified EUI-64 (RFC 4291 appendix A), as
/// Linux rxe derives `node_guid` from its netdev's address.
fn ca_guid(mac: [u8; 6]) -> u64 {
    let b = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_be_bytes(b)
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use core::mem::{offset_of, size_of};

    /// What every visit reads of the slot takes its first three lines and
    /// the per-QP core starts the fourth (the struct's docs).
    #[test]
    fn a_visit_reads_the_first_three_lines() {
        assert!(offset_of!(QpSlot, tpl) + size_of::<Option<HeaderTemplate>>() <= 3 * 64);
        assert_eq!(offset_of!(QpSlot, core), 3 * 64);
    }

    /// Every hot line is a line of the slot, counted once.
    #[test]
    fn the_hot_lines_are_lines_of_the_slot() {
        let mut lines = QpSlot::HOT_LINES.to_vec();
        assert!(lines
            .iter()
            .all(|&l| l % 64 == 0 && l < size_of::<QpSlot>()));
        lines.sort_unstable();
        lines.dedup();
        assert_eq!(lines.len(), QpSlot::HOT_LINES.len());
    }
}
