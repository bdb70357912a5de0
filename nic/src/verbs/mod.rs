//! A verbs-like API for programs (docs/design.md §5): a [`Device`] on a DPDK
//! port, memory regions, completion queues and RC queue pairs with
//! `post_send` / `post_recv` / `poll`.
//!
//! The device runs its engine ([`crate::engine`]) on a poll-mode thread
//! (started and stopped in [`crate::device`]); what passes between the two
//! is [`crate::contract`]. The slow path (register, create, connect, destroy) is a request/reply over
//! `crossbeam-channel`; the fast path is lock-free: each QP handle owns the
//! producer end of an SPSC doorbell ring (and rings the engine through a
//! lock-free queue of QP numbers), each CQ handle the consumer end of an SPSC
//! completion ring.
//!
//! The lifecycle is ibverbs': `modify_qp` through RESET, INIT, RTR, RTS
//! and ERR ([`QueuePair::modify_qp`]; `connect` is INIT -> RTS in one
//! call), `destroy_qp` / `destroy_cq` / `dereg_mr` / `dealloc_pd` on the
//! [`Device`] (a CQ or PD still in use is refused, as EBUSY), the same on
//! drop, async events ([`Device::events`]) and a CQ a program can sleep on
//! ([`Device::create_cq_with_channel`]).
//!
//! A whole program (two devices on a ring pair; WRITE, WRITE with
//! immediate, SEND, READ, both ATOMICs, a bad rkey) is
//! `nic/examples/verbs.rs`:
//! `cargo run --release -p nic --example verbs -- --cc hpcc`.
//!
//! ```no_run
//! use nic::verbs::{Device, DeviceConfig, RemoteQp, QpOptions};
//! use rdma::transport::{Access, SendOp, SendWr, Sge};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let eal = dpdk::Eal::for_tests();
//! let (a, b) = dpdk::Port::ring_pair(eal, "doc", 4096)?;
//! let dev_a = Device::open(eal, a, DeviceConfig::new([10, 0, 0, 1]))?;
//! let dev_b = Device::open(eal, b, DeviceConfig::new([10, 0, 0, 2]))?;
//! let src = dev_a.reg_mr(1 << 20, Access::LOCAL_WRITE)?;
//! let dst = dev_b.reg_mr(1 << 20, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
//! let mut cq = dev_a.create_cq(256)?;
//! let cq_b = dev_b.create_cq(256)?;
//! let mut qa = dev_a.create_qp(&cq, &cq, QpOptions::default())?;
//! let mut qb = dev_b.create_qp(&cq_b, &cq_b, QpOptions::default())?;
//! qa.connect(&qb.remote_info())?;
//! qb.connect(&qa.remote_info())?;
//! src.write(0, b"hello, RDMA");
//! qa.post_send(SendWr {
//!     wr_id: 1,
//!     op: SendOp::Write { remote_va: dst.va(), rkey: dst.rkey() },
//!     sge: Sge { addr: src.va(), len: 11, lkey: src.lkey() },
//!     signaled: true,
//!     solicited: false,
//! })?;
//! let wc = cq.wait(std::time::Duration::from_secs(5)).expect("completion");
//! assert_eq!(wc.status, rdma::transport::WcStatus::Success);
//! # Ok(()) }
//! ```

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::bounded;
use dpdk::ExtBuf;
use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{Access, QpState};

use crate::contract::{doorbell_slots, Command, CommandTx, Reply, MAX_HOPS};
pub use crate::contract::{AsyncEvent, DeviceConfig, QpOptions, QpTransition, RemoteQp, UdWr};
use crate::counters::Counters;
pub use crate::device::Device;
pub use crate::error::VerbsError;
use crate::notify::CqNotify;

mod ah;
mod cm;
mod cq;
mod mr;
mod mw;
mod qp;
mod srq;
mod staging;

pub use ah::AddressHandle;
pub(crate) use ah::AhIds;
pub use cm::mtu_of_enum;
pub use cq::{AsyncEvents, CompletionQueue};
use mr::MrInner;
pub use mr::{DeregError, MemoryRegion, SgRef};
pub use mw::{inc_rkey, MemoryWindow};
pub use qp::QueuePair;
pub use srq::{SharedReceiveQueue, SrqAttr};
use staging::Staging;

