//! The device's error type: what opening a device, its verbs and its engine's start can
//! fail with. Below [`crate::verbs`], [`crate::device`] and [`crate::engine`], which all
//! return it (re-exported as `nic::verbs::VerbsError`).

use cc::CcKind;
use rdma::transport::QpState;

use crate::contract::EngineError;

/// Errors of the verbs API.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// A DPDK call failed.
    #[error(transparent)]
    Dpdk(#[from] dpdk::Error),
    /// The engine thread is gone.
    #[error("the device's engine has stopped")]
    EngineGone,
    /// Host mode: resolving a peer through the kernel failed (boxed: the
    /// error is large and the verbs' results should stay small).
    #[error(transparent)]
    Host(Box<crate::host::HostError>),
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
    /// `dereg_mr` of region `lkey` with memory windows bound to it (IBA
    /// 10.6.7.2.6; `ibv_dereg_mr`: EINVAL, as rxe). `dereg_mr` itself answers
    /// [`crate::verbs::DeregError::WindowsBound`], which hands the region back.
    #[error(
        "memory region {0:#x} has memory windows bound to it: unbind or invalidate them first"
    )]
    WindowsBound(u32),
    /// Memory windows on a sharded device (rsnic's limit: a window's binding
    /// would have to reach every shard's table at once).
    #[error("memory windows need an unsharded device")]
    WindowsSharded,
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
    /// An inline payload longer than the QP's staging slot
    /// (`QpOptions::max_inline_data`).
    #[error("{len} bytes to copy at post time, the QP takes at most {max}")]
    TooLong {
        /// The payload's length.
        len: usize,
        /// The QP's limit.
        max: usize,
    },
    /// An inline request must be a SEND or a WRITE; an ATOMIC takes one
    /// 8-byte SGE (IBA 9.4.5).
    #[error("an inline request must be a SEND or a WRITE; an ATOMIC takes one SGE")]
    NotGatherable,
    /// A QP created to receive from a shared receive queue has no receive
    /// queue of its own (`ibv_post_recv`: EINVAL).
    #[error("the QP receives from a shared receive queue: post to the SRQ")]
    ReceivesFromSrq,
    /// A work request the QP's transport service does not have (a UD send
    /// on a connected QP, a connected one on a UD QP; `ibv_post_send`: EINVAL).
    #[error("{0}")]
    WrongService(&'static str),
    /// A UD message longer than the path MTU (IBA 9.8: one packet per
    /// datagram; `ibv_post_send`: EINVAL).
    #[error("a UD message of {len} bytes is longer than the path MTU ({mtu})")]
    DatagramTooLong {
        /// The message's length.
        len: u64,
        /// The QP's path MTU.
        mtu: u32,
    },
    /// Every address handle id is in use (2^32 - 1 of them).
    #[error("no address handle id left")]
    NoAddressHandleLeft,
    /// An SGE outside its region.
    #[error("an SGE lies outside its memory region")]
    OutsideRegion,
    /// The completion channel's eventfd failed.
    #[error("completion channel: {0}")]
    Channel(#[source] std::io::Error),
    /// The eventfd of the async event queue could not be made.
    #[error("async event queue: {0}")]
    AsyncEventFd(#[source] std::io::Error),
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
    /// `resize` to fewer entries than the CQ holds now.
    #[error("completion queue holds {queued} completions, more than {depth}")]
    CqTooSmall {
        /// Completions queued.
        queued: usize,
        /// The depth asked for.
        depth: usize,
    },
}

impl From<crate::host::HostError> for VerbsError {
    fn from(e: crate::host::HostError) -> Self {
        VerbsError::Host(Box::new(e))
    }
}
