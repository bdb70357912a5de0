//! The contract between the engine and the programs that use it
//! (docs/design.md §5): what crosses the boundary and nothing else.
//!
//! - [`DeviceConfig`], [`QpOptions`] and [`RemoteQp`]: what a program
//!   asks for (device settings, per-QP options, the peer of a QP);
//! - [`Command`]: the slow path (register, create, connect, query), a
//!   request over `crossbeam-channel` answered on a one-shot reply channel
//!   with a `Result<_, `[`EngineError`]`>`;
//! - [`Doorbell`] and [`EngineShared`]: the fast path, lock-free (posted
//!   work requests in a per-QP SPSC ring, the QP's number in a queue of QPs
//!   that rang) and the counters the engine publishes.
//!
//! Both the engine ([`crate::engine`]) and the user handles
//! ([`crate::verbs`], [`crate::device`]) import this module; neither
//! imports the other's internals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cc::CcKind;
use crossbeam_channel::Sender;
use dpdk::ExtBuf;
pub use rdma::transport::LossRecovery;
use rdma::transport::{
    Access, AhId, QpError, QpState, RecvWr, SendWr, Service, Sge, UdDest, WorkCompletion,
};

use crate::control::ArpConfig;
use crate::counters::SharedCounters;
use crate::doorbell::Doorbells;
use crate::notify::CqNotify;
use crate::park::Parker;
use crate::sys::EventFd;

/// QP numbers start here (0 and 1 are special in the IBA).
pub const QPN_BASE: u32 = 0x11;
/// Most QPs one engine holds (docs/design.md §5: the scheduler and the timers
/// are O(1) per decision at this many).
pub const MAX_QPS: usize = 16384;
/// Most hop records the engine takes from one packet's INT container (and
/// asks the switches for in the containers it inserts).
pub const MAX_HOPS: usize = 8;
/// Bytes of each frame kept by the optional capture (every header, the
/// start of the payload); the original length is recorded in full.
pub const CAPTURE_SNAP: usize = 512;

/// Device settings.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Local IPv4 address.
    pub ip: [u8; 4],
    /// Local MAC (None: the port's).
    pub mac: Option<[u8; 6]>,
    /// Line rate the CC and the pacer assume, bits/s.
    pub line_rate_bps: u64,
    /// Base RTT the CC assumes, ns.
    pub base_rtt_ns: u64,
    /// DSCP that announces an INT container.
    pub int_dscp: u8,
    /// CPU to pin the engine to (None: not pinned).
    pub core: Option<usize>,
    /// Mbufs in the RX/header pool.
    pub pool_size: u32,
    /// Capture every frame sent and received into this pcapng file.
    pub pcap: Option<std::path::PathBuf>,
    /// Payloads up to this many bytes are copied into the frame rather than
    /// attached zero-copy ([`crate::io::TxPools::copy_threshold`]).
    pub copy_threshold: usize,
    /// Data room of the mbufs frames are built in (headroom included;
    /// default `Mempool::DEFAULT_DATA_ROOM`, 2 KiB + 128). A copied payload
    /// that fits with its headers makes a one-segment frame, built and
    /// checksummed in one pass (`HeaderTemplate::write_frame`); with a
    /// `copy_threshold` of a path MTU and a room to match (4 KiB + 512),
    /// every data frame is one mbuf: no external attach, no trailer.
    pub tx_data_room: u16,
    /// Park the engine's thread when idle: after `verbs::SPIN_BEFORE_PARK`
    /// (50 us) with nothing to do it sleeps on a futex until a doorbell, a
    /// command, the stop or its next timer wakes it (frames from a port
    /// that cannot wake it end the sleep within 100 us; crate::park,
    /// `engine::poll`). For threads that share cores (two `roce-perf` on
    /// one 2-core host, or anything else busy on it), where a busy-polling
    /// engine would hold its core. Off: a pure poll-mode core, no syscall
    /// ever. (Named for the `sched_yield` it did before.)
    pub idle_yield: bool,
    /// Seed of the memory-region key bytes (`rdma::transport::MrTable::with_key_seed`):
    /// [`DeviceConfig::new`] draws it from the OS, so a peer cannot guess keys.
    pub mr_key_seed: u64,
    /// The port's ARP: cache size, entry lifetime, request retries
    /// (crate::control).
    pub arp: ArpConfig,
    /// Host mode (crate::host): the port is shared with this kernel
    /// interface (a `net_af_xdp` port), so peers are resolved through the
    /// kernel's neighbour table and the NIC sends no ARP of its own. Set by
    /// `Device::open*` for a port on a kernel interface.
    pub kernel_iface: Option<crate::host::KernelIface>,
    /// The CM's response timeout (an exponent: 4.096 us << it) and how many
    /// times a REQ, REP or DREQ is sent again before the connection is given
    /// up (`rdma::cm::CmConfig`; Linux rdma_cm's 20 and 15 by default:
    /// about 69 s before an unanswered REQ ends in UNREACHABLE).
    pub cm_timing: (u8, u8),
}

