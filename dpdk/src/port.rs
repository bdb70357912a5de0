//! Ethernet ports and their queues.

use std::ffi::CString;
use std::sync::{Arc, Mutex};

use crate::error::{check, Error, Result};
use crate::{Burst, Eal, Mempool};

/// How to configure a port.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// Number of RX queues.
    pub rx_queues: u16,
    /// Number of TX queues.
    pub tx_queues: u16,
    /// RX descriptors per queue (adjusted to the driver's limits).
    pub rx_desc: u16,
    /// TX descriptors per queue (adjusted to the driver's limits).
    pub tx_desc: u16,
    /// Receive every frame, whatever its destination MAC.
    pub promiscuous: bool,
    /// IP MTU to set (`rte_eth_dev_set_mtu`, before the queues are set up so
    /// that RX buffers are sized for it), or the driver's default. Best
    /// effort: a PMD without MTU control (ring, null) keeps its own.
    pub mtu: Option<u16>,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            promiscuous: true,
            mtu: None,
        }
    }
}

/// Link state as `rte_eth_link_get_nowait` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Whether the link is up.
    pub up: bool,
    /// Speed in Mbit/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port counters (`rte_eth_stats_get`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets dropped by the hardware (RX queue full).
    pub rx_missed: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
}

/// What must be released after the port is closed.
enum Backing {
    /// Probed by the EAL or `rte_dev_probe`: close the ethdev.
    Probed,
    /// A vdev we created: `rte_vdev_uninit` by name.
    Vdev(CString),
    /// One end of a ring pair: uninit the vdev, then (when both ends are
    /// gone) free the rings, which the `Arc` keeps alive until then.
    RingPair(CString, Arc<RingPairRings>),
}

struct RingPairRings(Vec<*mut dpdk_sys::rte_ring>);
// SAFETY: the rings are only freed in Drop, after both ports are gone.
unsafe impl Send for RingPairRings {}
// SAFETY: as for Send; the handle itself never touches the rings.
unsafe impl Sync for RingPairRings {}
impl Drop for RingPairRings {
    fn drop(&mut self) {
        for &r in &self.0 {
            // Free any mbuf still in flight, then the ring.
            let mut burst: Burst = Burst::new();
            loop {
                let (ptr, room) = burst.spare_raw();
                // SAFETY: valid ring of mbuf pointers; room slots available.
                let n = unsafe {
                    dpdk_sys::shim_rte_ring_dequeue_burst(
                        r,
                        ptr.cast(),
                        room as u32,
                        std::ptr::null_mut(),
                    )
                };
                if n == 0 {
                    break;
                }
                // SAFETY: the dequeue set the first `n` spare slots.
                unsafe { burst.assume_init_spare(n as usize) };
                burst.clear();
            }
            // SAFETY: no port uses the ring any more.
            unsafe { dpdk_sys::rte_ring_free(r) };
        }
    }
}

struct PortInner {
    id: u16,
    name: String,
    backing: Backing,
    /// RX pools must outlive the queues that fill from them.
    pools: Mutex<Vec<Arc<Mempool>>>,
    /// A `net_af_xdp` port (crate::af_xdp): its interface, and the XDP
    /// object's file, which the PMD loads when the RX queue is set up.
    af_xdp: Option<crate::af_xdp::Prepared>,
}

impl PortInner {
    /// [`Port::ring_pair_key`].
    fn ring_pair_key(&self) -> Option<usize> {
        match &self.backing {
            Backing::RingPair(_, rings) => Some(Arc::as_ptr(rings) as usize),
            _ => None,
        }
    }
}

impl Drop for PortInner {
    fn drop(&mut self) {
        // SAFETY: every queue handle holds an Arc to us, so none is alive.
        unsafe {
            dpdk_sys::rte_eth_dev_stop(self.id);
            match &self.backing {
                Backing::Probed => {
                    dpdk_sys::rte_eth_dev_close(self.id);
                }
                Backing::Vdev(name) | Backing::RingPair(name, _) => {
                    dpdk_sys::rte_vdev_uninit(name.as_ptr());
                }
            }
        }
        // The PMD detached its XDP program when the vdev went away.
        if let Some(p) = &self.af_xdp {
            crate::xdp_link::unguard(crate::af_xdp::ifindex(&p.iface));
        }
    }
}

