//! librdmacm's public API over rsnic's own IB CM (issue 41 item 3): `rdma_create_id`,
//! `rdma_resolve_addr`, `rdma_connect`, `rdma_listen`, `rdma_accept`, event channels
//! and the rest of rdma-core's `librdmacm.map` that programs call (symbols.txt), so
//! that rping, ucmatose, udaddy, `rdma_server`/`rdma_client` and perftest's `-R` run
//! unmodified under `rsnic-exec`.
//!
//! Why our own: the real librdmacm talks to the kernel's `/dev/infiniband/rdma_cm`,
//! which a user-space NIC does not have. The protocol on the wire stays the kernel's:
//! REQ/REP/RTU, REJ, DREQ/DREP and SIDR on QP 1 (`rdma::cm`, the engine's GSI), with
//! rdma_cm's service IDs and `cma_hdr` (`rdma::wire::cm`), so an rsnic program and a
//! program on Linux rxe or a hardware RoCE NIC connect through rdma_cm either way.
//!
//! Shape, as librdmacm over the kernel's `ucma`:
//! - an **event channel** is an eventfd (its `fd`, pollable, blocking unless the
//!   program sets `O_NONBLOCK` on it) and a queue of events; the eventfd is readable
//!   while the queue is not empty;
//! - a **cm_id** is a `rdma_cm_id` the program reads (`verbs`, `qp`, `route`, ...)
//!   and its state here ([`IdState`]), keyed by the id's address;
//! - one thread of ours (`rsnic-cm`, every signal blocked) sleeps on the engine's CM
//!   eventfd (`nic::verbs::Device::cm_notifier`), takes the engine's CM events and
//!   turns each into librdmacm's event on the right id's channel, moving the id's
//!   QP to RTR/RTS when a REP arrives as the kernel's rdma_cm does;
//! - a **synchronous** id (created without a channel, `rdma_create_ep`) gets a
//!   private channel, and each asynchronous call waits for its event
//!   (librdmacm's `ucma_complete`).
//!
//! Every state change happens under one mutex ([`STATE`]): the control path only.

mod addr;
mod calls;
mod conn;
mod events;
mod qp;

pub(crate) use calls::*;
pub(crate) use conn::*;
pub(crate) use events::*;
pub(crate) use qp::*;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

use rdma::wire::cm::SidrReq;

use crate::ffi::*;

/// Where an id stands (librdmacm's view; the connection's own state is the
/// engine's `rdma::cm::Cm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Created.
    Idle,
    /// `rdma_bind_addr` done.
    Bound,
    /// ADDR_RESOLVED delivered.
    AddrResolved,
    /// ROUTE_RESOLVED delivered.
    RouteResolved,
    /// `rdma_listen` done.
    Listening,
    /// Active: REQ (or SIDR_REQ) sent.
    Connecting,
    /// Active: REP came, no QP on the id: `rdma_establish` sends the RTU.
    RepReceived,
    /// Passive: a REQ came (CONNECT_REQUEST delivered).
    ReqReceived,
    /// Passive: REP sent, waiting for the RTU.
    Accepting,
    /// ESTABLISHED.
    Connected,
    /// DISCONNECTED delivered (or about to be).
    Disconnected,
}

/// What the peer's REQ or REP said about its QP (for RTR/RTS and the events).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerQp {
    /// Its QPN.
    pub qpn: u32,
    /// Its first PSN.
    pub psn: u32,
    /// READs/atomics it accepts at once.
    pub responder_resources: u8,
    /// READs/atomics it issues at once.
    pub initiator_depth: u8,
    /// Transport retry count it asked for (REQ).
    pub retry_count: u8,
    /// RNR retry count it asked for.
    pub rnr_retry_count: u8,
    /// Path MTU (`enum ibv_mtu`).
    pub path_mtu: u8,
    /// Local ACK timeout of the path (REQ).
    pub ack_timeout: u8,
}

/// A passive id's SIDR_REQ, kept for `rdma_accept`/`rdma_reject`.
#[derive(Debug, Clone)]
pub(crate) struct SidrAsk {
    /// Where it came from.
    pub peer_ip: [u8; 4],
    /// Its TID.
    pub tid: u64,
    /// The request.
    pub req: Box<SidrReq>,
}