impl DeviceConfig {
    /// A device configuration in host mode on kernel interface `iface`: the
    /// interface's IPv4 address, the port's MAC (the interface's, as the
    /// `net_af_xdp` PMD reports it) and the kernel's neighbour table.
    pub fn host(iface: &str) -> Result<Self, crate::host::HostError> {
        let k = crate::host::KernelIface::new(iface)?;
        let mut cfg = DeviceConfig::new(k.ipv4()?);
        cfg.kernel_iface = Some(k);
        Ok(cfg)
    }

    /// Defaults for a device with address `ip`: 100 Gbit/s, 10 us base RTT.
    pub fn new(ip: [u8; 4]) -> Self {
        DeviceConfig {
            ip,
            mac: None,
            line_rate_bps: 100_000_000_000,
            base_rtt_ns: 10_000,
            int_dscp: rdma::wire::int::DEFAULT_INT_DSCP,
            core: None,
            pool_size: 16383,
            pcap: None,
            copy_threshold: crate::io::COPY_THRESHOLD,
            tx_data_room: dpdk::Mempool::DEFAULT_DATA_ROOM,
            idle_yield: false,
            // std's RandomState keys come from the OS (getrandom).
            mr_key_seed: std::hash::BuildHasher::hash_one(
                &std::collections::hash_map::RandomState::new(),
                0u64,
            ),
            arp: ArpConfig::default(),
            kernel_iface: None,
            cm_timing: (
                rdma::cm::CmConfig::default().response_timeout,
                rdma::cm::CmConfig::default().max_retries,
            ),
        }
    }
}

/// Per-QP options chosen at creation.
#[derive(Debug, Clone, Copy)]
pub struct QpOptions {
    /// Send queue depth.
    pub sq_depth: u16,
    /// Receive queue depth.
    pub rq_depth: u16,
    /// Path MTU (256..4096).
    pub mtu: u32,
    /// Congestion control.
    pub cc: CcKind,
    /// Retransmit timeout, ns. The default is IBA timeout code 14
    /// (4.096 us x 2^14 = 67 ms), perftest's default: software engines on a
    /// shared host can be descheduled for milliseconds, and a NAK, not the
    /// timer, recovers ordinary loss quickly.
    pub timeout_ns: u64,
    /// Retries on timeout (0..7).
    pub retry_cnt: u8,
    /// RNR retries (0..7, 7 = infinite).
    pub rnr_retry: u8,
    /// Outstanding READ/ATOMIC requests.
    pub max_rd_atomic: u8,
    /// Most SGEs a send work request may carry (`ibv_qp_cap.max_send_sge`,
    /// at most [`rdma::transport::sgl::MAX_SGE`]): gathered zero-copy for
    /// SEND and WRITE, scattered into for READ.
    pub max_send_sge: u8,
    /// Most SGEs a receive work request may carry (`ibv_qp_cap.max_recv_sge`).
    pub max_recv_sge: u8,
    /// Largest payload of an inline send (`QueuePair::post_send_inline`;
    /// `ibv_qp_cap.max_inline_data`), copied at post time.
    pub max_inline_data: u32,
    /// The shared receive queue its receives come from
    /// (`ibv_qp_init_attr.srq`; `SharedReceiveQueue::id`), in its PD and on
    /// its engine; None: its own receive queue.
    pub srq: Option<u32>,
    /// The transport service (`ibv_qp_init_attr.qp_type`): RC, UC (SEND and
    /// WRITE, no acknowledgements) or UD (datagrams to address handles).
    pub service: Service,
    /// The Q_Key of a UD QP (`ibv_qp_attr.qkey`, IBA 10.2.4.4).
    pub qkey: u32,
    /// How an RC QP may recover a loss (`rdma::transport::sack`): go-back-N (the
    /// default, what any standard peer does) or selective repeat (`--loss-recovery
    /// sr`, `RSNIC_LOSS_RECOVERY=sr`; docs/reliability.md). `Sr` is what this QP
    /// wants: it runs `sr` only with a peer known to be an rsnic QP that wants it
    /// too, as the port's CM negotiated it (`rdma::cm::ext`) or an exchange told
    /// it (`QueuePair::set_peer_loss_recovery`); with any other peer, go-back-N.
    /// Unused by UC and UD.
    pub loss_recovery: LossRecovery,
}

