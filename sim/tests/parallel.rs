//! The parallel event loop: the results are a function of the inputs, the seed and
//! the number of logical partitions, never of the threads that run them, and no
//! message between partitions takes effect before the barrier it crosses.

use cc::CcKind;
use sim::fabric::{RunConfig, RunTotals, Sim};
use sim::nic::NicConfig;
use sim::topo::{hpcc_ecn, Topology};
use sim::workload::{self, SizeCdf};

const G100: u64 = 100_000_000_000;

/// Everything a run produced except its CPU time and thread count: each flow's start
/// and end, the queue samples, every counter.
#[derive(Debug, PartialEq)]
struct Outcome {
    results: Vec<(u64, u64)>,
    samples: Vec<u32>,
    delivered: u64,
    totals: String,
}

fn run(
    topo: &Topology,
    cc: CcKind,
    pfc: bool,
    partitions: u32,
    threads: u32,
) -> (Outcome, RunTotals) {
    let cdf = SizeCdf::parse(workload::WEBSEARCH).unwrap();
    let flows = workload::poisson(topo.hosts(), G100, 0.5, 1_000_000, &cdf, 7);
    let cfg = RunConfig {
        nic: NicConfig {
            line_rate_bps: G100,
            link_bps: G100,
            base_rtt_ns: topo.base_rtt_ns(1024),
            mtu: 1024,
            cc,
            int_dscp: rdma::wire::int::DEFAULT_INT_DSCP,
            timeout_ns: 67_108_864,
            sched_quantum: 0,
            loss_recovery: Default::default(),
        },
        seed: 7,
        msg_bytes: u32::MAX >> 1,
        outstanding: 1,
        sample_ns: 10_000,
        max_time_ns: 1_000_000_000,
        ctrl_buf: 1 << 18,
        // A low XOFF so that PAUSEs cross between partitions.
        pfc: pfc.then_some((32_000, 16_000)),
        shared_buffer: None,
        partitions,
        threads,
    };
    let mut sim = Sim::new(topo, flows, cfg).unwrap();
    assert_eq!(sim.partitions(), (partitions as usize, threads as usize));
    let mut t = sim.run(|_, _, _| {});
    let (fl, res) = sim.flows();
    assert!(fl.len() > 50, "{} flows", fl.len());
    assert!(res.iter().all(|r| r.end > 0), "a flow did not finish");
    let offered: u64 = fl.iter().map(|f| f.bytes).sum();
    assert_eq!(sim.delivered(), offered);
    let out = Outcome {
        results: res.iter().map(|r| (r.start, r.end)).collect(),
        samples: sim.samples.clone(),
        delivered: sim.delivered(),
        totals: {
            let mut c = t.clone();
            c.cpu_s = None;
            c.threads = 0;
            format!("{c:?}")
        },
    };
    t.cpu_s = None;
    (out, t)
}

/// The paper's shape at 32 hosts split in two (ToRs, aggregation switches and cores
/// halved), DCQCN with PFC: frames and PAUSEs cross in both directions. One thread
/// running both partitions one after the other and two running them at once give
/// the same flows, samples and counters, and no message arrives late.
#[test]
fn two_threads_give_the_results_of_one() {
    let topo = Topology::fattree("hpcc32", Topology::hpcc_shape(32, 1000).unwrap(), |b| {
        hpcc_ecn(b, 1 << 20)
    });
    let (one, t) = run(&topo, CcKind::Dcqcn, true, 2, 1);
    let (two, _) = run(&topo, CcKind::Dcqcn, true, 2, 2);
    assert!(t.cross_messages > 10_000, "{t:?}");
    assert!(t.pfc_pauses > 0, "no PAUSE: {t:?}");
    assert_eq!(t.late_messages, 0);
    assert_eq!(t.lookahead_ns, 1000);
    assert_eq!(one, two);
}

/// Four partitions (the k = 4 fat-tree's pods, a core each) on one, two and four
/// threads: each partition's messages come from three others.
#[test]
fn four_partitions_on_one_two_and_four_threads_agree() {
    let topo = Topology::fattree("k4", Topology::kary_shape(4, G100, 1000).unwrap(), |b| {
        hpcc_ecn(b, 1 << 20)
    });
    let (one, t) = run(&topo, CcKind::Hpcc, true, 4, 1);
    assert!(t.cross_messages > 10_000, "{t:?}");
    assert_eq!(t.late_messages, 0);
    for threads in [2, 4] {
        let (other, _) = run(&topo, CcKind::Hpcc, true, 4, threads);
        assert_eq!(one, other, "{threads} threads");
    }
}

/// The partition count is part of the input: one partition and two give runs that
/// differ in their tie orders but agree on every flow finishing and every byte
/// arriving (checked in `run`), and the star of the incast always runs as one.
#[test]
fn partition_count_is_chosen_from_the_topology() {
    let small = Topology::fattree("hpcc32", Topology::hpcc_shape(32, 1000).unwrap(), |b| {
        hpcc_ecn(b, 1 << 20)
    });
    assert_eq!(small.auto_partitions(), 1);
    let paper = Topology::fattree("hpcc320", Topology::hpcc_shape(320, 1000).unwrap(), |b| {
        hpcc_ecn(b, 1 << 20)
    });
    assert_eq!(paper.auto_partitions(), 2);
    let (hosts, switches) = paper.partition(2).unwrap();
    // 160 hosts, 10 ToRs, 10 aggregation switches and 8 cores each.
    assert_eq!(hosts.iter().filter(|&&p| p == 0).count(), 160);
    assert_eq!(switches.iter().filter(|&&p| p == 0).count(), 28);
    let port = hpcc_ecn(G100, 1 << 20);
    let star = Topology::star(9, G100, G100, 1000, port);
    assert_eq!(star.auto_partitions(), 1);
    assert!(star.partition(2).is_err());
    let (a, _) = run(&small, CcKind::Hpcc, false, 1, 1);
    let (b, t) = run(&small, CcKind::Hpcc, false, 2, 2);
    assert_eq!(t.partitions, 2);
    assert_eq!(a.results.len(), b.results.len());
}
