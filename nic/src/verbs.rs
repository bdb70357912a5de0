//! A verbs-like API for programs (DESIGN.md §5): a [`Device`] on a DPDK
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

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cc::CcKind;
use crossbeam_channel::{bounded, Receiver, Sender};
use dpdk::ExtBuf;
use rdma::transport::{Access, QpState, RecvWr, SendOp, SendWr, Sge, WorkCompletion};

pub use crate::contract::{AsyncEvent, DeviceConfig, QpOptions, QpTransition, RemoteQp};
use crate::contract::{Command, Doorbell, EngineError, EngineShared, Reply, MAX_HOPS};
use crate::counters::Counters;
use crate::device::CaptureWriter;
use crate::notify::CqNotify;
use crate::staging::{Part, Staging};

/// Errors of the verbs API.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// A DPDK call failed.
    #[error(transparent)]
    Dpdk(#[from] dpdk::Error),
    /// The engine thread is gone.
    #[error("the device's engine has stopped")]
    EngineGone,
    /// The engine refused a request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The ring towards the engine is full: wait for completions.
    #[error("send queue full")]
    QueueFull,
    /// The QP's state does not accept this work request (sends need RTS,
    /// receives INIT or later; `connect` or `modify_qp` first).
    #[error("QP {qpn:#x} is in {state:?}: post sends in RTS, receives from INIT on")]
    NotReady {
        /// The QP.
        qpn: u32,
        /// Its state.
        state: QpState,
    },
    /// `dereg_mr` on a region another clone of the handle still uses.
    #[error(
        "memory region {0:#x} has other handles (drop them, or let the last one deregister it)"
    )]
    MrShared(u32),
    /// `reg_mr` over no memory (a null pointer or zero length).
    #[error("a memory region needs a non-null address and a length above 0")]
    EmptyRegion,
    /// More SGEs than the QP was created for (`QpOptions::max_sge`).
    #[error("{given} SGEs, the QP takes at most {max} (QpOptions::max_sge)")]
    TooManySges {
        /// SGEs in the work request.
        given: usize,
        /// The QP's limit.
        max: usize,
    },
    /// An inline or gathered payload longer than the QP's staging slot
    /// (`QpOptions::max_inline_data` / `max_gather_bytes`).
    #[error("{len} bytes to copy at post time, the QP takes at most {max}")]
    TooLong {
        /// The payload's length.
        len: usize,
        /// The QP's limit.
        max: usize,
    },
    /// READ and ATOMIC scatter into their local buffer: they take one SGE.
    #[error("an inline or multi-SGE work request must be a SEND or a WRITE")]
    NotGatherable,
    /// An SGE outside its region.
    #[error("an SGE lies outside its memory region")]
    OutsideRegion,
    /// The completion channel's eventfd failed.
    #[error("completion channel: {0}")]
    Channel(#[source] std::io::Error),
    /// The two ends of a QP chose different congestion controls.
    #[error("congestion control mismatch: local {local}, remote {remote}")]
    CcMismatch {
        /// This QP's.
        local: CcKind,
        /// The peer's.
        remote: CcKind,
    },
    /// A QP's send and receive CQs live on different shards.
    #[error(
        "the send CQ is on shard {send} and the receive CQ on shard {recv}: a QP's CQs must \
         be on one shard (CQs are spread over the shards in creation order)"
    )]
    CqShards {
        /// The send CQ's shard.
        send: usize,
        /// The receive CQ's shard.
        recv: usize,
    },
    /// Two shards registered one region under different keys.
    #[error("shard {shard} registered the region under other keys ({got:?} vs {first:?})")]
    ShardKeys {
        /// The shard.
        shard: usize,
        /// Its (lkey, rkey).
        got: (u32, u32),
        /// Shard 0's.
        first: (u32, u32),
    },
    /// `open_sharded` with no shard.
    #[error("a sharded device needs at least one shard")]
    NoShards,
    /// `open_sharded` with a capture file.
    #[error("pcap capture is per engine: open the device unsharded to capture")]
    ShardedCapture,
    /// The port was configured without an RX or a TX queue.
    #[error("the port has no queue")]
    PortWithoutQueue,
    /// A thread of the device could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The capture file could not be created or written.
    #[error("capture file {}: {source}", path.display())]
    Capture {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

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

/// One engine of a device: how the API reaches it.
pub(crate) struct EngineHandle {
    pub(crate) shared: Arc<EngineShared>,
    pub(crate) cmd: Sender<Command>,
}

/// A RoCEv2 NIC on one DPDK port, with its engine running (or, sharded,
/// its engines and their dispatcher: [`Device::open_sharded`]). Started
/// and stopped in [`crate::device`].
pub struct Device {
    /// The engines: one, or one per shard (shard `k` owns the QPNs from
    /// [`crate::shard::shard_base`]`(k)`).
    pub(crate) engines: Vec<EngineHandle>,
    /// A sharded device's dispatcher (its stop/done flags and counters).
    pub(crate) dispatcher: Option<Arc<EngineShared>>,
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
    /// The shard of the next completion queue (round robin).
    pub(crate) next_cq: AtomicUsize,
    pub(crate) capture: Option<CaptureWriter>,
    pub(crate) mac: [u8; 6],
    pub(crate) ip: [u8; 4],
    /// The next protection domain number ([`Device::alloc_pd`]).
    pub(crate) next_pd: AtomicU32,
    /// The longest frame the port carries.
    pub(crate) max_frame: usize,
}

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
        let mem = ExtBuf::new(vec![0u8; len.max(1)].into_boxed_slice());
        self.reg_mr_in(0, mem, len, access, false)
    }

    /// Registers the caller's memory, `len` bytes at `addr`, with `access`
    /// in the default PD (`ibv_reg_mr` over a buffer the program owns): the
    /// engine sends from it without copying and places received data into
    /// it, so its virtual address is `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be valid for reads and writes from now until
    /// the region is deregistered: [`Device::dereg_mr`] or the drop of its
    /// last handle, which return only once the engine no longer uses the
    /// memory and no frame in flight refers to it (they wait for such
    /// frames to be freed). While registered, the engine (another thread)
    /// reads and writes these bytes, as a NIC's DMA does: the program must
    /// not hold Rust references over bytes an operation in flight uses.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        if addr.is_null() || len == 0 {
            return Err(VerbsError::EmptyRegion);
        }
        // SAFETY: the caller's contract above is `from_raw`'s.
        let mem = unsafe { ExtBuf::from_raw(addr, len) };
        self.reg_mr_in(0, mem, len, access, true)
    }

    fn reg_mr_in(
        &self,
        pd: u32,
        mem: ExtBuf,
        len: usize,
        access: Access,
        caller_memory: bool,
    ) -> Result<MemoryRegion, VerbsError> {
        let mem = Arc::new(mem);
        let mut inner = MrInner {
            mem,
            lkey: 0,
            rkey: 0,
            len,
            cmds: Vec::with_capacity(self.engines.len()),
            caller_memory,
        };
        // Every shard knows every region, under the same keys (each shard's
        // table hands out keys in the order of the same requests). A failure
        // drops `inner`, which deregisters from the shards that accepted.
        let mut keys = None;
        for k in 0..self.engines.len() {
            let m2 = inner.mem.clone();
            let got = self.call(k, |reply| Command::RegMr {
                pd,
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
    /// handle exist (the last one's drop deregisters it).
    pub fn dereg_mr(&self, mr: MemoryRegion) -> Result<(), VerbsError> {
        let lkey = mr.lkey();
        let mut inner = Arc::try_unwrap(mr.inner).map_err(|_| VerbsError::MrShared(lkey))?;
        inner.deregister()
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
        let id = self.call(shard, |reply| Command::CreateCq {
            ring: prod,
            notify: n2,
            reply,
        })?;
        Ok(CompletionQueue {
            id,
            shard,
            ring: cons,
            cmd: Some(self.engines[shard].cmd.clone()),
            notify,
        })
    }

    /// Destroys a completion queue (`ibv_destroy_cq`). Refused while a QP
    /// completes into it (EBUSY in ibverbs): the handle comes back in the
    /// error. Dropping the handle instead frees the CQ with its last QP.
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
            rx: self
                .engines
                .iter()
                .map(|h| h.shared.events.1.clone())
                .collect(),
        }
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
        let staging = match Staging::region_len(&opts) {
            0 => None,
            n => {
                let mem = ExtBuf::new(vec![0u8; n].into_boxed_slice());
                let mr = self.reg_mr_in(pd, mem, n, Staging::ACCESS, false)?;
                Some(Staging::new(mr, &opts))
            }
        };
        let depth = opts.sq_depth as usize + opts.rq_depth as usize;
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
            mac: self.mac,
            ip: self.ip,
            state: QpState::Init,
            staging,
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

    /// Registers `len` zeroed bytes with `access` in this PD
    /// ([`Device::reg_mr`]).
    pub fn reg_mr(&self, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let mem = ExtBuf::new(vec![0u8; len.max(1)].into_boxed_slice());
        self.dev.reg_mr_in(self.id, mem, len, access, false)
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
}

/// A registered memory region. Its bytes are shared with the engine, like a
/// real NIC's DMA memory: do not change bytes an operation in flight uses.
/// Clones share the registration; the last one's drop deregisters it
/// (or [`Device::dereg_mr`]).
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<MrInner>,
}

/// The registration behind the clones of a [`MemoryRegion`].
struct MrInner {
    mem: Arc<ExtBuf>,
    lkey: u32,
    rkey: u32,
    len: usize,
    /// The engines it is registered with (emptied once deregistered).
    cmds: Vec<Sender<Command>>,
    /// The caller's memory ([`Device::reg_user_mr`]): deregistering waits
    /// until nothing uses it any more.
    caller_memory: bool,
}

impl MrInner {
    /// Deregisters from every engine and, for the caller's memory, waits
    /// until no frame in flight refers to it.
    fn deregister(&mut self) -> Result<(), VerbsError> {
        let mut result = Ok(());
        for cmd in self.cmds.drain(..) {
            let lkey = self.lkey;
            let r = request(&cmd, |reply| Command::DeregMr {
                lkey,
                reply: Some(reply),
            });
            result = result.and(r);
        }
        if self.caller_memory {
            // The engines dropped their references; frames sent zero-copy
            // hold one each until the driver frees them.
            while self.mem.refs() != 1 {
                std::thread::yield_now();
            }
        }
        result
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if self.caller_memory {
            let _ = self.deregister();
        } else {
            // The engine keeps the memory alive while frames use it.
            for cmd in self.cmds.drain(..) {
                let _ = cmd.send(Command::DeregMr {
                    lkey: self.lkey,
                    reply: None,
                });
            }
        }
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    /// Virtual address of byte 0 (what goes into a RETH).
    pub fn va(&self) -> u64 {
        self.inner.mem.base_ptr() as u64
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Copies `data` into the region at `offset`. Panics if out of range.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.inner.len),
            "write outside the region"
        );
        // SAFETY: in range of memory we keep alive; concurrent engine access
        // to the same bytes is the caller's race, as with hardware DMA.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.inner.mem.base_ptr().add(offset),
                data.len(),
            )
        }
    }

    /// Copies `len` bytes at `src_offset` of `src` into this region at
    /// `offset` (regions may be the same; ranges are checked).
    pub(crate) fn copy_from(
        &self,
        offset: usize,
        src: &MemoryRegion,
        src_offset: usize,
        len: usize,
    ) -> Result<(), VerbsError> {
        let fits = |o: usize, r: &MemoryRegion| o.checked_add(len).is_some_and(|e| e <= r.len());
        if !fits(offset, self) || !fits(src_offset, src) {
            return Err(VerbsError::OutsideRegion);
        }
        // SAFETY: both ranges are inside memory the handles keep alive;
        // `copy` allows overlap. Concurrent engine access to the same
        // bytes is the caller's race, as with hardware DMA (see `write`).
        unsafe {
            std::ptr::copy(
                src.inner.mem.base_ptr().add(src_offset),
                self.inner.mem.base_ptr().add(offset),
                len,
            )
        }
        Ok(())
    }

    /// Copies bytes at `offset` out of the region. Panics if out of range.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|e| e <= self.inner.len),
            "read outside the region"
        );
        // SAFETY: as in `write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.inner.mem.base_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }
}