impl Default for QpOptions {
    fn default() -> Self {
        QpOptions {
            sq_depth: 256,
            rq_depth: 256,
            mtu: 4096,
            cc: CcKind::None,
            timeout_ns: 4_096 << 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            srq: None,
            service: Service::Rc,
            qkey: 0,
            loss_recovery: LossRecovery::Gbn,
        }
    }
}

/// What the peer needs to know to talk to a QP (exchanged out of band).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteQp {
    /// QP number.
    pub qpn: u32,
    /// First PSN it sends.
    pub psn: u32,
    /// IPv4 address.
    pub ip: [u8; 4],
    /// MAC address of the next hop towards the peer. `Some` is used as
    /// given (an out-of-band exchange that carries it, or a router's MAC);
    /// `None`: the engine resolves the peer's IP by ARP before the QP sends
    /// (rxe resolves the path the same way when the QP goes to RTR;
    /// perftest's exchange carries no MAC).
    pub mac: Option<[u8; 6]>,
    /// Path MTU.
    pub mtu: u32,
    /// Congestion control (must match).
    pub cc: CcKind,
}

/// A request to the communication manager ([`Command::Cm`]; `rdma::cm::Cm`'s calls).
#[derive(Debug, Clone)]
pub enum CmOp {
    /// Signal this notifier whenever events are queued (one per device; a
    /// later one replaces it).
    Notify(std::sync::Arc<crate::notify::EventNotify>),
    /// Accept REQs for a service ID.
    Listen(u64),
    /// Stop accepting them.
    Unlisten(u64),
    /// Send a REQ (replies the new connection's ID).
    Connect {
        /// The passive side's address.
        peer_ip: [u8; 4],
        /// The service.
        service_id: u64,
        /// What the REQ announces.
        params: rdma::cm::ConnParams,
        /// At most 92 bytes.
        private_data: Vec<u8>,
    },
    /// Accept a request (REP).
    Accept {
        /// The connection.
        id: u32,
        /// What the REP announces.
        params: rdma::cm::ConnParams,
        /// At most 196 bytes.
        private_data: Vec<u8>,
    },
    /// Reject a request or a reply (REJ).
    Reject {
        /// The connection.
        id: u32,
        /// The REJ reason (`rdma::wire::cm::rej_reason`).
        reason: u16,
        /// At most 148 bytes.
        private_data: Vec<u8>,
    },
    /// Ask the active side to wait longer (MRA).
    Mra(u32),
    /// The active side's QP is ready: send the RTU.
    Ready(u32),
    /// Release (DREQ).
    Disconnect {
        /// The connection.
        id: u32,
        /// At most 220 bytes.
        private_data: Vec<u8>,
    },
    /// Resolve a UD service (SIDR_REQ; replies the request's ID).
    SidrRequest {
        /// The service's address.
        peer_ip: [u8; 4],
        /// The service.
        service_id: u64,
        /// At most 216 bytes.
        private_data: Vec<u8>,
    },
    /// Answer a SIDR request (SIDR_REP).
    SidrReply {
        /// Where the request came from.
        peer_ip: [u8; 4],
        /// Its TID.
        tid: u64,
        /// The request.
        req: Box<rdma::wire::cm::SidrReq>,
        /// `rdma::cm::sidr_status`.
        status: u8,
        /// The UD QP's number.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
    },
    /// Take the events queued since the last time.
    Events,
}

/// A [`CmOp`]'s outcome.
#[derive(Debug, Clone)]
pub enum CmDone {
    /// Done.
    Done,
    /// The new connection's ID.
    Id(u32),
    /// The queued events, oldest first.
    Events(Vec<rdma::cm::CmEvent>),
}

