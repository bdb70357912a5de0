//! Starting and stopping a device: its engine on a poll-mode thread
//! ([`Device::open`]), several devices' engines on one thread
//! ([`Device::open_group`]), or one device's QPs sharded over several
//! engines, each on its own queue pair of the port or behind a dispatcher
//! ([`Device::open_sharded`], crate::shard);
//! the optional capture writer; and the orderly stop that waits until every
//! engine has released its port ([`Device::close`], also on drop).
//!
//! The handles a program then uses are in [`crate::verbs`].

use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::Arc;
use std::thread::JoinHandle;

use dpdk::tap_signal::TapSignalRoute;
use dpdk::{Eal, Port};

use crate::contract::{CommandTx, DeviceConfig, EngineShared, CAPTURE_SNAP, MAX_QPS, QPN_BASE};
use crate::counters::Counters;
use crate::engine::{Engine, EngineParts, PacketIo};
use crate::error::VerbsError;
use crate::pcapng::{CaptureProducer, Interface, PcapngWriter};
use crate::port_shaper::SharedLine;
use crate::shard::{shard_base, Dispatcher, DispatcherParts, Steer};

/// Records in the ring between the engine and the capture writer.
const CAPTURE_RING: usize = 8192;
/// Frames in each ring between a sharded device's dispatcher and a shard,
/// and in each shard's steering ring.
const SHARD_RING: u32 = 4096;

/// The thread that writes a device's capture file.
pub(crate) type CaptureWriter =
    JoinHandle<std::io::Result<PcapngWriter<std::io::BufWriter<std::fs::File>>>>;

/// One engine of a device: how the API reaches it.
pub(crate) struct EngineHandle {
    pub(crate) shared: Arc<EngineShared>,
    pub(crate) cmd: CommandTx,
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
    /// Host mode: the kernel interface whose neighbour table resolves peers.
    pub(crate) kernel_iface: Option<crate::host::KernelIface>,
    /// The address handles' ids in use (`Device::create_ah`).
    pub(crate) ah_ids: Arc<crate::verbs::AhIds>,
}

impl Device {
    /// Starts a device on `port` (configured here with one RX and one TX
    /// queue) and its engine thread, pinned to `cfg.core`. Every thread
    /// that polls a port takes the TAP PMD's RX signal of the ports opened
    /// so far ([`TapSignalRoute`]), so that it never interrupts the
    /// program's threads (a `poll` on a completion channel would return
    /// EINTR once per frame).
    pub fn open(eal: &'static Eal, port: Port, cfg: DeviceConfig) -> Result<Device, VerbsError> {
        let core = cfg.core;
        let (engine, mut dev) = Self::prepare(eal, port, &cfg, Arc::default())?;
        let thread = dpdk::lcore::spawn_pinned(eal, "rsnic-engine", core, move || {
            let _route = TapSignalRoute::here();
            engine.run()
        })
        .map_err(|source| VerbsError::Thread {
            what: "engine",
            source,
        })?;
        dev.threads.push(thread);
        Ok(dev)
    }

    /// Starts one device per `(port, config)` with all their engines on ONE
    /// poll-mode thread pinned to `core` ([`crate::engine::run_group`]), so
    /// that many NICs share a core; each config's own `core` is ignored.
    /// Devices are closed one by one as usual; the thread ends with the last.
    pub fn open_group(
        eal: &'static Eal,
        ports: Vec<(Port, DeviceConfig)>,
        core: Option<usize>,
    ) -> Result<Vec<Device>, VerbsError> {
        let mut engines = Vec::with_capacity(ports.len());
        let mut devices = Vec::with_capacity(ports.len());
        // One thread, one place to sleep: whatever wakes one engine of the
        // group wakes the thread that turns them all.
        let parker = Arc::new(crate::park::Parker::new());
        for (port, cfg) in ports {
            let (e, d) = Self::prepare(eal, port, &cfg, parker.clone())?;
            engines.push(e);
            devices.push(d);
        }
        match dpdk::lcore::spawn_pinned(eal, "rsnic-group", core, move || {
            let _route = TapSignalRoute::here();
            crate::engine::run_group(engines)
        }) {
            Ok(_detached) => Ok(devices),
            Err(source) => {
                // The engines were dropped with the closure: nothing to wait for.
                for d in &devices {
                    d.engines[0].shared.mark_done();
                }
                Err(VerbsError::Thread {
                    what: "engine",
                    source,
                })
            }
        }
    }

