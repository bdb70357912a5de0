//! One run of a scenario for one CC: build the fabric, run it, report.

use std::time::Instant;

use cc::CcKind;

use crate::fabric::{RunConfig, RunTotals, Sim};
use crate::nic::NicConfig;
use crate::report::{CcReport, PathModel, RunOutcome};
use crate::topo::Topology;
use crate::workload::Flow;

/// Settings common to every CC of a scenario.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// RoCE MTU.
    pub mtu: u32,
    /// The CCs' T, ns (0: the topology's base RTT).
    pub base_rtt_ns: u64,
    /// Seed.
    pub seed: u64,
    /// Message size flows are written in (0: one message per flow).
    pub msg_bytes: u32,
    /// Messages outstanding per flow.
    pub outstanding: u16,
    /// Queue sampling interval, ns.
    pub sample_ns: u64,
    /// Simulated time limit, ns.
    pub max_time_ns: u64,
    /// Retransmit timeout, ns.
    pub timeout_ns: u64,
    /// Control-class buffer per port, bytes.
    pub ctrl_buf: u64,
    /// The NICs' line rate as their CC and pacer know it, bit/s (0: the host link's).
    /// roce-testbed gives its NICs the bottleneck's rate while their ports run faster.
    pub nic_line_bps: u64,
    /// PFC (XOFF, XON) bytes per ingress link, or none.
    pub pfc: Option<(u64, u64)>,
    /// Each switch's data queues share a pool of this many bytes with a dynamic
    /// threshold of `2^alpha_log2` x the free bytes: `(bytes, alpha_log2)`, or none.
    pub shared_buffer: Option<(u64, i8)>,
    /// Logical partitions of the event loop (0: the topology's choice); the results
    /// depend on it.
    pub partitions: u32,
    /// Threads that run them (0: as many as partitions and cores allow); the results
    /// do not depend on it.
    pub threads: u32,
    /// Bytes a QP without CC sends per visit of its NIC's round robin (0: one
    /// packet; QPs under CC always send one).
    pub sched_quantum: u32,
    /// Loss recovery of every QP (go-back-N, or selective repeat with IRN's BDP
    /// cap and timeouts: `rdma::transport::sack`).
    pub loss_recovery: rdma::transport::LossRecovery,
}

/// The outcome of one run.
pub struct Run {
    /// The report.
    pub report: CcReport,
    /// Raw totals.
    pub totals: RunTotals,
}

/// Runs `flows` on `topo` with `cc`; `progress(now, done, total)` is called now and then.
pub fn run(
    topo: &Topology,
    flows: &[Flow],
    cc: CcKind,
    p: &Params,
    progress: impl FnMut(u64, usize, usize),
) -> Result<Run, String> {
    let base_rtt_ns = if p.base_rtt_ns > 0 {
        p.base_rtt_ns
    } else {
        topo.base_rtt_ns(p.mtu)
    };
    let cfg = RunConfig {
        nic: NicConfig {
            line_rate_bps: if p.nic_line_bps > 0 {
                p.nic_line_bps
            } else {
                topo.host_rate_bps
            },
            link_bps: topo.host_rate_bps,
            base_rtt_ns,
            mtu: p.mtu,
            cc,
            int_dscp: rdma::wire::int::DEFAULT_INT_DSCP,
            timeout_ns: p.timeout_ns,
            sched_quantum: p.sched_quantum,
            loss_recovery: p.loss_recovery,
        },
        seed: p.seed,
        msg_bytes: if p.msg_bytes == 0 {
            u32::MAX >> 1
        } else {
            p.msg_bytes
        },
        outstanding: p.outstanding.max(1),
        sample_ns: p.sample_ns,
        max_time_ns: p.max_time_ns,
        ctrl_buf: p.ctrl_buf,
        pfc: p.pfc,
        shared_buffer: p.shared_buffer,
        partitions: p.partitions,
        threads: p.threads,
    };
    if !matches!(p.mtu, 256 | 512 | 1024) {
        return Err(format!(
            "--mtu {}: one of 256, 512, 1024 (the simulator's frame buffers hold MTU {})",
            p.mtu,
            crate::frame::MAX_MTU
        ));
    }
    let mut sim = Sim::new(topo, flows.to_vec(), cfg)?;
    let wall = Instant::now();
    let totals = sim.run(progress);
    let wall_s = wall.elapsed().as_secs_f64();
    // Clock ticks are 10 ms: a shorter run reports its wall time.
    let cpu_s = match totals.cpu_s {
        Some(c) if c >= 0.1 => c,
        _ => wall_s,
    };
    let delivered = sim.delivered();
    let samples = std::mem::take(&mut sim.samples);
    let (fl, res) = sim.flows();
    let path = |f: &Flow| PathModel {
        rates: topo.path_rates(f.src, f.dst),
        prop_ns: topo.prop_ns,
    };
    let monitored_bps = topo
        .monitored
        .iter()
        .map(|&(s, port)| topo.switches[s as usize].ports[usize::from(port)].speed_bps)
        .collect();
    let report = CcReport::build(RunOutcome {
        cc: cc.as_str(),
        flows: fl,
        results: res,
        totals: &totals,
        samples,
        monitored_bps,
        delivered,
        path: &path,
        mtu: p.mtu,
        wall_s,
        cpu_s,
    });
    Ok(Run { report, totals })
}
