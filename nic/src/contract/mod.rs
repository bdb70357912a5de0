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

mod cm;
mod config;
mod doorbell;

pub use cm::*;
pub use config::*;
pub use doorbell::*;

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