/// The engine that holds a device's shared receive queues.
const SRQ_SHARD: usize = 0;

/// Bytes a data frame carries besides its payload at most: Ethernet, IPv4,
/// UDP, BTH, RETH, ImmDt, the CC extension header, an INT container of the
/// engine's most hops, and the ICRC.
const FRAME_OVERHEAD_MAX: usize = 14
    + 20
    + 8
    + 12
    + rdma::wire::transport_hdrs::RETH_LEN
    + rdma::wire::transport_hdrs::IMMDT_LEN
    + rdma::wire::ccext::BASE_LEN
    + rdma::wire::int::HEADER_LEN
    + MAX_HOPS * rdma::wire::int::HOP_LEN
    + 4;

impl Device {
    /// How many engines (shards) run this device's QPs.
    pub fn shards(&self) -> usize {
        self.engines.len()
    }

    /// Each engine's counters, by shard (one entry for an unsharded device).
    pub fn shard_counters(&self) -> Vec<Counters> {
        self.engines
            .iter()
            .map(|h| h.shared.counters.snapshot())
            .collect()
    }

    /// The dispatcher's counters, for a sharded device that has one
    /// ([`Self::has_dispatcher`]): frames it dropped on a full shard ring,
    /// and how often it parked.
    pub fn dispatcher_counters(&self) -> Option<Counters> {
        self.dispatcher.as_ref().map(|d| d.counters.snapshot())
    }

    /// The largest RoCE path MTU (256 .. 4096) whose frames, with the
    /// headers, the CC extension and a full INT stack, the port carries
    /// (as `ibv_port_attr.active_mtu` follows the netdev's MTU): 1024 on a
    /// DPDK 22.11 `net_tap`, 4096 on rings and jumbo-capable NICs.
    pub fn max_path_mtu(&self) -> u32 {
        [4096u32, 2048, 1024, 512, 256]
            .into_iter()
            .find(|&m| m as usize + FRAME_OVERHEAD_MAX <= self.max_frame)
            .unwrap_or(256)
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The device's IPv4 address.
    pub fn ip(&self) -> [u8; 4] {
        self.ip
    }

    /// The device's counters (as last published by the engine, at most
    /// about a millisecond old).
    /// (Summed over the shards of a sharded device, with its dispatcher's.)
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for h in &self.engines {
            c.accumulate(&h.shared.counters.snapshot());
        }
        if let Some(d) = &self.dispatcher {
            c.accumulate(&d.counters.snapshot());
        }
        c
    }