/// Why the engine refused a slow-path request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// Every memory region key of the engine is in use.
    #[error("memory region table full")]
    MrTableFull,
    /// No region is registered under this key.
    #[error("no memory region with key {0:#x}")]
    NoSuchMr(u32),
    /// `dereg_mr` of a region memory windows are bound to (IBA 10.6.7.2.6; rxe and
    /// so `ibv_dereg_mr`: EINVAL): unbind or invalidate them first.
    #[error("memory region {key:#x} has {windows} memory windows bound to it")]
    MrHasWindows {
        /// The region's key.
        key: u32,
        /// How many windows are bound to it.
        windows: u32,
    },
    /// The communication manager refused the request.
    #[error("communication manager: {0}")]
    Cm(#[from] rdma::cm::CmError),
    /// No memory window of this PD in the slot of this R_Key.
    #[error("no memory window with key {0:#x}")]
    NoSuchMw(u32),
    /// No completion queue with this id.
    #[error("unknown completion queue {0}")]
    NoSuchCq(u32),
    /// A path MTU the IBA does not define.
    #[error("MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    BadMtu(u32),
    /// Every QP slot of the engine is in use.
    #[error("too many QPs (at most {MAX_QPS} per engine)")]
    TooManyQps,
    /// No QP with this number on the engine.
    #[error("no QP {0:#x}")]
    NoSuchQp(u32),
    /// `connect` on a QP that was connected before.
    #[error("QP {0:#x} is already connected")]
    AlreadyConnected(u32),
    /// `connect` reached the engine without the peer's MAC (the API
    /// resolves it first: [`Command::ResolveMac`]).
    #[error("QP {0:#x}: the peer's MAC is not resolved")]
    NoPeerMac(u32),
    /// Nobody answered the ARP requests for this address.
    #[error("no ARP reply from {0} (the peer is unreachable or not on this link)")]
    ArpFailed(std::net::Ipv4Addr),
    /// The ARP cache is full of resolutions under way.
    #[error("cannot resolve {0}: the ARP cache is full of pending resolutions")]
    ArpCacheFull(std::net::Ipv4Addr),
    /// `destroy_cq` on a CQ a QP still completes into (ibverbs: EBUSY).
    #[error("completion queue {0} is still used by a QP")]
    CqBusy(u32),
    /// `dealloc_pd` on a PD that still holds a region or a QP (EBUSY).
    #[error("protection domain {0} still holds a memory region or a QP")]
    PdBusy(u32),
    /// No such shared receive queue (or one of another PD).
    #[error("unknown shared receive queue {0}")]
    NoSuchSrq(u32),
    /// The SRQ still has QPs receiving from it.
    #[error("shared receive queue {0} is still used by a QP")]
    SrqBusy(u32),
    /// The transport refused the QP's configuration or a state change.
    #[error("QP {qpn:#x}: {source}")]
    Transport {
        /// The QP.
        qpn: u32,
        /// What the transport said.
        #[source]
        source: QpError,
    },
}

/// The reply channel of a [`Command`].
pub type Reply<T> = Sender<Result<T, EngineError>>;

/// A posted work request on its way to the engine.
#[derive(Debug, Clone, Copy)]
pub enum Doorbell {
    /// `post_send`.
    Send(SendWr),
    /// `post_recv`.
    Recv(RecvWr),
    /// `post_send` on a UD QP (`wr.ud`): SEND or SEND with immediate to
    /// one destination (IBA 9.8), in one slot as the others.
    SendUd(UdWr),
    /// Part of the SGE list of the work request in the first `Send` or
    /// `Recv` slot after it: a request with several SGEs takes
    /// `n.div_ceil(GATHER_PER_SLOT)` of these before its own slot, all
    /// committed to the ring at once (its `sge` is then ignored).
    Sges {
        /// SGEs; the first `n` are used.
        sges: [Sge; GATHER_PER_SLOT],
        /// How many of `sges` are used.
        n: u8,
    },
}

/// A UD send work request ([`Doorbell::SendUd`]): what a [`SendWr`] of a
/// SEND says, and where it goes. UD has no RDMA or atomic operation, so
/// this is smaller than a `SendWr` beside a [`UdDest`] and keeps a doorbell
/// slot at one cache line.
#[derive(Debug, Clone, Copy)]
pub struct UdWr {
    /// Caller's id.
    pub wr_id: u64,
    /// The payload (ignored when the request carries an SGE list).
    pub sge: Sge,
    /// `IBV_WR_SEND_WITH_IMM`'s immediate.
    pub imm: Option<u32>,
    /// Address handle, remote QPN and Q_Key.
    pub dest: UdDest,
    /// Completes with a work completion.
    pub signaled: bool,
    /// Sets the BTH SE bit.
    pub solicited: bool,
}