/// An Ethernet port (`rte_eth_dev`).
///
/// Configuring it yields one [`RxQueue`] and one [`TxQueue`] handle per
/// queue; the handles are unique and `Send`, so each poll-mode thread owns
/// its queues and bursts without locks. The port is stopped and closed (and
/// a vdev we created removed) when the port and all its queue handles are
/// dropped.
pub struct Port {
    inner: Arc<PortInner>,
}

/// Reads a port's link state from another thread ([`Port::link_watch`]).
#[derive(Clone)]
pub struct LinkWatch {
    inner: Arc<PortInner>,
}

impl LinkWatch {
    /// The link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        link_of(self.inner.id)
    }

    /// Sets the link administratively up or down
    /// (`rte_eth_dev_set_link_up` / `_down`; a ring PMD flips its link
    /// state, what a cable pulled and plugged back looks like).
    pub fn set_up(&self, up: bool) -> Result<()> {
        // SAFETY: valid port (held open by this handle).
        let rc = unsafe {
            if up {
                dpdk_sys::rte_eth_dev_set_link_up(self.inner.id)
            } else {
                dpdk_sys::rte_eth_dev_set_link_down(self.inner.id)
            }
        };
        check(
            if up {
                "rte_eth_dev_set_link_up"
            } else {
                "rte_eth_dev_set_link_down"
            },
            rc,
        )
        .map(|_| ())
    }

    /// Waits up to `limit` for the link to come up; whether it did.
    pub fn wait_up(&self, limit: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + limit;
        loop {
            if self.link().is_ok_and(|l| l.up) {
                return true;
            }
            if std::time::Instant::now() >= end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

fn link_of(id: u16) -> Result<Link> {
    let mut link = dpdk_sys::rte_eth_link::default();
    // SAFETY: valid port (held open by the caller), valid out pointer.
    check("rte_eth_link_get_nowait", unsafe {
        dpdk_sys::rte_eth_link_get_nowait(id, &mut link)
    })?;
    Ok(Link {
        up: link.link_status() != 0,
        speed_mbps: if link.link_speed == u32::MAX {
            0
        } else {
            link.link_speed
        },
        full_duplex: link.link_duplex() != 0,
    })
}

impl Port {
    /// Opens a port from DPDK devargs: a vdev (`net_null0`,
    /// `net_tap0,iface=dtap0`, `net_af_packet0,iface=veth0`, ...) is created
    /// at run time; anything else (a PCI address, or a vdev given to the EAL
    /// with `--vdev`) is looked up by name and hot-plugged if needed.
    ///
    /// `net_af_xdp` ports (`af_xdp:IF` or `net_af_xdp<N>,iface=IF,...`) get
    /// rsnic's XDP program unless the devargs name one ([`crate::af_xdp`]).
    pub fn open(eal: &Eal, devargs: &str) -> Result<Port> {
        if crate::af_xdp::is_af_xdp(devargs) {
            return Self::open_af_xdp(eal, devargs);
        }
        let (name, args) = match devargs.split_once(',') {
            Some((n, a)) => (n.trim(), a.trim()),
            None => (devargs.trim(), ""),
        };
        if name.is_empty() {
            return Err(Error::InvalidArgument(devargs.into(), "empty device name"));
        }
        let cname =
            CString::new(name).map_err(|_| Error::InvalidArgument(devargs.into(), "NUL byte"))?;
        if let Some(id) = port_by_name(&cname) {
            return Ok(Self::wrap(id, name, Backing::Probed));
        }
        if is_vdev_name(name) {
            let cargs = CString::new(args)
                .map_err(|_| Error::InvalidArgument(devargs.into(), "NUL byte"))?;
            // SAFETY: valid C strings.
            check("rte_vdev_init", unsafe {
                dpdk_sys::rte_vdev_init(cname.as_ptr(), cargs.as_ptr())
            })?;
            let id = port_by_name(&cname).ok_or_else(|| Error::NoSuchPort(name.into()))?;
            Ok(Self::wrap(id, name, Backing::Vdev(cname)))
        } else {
            let cdev = CString::new(devargs)
                .map_err(|_| Error::InvalidArgument(devargs.into(), "NUL byte"))?;
            // SAFETY: valid C string.
            let rc = unsafe { dpdk_sys::rte_dev_probe(cdev.as_ptr()) };
            if rc < 0 {
                return Err(Error::NoSuchPort(format!(
                    "{devargs} ({})",
                    crate::error::strerror(-rc)
                )));
            }
            let id = port_by_name(&cname).ok_or_else(|| Error::NoSuchPort(name.into()))?;
            Ok(Self::wrap(id, name, Backing::Probed))
        }
    }

    /// A `net_af_xdp` port ([`crate::af_xdp::prepare`]): the interface and
    /// queue are checked first, and a failure of the PMD is explained.
    fn open_af_xdp(_eal: &Eal, devargs: &str) -> Result<Port> {
        let p = crate::af_xdp::prepare(devargs)?;
        let cname = CString::new(p.name.as_str())
            .map_err(|_| Error::InvalidArgument(devargs.into(), "NUL byte"))?;
        if port_by_name(&cname).is_some() {
            return Err(Error::AfXdp {
                iface: p.iface.clone(),
                reason: format!("port {} is already open in this process", p.name),
            });
        }
        let cargs = CString::new(p.args.as_str())
            .map_err(|_| Error::InvalidArgument(devargs.into(), "NUL byte"))?;
        // SAFETY: valid C strings; our XDP object's file lives in `p` until
        // this returns (libbpf reads it during the probe).
        let rc = unsafe { dpdk_sys::rte_vdev_init(cname.as_ptr(), cargs.as_ptr()) };
        if rc < 0 {
            return Err(crate::af_xdp::diagnose(&p, rc));
        }
        let id = port_by_name(&cname).ok_or_else(|| Error::NoSuchPort(p.name.clone()))?;
        let mut port = Self::wrap(id, &p.name, Backing::Vdev(cname));
        tracing::info!(port = id, iface = %p.iface, ours = p.ours, "net_af_xdp port open");
        if let Some(inner) = Arc::get_mut(&mut port.inner) {
            inner.af_xdp = Some(p);
        }
        Ok(port)
    }

    /// Whether the port is a device on a bus (a PCI NIC, probed by the EAL
    /// or `rte_dev_probe`), which reads the frames it sends by DMA: an mbuf
    /// attached to memory DPDK did not allocate would hand it an address
    /// that is not an IOVA it may use (unless that memory was registered
    /// with `rte_extmem_register` and mapped with `rte_dev_dma_map`).
    /// Virtual devices (`net_tap`, `net_ring`, `net_af_packet`, `net_null`,
    /// `net_af_xdp`) and ring pairs copy with the CPU: false.
    pub fn dma_from_mbufs_only(&self) -> bool {
        matches!(self.inner.backing, Backing::Probed) && !is_vdev_name(&self.inner.name)
    }

    /// The kernel interface under this port, for a `net_af_xdp` port (the
    /// interface is shared with the kernel: host mode).
    pub fn kernel_iface(&self) -> Option<&str> {
        self.inner.af_xdp.as_ref().map(|p| p.iface.as_str())
    }

    /// Two ports cabled back to back in this process: what one sends, the
    /// other receives (`rte_eth_from_rings` with crossed rings; a single
    /// `net_ring` would loop back to itself). `name` must be unique.
    pub fn ring_pair(eal: &Eal, name: &str, ring_size: u32) -> Result<(Port, Port)> {
        Self::ring_pair_queues(eal, name, ring_size, 1)
    }

    /// [`Port::ring_pair`] with `queues` queue pairs per port, cabled queue
    /// to queue: what port A sends on TX queue `k` arrives on port B's RX
    /// queue `k` (as a NIC's flow steering would put a flow on the queue of
    /// the core that owns it). Each ring has one producer and one consumer.
    pub fn ring_pair_queues(
        _eal: &Eal,
        name: &str,
        ring_size: u32,
        queues: u16,
    ) -> Result<(Port, Port)> {
        if queues == 0 {
            return Err(Error::InvalidArgument(
                name.into(),
                "a ring pair needs a queue",
            ));
        }
        let mut rings = RingPairRings(Vec::with_capacity(2 * usize::from(queues)));
        // Rings a->b are 0..queues, b->a queues..2*queues; whatever was made
        // is freed by `rings`' drop if a later step fails.
        for (dir, k) in ["ab", "ba"]
            .iter()
            .flat_map(|d| (0..queues).map(move |k| (d, k)))
        {
            let n = CString::new(format!("{name}_{dir}{k}"))
                .map_err(|_| Error::InvalidArgument(name.into(), "NUL byte"))?;
            // SAFETY: valid name; single producer and consumer per ring
            // (one TX queue feeds it, one RX queue drains it).
            let r = unsafe {
                dpdk_sys::rte_ring_create(
                    n.as_ptr(),
                    ring_size,
                    dpdk_sys::SOCKET_ID_ANY,
                    dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
                )
            };
            if r.is_null() {
                return Err(Error::last("rte_ring_create"));
            }
            rings.0.push(r);
        }
        let q = usize::from(queues);
        let (a_to_b, b_to_a) = (rings.0[..q].to_vec(), rings.0[q..].to_vec());
        let rings = Arc::new(rings);
        let make = |end: &str, rx: &[*mut dpdk_sys::rte_ring], tx: &[*mut dpdk_sys::rte_ring]| {
            // rte_eth_from_rings registers the vdev as `net_ring_<name>`:
            // it gets the bare name, and the drop uninits the registered one
            // (otherwise the port id is never released; 22.11 has 32).
            let bare = CString::new(format!("{name}_{end}"))
                .map_err(|_| Error::InvalidArgument(name.into(), "NUL byte"))?;
            let pname = format!("net_ring_{name}_{end}");
            let cname = CString::new(pname.clone())
                .map_err(|_| Error::InvalidArgument(name.into(), "NUL byte"))?;
            // SAFETY: the rings outlive the port (the port holds `rings`);
            // the arrays hold `queues` valid rings each.
            let id = unsafe {
                dpdk_sys::rte_eth_from_rings(
                    bare.as_ptr(),
                    rx.as_ptr(),
                    u32::from(queues),
                    tx.as_ptr(),
                    u32::from(queues),
                    0,
                )
            };
            if id < 0 {
                return Err(Error::last("rte_eth_from_rings"));
            }
            Ok(Self::wrap(
                id as u16,
                &pname,
                Backing::RingPair(cname, rings.clone()),
            ))
        };
        let a = make("a", &b_to_a, &a_to_b)?;
        let b = make("b", &a_to_b, &b_to_a)?;
        Ok((a, b))
    }

    fn wrap(id: u16, name: &str, backing: Backing) -> Port {
        Port {
            inner: Arc::new(PortInner {
                id,
                name: name.to_owned(),
                backing,
                pools: Mutex::new(Vec::new()),
                af_xdp: None,
            }),
        }
    }

    /// For one end of a [`Port::ring_pair`], a key both ends share (and no
    /// other port): whoever turns both ends on one thread knows that what
    /// one sends the other receives on that thread (nic's engines park
    /// without a bound then). None for every other port.
    pub fn ring_pair_key(&self) -> Option<usize> {
        self.inner.ring_pair_key()
    }

    /// DPDK port id.
    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Configures queues (RX queues fill from `pool`) and starts the port.
    pub fn configure(
        &mut self,
        cfg: &PortConfig,
        pool: &Arc<Mempool>,
    ) -> Result<(Vec<RxQueue>, Vec<TxQueue>)> {
        let id = self.inner.id;
        // SAFETY: plain calls on a valid port id with valid pointers.
        unsafe {
            let conf: dpdk_sys::rte_eth_conf = std::mem::zeroed();
            check(
                "rte_eth_dev_configure",
                dpdk_sys::rte_eth_dev_configure(id, cfg.rx_queues, cfg.tx_queues, &conf),
            )?;
            // Asked only where the driver's frame limit allows it (DPDK
            // logs an error for every refused MTU).
            // Never on an interface shared with the kernel (its MTU is the host's).
            let fits = |mtu: u16| {
                self.kernel_iface().is_none()
                    && self.max_frame_len().is_ok_and(|m| u32::from(mtu) + 18 <= m)
            };
            if let Some(mtu) = cfg.mtu.filter(|&m| fits(m)) {
                let rc = dpdk_sys::rte_eth_dev_set_mtu(id, mtu);
                if rc != 0 {
                    tracing::debug!(port = id, mtu, rc, "MTU not set (kept the driver's)");
                }
            }
            let mut nb_rx = cfg.rx_desc;
            let mut nb_tx = cfg.tx_desc;
            check(
                "rte_eth_dev_adjust_nb_rx_tx_desc",
                dpdk_sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nb_rx, &mut nb_tx),
            )?;
            let socket = dpdk_sys::rte_eth_dev_socket_id(id);
            let socket = if socket < 0 { 0 } else { socket as u32 };
            for q in 0..cfg.rx_queues {
                let rc = dpdk_sys::rte_eth_rx_queue_setup(
                    id,
                    q,
                    nb_rx,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                );
                // net_af_xdp loads and attaches the XDP program and binds the
                // socket here: say why it may have failed.
                if let (true, Some(p)) = (rc < 0, &self.inner.af_xdp) {
                    return Err(crate::af_xdp::diagnose(p, rc));
                }
                check("rte_eth_rx_queue_setup", rc)?;
                // The program is attached now: detach it at exit if the
                // port is never closed (crate::xdp_link).
                if let (0, Some(p)) = (q, &self.inner.af_xdp) {
                    crate::xdp_link::guard(crate::af_xdp::ifindex(&p.iface));
                }
            }
            // The PMD has loaded our XDP object: its file can go.
            if let Some(p) = &self.inner.af_xdp {
                p.program_loaded();
            }
            for q in 0..cfg.tx_queues {
                check(
                    "rte_eth_tx_queue_setup",
                    dpdk_sys::rte_eth_tx_queue_setup(id, q, nb_tx, socket, std::ptr::null()),
                )?;
            }
            check("rte_eth_dev_start", dpdk_sys::rte_eth_dev_start(id))?;
            if cfg.promiscuous {
                // Not every PMD supports it (net_null does not); not fatal.
                dpdk_sys::rte_eth_promiscuous_enable(id);
            }
        }
        self.inner
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pool.clone());
        let rx = (0..cfg.rx_queues)
            .map(|q| RxQueue {
                port: self.inner.clone(),
                port_id: id,
                queue: q,
            })
            .collect();
        let tx = (0..cfg.tx_queues)
            .map(|q| TxQueue {
                port: self.inner.clone(),
                port_id: id,
                queue: q,
            })
            .collect();
        Ok((rx, tx))
    }

    /// Configures one RX and one TX queue with defaults and starts the port:
    /// the common case of one poll-mode thread per port.
    pub fn configure_single(&mut self, pool: &Arc<Mempool>) -> Result<(RxQueue, TxQueue)> {
        let (mut rx, mut tx) = self.configure(&PortConfig::default(), pool)?;
        match (rx.pop(), tx.pop()) {
            (Some(r), Some(t)) => Ok((r, t)),
            _ => unreachable!("default config has one queue each"),
        }
    }

    /// The port's MAC address.
    pub fn mac(&self) -> Result<[u8; 6]> {
        let mut addr = dpdk_sys::rte_ether_addr::default();
        // SAFETY: valid port, valid out pointer.
        check("rte_eth_macaddr_get", unsafe {
            dpdk_sys::rte_eth_macaddr_get(self.inner.id, &mut addr)
        })?;
        Ok(addr.addr_bytes)
    }

    /// The link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        link_of(self.inner.id)
    }

    /// How many RX and TX queues the driver offers (`max_rx_queues`,
    /// `max_tx_queues`): a ring pair has as many as it was made with, a
    /// TAP up to 16, a PCI NIC its hardware queues.
    pub fn max_queues(&self) -> Result<(u16, u16)> {
        // SAFETY: rte_eth_dev_info is plain C data; all zeroes is valid.
        let mut info: dpdk_sys::rte_eth_dev_info = unsafe { std::mem::zeroed() };
        // SAFETY: valid port, valid out pointer (zeroed POD).
        check("rte_eth_dev_info_get", unsafe {
            dpdk_sys::rte_eth_dev_info_get(self.inner.id, &mut info)
        })?;
        Ok((info.max_rx_queues, info.max_tx_queues))
    }

    /// The longest frame (Ethernet header to payload end, no FCS) the
    /// driver receives (`max_rx_pktlen`; 1522 for `net_tap` in DPDK 22.11,
    /// so no jumbo frames there).
    pub fn max_frame_len(&self) -> Result<u32> {
        // SAFETY: rte_eth_dev_info is plain C data; all zeroes is valid.
        let mut info: dpdk_sys::rte_eth_dev_info = unsafe { std::mem::zeroed() };
        // SAFETY: valid port, valid out pointer (zeroed POD).
        check("rte_eth_dev_info_get", unsafe {
            dpdk_sys::rte_eth_dev_info_get(self.inner.id, &mut info)
        })?;
        // A port on a kernel interface carries what the interface's MTU
        // lets through (the kernel drops longer frames; rsnic never changes
        // the MTU of an interface it shares).
        let mut max = info.max_rx_pktlen;
        if let Some(mtu) = self.kernel_iface().and_then(crate::af_xdp::kernel_mtu) {
            max = max.min(mtu + 14);
        }
        // A kernel-interface port that cannot send chained mbufs
        // (`tx_multi_seg`) carries frames of one default-sized mbuf.
        if self.kernel_iface().is_some() && !self.tx_multi_seg().unwrap_or(false) {
            max = max
                .min(u32::from(crate::Mempool::DEFAULT_DATA_ROOM) - dpdk_sys::RTE_PKTMBUF_HEADROOM);
        }
        Ok(max)
    }

    /// Whether the driver sends chained (multi-segment) mbufs
    /// (`RTE_ETH_TX_OFFLOAD_MULTI_SEGS` in `tx_offload_capa`). DPDK
    /// 22.11's `net_af_xdp` does not: it copies only the first segment's
    /// room into the AF_XDP frame, so a chained frame goes out with garbage
    /// after its first segment.
    pub fn tx_multi_seg(&self) -> Result<bool> {
        /// `RTE_ETH_TX_OFFLOAD_MULTI_SEGS` (`RTE_BIT64(15)`, rte_ethdev.h;
        /// bindgen cannot evaluate the macro).
        const MULTI_SEGS: u64 = 1 << 15;
        // SAFETY: rte_eth_dev_info is plain C data; all zeroes is valid.
        let mut info: dpdk_sys::rte_eth_dev_info = unsafe { std::mem::zeroed() };
        // SAFETY: valid port, valid out pointer (zeroed POD).
        check("rte_eth_dev_info_get", unsafe {
            dpdk_sys::rte_eth_dev_info_get(self.inner.id, &mut info)
        })?;
        Ok(info.tx_offload_capa & MULTI_SEGS != 0)
    }

    /// The port's IP MTU.
    pub fn mtu(&self) -> Result<u16> {
        let mut mtu = 0u16;
        // SAFETY: valid port, valid out pointer.
        check("rte_eth_dev_get_mtu", unsafe {
            dpdk_sys::rte_eth_dev_get_mtu(self.inner.id, &mut mtu)
        })?;
        Ok(mtu)
    }

    /// A handle that reads this port's link state from any thread while the
    /// port itself has moved to its poll-mode thread (control path, as
    /// testpmd's main lcore does while forwarding runs). It keeps the port
    /// open while it lives.
    pub fn link_watch(&self) -> LinkWatch {
        LinkWatch {
            inner: self.inner.clone(),
        }
    }

    /// The port's counters.
    pub fn stats(&self) -> Result<PortStats> {
        let mut s = dpdk_sys::rte_eth_stats::default();
        // SAFETY: valid port, valid out pointer.
        check("rte_eth_stats_get", unsafe {
            dpdk_sys::rte_eth_stats_get(self.inner.id, &mut s)
        })?;
        Ok(PortStats {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_bytes: s.ibytes,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Resets the port's counters.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: valid port.
        check("rte_eth_stats_reset", unsafe {
            dpdk_sys::rte_eth_stats_reset(self.inner.id)
        })?;
        Ok(())
    }

    /// Stops the port (queues stop moving packets until started again).
    pub fn stop(&self) -> Result<()> {
        // SAFETY: valid port.
        check("rte_eth_dev_stop", unsafe {
            dpdk_sys::rte_eth_dev_stop(self.inner.id)
        })?;
        Ok(())
    }

    /// Starts a configured, stopped port.
    pub fn start(&self) -> Result<()> {
        // SAFETY: valid port.
        check("rte_eth_dev_start", unsafe {
            dpdk_sys::rte_eth_dev_start(self.inner.id)
        })?;
        Ok(())
    }
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .finish()
    }
}