/// One element of a gather list ([`QueuePair::post_send_sgl`]): `len`
/// bytes at `offset` of a registered region (an `ibv_sge` with its region
/// instead of the region's lkey).
#[derive(Clone, Copy)]
pub struct SgRef<'a> {
    /// The region.
    pub mr: &'a MemoryRegion,
    /// Offset of the first byte in the region.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

impl SgRef<'_> {
    /// The element as a work request's SGE, checked against its region.
    fn sge(&self) -> Result<Sge, VerbsError> {
        let inside = matches!(self.offset.checked_add(self.len), Some(e) if e <= self.mr.len());
        if !inside || self.len > u32::MAX as usize {
            return Err(VerbsError::OutsideRegion);
        }
        Ok(Sge {
            addr: self.mr.va() + self.offset as u64,
            len: self.len as u32,
            lkey: self.mr.lkey(),
        })
    }
}

/// A completion queue: the consumer end of the engine's completion ring.
/// Dropping it destroys the CQ (with its last QP, if QPs still use it).
pub struct CompletionQueue {
    id: u32,
    /// The engine (shard) that completes into it.
    shard: usize,
    ring: rtrb::Consumer<WorkCompletion>,
    /// The engine's command channel (None once destroyed).
    cmd: Option<Sender<Command>>,
    /// The completion channel ([`Device::create_cq_with_channel`]).
    notify: Option<Arc<CqNotify>>,
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DestroyCq {
                cq: self.id,
                reply: None,
            });
        }
    }
}

