//! What a program asks of the engine before any traffic: the device's
//! settings ([`DeviceConfig`]), a QP's options ([`QpOptions`]) and its peer
//! ([`RemoteQp`]).

use super::*;

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