fn port_by_name(name: &CString) -> Option<u16> {
    let mut id = 0u16;
    // SAFETY: valid C string and out pointer.
    let rc = unsafe { dpdk_sys::rte_eth_dev_get_port_by_name(name.as_ptr(), &mut id) };
    (rc == 0).then_some(id)
}

/// The receive side of one port queue. Unique: only its owner polls it.
pub struct RxQueue {
    port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
}

/// The transmit side of one port queue. Unique: only its owner sends on it.
pub struct TxQueue {
    port: Arc<PortInner>,
    port_id: u16,
    queue: u16,
}

impl RxQueue {
    /// Receives into the free space of `burst`; returns how many arrived.
    #[inline]
    pub fn recv<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let (ptr, room) = burst.spare_raw();
        if room == 0 {
            return 0;
        }
        // SAFETY: `ptr` has `room` free slots; the driver fills the first
        // `n` with mbufs that we now own.
        let n = unsafe {
            dpdk_sys::shim_rte_eth_rx_burst(
                self.port_id,
                self.queue,
                ptr,
                room.min(u16::MAX as usize) as u16,
            )
        } as usize;
        // SAFETY: the burst call set the first `n` spare slots.
        unsafe { burst.assume_init_spare(n) };
        n
    }

    /// The port this queue belongs to.
    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    /// The queue index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }

    /// [`Port::ring_pair_key`] of the port this queue belongs to.
    pub fn ring_pair_key(&self) -> Option<usize> {
        self.port.ring_pair_key()
    }
}