    /// A slow-path request to engine `k`.
    fn call<T>(&self, k: usize, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, VerbsError> {
        request(&self.engines[k].cmd, make)
    }

    /// The MAC of the host at `ip` on this port's link, by ARP (from the
    /// cache when known; otherwise this waits for the reply, and fails with
    /// [`crate::contract::EngineError::ArpFailed`] when none comes).
    ///
    /// In host mode (`DeviceConfig::kernel_iface`), from the kernel's
    /// neighbour table instead (crate::host).
    pub fn resolve_mac(&self, ip: [u8; 4]) -> Result<[u8; 6], VerbsError> {
        if let Some(k) = &self.kernel_iface {
            return Ok(k.resolve(ip, crate::host::RESOLVE_TIMEOUT)?);
        }
        self.call(0, |reply| Command::ResolveMac { ip, reply })
    }

    /// Allocates a protection domain (`ibv_alloc_pd`): regions registered
    /// in it can only be used by queue pairs created in it, locally (lkeys)
    /// and remotely (rkeys sent by the peer; a key of another PD is refused
    /// as an invalid key, IBA 10.2.3). [`Device::reg_mr`] and
    /// [`Device::create_qp`] use the device's default PD.
    pub fn alloc_pd(&self) -> ProtectionDomain<'_> {
        ProtectionDomain {
            dev: self,
            id: self.next_pd.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Registers `len` zeroed bytes with `access` in the default PD; the
    /// region's address is its virtual address on the wire (as with
    /// ibverbs, the buffer's pointer).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let mem = ExtBuf::zeroed_pages(len);
        let va = mem.base_ptr() as u64;
        self.reg_mr_in((0, va, mem), len, access, false, None)
    }

    /// Registers `mem` in protection domain `pd` at virtual address `va`
    /// (its own address, or the program's address of a range the engine
    /// reaches through its own mapping, [`crate::shmem`]); `hold` is the
    /// page registry's count of such a range, released after the engines
    /// let go of the region.
    pub(crate) fn reg_mr_in(
        &self,
        (pd, va, mem): (u32, u64, ExtBuf),
        len: usize,
        access: Access,
        caller_memory: bool,
        hold: Option<crate::shmem::Hold>,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = Arc::new(mem);
        let mut inner = MrInner {
            mem,
            va,
            hold,
            lkey: 0,
            rkey: 0,
            len,
            access,
            cmds: Vec::with_capacity(self.engines.len()),
            caller_memory,
        };
        // Every shard knows every region, under the same keys (each shard's
        // table hands out keys in the order of the same requests). A failure
        // drops `inner`, which deregisters from the shards that accepted.
        let mut keys = None;
        for k in 0..self.engines.len() {
            // Shards past the first get a view of the memory with its own
            // reference count, so that shards sending from one region do
            // not all update one atomic per frame (dpdk::ExtBuf::view).
            let m2 = if k == 0 {
                inner.mem.clone()
            } else {
                Arc::new(inner.mem.view())
            };
            let got = self.call(k, |reply| Command::RegMr {
                pd,
                va,
                mem: m2,
                access,
                reply,
            })?;
            (inner.lkey, inner.rkey) = got;
            inner.cmds.push(self.engines[k].cmd.clone());
            if let Some(first) = keys.filter(|&k0| k0 != got) {
                return Err(VerbsError::ShardKeys {
                    shard: k,
                    got,
                    first,
                });
            }
            keys = Some(got);
        }
        Ok(MemoryRegion {
            inner: Arc::new(inner),
        })
    }

    /// Deregisters a region (`ibv_dereg_mr`): once this returns, no work
    /// request or peer can use its keys. Refused while other clones of the
    /// handle exist (the last one's drop deregisters it), and while memory
    /// windows are bound to it ([`DeregError::WindowsBound`], which hands the
    /// region back; IBA 10.6.7.2.6).
    pub fn dereg_mr(&self, mr: MemoryRegion) -> Result<(), DeregError> {
        let lkey = mr.lkey();
        let mut inner = Arc::try_unwrap(mr.inner).map_err(|_| VerbsError::MrShared(lkey))?;
        match inner.deregister(false) {
            Err(VerbsError::Engine(crate::contract::EngineError::MrHasWindows { .. })) => {
                Err(DeregError::WindowsBound(MemoryRegion {
                    inner: Arc::new(inner),
                }))
            }
            r => Ok(r?),
        }
    }

    /// Allocates a memory window of `kind` in the device's default PD
    /// (`ibv_alloc_mw`); [`ProtectionDomain::alloc_mw`] for another PD. Not on a
    /// sharded device (a window must be seen by every shard's QPs alike).
    pub fn alloc_mw(&self, kind: rdma::transport::MwType) -> Result<MemoryWindow, VerbsError> {
        self.alloc_mw_in(0, kind)
    }

    pub(crate) fn alloc_mw_in(
        &self,
        pd: u32,
        kind: rdma::transport::MwType,
    ) -> Result<MemoryWindow, VerbsError> {
        if self.engines.len() > 1 {
            return Err(VerbsError::WindowsSharded);
        }
        let rkey = self.call(0, |reply| Command::AllocMw { pd, kind, reply })?;
        Ok(MemoryWindow {
            rkey,
            pd,
            kind,
            cmd: Some(self.engines[0].cmd.clone()),
        })
    }

    /// Frees a memory window (`ibv_dealloc_mw`), bound or not.
    pub fn dealloc_mw(&self, mut mw: MemoryWindow) -> Result<(), VerbsError> {
        let Some(cmd) = mw.cmd.take() else {
            return Ok(());
        };
        let (pd, rkey) = (mw.pd, mw.rkey);
        request(&cmd, |reply| Command::DeallocMw {
            pd,
            rkey,
            reply: Some(reply),
        })
    }

    /// Creates a completion queue of `depth` entries, polled by the program
    /// ([`CompletionQueue::poll`]).
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, VerbsError> {
        self.create_cq_on(depth, None)
    }

    /// Creates a completion queue of `depth` entries with a completion
    /// channel, so that the program can sleep until a completion arrives
    /// ([`CompletionQueue::wait_blocking`]; `ibv_create_comp_channel` +
    /// `ibv_create_cq`).
    pub fn create_cq_with_channel(&self, depth: usize) -> Result<CompletionQueue, VerbsError> {
        let notify = CqNotify::new().map_err(VerbsError::Channel)?;
        self.create_cq_on(depth, Some(Arc::new(notify)))
    }

    fn create_cq_on(
        &self,
        depth: usize,
        notify: Option<Arc<CqNotify>>,
    ) -> Result<CompletionQueue, VerbsError> {
        let (prod, cons) = rtrb::RingBuffer::new(depth.max(1));
        let shard = self.next_cq.fetch_add(1, Ordering::Relaxed) % self.engines.len();
        let n2 = notify.clone();
        let waiter = Arc::new(crate::park::Parker::new());
        let w2 = waiter.clone();
        let id = self.call(shard, |reply| Command::CreateCq {
            ring: prod,
            notify: n2,
            waiter: w2,
            reply,
        })?;
        Ok(CompletionQueue {
            id,
            shard,
            ring: cons,
            cmd: Some(self.engines[shard].cmd.clone()),
            notify,
            waiter,
            contended_until: None,
            quick_answers: 0,
        })
    }

    /// Destroys a completion queue (`ibv_destroy_cq`). Refused while a QP
    /// completes into it (EBUSY in ibverbs): the handle comes back in the
    /// error. Dropping the handle instead frees the CQ with its last QP.
    // The error hands the CQ back whole (as ibverbs keeps it alive): its
    // size is the handle's, and the slow path has no use for a box.
    #[allow(clippy::result_large_err)]
    pub fn destroy_cq(&self, mut cq: CompletionQueue) -> Result<(), Busy<CompletionQueue>> {
        let (id, cmd) = (cq.id, cq.cmd.clone());
        let r = match &cmd {
            Some(c) => request(c, |reply| Command::DestroyCq {
                cq: id,
                reply: Some(reply),
            }),
            None => Ok(()),
        };
        match r {
            Ok(()) => {
                cq.cmd = None;
                Ok(())
            }
            Err(error) => Err(Busy { handle: cq, error }),
        }
    }

    /// Destroys a queue pair (`ibv_destroy_qp`): its engine slot, timers
    /// and queues are freed at once; work requests in flight are dropped
    /// without completions. Dropping the handle does the same.
    pub fn destroy_qp(&self, mut qp: QueuePair) -> Result<(), VerbsError> {
        let qpn = qp.qpn;
        let cmd = qp.cmd.take().ok_or(VerbsError::EngineGone)?;
        request(&cmd, |reply| Command::DestroyQp {
            qpn,
            reply: Some(reply),
        })
    }

    /// Deallocates a protection domain (`ibv_dealloc_pd`). Refused while a
    /// region or a QP of it exists (EBUSY): the handle comes back.
    pub fn dealloc_pd<'a>(
        &'a self,
        pd: ProtectionDomain<'a>,
    ) -> Result<(), Busy<ProtectionDomain<'a>>> {
        let id = pd.id;
        for k in 0..self.engines.len() {
            if let Err(error) = self.call(k, |reply| Command::DeallocPd { pd: id, reply }) {
                return Err(Busy { handle: pd, error });
            }
        }
        Ok(())
    }

    /// The device's async events (`ibv_get_async_event`): a QP that went to
    /// ERR on its own, a full CQ, the port's link going down or up.
    pub fn events(&self) -> AsyncEvents {
        AsyncEvents {
            engines: self.engines.iter().map(|h| h.shared.clone()).collect(),
        }
    }

    /// Creates a shared receive queue (`ibv_create_srq`) of `max_wr` WQEs of
    /// up to `max_sge` SGEs in the default PD; QPs receive from it with
    /// `QpOptions::srq` (on a sharded device, QPs of the first shard).
    pub fn create_srq(&self, max_wr: u16, max_sge: u8) -> Result<SharedReceiveQueue, VerbsError> {
        self.create_srq_in(0, max_wr, max_sge)
    }

    fn create_srq_in(
        &self,
        pd: u32,
        max_wr: u16,
        max_sge: u8,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        if usize::from(max_sge) > MAX_SGE || max_sge == 0 || max_wr == 0 {
            return Err(VerbsError::TooManySges {
                given: max_sge.into(),
                max: MAX_SGE,
            });
        }
        let (prod, cons) =
            rtrb::RingBuffer::new(usize::from(max_wr) * doorbell_slots(max_sge.into()));
        let e = &self.engines[SRQ_SHARD];
        let id = self.call(SRQ_SHARD, |reply| Command::CreateSrq {
            pd,
            depth: max_wr,
            max_sge,
            ring: cons,
            reply,
        })?;
        Ok(SharedReceiveQueue {
            id,
            ring: prod,
            shared: e.shared.clone(),
            cmd: Some(e.cmd.clone()),
            max_sge,
        })
    }

    /// Creates an RC queue pair in the default PD, completing into
    /// `send_cq` and `recv_cq`. It stays in INIT until
    /// [`QueuePair::connect`].
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: QpOptions,
    ) -> Result<QueuePair, VerbsError> {
        self.create_qp_in(0, send_cq, recv_cq, opts)
    }

    fn create_qp_in(
        &self,
        pd: u32,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: QpOptions,
    ) -> Result<QueuePair, VerbsError> {
        if send_cq.shard != recv_cq.shard {
            return Err(VerbsError::CqShards {
                send: send_cq.shard,
                recv: recv_cq.shard,
            });
        }
        let shard = send_cq.shard;
        if opts.srq.is_some() && shard != SRQ_SHARD {
            // SRQs live on the first engine (Self::create_srq).
            return Err(VerbsError::CqShards {
                send: shard,
                recv: SRQ_SHARD,
            });
        }
        let staging = match Staging::region_len(&opts) {
            0 => None,
            n => {
                let mem = ExtBuf::zeroed_pages(n);
                let va = mem.base_ptr() as u64;
                let mr = self.reg_mr_in((pd, va, mem), n, Staging::ACCESS, false, None)?;
                Some(Staging::new(mr, &opts))
            }
        };
        for n in [opts.max_send_sge, opts.max_recv_sge] {
            if usize::from(n) > MAX_SGE {
                return Err(VerbsError::TooManySges {
                    given: n.into(),
                    max: MAX_SGE,
                });
            }
        }
        // Room for both queues full of requests with the most SGEs each
        // (a request with several takes several slots: contract::Doorbell::Sges).
        let depth = opts.sq_depth as usize * doorbell_slots(opts.max_send_sge.into())
            + opts.rq_depth as usize * doorbell_slots(opts.max_recv_sge.into());
        let (prod, cons) = rtrb::RingBuffer::new(depth.max(2));
        let (send_cq, recv_cq) = (send_cq.id, recv_cq.id);
        let (qpn, psn) = self.call(shard, |reply| Command::CreateQp {
            pd,
            send_cq,
            recv_cq,
            opts,
            ring: cons,
            reply,
        })?;
        Ok(QueuePair {
            qpn,
            psn,
            opts,
            ring: prod,
            shared: self.engines[shard].shared.clone(),
            cmd: Some(self.engines[shard].cmd.clone()),
            resolver: self.engines[0].cmd.clone(),
            kernel_iface: self.kernel_iface.clone(),
            mac: self.mac,
            ip: self.ip,
            state: QpState::Init,
            staging,
            peer_loss_recovery: rdma::transport::LossRecovery::Gbn,
        })
    }
}

