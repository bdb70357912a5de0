//! Builds the fabric for one congestion control and runs a [`Workload`] on it.
//!
//! ```text
//!  sender 0 NIC ──ring──┐
//!  sender 1 NIC ──ring──┤ switch ──ring (shaped to the bottleneck)── receiver NIC
//!  ...                  │
//!  sender N-1 NIC ─ring─┘
//! ```
//!
//! Threads: every NIC engine on ONE poll thread ([`Device::open_group`]), the
//! switch on a second one that we drive ourselves: per loop turn it reads the
//! TSC, calls [`Dataplane::poll`], samples the bottleneck queue when a sample
//! is due, and every few turns polls the senders' completion queues and posts
//! the WRITEs the workload asks for. The calling thread only waits (and draws
//! the progress bar), so the fabric needs two cores.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cc::CcKind;
use dpdk::{lcore, Eal, Mbuf, Mempool, Port, TscClock};
use nic::counters::Counters;
use nic::verbs::{
    CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair, RemoteQp,
};
use rdma::transport::Access;
use switch::dataplane::{Dataplane, PortIo};
use switch::{Config, PortCounters, Switch};

use super::driver::{drive, DriveParams, DriverOut, FlowState, SenderIo};
pub use super::driver::{Completion, NO_SAMPLE, QUEUE_BUCKET, STALL_NS};
use super::{FlowSpec, TestbedError, Workload};

/// Most senders a fabric can have.
pub const MAX_SENDERS: usize = 15;

/// The fabric's settings (the CLI's flags).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FabricConfig {
    /// Bottleneck link speed (the switch port towards the receiver), bit/s.
    pub bottleneck_bps: u64,
    /// Switch data buffer per port, bytes.
    pub buf_max: u64,
    /// WRED K_min, bytes.
    pub k_min: u64,
    /// WRED K_max, bytes.
    pub k_max: u64,
    /// WRED P_max.
    pub p_max: f64,
    /// Not-ECT drop threshold K (LDCP's first RTT), bytes.
    pub k_drop: u64,
    /// Shaper idle credit, bytes.
    pub burst: u64,
    /// Path MTU (256..=1024: frames must fit one mbuf for the switch core).
    pub mtu: u32,
    /// Base RTT the CCs assume, ns (DeviceConfig::base_rtt_ns).
    pub base_rtt_ns: u64,
    /// WRITEs in flight per sender QP.
    pub outstanding: usize,
    /// Bytes of registered memory per sender (WRITEs cycle through it).
    pub region: usize,
    /// CPU of the NIC engines' thread.
    pub nic_core: Option<usize>,
    /// CPU of the switch thread.
    pub switch_core: Option<usize>,
    /// Queue sampling interval, ns.
    pub sample_ns: u64,
    /// WRED seed.
    pub seed: u64,
    /// A run that has not finished after this long is stopped, ns.
    pub timeout_ns: u64,
}

/// What became of one flow.
#[derive(Debug, Clone, Copy)]
pub struct FlowResult {
    /// The flow as planned.
    pub spec: FlowSpec,
    /// Bytes posted.
    pub bytes_posted: u64,
    /// Bytes completed successfully.
    pub bytes_done: u64,
    /// First post (ns after the start).
    pub first_post_ns: Option<u64>,
    /// Last completion (ns after the start), once nothing is left to post.
    pub end_ns: Option<u64>,
}

/// Everything one run recorded.
#[derive(Debug, Clone)]
pub struct RunData {
    /// The CC of every QP.
    pub cc: CcKind,
    /// Per flow.
    pub flows: Vec<FlowResult>,
    /// Every completion, in time order.
    pub completions: Vec<Completion>,
    /// Bottleneck queue samples per [`QUEUE_BUCKET`]-byte bucket (a sample
    /// whose loop turn came k intervals late counts k times).
    pub queue_hist: Vec<u64>,
    /// Largest queue sample per `series_bin_ns` ([`NO_SAMPLE`]: none taken).
    pub queue_series: Vec<u32>,
    /// Width of a `queue_series` bin, ns.
    pub series_bin_ns: u64,
    /// Largest queue sampled, bytes.
    pub queue_max: u64,
    /// From the start to the end of the last flow (or the timeout), ns.
    pub duration_ns: u64,
    /// Bottleneck port counters over the run.
    pub bottleneck: PortCounters,
    /// Frame bytes the switch received from the senders over the run.
    pub offered_bytes: u64,
    /// Switch loop turns.
    pub turns: u64,
    /// Time the switch loop spent in gaps longer than [`STALL_NS`] (descheduled), ns.
    pub stall_ns: u64,
    /// Whether the run hit the timeout.
    pub timed_out: bool,
    /// Error completions and post errors.
    pub errors: Vec<String>,
    /// The senders' NIC counters, summed.
    pub senders_nic: Counters,
    /// The receiver's NIC counters.
    pub receiver_nic: Counters,
    /// Whether the receiver's memory holds what the senders wrote.
    pub verified: bool,
}