/// Our state of one `rdma_cm_id`.
pub(crate) struct IdState {
    /// The channel its events go to.
    pub channel: usize,
    /// A synchronous id: the channel is its own (freed with it).
    pub sync: bool,
    /// `rdma_port_space`.
    pub ps: u32,
    /// Where it stands.
    pub phase: Phase,
    /// Its address (`rdma_bind_addr`, or chosen by `rdma_resolve_addr`).
    pub src: Option<SocketAddrV4>,
    /// The peer's.
    pub dst: Option<SocketAddrV4>,
    /// `rdma_resolve_addr` was given a loopback address: resolved to this
    /// device, with no route (Linux: `rdma_resolve_route` fails, ENODEV).
    pub dst_loopback: bool,
    /// The service ID it listens on.
    pub listening: Option<u64>,
    /// Its connection in the engine's CM.
    pub conn: Option<u32>,
    /// Its outstanding SIDR_REQ.
    pub sidr: Option<u32>,
    /// Passive UD: the SIDR_REQ to answer.
    pub sidr_ask: Option<SidrAsk>,
    /// The peer's QP (from its REQ or REP).
    pub peer: Option<PeerQp>,
    /// Our first PSN (random, as the kernel's).
    pub psn: u32,
    /// READs/atomics we accept and issue (what we announced).
    pub resources: (u8, u8),
    /// Our RNR retry count for the active side's RTS (`rdma_conn_param`).
    pub retry: (u8, u8),
    /// RDMA_OPTION_ID_TOS.
    pub tos: u8,
    /// RDMA_OPTION_ID_ACK_TIMEOUT (None: the REQ's default, 18).
    pub ack_timeout: Option<u8>,
    /// RDMA_OPTION_ID_REUSEADDR.
    pub reuseaddr: bool,
    /// Events delivered (taken by `rdma_get_cm_event`) and not acked yet.
    pub unacked: u32,
    /// A DREQ came from the peer (our CM answered it): `rdma_disconnect` sends nothing.
    pub dreq_received: bool,
    /// DISCONNECTED was delivered.
    pub disconnect_reported: bool,
    /// The CQs `rdma_create_qp` made for the id (destroyed with it).
    pub lib_cqs: Vec<(*mut ibv_cq, *mut ibv_comp_channel)>,
    /// `rdma_create_ep` on a passive id: the QP every request's id gets.
    pub ep_qp: Option<(ibv_qp_init_attr, *mut ibv_pd)>,
    /// The path record `route.path_rec` points at.
    pub path: Box<ibv_sa_path_rec>,
}

// SAFETY: the raw pointers are our own objects' addresses, used under STATE's lock.
unsafe impl Send for IdState {}

/// One queued event: which id's count it adds to when taken.
pub(crate) struct Queued {
    /// The event (a boxed [`EventBox`]).
    pub event: usize,
    /// The id whose `unacked` it counts in (the listener for CONNECT_REQUEST).
    pub owner: usize,
}

/// Our state of one event channel.
pub(crate) struct ChannelState {
    /// Its eventfd (`rdma_event_channel.fd`), readable while `queue` is not empty.
    pub fd: OwnedFd,
    /// Events not taken yet, oldest first.
    pub queue: VecDeque<Queued>,
}

/// Everything the library knows about rdma_cm objects.
#[derive(Default)]
pub(crate) struct CmState {
    /// Live ids.
    pub ids: HashMap<usize, IdState>,
    /// Live channels.
    pub channels: HashMap<usize, ChannelState>,
    /// Events taken and not acked: event -> owner.
    pub taken: HashMap<usize, usize>,
    /// The engine's connection IDs -> our id.
    pub conns: HashMap<u32, usize>,
    /// The engine's SIDR request IDs -> our id.
    pub sidrs: HashMap<u32, usize>,
    /// Service IDs listened on -> the listening id.
    pub listeners: HashMap<u64, usize>,
    /// The next ephemeral port to try.
    pub next_port: u16,
}

// SAFETY: see IdState.
unsafe impl Send for CmState {}

/// The library's rdma_cm state.
pub(crate) static STATE: Mutex<Option<CmState>> = Mutex::new(None);
/// Signalled when an event is acked (`rdma_destroy_id` waits for its events).
pub(crate) static ACKED: Condvar = Condvar::new();

/// The state, locked (created at first use).
pub(crate) fn state() -> MutexGuard<'static, Option<CmState>> {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(CmState {
            next_port: 32768 + (random_u32() % 28000) as u16,
            ..CmState::default()
        });
    }
    g
}