impl UdWr {
    /// The [`SendWr`] the transport queues.
    pub fn send_wr(&self) -> SendWr {
        SendWr {
            wr_id: self.wr_id,
            op: match self.imm {
                Some(i) => rdma::transport::SendOp::SendImm(i),
                None => rdma::transport::SendOp::Send,
            },
            sge: self.sge,
            signaled: self.signaled,
            solicited: self.solicited,
        }
    }
}

/// SGEs one [`Doorbell::Sges`] slot carries.
pub const GATHER_PER_SLOT: usize = 3;

/// The doorbell slots a work request with `n` SGEs takes.
pub const fn doorbell_slots(n: usize) -> usize {
    if n > 1 {
        1 + n.div_ceil(GATHER_PER_SLOT)
    } else {
        1
    }
}

/// Pushes request `d` into `ring`, preceded by its SGE list when `sgl` has
/// several ([`Doorbell::Sges`]), all its slots committed at once so that the
/// engine never sees a list without its request; `Err` (nothing pushed)
/// when the ring lacks the room.
pub(crate) fn push_request(
    ring: &mut rtrb::Producer<DoorbellSlot>,
    d: Doorbell,
    sgl: &[Sge],
) -> Result<(), ()> {
    let list = if sgl.len() > 1 { sgl } else { &[] };
    let chunk = ring
        .write_chunk_uninit(doorbell_slots(list.len()))
        .map_err(|_| ())?;
    let parts = list.chunks(GATHER_PER_SLOT).map(|c| {
        let mut sges = [Sge::default(); GATHER_PER_SLOT];
        sges[..c.len()].copy_from_slice(c);
        DoorbellSlot(Doorbell::Sges {
            sges,
            n: c.len() as u8,
        })
    });
    chunk.fill_from_iter(parts.chain(std::iter::once(DoorbellSlot(d))));
    Ok(())
}

/// A [`Doorbell`] in its QP's ring: one cache line, aligned to one. The
/// ring is cold whenever thousands of QPs take turns, and a slot that
/// straddled two lines cost the program and the engine two misses each.
/// (The alignment sits on this wrapper, not on the enum: an aligned enum
/// loses the niche that keeps its tag inside the 64 bytes.)
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
pub struct DoorbellSlot(pub Doorbell);