const SENDER_MAC: fn(usize) -> [u8; 6] = |i| [0x02, 0, 0, 0, (i >> 8) as u8, (i & 0xff) as u8 + 1];
const RECEIVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x02, 0x01];
const SWITCH_MAC: fn(usize) -> [u8; 6] = |i| [0x02, 0, 0, 0, 0x01, i as u8];
const RECEIVER_IP: [u8; 4] = [10, 0, 1, 1];

fn sender_ip(i: usize) -> [u8; 4] {
    [10, 0, (i >> 8) as u8, (i & 0xff) as u8 + 1]
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The switch configuration: one port per sender at 100 Gbit/s, the
/// receiver's port shaped to the bottleneck.
fn switch_config(cfg: &FabricConfig, sender_ports: &[u16], rx_port: u16) -> String {
    let mut s = format!(
        "switch_id = 1\nint_dscp = {}\nseed = {}\n[defaults]\nspeed = 100000000000\nbuf_max = {}\nk_min = {}\nk_max = {}\np_max = {}\nk_drop = {}\nburst = {}\n",
        rdma::wire::int::DEFAULT_INT_DSCP,
        cfg.seed,
        cfg.buf_max,
        cfg.k_min,
        cfg.k_max,
        cfg.p_max,
        cfg.k_drop,
        cfg.burst
    );
    for (i, &p) in sender_ports.iter().enumerate() {
        s += &format!("[[port]]\nid = {p}\nmac = \"{}\"\n", mac_str(SWITCH_MAC(i)));
    }
    s += &format!(
        "[[port]]\nid = {rx_port}\nmac = \"{}\"\nspeed = {}\n",
        mac_str(SWITCH_MAC(255)),
        cfg.bottleneck_bps
    );
    for (i, &p) in sender_ports.iter().enumerate() {
        let ip = sender_ip(i);
        s += &format!(
            "[[route]]\nprefix = \"{}.{}.{}.{}/32\"\nport = {p}\nnext_hop_mac = \"{}\"\n",
            ip[0],
            ip[1],
            ip[2],
            ip[3],
            mac_str(SENDER_MAC(i))
        );
    }
    s += &format!(
        "[[route]]\nprefix = \"10.0.1.1/32\"\nport = {rx_port}\nnext_hop_mac = \"{}\"\n",
        mac_str(RECEIVER_MAC)
    );
    s
}

/// Validates the parts of `cfg` the switch does not check itself.
pub fn check_config(cfg: &FabricConfig, senders: usize) -> Result<(), TestbedError> {
    // Two ports per NIC (NIC and switch ends of its ring pair) out of
    // DPDK 22.11's 32 port ids.
    if senders == 0 || senders > MAX_SENDERS {
        return Err(TestbedError::Config(format!(
            "--senders {senders}: must be 1..={MAX_SENDERS} (DPDK's 32 port ids, two per NIC)"
        )));
    }
    if ![256, 512, 1024].contains(&cfg.mtu) {
        return Err(TestbedError::Config(format!(
            "--mtu {}: must be 256, 512 or 1024 (the switch core needs every frame in one 2 KiB mbuf)",
            cfg.mtu
        )));
    }
    if cfg.outstanding == 0 || cfg.outstanding > 1024 {
        return Err(TestbedError::Config(format!(
            "--outstanding {}: must be 1..=1024",
            cfg.outstanding
        )));
    }
    if cfg.sample_ns == 0 {
        return Err(TestbedError::Config("--sample-us must be > 0".into()));
    }
    // Let the switch validate thresholds against each other.
    let ports: Vec<u16> = (0..senders as u16).collect();
    Config::load_str(&switch_config(cfg, &ports, senders as u16))?;
    Ok(())
}

/// Builds the fabric with every QP on `cc`, runs `w`, tears it down. `tag`
/// makes the DPDK object names unique in the process. `wait` is called about
/// every 100 ms with the progress (0..1) while the run goes on.
pub fn run(
    eal: &'static Eal,
    cfg: &FabricConfig,
    cc: CcKind,
    w: &Workload,
    tag: &str,
    wait: &mut dyn FnMut(f64),
) -> Result<RunData, TestbedError> {
    let n = w.senders;
    check_config(cfg, n)?;
    let (dp, nic_ports, rx_nic, sender_ids, rx_id) = build_switch(eal, cfg, n, tag)?;

    // NICs: all engines on one thread.
    let dev_cfg = |ip: [u8; 4], mac: [u8; 6], pool: u32| {
        let mut c = DeviceConfig::new(ip);
        c.mac = Some(mac);
        c.line_rate_bps = cfg.bottleneck_bps;
        c.base_rtt_ns = cfg.base_rtt_ns;
        c.pool_size = pool;
        // The switch core parses the first segment only: keep frames in one.
        c.copy_threshold = 2048;
        c
    };
    let mut group: Vec<(Port, DeviceConfig)> = nic_ports
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, dev_cfg(sender_ip(i), SENDER_MAC(i), 4095)))
        .collect();
    group.push((rx_nic, dev_cfg(RECEIVER_IP, RECEIVER_MAC, 8191)));
    let mut devs = Device::open_group(eal, group, cfg.nic_core)?;
    let rx_dev = devs.pop().expect("receiver device");
    let tx_devs = devs;

    let opts = QpOptions {
        cc,
        mtu: cfg.mtu,
        sq_depth: (cfg.outstanding + 16).min(4096) as u16,
        rq_depth: 16,
        ..QpOptions::default()
    };
    let Receivers {
        rx_cq,
        rx_qps,
        rx_mrs,
        senders,
    } = connect_senders(cfg, w, opts, &tx_devs, &rx_dev)?;

    let progress = Arc::new(AtomicU64::new(0));
    let p2 = progress.clone();
    let flows: Vec<FlowState> = w
        .flows
        .iter()
        .map(|&spec| FlowState {
            spec,
            posted: 0,
            done: 0,
            posting_done: false,
            first_post: None,
            end: None,
        })
        .collect();
    let total_bytes = w.total_bytes();
    let planned = w.planned_ns.max(1);
    let (timeout, sample_ns, outstanding) = (cfg.timeout_ns, cfg.sample_ns, cfg.outstanding);
    // Plot bins: about 4000 over the planned time, at least the sample interval.
    let series_bin_ns = (planned / 4000).max(sample_ns);
    let hist_len = (cfg.buf_max / QUEUE_BUCKET + 2) as usize;
    let worker = lcore::spawn_pinned(eal, "tb-switch", cfg.switch_core, move || {
        drive(
            dp,
            senders,
            flows,
            DriveParams {
                rx_port: rx_id,
                sender_ports: sender_ids,
                sample_ns,
                series_bin_ns,
                hist_len,
                timeout,
                outstanding,
                total_bytes,
                planned,
            },
            &p2,
        )
    })
    .map_err(|e| TestbedError::Thread(format!("cannot start the switch thread: {e}")))?;
    while !worker.is_finished() {
        wait(progress.load(Ordering::Relaxed) as f64 / 1e6);
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = worker
        .join()
        .map_err(|_| TestbedError::Thread("the switch thread panicked".into()))?;
    wait(1.0);

    // Counters are published about every millisecond: let them settle.
    std::thread::sleep(Duration::from_millis(5));
    let mut senders_nic = Counters::default();
    for d in &tx_devs {
        let c = d.counters();
        add_counters(&mut senders_nic, &c);
    }
    let receiver_nic = rx_dev.counters();

    let (data, dp, senders) = run_data(cc, rx_id, out, &rx_mrs, senders_nic, receiver_nic);
    // Tear down: QPs first, then the devices (the engine thread ends with
    // the last), then the switch's ports.
    drop(senders);
    drop(rx_qps);
    drop(rx_mrs);
    drop(rx_cq);
    for d in tx_devs {
        d.close();
    }
    rx_dev.close();
    drop(dp);
    Ok(data)
}