    /// Starts a device on `port` whose QPs are sharded over one engine per
    /// entry of `shard_cores` (each pinned to that CPU, or not pinned for
    /// `None`); crate::shard, docs/design.md §5.5.
    ///
    /// Where the port offers a queue pair per shard, shard `k` owns queue
    /// pair `k` and frames on the wrong queue are steered between shards
    /// (`shard::Steer`); otherwise a dispatcher thread on
    /// `cfg.core` owns the port's one queue pair and steers received frames
    /// to the shard of their destination QPN (`shard::Dispatcher`).
    ///
    /// Completion queues are spread over the shards round robin; a QP lives
    /// on the shard of its CQs (both must be on the same one). Memory regions
    /// are registered with every shard, under the same keys. Not available
    /// with a capture file (`cfg.pcap`), which is per engine.
    pub fn open_sharded(
        eal: &'static Eal,
        port: Port,
        cfg: DeviceConfig,
        shard_cores: &[Option<usize>],
    ) -> Result<Device, VerbsError> {
        let n = shard_cores.len();
        if n == 0 {
            return Err(VerbsError::NoShards);
        }
        if cfg.pcap.is_some() {
            return Err(VerbsError::ShardedCapture);
        }
        let cfg = adopt(&port, &cfg)?;
        let mac = match cfg.mac {
            Some(m) => m,
            None => port.mac()?,
        };
        let rx_pool = Engine::rx_pool(eal, &cfg)?;
        let queues = port
            .max_queues()
            .ok()
            .and_then(|(rx, tx)| u16::try_from(n).ok().filter(|&n| n <= rx.min(tx)));
        let mut engines = Vec::new();
        let mut handles = Vec::new();
        let mut dispatcher = None;
        let mut port = Some(port);
        // One port, one line: the shards share its rate (crate::port_shaper),
        // on one clock.
        let clock = dpdk::TscClock::new(eal);
        let line = Arc::new(SharedLine::new(
            cfg.line_rate_bps,
            crate::engine::shaper_depth(cfg.line_rate_bps),
            clock.now_ns(),
        ));
        let mut shard_parts = |k: usize, io: PacketIo, port: Option<Port>, max_frame| {
            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            let parker = Arc::new(crate::park::Parker::new());
            let shared = Arc::new(
                EngineShared::new(MAX_QPS, shard_base(k), parker.clone())
                    .map_err(VerbsError::AsyncEventFd)?,
            );
            let e = Engine::build(
                eal,
                &cfg,
                EngineParts {
                    port,
                    io,
                    rx_pool: rx_pool.clone(),
                    max_frame,
                    mac,
                    shared: shared.clone(),
                    cmd: cmd_rx,
                    capture: None,
                    line: Some((line.clone(), clock)),
                },
            )?;
            handles.push(EngineHandle {
                shared,
                cmd: CommandTx::new(cmd_tx, parker),
            });
            Ok::<_, VerbsError>(e)
        };
        let max_frame;
        if let (Some(q), Some(p)) = (queues, port.as_mut()) {
            // A queue pair per shard: no dispatcher.
            let (rxs, txs, mf) = Engine::open_port_queues(p, &rx_pool, q)?;
            max_frame = mf;
            // One shard owns every frame: nothing to steer, and no reason to
            // read each frame's headers before the RX path's prefetches.
            let rings: Option<Arc<[dpdk::Ring]>> = if n > 1 {
                let rings = (0..n)
                    .map(|_| dpdk::Ring::new(eal, &Engine::unique_name("steer"), SHARD_RING))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(rings.into())
            } else {
                None
            };
            for (k, (rx, tx)) in rxs.into_iter().zip(txs).enumerate() {
                let io = match &rings {
                    Some(rings) => PacketIo::Queue {
                        rx,
                        tx,
                        steer: Steer::new(k, cfg.int_dscp, rings.clone()),
                    },
                    None => PacketIo::Port { rx, tx },
                };
                // Shard 0 keeps the port open (the queues hold it too).
                engines.push(shard_parts(k, io, port.take(), max_frame)?);
            }
        } else {
            let p = port.as_mut().ok_or(VerbsError::PortWithoutQueue)?;
            let (rx, tx, mf) = Engine::open_port(p, &rx_pool)?;
            max_frame = mf;
            let (mut to_shard, mut from_shard, mut pools) = (Vec::new(), Vec::new(), Vec::new());
            let mut shard_parkers = Vec::new();
            // Shards wake the dispatcher when they hand it frames, the
            // dispatcher wakes a shard when it hands it frames (crate::shard).
            let dparker = Arc::new(crate::park::Parker::new());
            for k in 0..n {
                let (in_p, in_c) = dpdk::Ring::spsc(eal, &Engine::unique_name("in"), SHARD_RING)?;
                let (out_p, out_c) =
                    dpdk::Ring::spsc(eal, &Engine::unique_name("out"), SHARD_RING)?;
                let io = PacketIo::Shard {
                    rx: in_c,
                    tx: out_p,
                    dispatcher: dparker.clone(),
                };
                let e = shard_parts(k, io, None, max_frame)?;
                pools.push(e.tx_pools().pools());
                shard_parkers.push(e.parker().clone());
                to_shard.push(in_p);
                from_shard.push(out_c);
                engines.push(e);
            }
            let dshared = Arc::new(
                EngineShared::new(1, QPN_BASE, dparker).map_err(VerbsError::AsyncEventFd)?,
            );
            dispatcher = Some((
                Dispatcher::new(DispatcherParts {
                    port: port.take().ok_or(VerbsError::PortWithoutQueue)?,
                    rx,
                    tx,
                    rx_pool: rx_pool.clone(),
                    to_shard,
                    from_shard,
                    shard_parkers,
                    pools,
                    mac,
                    ip: cfg.ip,
                    int_dscp: cfg.int_dscp,
                    park_when_idle: cfg.idle_yield,
                    clock,
                    shared: dshared.clone(),
                }),
                dshared,
            ));
        }
        let dshared = dispatcher.as_ref().map(|(_, s)| s.clone());
        let mut dev = Device::new(handles, dshared, None, mac, &cfg, max_frame);
        // From here on, `dev`'s drop stops whatever was started.
        if let Some((dispatcher, _)) = dispatcher {
            let started = dpdk::lcore::spawn_pinned(eal, "rsnic-dispatch", cfg.core, move || {
                let _route = TapSignalRoute::here();
                dispatcher.run()
            });
            match started {
                Ok(t) => dev.threads.push(t),
                Err(source) => {
                    dev.all_engines().for_each(|s| s.mark_done());
                    return Err(VerbsError::Thread {
                        what: "dispatcher",
                        source,
                    });
                }
            }
        }
        for ((e, core), k) in engines.into_iter().zip(shard_cores).zip(0..) {
            match dpdk::lcore::spawn_pinned(eal, "rsnic-shard", *core, move || {
                let _route = TapSignalRoute::here();
                e.run()
            }) {
                Ok(t) => dev.threads.push(t),
                Err(source) => {
                    for h in &dev.engines[k..] {
                        h.shared.mark_done();
                    }
                    return Err(VerbsError::Thread {
                        what: "shard",
                        source,
                    });
                }
            }
        }
        Ok(dev)
    }