/// Slow-path requests.
pub enum Command {
    /// Register memory.
    RegMr {
        /// Its protection domain.
        pd: u32,
        /// Its virtual address (what work requests and peers name; the
        /// address of `mem` itself, except for a program's range shared
        /// with the engine, `crate::shmem`, whose bytes the engine reaches
        /// through its own mapping).
        va: u64,
        /// The memory.
        mem: Arc<ExtBuf>,
        /// Access flags.
        access: Access,
        /// (lkey, rkey).
        reply: Reply<(u32, u32)>,
    },
    /// Create a shared receive queue around a doorbell ring.
    CreateSrq {
        /// Its protection domain.
        pd: u32,
        /// `max_wr`.
        depth: u16,
        /// `max_sge`.
        max_sge: u8,
        /// Consumer end of its ring.
        ring: rtrb::Consumer<DoorbellSlot>,
        /// Its id.
        reply: Reply<u32>,
    },
    /// Arm an SRQ's limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0 disarms).
    ArmSrq {
        /// The SRQ.
        srq: u32,
        /// The limit.
        limit: u32,
        /// Done.
        reply: Reply<()>,
    },
    /// An SRQ's attributes (`ibv_query_srq`).
    QuerySrq {
        /// The SRQ.
        srq: u32,
        /// `(max_wr, max_sge, srq_limit)`.
        reply: Reply<(u16, u8, u32)>,
    },
    /// Destroy an SRQ (refused while a QP receives from it).
    DestroySrq {
        /// The SRQ.
        srq: u32,
        /// Done (None: a handle's drop, nobody waits).
        reply: Option<Reply<()>>,
    },
    /// Deregister memory.
    DeregMr {
        /// Its key.
        lkey: u32,
        /// Unbind the windows bound to it first (a handle's drop, the program
        /// gone); otherwise a region with windows bound is refused.
        force: bool,
        /// Done (None: a handle's drop, nobody waits).
        reply: Option<Reply<()>>,
    },
    /// A request to the port's communication manager (QP 1, engine/gsi.rs).
    Cm {
        /// What to do.
        op: CmOp,
        /// Its outcome.
        reply: Reply<CmDone>,
    },
    /// Allocate a memory window (`ibv_alloc_mw`); replies its first R_Key.
    AllocMw {
        /// Its protection domain.
        pd: u32,
        /// Type 1 or 2B.
        kind: rdma::transport::MwType,
        /// Its R_Key.
        reply: Reply<u32>,
    },
    /// Free a memory window (`ibv_dealloc_mw`), bound or not: the window of protection
    /// domain `pd` in the slot of `rkey` (whatever key byte a failed bind left in the
    /// program's copy of it).
    DeallocMw {
        /// Its protection domain.
        pd: u32,
        /// Its R_Key (the slot counts).
        rkey: u32,
        /// Done (None: a handle's drop, nobody waits).
        reply: Option<Reply<()>>,
    },
    /// Create a completion queue around a ring.
    CreateCq {
        /// Producer end of its ring.
        ring: rtrb::Producer<WorkCompletion>,
        /// Its completion channel, if the program waits on an eventfd.
        notify: Option<Arc<CqNotify>>,
        /// Where the program's thread parks while it waits for a completion
        /// ([`crate::verbs::CompletionQueue::wait`]); the engine wakes it
        /// after a push.
        waiter: Arc<Parker>,
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
        ring: rtrb::Consumer<DoorbellSlot>,
        /// (QPN, initial PSN).
        reply: Reply<(u32, u32)>,
    },
    /// Connect a QP to its peer (INIT -> RTR -> RTS).
    Connect {
        /// Local QPN.
        qpn: u32,
        /// The peer.
        remote: RemoteQp,
        /// The peer is an rsnic QP configured `sr` too, as an exchange told it
        /// (`QueuePair::set_peer_loss_recovery`; the port's CM may also have
        /// negotiated it).
        peer_sr: bool,
        /// Done.
        reply: Reply<()>,
    },
    /// Set the first PSN a QP sends (`IBV_QP_SQ_PSN`, which ibverbs gives
    /// at RTR -> RTS): before it sent anything (INIT or RTR).
    SetSqPsn {
        /// Local QPN.
        qpn: u32,
        /// The PSN (24 bits).
        psn: u32,
        /// Done.
        reply: Reply<()>,
    },
    /// Set a QP's retry attributes before RTS (`ibv_modify_qp`'s
    /// `IBV_QP_TIMEOUT`, `IBV_QP_RETRY_CNT`, `IBV_QP_RNR_RETRY`).
    SetRetry {
        /// Local QPN.
        qpn: u32,
        /// The transport timeout in ns.
        timeout_ns: u64,
        /// Retries after a timeout or NAK (0..=7).
        retry_cnt: u8,
        /// Retries after an RNR NAK (0..=7; 7 = forever).
        rnr_retry: u8,
        /// Done.
        reply: Reply<()>,
    },
    /// Resolve an IPv4 address to the MAC of its host by ARP (answered
    /// from the cache, or once a reply came, or with an error once the
    /// retries ran out).
    ResolveMac {
        /// The address.
        ip: [u8; 4],
        /// Its MAC.
        reply: Reply<[u8; 6]>,
    },
    /// Query a QP's state.
    QueryQp {
        /// QPN.
        qpn: u32,
        /// Its state.
        reply: Reply<QpState>,
    },
    /// Move a QP to another state (`ibv_modify_qp`, IBA 10.3.1).
    ModifyQp {
        /// QPN.
        qpn: u32,
        /// The new state (with the peer, for RTR).
        to: QpTransition,
        /// At RTR: as [`Command::Connect`]'s.
        peer_sr: bool,
        /// Done.
        reply: Reply<()>,
    },
    /// Destroy a QP (`ibv_destroy_qp`): its slot, timers and queues are
    /// freed; work in flight is dropped without completions.
    DestroyQp {
        /// QPN.
        qpn: u32,
        /// Done (None: a handle's drop, nobody waits).
        reply: Option<Reply<()>>,
    },
    /// Destroy a CQ (`ibv_destroy_cq`), refused while a QP uses it. A
    /// dropped handle's CQ (no reply) is freed with its last QP instead.
    DestroyCq {
        /// CQ id.
        cq: u32,
        /// Done (None: a handle's drop).
        reply: Option<Reply<()>>,
    },
    /// Check that no region or QP of a PD is left (`ibv_dealloc_pd`).
    DeallocPd {
        /// The PD.
        pd: u32,
        /// Done, or [`EngineError::PdBusy`].
        reply: Reply<()>,
    },
    /// Describe a QP's transport, scheduler and timer state in one line of
    /// text (like `rdma resource show qp -d`; for diagnosing a stall).
    DescribeQp {
        /// QPN.
        qpn: u32,
        /// The description.
        reply: Reply<String>,
    },
    /// Set a UD QP's Q_Key (`ibv_modify_qp` with `IBV_QP_QKEY`).
    SetQkey {
        /// QPN.
        qpn: u32,
        /// The Q_Key.
        qkey: u32,
        /// Done.
        reply: Reply<()>,
    },
    /// Learn address handle `ah` (`ibv_create_ah`): UD packets sent to it
    /// go to `ip` through the next hop `mac`. Every engine of the device
    /// learns it under the same id.
    CreateAh {
        /// Its id (the device's, [`crate::verbs::AddressHandle`]).
        ah: AhId,
        /// Destination IPv4 address.
        ip: [u8; 4],
        /// Next hop's MAC (resolved before the command).
        mac: [u8; 6],
        /// Done.
        reply: Reply<()>,
    },
    /// Forget address handle `ah` (`ibv_destroy_ah`); packets already built
    /// are not affected, later UD sends to it are dropped (counted).
    DestroyAh {
        /// Its id.
        ah: AhId,
    },
    /// Give a CQ a ring of another depth (`ibv_resize_cq(3)`): the engine
    /// moves the completions queued in the old ring (`old`, the program's
    /// consumer end) into the new one, in order, and completes into it from
    /// then on. The reply is the consumer the program polls from now on and
    /// whether the CQ was resized: `new` (true), or `old` back untouched
    /// (false) when more completions are queued than the new ring holds or
    /// the CQ does not exist, so that the program never loses its ring.
    ResizeCq {
        /// CQ id.
        cq: u32,
        /// Producer end of the new ring.
        ring: rtrb::Producer<WorkCompletion>,
        /// Consumer end of the new ring.
        new: rtrb::Consumer<WorkCompletion>,
        /// Consumer end of the current ring.
        old: rtrb::Consumer<WorkCompletion>,
        /// The consumer to poll, and whether it is the new ring's.
        reply: Reply<(rtrb::Consumer<WorkCompletion>, bool)>,
    },
}