/// The device context every id uses (`cm_id->verbs`; librdmacm opens each
/// device once and shares it), with its default PD, opened at first use and
/// kept for the life of the process, as librdmacm keeps its.
pub(crate) struct Shared {
    /// `cm_id->verbs`.
    pub ctx: usize,
    /// The PD `rdma_create_qp` uses when given none.
    pub pd: usize,
}

static SHARED: OnceLock<Result<Shared, i32>> = OnceLock::new();

/// The shared context (errno on failure: the device cannot start).
pub(crate) fn shared() -> Result<&'static Shared, i32> {
    SHARED
        .get_or_init(|| {
            let list = crate::abi::rsnic_ibv_get_device_list(std::ptr::null_mut());
            if list.is_null() {
                return Err(libc::ENODEV);
            }
            // SAFETY: our list of one device and a NULL.
            let dev = unsafe { *list };
            let ctx = if dev.is_null() {
                std::ptr::null_mut()
            } else {
                crate::abi::rsnic_ibv_open_device(dev)
            };
            crate::abi::rsnic_ibv_free_device_list(list);
            if ctx.is_null() {
                return Err(libc::ENODEV);
            }
            let pd = crate::abi::rsnic_ibv_alloc_pd(ctx);
            if pd.is_null() {
                return Err(libc::ENOMEM);
            }
            start_dispatcher()?;
            Ok(Shared {
                ctx: ctx as usize,
                pd: pd as usize,
            })
        })
        .as_ref()
        .map_err(|&e| e)
}

/// The running backend (after [`shared`] succeeded).
pub(crate) fn backend() -> &'static crate::backend::Backend {
    crate::backend::Backend::get().expect("the device started in shared()")
}

/// Starts the thread that turns the engine's CM events into librdmacm's, with
/// every signal blocked (it must never run a handler of the program's).
fn start_dispatcher() -> Result<(), i32> {
    let be = crate::backend::Backend::get().map_err(|_| libc::ENODEV)?;
    let notify = be.dev.cm_notifier().map_err(|_| libc::ENODEV)?;
    // SAFETY: plain sigset manipulation on locals; the new thread inherits the
    // blocked mask, the caller's is restored after the spawn.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    let spawned = std::thread::Builder::new()
        .name("rsnic-cm".into())
        .spawn(move || loop {
            let _ = notify.wait(None);
            match be.dev.cm_events() {
                Ok(evs) => {
                    let mut g = state();
                    let st = g.as_mut().expect("state");
                    for e in evs {
                        events::dispatch(st, e);
                    }
                }
                Err(_) => return,
            }
        });
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    spawned.map(drop).map_err(|_| libc::EAGAIN)
}

/// 32 random bits from the kernel (PSNs, ports).
pub(crate) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: fills 4 bytes of a live array.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n != 4 {
        // getrandom cannot fail for 4 bytes once the pool is up; a fallback
        // that still differs between processes and calls.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return t ^ std::process::id().rotate_left(16);
    }
    u32::from_ne_bytes(b)
}

impl ChannelState {
    /// A channel with a fresh eventfd (blocking, close-on-exec: the program may
    /// set `O_NONBLOCK` on it, as on librdmacm's).
    pub(crate) fn new() -> Result<ChannelState, i32> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::abi::last_errno(libc::EMFILE));
        }
        // SAFETY: a new descriptor nobody else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(ChannelState {
            fd,
            queue: VecDeque::new(),
        })
    }

    /// Queues an event; the eventfd becomes readable with the first.
    pub(crate) fn push(&mut self, q: Queued) {
        if self.queue.is_empty() {
            let one: u64 = 1;
            // SAFETY: 8 bytes from a live u64 to our eventfd (its counter is 0
            // here, so the write cannot block).
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
        self.queue.push_back(q);
    }

    /// Takes the oldest event; the eventfd stops being readable with the last.
    pub(crate) fn pop(&mut self) -> Option<Queued> {
        let q = self.queue.pop_front()?;
        if self.queue.is_empty() {
            self.drained();
        }
        Some(q)
    }

    /// Resets the eventfd after the queue emptied (its counter is 1: no block).
    pub(crate) fn drained(&self) {
        let mut v: u64 = 0;
        // SAFETY: 8 bytes into a live u64 from our eventfd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}