    /// Whether a dispatcher thread stands between the port and this
    /// device's engines (a sharded device on a port with fewer queue pairs
    /// than shards; crate::shard).
    pub fn has_dispatcher(&self) -> bool {
        self.dispatcher.is_some()
    }

    /// Builds a device's engine (not yet running) and its handle; its
    /// thread will park on `parker`.
    fn prepare(
        eal: &'static Eal,
        port: Port,
        cfg: &DeviceConfig,
        parker: Arc<crate::park::Parker>,
    ) -> Result<(Engine, Device), VerbsError> {
        let cfg = &adopt(&port, cfg)?;
        let mac = match cfg.mac {
            Some(m) => m,
            None => port.mac()?,
        };
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(
            EngineShared::new(MAX_QPS, QPN_BASE, parker.clone())
                .map_err(VerbsError::AsyncEventFd)?,
        );
        let (producer, writer) = match &cfg.pcap {
            Some(path) => {
                let (p, w) = start_capture(path, port.name())?;
                (Some(p), Some(w))
            }
            None => (None, None),
        };
        let engine = Engine::on_port(eal, port, cfg, mac, shared.clone(), cmd_rx, producer)?;
        let handle = EngineHandle {
            shared,
            cmd: CommandTx::new(cmd_tx, parker),
        };
        let dev = Device::new(vec![handle], None, writer, mac, cfg, engine.max_frame());
        Ok((engine, dev))
    }