/// A protection domain of a [`Device`] ([`Device::alloc_pd`]): what it
/// registers and creates is isolated from other PDs' keys.
pub struct ProtectionDomain<'a> {
    dev: &'a Device,
    id: u32,
}

impl ProtectionDomain<'_> {
    /// Its number (0 is the device's default PD).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        self.dev
    }

    /// Allocates a memory window of `kind` in this PD ([`Device::alloc_mw`]).
    pub fn alloc_mw(&self, kind: rdma::transport::MwType) -> Result<MemoryWindow, VerbsError> {
        self.dev.alloc_mw_in(self.id, kind)
    }

    /// Registers `len` zeroed bytes with `access` in this PD
    /// ([`Device::reg_mr`]).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let mem = ExtBuf::zeroed_pages(len);
        let va = mem.base_ptr() as u64;
        self.dev
            .reg_mr_in((self.id, va, mem), len, access, false, None)
    }

    /// Creates an RC queue pair in this PD ([`Device::create_qp`]): it may
    /// only use regions of this PD.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        opts: QpOptions,
    ) -> Result<QueuePair, VerbsError> {
        self.dev.create_qp_in(self.id, send_cq, recv_cq, opts)
    }

    /// Creates a shared receive queue in this PD ([`Device::create_srq`]).
    pub fn create_srq(&self, max_wr: u16, max_sge: u8) -> Result<SharedReceiveQueue, VerbsError> {
        self.dev.create_srq_in(self.id, max_wr, max_sge)
    }
}