impl TxQueue {
    /// Sends from the front of `burst`; returns how many the driver took.
    /// What it did not take stays in `burst` (retry, or `clear()` to drop).
    #[inline]
    pub fn send<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots hold owned mbufs; the driver takes
        // ownership of the first `n`.
        let n = unsafe {
            dpdk_sys::shim_rte_eth_tx_burst(self.port_id, self.queue, burst.as_raw(), len as u16)
        } as usize;
        burst.consume_front(n);
        n
    }

    /// The port this queue belongs to.
    pub fn port_id(&self) -> u16 {
        self.port_id
    }

    /// The queue index.
    pub fn queue_id(&self) -> u16 {
        self.queue
    }
}

impl std::fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxQueue({}:{})", self.port.name, self.queue)
    }
}

impl std::fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TxQueue({}:{})", self.port.name, self.queue)
    }
}

/// Whether a port's driver name is a virtual device's (`net_tap0`,
/// `net_ring0`, `eth_...`), created with `rte_vdev_init`.
fn is_vdev_name(name: &str) -> bool {
    name.starts_with("net_") || name.starts_with("eth_")
}

/// Whether the port `devargs` names needs the EAL's PCI bus: a PCI address
/// (`0000:00:03.0[,args]`), not a virtual device (`net_tap0,iface=t0`,
/// `net_ring0`) nor a `net_af_xdp` port (`af_xdp:eth0`). A process that
/// needs none passes `--no-pci`, so that the EAL neither scans nor
/// probes (and complains about) the host's PCI devices.
pub fn needs_pci(devargs: &str) -> bool {
    let name = devargs.split(',').next().unwrap_or_default().trim();
    !(crate::af_xdp::is_af_xdp(devargs) || is_vdev_name(name) || name.is_empty())
}

#[cfg(test)]
mod needs_pci_tests {
    use super::needs_pci;

    #[test]
    fn only_pci_addresses_need_the_pci_bus() {
        for d in ["0000:00:03.0", "0000:3b:00.1,rxq_cqe_comp_en=0"] {
            assert!(needs_pci(d), "{d}");
        }
        for d in [
            "net_tap0,iface=rt-a",
            "net_ring0",
            "eth_foo",
            "af_xdp:eth0",
            "net_af_xdp0,iface=v1",
        ] {
            assert!(!needs_pci(d), "{d}");
        }
    }
}