/// The switch side of a run: one ring pair per sender and one to the receiver, the
/// switch core configured for them on its own pool, in a dataplane. The NICs' ends
/// of the rings, the receiver's, the switch's port ids of the senders and of the
/// receiver.
#[allow(clippy::type_complexity)]
fn build_switch(
    eal: &'static Eal,
    cfg: &FabricConfig,
    n: usize,
    tag: &str,
) -> Result<(Dataplane, Vec<Port>, Port, Vec<u16>, u16), TestbedError> {
    let pool = Mempool::new(
        eal,
        &format!("tb{tag}sw"),
        1023,
        32,
        Mempool::DEFAULT_DATA_ROOM,
    )?;
    let mut nic_ports = Vec::with_capacity(n + 1);
    let mut sw_ports = Vec::with_capacity(n + 1);
    for i in 0..n {
        let (a, b) = Port::ring_pair(eal, &format!("tb{tag}s{i}"), 4096)?;
        nic_ports.push(a);
        sw_ports.push(b);
    }
    let (rx_nic, rx_sw) = Port::ring_pair(eal, &format!("tb{tag}r"), 4096)?;
    let sender_ids: Vec<u16> = sw_ports.iter().map(|p| p.id()).collect();
    let rx_id = rx_sw.id();
    let settings = Config::load_str(&switch_config(cfg, &sender_ids, rx_id))?;
    let sw: Switch<Mbuf> = Switch::new(&settings);
    let mut ios = Vec::with_capacity(n + 1);
    for mut p in sw_ports.into_iter().chain(std::iter::once(rx_sw)) {
        let (rx, tx) = p.configure_single(&pool)?;
        ios.push(PortIo::new(p.id(), rx, tx));
    }
    let dp = Dataplane::new(sw, ios, TscClock::new(eal));

    Ok((dp, nic_ports, rx_nic, sender_ids, rx_id))
}