    fn new(
        engines: Vec<EngineHandle>,
        dispatcher: Option<Arc<EngineShared>>,
        capture: Option<CaptureWriter>,
        mac: [u8; 6],
        cfg: &DeviceConfig,
        max_frame: usize,
    ) -> Device {
        Device {
            engines,
            dispatcher,
            threads: Vec::new(),
            next_cq: AtomicUsize::new(0),
            capture,
            mac,
            ip: cfg.ip,
            next_pd: AtomicU32::new(1),
            ah_ids: Arc::default(),
            max_frame,
            kernel_iface: cfg.kernel_iface.clone(),
        }
    }

    /// Every engine of the device, with the dispatcher of a sharded one.
    fn all_engines(&self) -> impl Iterator<Item = &Arc<EngineShared>> {
        self.engines
            .iter()
            .map(|h| &h.shared)
            .chain(&self.dispatcher)
    }

    /// Stops the engine and releases the port.
    pub fn close(mut self) {
        self.stop();
    }

    /// Stops the engine, as [`Device::close`], and returns its final
    /// counters: each engine publishes them after its last poll turn, so
    /// nothing it counted while the program finished is missing.
    pub fn close_with_counters(mut self) -> Counters {
        self.stop();
        self.counters()
    }

    /// Asks every engine to stop, waits for their threads, then until every
    /// engine has been dropped (its port released), then for the capture
    /// writer to drain and flush.
    pub(crate) fn stop(&mut self) {
        for s in self.all_engines() {
            s.request_stop();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Every engine, alone or in a group, is marked done once dropped (its
        // port released), also when its thread unwinds; so this returns at
        // once when called again (from `Drop` after `close`).
        while !self
            .all_engines()
            .all(|s| s.done.load(std::sync::atomic::Ordering::Acquire))
        {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        // The engine dropped its end of the capture ring: the writer drains
        // what is left, flushes and ends.
        if let Some(t) = self.capture.take() {
            match t.join() {
                Ok(Err(e)) => tracing::warn!(error = %e, "capture file incomplete"),
                Err(_) => tracing::warn!("capture writer panicked"),
                Ok(Ok(_)) => {}
            }
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Creates the capture file at `path` (one interface for received frames,
/// one for sent frames, named after the port) and starts its writer: the
/// engine's end of the capture ring and the writer's thread.
fn start_capture(
    path: &std::path::Path,
    port_name: &str,
) -> Result<(CaptureProducer<CAPTURE_SNAP>, CaptureWriter), VerbsError> {
    let capture_err = |source| VerbsError::Capture {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::create(path).map_err(capture_err)?;
    let ifaces = ["rx", "tx"].map(|dir| Interface {
        name: format!("{port_name}-{dir}"),
        snaplen: CAPTURE_SNAP as u32,
    });
    let writer = PcapngWriter::new(std::io::BufWriter::new(file), &ifaces).map_err(capture_err)?;
    let (p, c) = crate::pcapng::capture_ring(CAPTURE_RING);
    let t = crate::pcapng::spawn_writer(c, writer).map_err(|source| VerbsError::Thread {
        what: "capture writer",
        source,
    })?;
    Ok((p, t))
}

/// `cfg` for a device on `port`: a port on a kernel interface (dpdk's
/// `Port::kernel_iface`) is put in host mode if `cfg` does not say so
/// already, since ARP replies for the NIC would reach the kernel, not it;
/// and, where its driver cannot send chained mbufs (`net_af_xdp` in DPDK
/// 22.11, dpdk::Port::tx_multi_seg), every payload is copied into the
/// frame (`copy_threshold`), so that frames leave in one segment. On a
/// device that reads frames by DMA (a PCI NIC, `Port::dma_from_mbufs_only`)
/// every payload is copied into the mbufs too: registered memory is the
/// program's (or its memfd's) pages, not DPDK memory with an IOVA the NIC
/// may read (issue 44 item 1, the copy path; docs/verbs.md).
fn adopt(port: &Port, cfg: &DeviceConfig) -> Result<DeviceConfig, crate::host::HostError> {
    let mut cfg = cfg.clone();
    if port.dma_from_mbufs_only() {
        cfg.copy_threshold = usize::MAX;
    }
    if let Some(name) = port.kernel_iface() {
        if cfg.kernel_iface.is_none() {
            cfg.kernel_iface = Some(crate::host::KernelIface::new(name)?);
        }
        if !port.tx_multi_seg().unwrap_or(false) {
            cfg.copy_threshold = usize::MAX;
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdma::transport::{Access, SendOp, SendWr, WcStatus};

    use super::*;
    use crate::verbs::{CompletionQueue, MemoryRegion, QpOptions, QueuePair};

    /// How long apart the group's two engines start.
    const GAP: Duration = Duration::from_millis(300);

    /// One ping-pong round's side: WRITE `i` (8 bytes, from offset 8 of
    /// `mine`) to the start of `peer`, and wait for its completion.
    fn write(
        q: &mut QueuePair,
        cq: &mut CompletionQueue,
        i: u64,
        mine: &MemoryRegion,
        peer: &MemoryRegion,
    ) {
        mine.write(8, &i.to_le_bytes());
        let op = SendOp::Write {
            remote_va: peer.va(),
            rkey: peer.rkey(),
        };
        q.post_send(SendWr::signaled(i, op, mine.sge(8, 8)))
            .unwrap();
        let wc = cq.wait(Duration::from_secs(10)).expect("a completion");
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }

    /// Waits until the peer's WRITE `i` has landed at offset 0 of `mine`.
    fn landed(mine: &MemoryRegion, i: u64) {
        let seen = crate::verbs::wait_until(Duration::from_secs(10), || {
            let mut b = [0u8; 8];
            mine.read(0, &mut b);
            (u64::from_le_bytes(b) == i).then_some(())
        });
        assert!(seen.is_some(), "WRITE {i} never landed");
    }

    /// A group's engines each keep time from their own start, and the
    /// group's thread asks each whether it is idle on its own clock: a
    /// ping-pong of WRITEs between two parking devices on one thread,
    /// started `GAP` apart, each WRITE answered by a program thread that
    /// sees it land, never waits for a timer. On the first engine's clock
    /// for both, the later engine's work in the turn before a park looked
    /// `GAP` old: a frame it sent then sat in the ring pair until a timer
    /// woke the thread (roce-perf write_lat's 12 ms tails).
    #[test]
    fn a_group_started_apart_parks_on_each_engines_clock() {
        let eal = Eal::for_tests();
        let (pa, pb) = Port::ring_pair(eal, "group_clock", 1024).unwrap();
        let parker = Arc::new(crate::park::Parker::new());
        let cfg = |ip| {
            let mut c = DeviceConfig::new(ip);
            c.idle_yield = true;
            c
        };
        let (ea, a) = Device::prepare(eal, pa, &cfg([10, 7, 3, 1]), parker.clone()).unwrap();
        std::thread::sleep(GAP);
        let (eb, b) = Device::prepare(eal, pb, &cfg([10, 7, 3, 2]), parker).unwrap();
        dpdk::lcore::spawn_pinned(eal, "group-clock", None, move || {
            crate::engine::run_group(vec![ea, eb])
        })
        .unwrap();
        let (mut ca, mut cb) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
        let mut qa = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
        let mut qb = b.create_qp(&cb, &cb, QpOptions::default()).unwrap();
        // No retransmit within the test: a stall ends only with a wake.
        qa.set_retry(60_000_000_000, 7, 7).unwrap();
        qb.set_retry(60_000_000_000, 7, 7).unwrap();
        qa.connect(&qb.remote_info()).unwrap();
        qb.connect(&qa.remote_info()).unwrap();
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let (ma, mb) = (a.reg_mr(64, acc).unwrap(), b.reg_mr(64, acc).unwrap());
        let (ma2, mb2) = (ma.clone(), mb.clone());
        const ROUNDS: u64 = 3000;
        let answer = std::thread::spawn(move || {
            for i in 1..=ROUNDS {
                landed(&mb2, i);
                write(&mut qb, &mut cb, i, &mb2, &ma2);
            }
            (qb, cb)
        });
        let mut slowest = Duration::ZERO;
        for i in 1..=ROUNDS {
            let start = Instant::now();
            write(&mut qa, &mut ca, i, &ma, &mb);
            landed(&ma, i);
            slowest = slowest.max(start.elapsed());
        }
        let _ = answer.join().unwrap();
        assert!(
            slowest < GAP / 2,
            "a round took {slowest:?}: the thread slept through a frame"
        );
    }
}