/// The program's end of an engine's slow path: a [`Command`] sent wakes
/// the engine's thread if it is parked (crate::park), so a request to an
/// idle engine is served at once, not at its next timeout.
#[derive(Clone)]
pub(crate) struct CommandTx {
    tx: Sender<Command>,
    parker: Arc<Parker>,
}

impl CommandTx {
    /// The sender `tx` of the engine that parks on `parker`.
    pub(crate) fn new(tx: Sender<Command>, parker: Arc<Parker>) -> Self {
        CommandTx { tx, parker }
    }

    /// Sends `c` and wakes the engine; an error if the engine is gone.
    pub(crate) fn send(&self, c: Command) -> Result<(), crossbeam_channel::SendError<Command>> {
        self.tx.send(c)?;
        self.parker.wake();
        Ok(())
    }
}

/// The states a program moves a QP to with `modify_qp` (IBA 10.3.1,
/// `ibv_qp_state`), with what each transition needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET: the QP forgets its peer and its work (posted work requests
    /// are dropped without completions); it can go to INIT again.
    Reset,
    /// INIT: receives may be posted.
    Init,
    /// RTR towards this peer: the responder works.
    Rtr(RemoteQp),
    /// RTS: the requester works too.
    Rts,
    /// ERR: every outstanding work request completes with
    /// `WR_FLUSH_ERR`, and so does every one posted until RESET.
    Err,
}