impl CompletionQueue {
    /// The CQ's number on its engine (ids of destroyed CQs are reused).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll(&mut self, out: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.ring.pop() {
                Ok(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }

    /// Takes one completion, if any.
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        self.ring.pop().ok()
    }

    /// Polls for one completion for at most `timeout`: busy for a short
    /// while, then yielding the CPU between polls (on a host with fewer cores
    /// than spinning threads, the engine needs it to make progress).
    pub fn wait(&mut self, timeout: Duration) -> Option<WorkCompletion> {
        wait_until(timeout, || self.poll_one())
    }

    /// Asks the engine to signal the completion channel at the next
    /// completion (`ibv_req_notify_cq`); false without a channel.
    pub fn req_notify(&self) -> bool {
        self.notify.as_ref().inspect(|n| n.arm()).is_some()
    }

    /// Takes one completion, sleeping in the kernel (not spinning) until
    /// one arrives or `timeout` passes: poll, arm, poll again, sleep on the
    /// completion channel (`ibv_get_cq_event`). Without a channel
    /// ([`Device::create_cq`]) it falls back to [`Self::wait`].
    pub fn wait_blocking(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        let Some(notify) = self.notify.clone() else {
            return Ok(self.wait(timeout));
        };
        let end = Instant::now() + timeout;
        loop {
            if let Some(wc) = self.poll_one() {
                return Ok(Some(wc));
            }
            notify.arm();
            // A completion that came before the arm does not signal.
            if let Some(wc) = self.poll_one() {
                return Ok(Some(wc));
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            notify.wait(Some(left)).map_err(VerbsError::Channel)?;
        }
    }

    /// The completion channel's eventfd, for a program that waits in its
    /// own `epoll` (arm with [`Self::req_notify`] first).
    pub fn channel_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.notify.as_ref().map(|n| n.as_raw_fd())
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

/// A device's async event queue ([`Device::events`]), one per engine
/// (shard) of the device, read as one.
pub struct AsyncEvents {
    rx: Vec<Receiver<AsyncEvent>>,
}

impl AsyncEvents {
    /// The next event, if one is queued.
    pub fn try_next(&self) -> Option<AsyncEvent> {
        self.rx.iter().find_map(|r| r.try_recv().ok())
    }

    /// Waits up to `timeout` for the next event (`ibv_get_async_event`).
    pub fn next_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        let mut sel = crossbeam_channel::Select::new();
        for r in &self.rx {
            sel.recv(r);
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let op = sel.select_timeout(left).ok()?;
            let i = op.index();
            if let Ok(ev) = op.recv(&self.rx[i]) {
                return Some(ev);
            }
            // That engine is gone; wait on the others.
            sel.remove(i);
        }
    }
}