/// A destroy the engine refused because the object is still in use
/// (ibverbs' EBUSY); the handle comes back so the program can keep using
/// it or try again.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct Busy<T> {
    /// The handle, still valid.
    pub handle: T,
    /// Why.
    #[source]
    pub error: VerbsError,
}

impl<T> std::fmt::Debug for Busy<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Busy").field("error", &self.error).finish()
    }
}

impl<T> From<Busy<T>> for VerbsError {
    fn from(b: Busy<T>) -> Self {
        b.error
    }
}

/// Sends an engine the command `make` builds around a reply channel and
/// waits for the reply (the slow path, docs/design.md §5).
fn request<T>(cmd: &CommandTx, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, VerbsError> {
    let (tx, rx) = bounded(1);
    cmd.send(make(tx)).map_err(|_| VerbsError::EngineGone)?;
    Ok(rx.recv().map_err(|_| VerbsError::EngineGone)??)
}

pub use crate::park::SPIN_BEFORE_PARK;

/// The scheduler slice [`wake_quickly`] asks for: EEVDF's shortest.
const QUICK_SLICE_NS: u64 = 100_000;

/// Asks the kernel to run the calling thread as soon as it is woken, also
/// when a CPU-bound thread holds its core: a scheduler slice of 0.1 ms
/// (Linux 6.12+; older kernels ignore it; nice is kept). For a thread that
/// waits in [`CompletionQueue::wait`] on a core it shares: woken by the
/// engine, it would otherwise wait for its neighbour's slice (~3 ms) to
/// end. Its timed sleeps ([`wait_until`]'s between polls) oversleep by
/// 1 us at most instead of Linux's default 50 us (`PR_SET_TIMERSLACK`).
/// Engine threads that park (`DeviceConfig::idle_yield`) do this
/// themselves. Whether the kernel took the slice.
pub fn wake_quickly() -> bool {
    crate::sys::set_timer_slack_ns(crate::park::PARK_TIMER_SLACK_NS);
    crate::sys::set_slice_ns(QUICK_SLICE_NS)
}

/// The longest sleep of [`wait_until`] between two polls once it stops
/// spinning: what it can wait on has no waker it can park on.
const POLL_SLEEP: Duration = Duration::from_micros(20);

/// Calls `poll` until it returns something or `timeout` has passed: busy
/// for [`SPIN_BEFORE_PARK`], then sleeping `POLL_SLEEP` between polls
/// (on a host with fewer cores than busy threads, whoever shares the core
/// runs meanwhile; `sched_yield` would hand it a whole scheduler slice),
/// and sleeping from the start while it runs on an engine's CPU
/// ([`on_an_engine_cpu`], asked at each look at the clock, every 64 polls):
/// what it waits for is an engine's work (the last byte of a peer's WRITE
/// landing, which perftest's write_lat polls; completions on several CQs),
/// and a spin there only keeps that engine from it. For a condition
/// nothing wakes; [`CompletionQueue::wait`] parks on its CQ instead, and
/// wakes as soon as the completion is there.
pub fn wait_until<T>(timeout: Duration, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let end = start + timeout;
    let spin_end = start + SPIN_BEFORE_PARK;
    loop {
        for _ in 0..64 {
            if let Some(v) = poll() {
                return Some(v);
            }
            std::hint::spin_loop();
        }
        let now = Instant::now();
        if now >= end {
            return None;
        }
        if now >= spin_end || on_an_engine_cpu() {
            std::thread::sleep(POLL_SLEEP.min(end - now));
        }
    }
}

/// Whether the calling thread runs on the CPU of an engine thread of this
/// process ([`CompletionQueue::on_engine_cpu`]), where a wait for an
/// engine's work should not spin.
pub fn on_an_engine_cpu() -> bool {
    crate::sys::current_cpu().is_some_and(crate::park::an_engine_runs_on)
}