/// An asynchronous event of a device (`ibv_get_async_event`,
/// `enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// IBV_EVENT_QP_FATAL: the QP went to ERR on its own (retries spent,
    /// a NAK, a remote error); its work completes with errors.
    QpFatal {
        /// The QP.
        qpn: u32,
    },
    /// IBV_EVENT_CQ_ERR: a completion queue was full. Completions of QPs
    /// are held until the program polls room free; a completion with no
    /// QP to hold it (an immediate error at post time) was lost.
    CqOverrun {
        /// The CQ id.
        cq: u32,
        /// Whether a completion was lost (not only held back).
        lost: bool,
    },
    /// IBV_EVENT_SRQ_LIMIT_REACHED: fewer WQEs than its armed limit remain
    /// in a shared receive queue (it disarmed; IBA 11.3.3.3).
    SrqLimitReached {
        /// The SRQ id.
        srq: u32,
    },
    /// IBV_EVENT_PORT_ACTIVE: the port's link came up.
    PortActive,
    /// IBV_EVENT_PORT_ERR: the port's link went down.
    PortDown,
}

/// Async events an engine queues for the program before it drops them
/// (counted in `Counters::async_event_drops`).
pub const ASYNC_EVENT_QUEUE: usize = 256;

/// What an engine shares with the API handles: the stop and done flags,
/// the published counters, the doorbell queue, the async event queue and
/// the parker its thread sleeps on when idle (crate::park; engines that
/// share a thread share one).
pub struct EngineShared {
    /// Set by the device to stop the engine.
    pub(crate) stop: AtomicBool,
    /// Set once the engine has been dropped (its port released).
    pub(crate) done: AtomicBool,
    pub(crate) counters: SharedCounters,
    doorbells: Doorbells,
    /// Async events, from the engine's slow path to the program.
    pub(crate) events: (Sender<AsyncEvent>, crossbeam_channel::Receiver<AsyncEvent>),
    /// Readable while `events` holds an event (`ibv_context.async_fd`,
    /// which a program polls): the engine signals it after each send, the
    /// program's side keeps it in step when it takes one
    /// (`verbs::AsyncEvents`).
    pub(crate) events_fd: EventFd,
    /// Where the engine's thread sleeps when idle; a doorbell, a command or
    /// the stop wakes it.
    pub(crate) parker: Arc<Parker>,
}

impl EngineShared {
    /// The shared state of an engine whose thread parks on `parker`; fails
    /// only if no eventfd can be made (the process is out of descriptors).
    pub(crate) fn new(max_qps: usize, qpn_base: u32, parker: Arc<Parker>) -> std::io::Result<Self> {
        Ok(EngineShared {
            stop: AtomicBool::new(false),
            done: AtomicBool::new(false),
            counters: SharedCounters::default(),
            doorbells: Doorbells::new(max_qps, qpn_base),
            events: crossbeam_channel::bounded(ASYNC_EVENT_QUEUE),
            events_fd: EventFd::new()?,
            parker,
        })
    }

    /// Asks the engine to stop (and wakes it if it sleeps).
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.parker.wake();
    }

    /// Whether no doorbell waits to be taken.
    #[inline]
    pub(crate) fn no_doorbells(&self) -> bool {
        self.doorbells.is_empty()
    }

    /// The engine's first QPN.
    pub(crate) fn qpn_base(&self) -> u32 {
        self.doorbells.qpn_base()
    }

    /// Whether the engine was asked to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Marks the engine done (dropped, or never started).
    pub(crate) fn mark_done(&self) {
        self.done.store(true, Ordering::Release);
    }

    /// Tells the engine that QP `qpn` has new work ([`Doorbells::ring`]).
    #[inline]
    pub(crate) fn ring_doorbell(&self, qpn: u32) {
        if self.doorbells.ring(qpn) {
            self.parker.wake();
        }
    }

    /// The engine's half of [`Self::ring_doorbell`] ([`Doorbells::take`]).
    #[inline]
    pub(crate) fn take_rung(&self) -> Option<usize> {
        self.doorbells.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};

    /// The doorbell protocol between a poster and the engine never loses a
    /// post: the poster posts two work requests back to back (the second
    /// races with the engine taking the first) and waits for both to be
    /// taken; a lost doorbell leaves one in the ring with nobody to take it.
    #[test]
    fn doorbells_are_never_lost() {
        let shared = Arc::new(EngineShared::new(4, QPN_BASE, Arc::default()).unwrap());
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