/// An RC queue pair handle: posts work requests to the engine.
pub struct QueuePair {
    qpn: u32,
    psn: u32,
    opts: QpOptions,
    ring: rtrb::Producer<Doorbell>,
    shared: Arc<EngineShared>,
    /// The engine's command channel (None once destroyed).
    cmd: Option<Sender<Command>>,
    mac: [u8; 6],
    ip: [u8; 4],
    /// The state the program last moved it to (the engine may have moved
    /// it to ERR since; work posted then completes with WR_FLUSH_ERR).
    state: QpState,
    /// Where inline and multi-SGE sends are copied at post time.
    staging: Option<Staging>,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DestroyQp {
                qpn: self.qpn,
                reply: None,
            });
        }
    }
}

impl QueuePair {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the peer needs to connect to this QP.
    pub fn remote_info(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            ip: self.ip,
            mac: Some(self.mac),
            mtu: self.opts.mtu,
            cc: self.opts.cc,
        }
    }

    /// Moves the QP from INIT to RTR and RTS towards `remote` in one call
    /// (IBA 10.3: INIT -> RTR needs the peer's QPN, PSN and path; RTR ->
    /// RTS our send PSN), the shortcut for [`Self::modify_qp`] twice. The
    /// MTU used is the smaller of the two; the CC kinds must match.
    pub fn connect(&mut self, remote: &RemoteQp) -> Result<(), VerbsError> {
        self.check_cc(remote)?;
        let (qpn, remote) = (self.qpn, *remote);
        self.request(|reply| Command::Connect { qpn, remote, reply })?;
        self.state = QpState::Rts;
        Ok(())
    }

    fn check_cc(&self, remote: &RemoteQp) -> Result<(), VerbsError> {
        if remote.cc != self.opts.cc {
            return Err(VerbsError::CcMismatch {
                local: self.opts.cc,
                remote: remote.cc,
            });
        }
        Ok(())
    }

    /// Moves the QP to another state (`ibv_modify_qp`), as IBA 10.3.1
    /// allows: RESET -> INIT -> RTR (towards a peer) -> RTS, any state to
    /// ERR (its outstanding work completes with `WR_FLUSH_ERR`, and so does
    /// work posted later) and to RESET (its work is dropped; it can go to
    /// INIT again and be reused). A QP is created in INIT (as
    /// `rdma_create_qp` leaves it).
    pub fn modify_qp(&mut self, to: QpTransition) -> Result<(), VerbsError> {
        if let QpTransition::Rtr(remote) = &to {
            self.check_cc(remote)?;
        }
        let qpn = self.qpn;
        self.request(|reply| Command::ModifyQp { qpn, to, reply })?;
        self.state = match to {
            QpTransition::Reset => QpState::Reset,
            QpTransition::Init => QpState::Init,
            QpTransition::Rtr(_) => QpState::Rtr,
            QpTransition::Rts => QpState::Rts,
            QpTransition::Err => QpState::Err,
        };
        Ok(())
    }

    fn request<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, VerbsError> {
        request(self.cmd.as_ref().ok_or(VerbsError::EngineGone)?, make)
    }

    /// The QP's state as the engine sees it.
    pub fn state(&self) -> Result<QpState, VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::QueryQp { qpn, reply })
    }

    /// One line describing the QP's transport, scheduler and timer state
    /// (like `rdma resource show qp -d`): for diagnosing a QP that does not
    /// progress.
    pub fn describe(&self) -> Result<String, VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::DescribeQp { qpn, reply })
    }

    fn ring(&mut self, d: Doorbell) -> Result<(), VerbsError> {
        self.ring.push(d).map_err(|_| VerbsError::QueueFull)?;
        self.shared.ring_doorbell(self.qpn);
        Ok(())
    }

    /// Posts a send work request (SEND, WRITE, READ, ATOMIC; see
    /// [`rdma::transport::SendOp`]). Errors found by the engine (a bad lkey,
    /// a full send queue) come back as error completions.
    /// In ERR, it completes with `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), VerbsError> {
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(self.not_ready());
        }
        self.ring(Doorbell::Send(wr))
    }

    /// Posts a receive buffer for an incoming SEND (from INIT on, as in
    /// verbs, so before `connect` too; in ERR it completes with
    /// `WR_FLUSH_ERR`).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.state == QpState::Reset {
            return Err(self.not_ready());
        }
        self.ring(Doorbell::Recv(wr))
    }

    /// Posts a SEND or WRITE that gathers its payload from several SGEs
    /// (`ibv_send_wr` with `num_sge` up to `QpOptions::max_sge`), in order.
    /// One SGE is sent zero-copy like [`Self::post_send`]; several are
    /// gathered into the QP's staging memory now (up to
    /// `QpOptions::max_gather_bytes`), so the regions may change as soon as
    /// this returns.
    pub fn post_send_sgl(
        &mut self,
        wr_id: u64,
        op: SendOp,
        sgl: &[SgRef<'_>],
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let max = usize::from(self.opts.max_sge.max(1));
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        let sge = match sgl {
            [one] => one.sge()?,
            _ => {
                for r in sgl {
                    r.sge()?;
                }
                self.stage(op, sgl.iter().map(|r| Part::Region(r.mr, r.offset, r.len)))?
            }
        };
        self.post_send(SendWr {
            wr_id,
            op,
            sge,
            signaled,
            solicited: false,
        })
    }

    /// Posts a SEND or WRITE of `data`, copied now (`IBV_SEND_INLINE`: no
    /// registered memory, no lkey; at most `QpOptions::max_inline_data`
    /// bytes).
    pub fn post_send_inline(
        &mut self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let max = self.opts.max_inline_data as usize;
        if data.len() > max {
            return Err(VerbsError::TooLong {
                len: data.len(),
                max,
            });
        }
        let sge = self.stage(op, [Part::Bytes(data)])?;
        self.post_send(SendWr {
            wr_id,
            op,
            sge,
            signaled,
            solicited: false,
        })
    }

    fn stage<'a>(
        &mut self,
        op: SendOp,
        parts: impl IntoIterator<Item = Part<'a>>,
    ) -> Result<Sge, VerbsError> {
        if op.needs_response() {
            return Err(VerbsError::NotGatherable);
        }
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(self.not_ready());
        }
        let max = Staging::slot_bytes(&self.opts);
        let staging = self
            .staging
            .as_mut()
            .ok_or(VerbsError::TooLong { len: 1, max })?;
        staging.stage(parts)
    }

    fn not_ready(&self) -> VerbsError {
        VerbsError::NotReady {
            qpn: self.qpn,
            state: self.state,
        }
    }

    /// Free slots in the doorbell ring.
    pub fn free_slots(&self) -> usize {
        self.ring.slots()
    }
}

/// Sends an engine the command `make` builds around a reply channel and
/// waits for the reply (the slow path, DESIGN.md §5).
fn request<T>(
    cmd: &Sender<Command>,
    make: impl FnOnce(Reply<T>) -> Command,
) -> Result<T, VerbsError> {
    let (tx, rx) = bounded(1);
    cmd.send(make(tx)).map_err(|_| VerbsError::EngineGone)?;
    Ok(rx.recv().map_err(|_| VerbsError::EngineGone)??)
}

/// Calls `poll` until it returns something or `timeout` has passed: busy
/// for a short while, then yielding the CPU between polls (on a host with
/// fewer cores than spinning threads, the engine needs it to make progress).
/// [`CompletionQueue::wait`] is this over one CQ; a program polling several
/// CQs can use it the same way.
pub fn wait_until<T>(timeout: Duration, mut poll: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    let mut spins = 0u32;
    loop {
        if let Some(v) = poll() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        // Spin briefly (a PAUSE is ~40-140 cycles), then let a thread
        // that shares this core run (e.g. the peer of a ping-pong).
        spins = spins.saturating_add(1);
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