/// The receiver's side of every sender's QP, and the senders.
struct Receivers {
    rx_cq: CompletionQueue,
    rx_qps: Vec<QueuePair>,
    rx_mrs: Vec<MemoryRegion>,
    senders: Vec<SenderIo>,
}

/// One connected QP pair per sender (its next hop the switch port it is cabled
/// to), its source region filled with its pattern, its destination region at the
/// receiver.
fn connect_senders(
    cfg: &FabricConfig,
    w: &Workload,
    opts: QpOptions,
    tx_devs: &[Device],
    rx_dev: &Device,
) -> Result<Receivers, TestbedError> {
    let n = tx_devs.len();
    let rx_cq = rx_dev.create_cq(1024)?;
    let mut rx_qps = Vec::with_capacity(n);
    let mut rx_mrs = Vec::with_capacity(n);
    let mut senders = Vec::with_capacity(n);
    for (i, dev) in tx_devs.iter().enumerate() {
        let stride = w
            .flows
            .iter()
            .filter(|f| f.sender == i)
            .map(|f| f.msg as usize)
            .max()
            .unwrap_or(4096)
            .max(1);
        let region = cfg.region.max(stride) / stride * stride;
        let cq = dev.create_cq(cfg.outstanding + 64)?;
        let mut qp = dev.create_qp(&cq, &cq, opts)?;
        let mut rqp = rx_dev.create_qp(&rx_cq, &rx_cq, opts)?;
        let (a, b) = (qp.remote_info(), rqp.remote_info());
        // Next hops: the switch port each NIC is cabled to.
        qp.connect(&RemoteQp {
            mac: Some(SWITCH_MAC(i)),
            ..b
        })?;
        rqp.connect(&RemoteQp {
            mac: Some(SWITCH_MAC(255)),
            ..a
        })?;
        let src = dev.reg_mr(region, Access::LOCAL_WRITE)?;
        fill_pattern(&src, i as u8);
        let dst = rx_dev.reg_mr(region, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
        senders.push(SenderIo {
            qp,
            cq,
            dst_va: dst.va(),
            rkey: dst.rkey(),
            src,
            flows: (0..w.flows.len())
                .filter(|&f| w.flows[f].sender == i)
                .collect(),
            cursor: 0,
            inflight: VecDeque::with_capacity(cfg.outstanding + 1),
            stride,
            slots: region / stride,
            msgs: 0,
            slot_len: vec![0; region / stride],
        });
        rx_qps.push(rqp);
        rx_mrs.push(dst);
    }
    Ok(Receivers {
        rx_cq,
        rx_qps,
        rx_mrs,
        senders,
    })
}

/// The run's figures from what the driver returned: the data checked against the
/// patterns, the bottleneck's counters and what the senders offered; the dataplane
/// and the senders back for the teardown.
fn run_data(
    cc: CcKind,
    rx_id: u16,
    out: DriverOut,
    rx_mrs: &[MemoryRegion],
    senders_nic: Counters,
    receiver_nic: Counters,
) -> (RunData, Dataplane, Vec<SenderIo>) {
    let mut verified = out.errors.is_empty() && !out.timed_out;
    for (s, dst) in out.senders.iter().zip(rx_mrs) {
        verified &= verify(s, dst);
    }
    let bn = *out
        .dp
        .switch
        .counters(rx_id)
        .unwrap_or(&PortCounters::default());
    let bottleneck = diff_counters(&bn, &out.bn0);
    let offered: u64 = out
        .dp
        .ports
        .iter()
        .filter(|p| p.id != rx_id)
        .filter_map(|p| out.dp.switch.counters(p.id))
        .map(|c| c.rx_bytes)
        .sum::<u64>()
        - out.offered0;

    let data = RunData {
        cc,
        flows: out
            .flows
            .iter()
            .map(|f| FlowResult {
                spec: f.spec,
                bytes_posted: f.posted,
                bytes_done: f.done,
                first_post_ns: f.first_post,
                end_ns: f.end,
            })
            .collect(),
        completions: out.completions,
        queue_hist: out.hist,
        queue_series: out.series,
        series_bin_ns: out.series_bin_ns,
        queue_max: out.queue_max,
        duration_ns: out.duration_ns,
        bottleneck,
        offered_bytes: offered,
        turns: out.turns,
        stall_ns: out.stall_ns,
        timed_out: out.timed_out,
        errors: out.errors,
        senders_nic,
        receiver_nic,
        verified,
    };
    let DriverOut { dp, senders, .. } = out;
    (data, dp, senders)
}

fn fill_pattern(m: &MemoryRegion, seed: u8) {
    let chunk: Vec<u8> = (0..1u32 << 16)
        .map(|i| (i.wrapping_mul(31) >> 3) as u8 ^ seed.wrapping_mul(101))
        .collect();
    let mut off = 0;
    while off < m.len() {
        let n = chunk.len().min(m.len() - off);
        m.write(off, &chunk[..n]);
        off += n;
    }
}

/// Whether every slot the sender wrote holds the sender's bytes at the receiver.
fn verify(s: &SenderIo, dst: &MemoryRegion) -> bool {
    let mut a = vec![0u8; s.stride];
    let mut b = vec![0u8; s.stride];
    s.slot_len.iter().enumerate().all(|(slot, &len)| {
        let len = len as usize;
        if len == 0 {
            return true;
        }
        s.src.read(slot * s.stride, &mut a[..len]);
        dst.read(slot * s.stride, &mut b[..len]);
        a[..len] == b[..len]
    })
}

fn add_counters(acc: &mut Counters, c: &Counters) {
    acc.tx_packets += c.tx_packets;
    acc.tx_bytes += c.tx_bytes;
    acc.rx_packets += c.rx_packets;
    acc.rx_bytes += c.rx_bytes;
    acc.tx_data_packets += c.tx_data_packets;
    acc.retransmits += c.retransmits;
    acc.timeouts += c.timeouts;
    acc.rx_naks += c.rx_naks;
    acc.rx_cnps += c.rx_cnps;
    acc.rx_acks += c.rx_acks;
    acc.tx_drop_no_mbuf += c.tx_drop_no_mbuf;
    acc.tx_drop_queue_full += c.tx_drop_queue_full;
    acc.completion_errors += c.completion_errors;
}

fn diff_counters(now: &PortCounters, then: &PortCounters) -> PortCounters {
    PortCounters {
        rx_packets: now.rx_packets - then.rx_packets,
        rx_bytes: now.rx_bytes - then.rx_bytes,
        enqueued: now.enqueued - then.enqueued,
        ce_marked: now.ce_marked - then.ce_marked,
        wred_drops: now.wred_drops - then.wred_drops,
        tail_drops: now.tail_drops - then.tail_drops,
        tx_packets: now.tx_packets - then.tx_packets,
        tx_bytes: now.tx_bytes - then.tx_bytes,
        tx_wire_bytes: now.tx_wire_bytes - then.tx_wire_bytes,
        int_pushed: now.int_pushed - then.int_pushed,
        ..*now
    }
}
