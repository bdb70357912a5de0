//! The simulator end to end: link timing, ECMP spread, determinism, and the invariants
//! CI checks (every flow completes, bytes conserved, slowdown >= 1) on a small fat-tree
//! for every CC.

use cc::CcKind;
use sim::fabric::{RunConfig, Sim};
use sim::nic::NicConfig;
use sim::report::{ideal_fct_ns, PathModel};
use sim::scenario::{self, Params};
use sim::topo::{hpcc_ecn, PortParams, Topology};
use sim::workload::{self, Flow, SizeCdf};

const G100: u64 = 100_000_000_000;

fn params(seed: u64) -> Params {
    Params {
        mtu: 1024,
        base_rtt_ns: 0,
        seed,
        msg_bytes: 0,
        outstanding: 1,
        sample_ns: 10_000,
        max_time_ns: 1_000_000_000,
        timeout_ns: 67_108_864,
        ctrl_buf: 256 << 10,
        nic_line_bps: 0,
        pfc: None,
        shared_buffer: None,
        partitions: 0,
        threads: 0,
        sched_quantum: 0,
        loss_recovery: Default::default(),
    }
}

fn star(n: u32) -> Topology {
    let port = PortParams {
        speed_bps: G100,
        buf_max: 1 << 20,
        k_min: 100_000,
        k_max: 400_000,
        p_max: 0.2,
    };
    Topology::star(n, G100, G100, 1000, port)
}

/// One packet alone: the FCT is two store-and-forward link crossings of the data frame
/// and of the ACK, each its serialisation plus 1 us (each shaper rounds a frame's time
/// down to the ns and carries the rest to the next frame).
#[test]
fn single_packet_fct_is_link_serialisation_plus_propagation() {
    let topo = star(2);
    let flows = vec![Flow {
        src: 1,
        dst: 0,
        bytes: 1000,
        start_ns: 5_000,
    }];
    let r = scenario::run(&topo, &flows, CcKind::None, &params(1), |_, _, _| {}).unwrap();
    assert_eq!(r.report.unfinished, 0);
    let fct = r.report.per_flow[0].1
        * ideal_fct_ns(
            1000,
            1024,
            &PathModel {
                rates: vec![G100, G100],
                prop_ns: 1000,
            },
        );
    // WRITE ONLY frame: 14 + 20 + 8 + 12 (BTH) + 16 (RETH) + 1000 + 4 (ICRC) = 1074,
    // 1098 on the wire; ACK: 14 + 20 + 8 + 12 + 4 (AETH) + 4 = 62, 86 on the wire.
    let ser = |wire: f64| (wire * 8.0 / 100.0).floor();
    let want = 2.0 * ser(1098.0) + 2.0 * ser(86.0) + 4.0 * 1000.0;
    assert!((fct - want).abs() < 0.5, "FCT {fct} ns, expected {want}");
}

#[test]
fn ecmp_spreads_flows_over_the_uplinks_and_keeps_each_on_one_path() {
    // k = 4: 16 hosts; every flow from pod 0 to pod 1 leaves its ToR on one of 2
    // uplinks. 64 single-packet flows from host 0.
    let shape = Topology::kary_shape(4, G100, 1000).unwrap();
    let topo = Topology::fattree("k4", shape, |b| hpcc_ecn(b, 1 << 20));
    let flows: Vec<Flow> = (0..64)
        .map(|i| Flow {
            src: 0,
            dst: 8 + (i % 8),
            bytes: 3000,
            start_ns: i as u64 * 20_000,
        })
        .collect();
    let nic = NicConfig {
        line_rate_bps: G100,
        link_bps: G100,
        base_rtt_ns: topo.base_rtt_ns(1024),
        mtu: 1024,
        cc: CcKind::None,
        int_dscp: rdma::wire::int::DEFAULT_INT_DSCP,
        timeout_ns: 67_108_864,
        sched_quantum: 0,
        loss_recovery: Default::default(),
    };
    let cfg = RunConfig {
        nic,
        seed: 3,
        msg_bytes: u32::MAX >> 1,
        outstanding: 1,
        sample_ns: 0,
        max_time_ns: 1_000_000_000,
        ctrl_buf: 1 << 18,
        pfc: None,
        shared_buffer: None,
        partitions: 0,
        threads: 0,
    };
    let mut sim = Sim::new(&topo, flows, cfg).unwrap();
    sim.run(|_, _, _| {});
    assert_eq!(sim.finished(), 64);
    // ToR 0: ports 0, 1 down, 2, 3 up. Each flow is 3 data packets on one uplink.
    let up: Vec<u64> = (2..4)
        .map(|p| sim.port_counters(0, p).unwrap().tx_packets)
        .collect();
    assert_eq!(up.iter().sum::<u64>(), 64 * 3, "{up:?}");
    assert!(
        up.iter().all(|&n| n % 3 == 0),
        "a flow split over paths: {up:?}"
    );
    assert!(up.iter().all(|&n| n >= 64 * 3 / 4), "uneven spread {up:?}");
}

fn small_run(seed: u64, cc: CcKind) -> scenario::Run {
    let shape = Topology::kary_shape(4, G100, 1000).unwrap();
    let topo = Topology::fattree("k4", shape, |b| hpcc_ecn(b, 1 << 20));
    let cdf = SizeCdf::parse(workload::WEBSEARCH).unwrap();
    let flows = workload::poisson(topo.hosts(), G100, 0.3, 1_000_000, &cdf, seed);
    scenario::run(&topo, &flows, cc, &params(seed), |_, _, _| {}).unwrap()
}

#[test]
fn same_seed_same_output_other_seed_other_output() {
    let a = small_run(5, CcKind::Hpcc);
    let b = small_run(5, CcKind::Hpcc);
    let c = small_run(6, CcKind::Hpcc);
    assert_eq!(a.report.per_flow, b.report.per_flow);
    assert_eq!(a.totals.events, b.totals.events);
    assert_eq!(a.report.queue_sorted, b.report.queue_sorted);
    assert_ne!(a.report.per_flow, c.report.per_flow);
}

#[test]
fn every_cc_completes_every_flow_conserves_bytes_and_slowdown_is_at_least_one() {
    for cc in CcKind::ALL {
        let r = small_run(2, cc).report;
        assert!(r.flows > 10, "{cc}: {} flows", r.flows);
        assert_eq!(r.unfinished, 0, "{cc}");
        assert_eq!(r.bytes_delivered, r.bytes_offered, "{cc}");
        let min = r.per_flow.iter().map(|f| f.1).fold(f64::INFINITY, f64::min);
        assert!(min >= 1.0, "{cc}: slowdown {min}");
    }
}

/// roce-testbed's incast without CC: 8 senders of 2 MiB (32 KiB WRITEs, 16 in flight)
/// into a 1 Gbit/s port with a 1 MB buffer; NICs at 1 Gbit/s on 100 Gbit/s links.
fn incast_8_to_1() -> (Topology, Vec<Flow>, Params) {
    let g1 = 1_000_000_000;
    let port = PortParams {
        speed_bps: 100 * g1,
        buf_max: 1_000_000,
        k_min: 20_000,
        k_max: 100_000,
        p_max: 0.5,
    };
    let topo = Topology::star(9, 100 * g1, g1, 1000, port);
    let flows = workload::incast(8, 2 << 20);
    let mut p = params(1);
    p.msg_bytes = 32 << 10;
    p.outstanding = 16;
    p.nic_line_bps = g1;
    (topo, flows, p)
}

/// Shared buffer: an 8:1 incast without CC into one port fills a private 1 MB port
/// buffer; with a 1 MB pool shared by the switch's ports at alpha = 1 the port's
/// queue stops at about half the pool (the dynamic threshold), and everything is
/// still delivered (go-back-N recovers what the threshold dropped).
#[test]
fn shared_buffer_holds_a_congested_port_at_its_dynamic_threshold() {
    let (topo, flows, mut p) = incast_8_to_1();
    let private = scenario::run(&topo, &flows, CcKind::None, &p, |_, _, _| {})
        .unwrap()
        .report;
    assert!(private.queue_max > 900_000, "{}", private.queue_max);
    p.shared_buffer = Some((1_000_000, 0));
    let r = scenario::run(&topo, &flows, CcKind::None, &p, |_, _, _| {})
        .unwrap()
        .report;
    assert!(r.drops > 0);
    assert!(
        r.queue_max > 400_000 && r.queue_max <= 500_000 + 2_000,
        "{}",
        r.queue_max
    );
    assert_eq!(r.unfinished, 0);
    assert_eq!(r.bytes_delivered, r.bytes_offered);
}

/// PFC: an 8:1 incast without CC overflows a 1 MB buffer; with PAUSE at 100 KB per
/// ingress link it loses nothing, the senders spend time paused, and the link stays full.
#[test]
fn pfc_makes_an_uncontrolled_incast_lossless() {
    let (topo, flows, mut p) = incast_8_to_1();
    let lossy = scenario::run(&topo, &flows, CcKind::None, &p, |_, _, _| {}).unwrap();
    assert!(lossy.report.drops > 0);
    assert_eq!(lossy.report.pfc_pause_ns, 0);
    p.pfc = Some((100_000, 50_000));
    let r = scenario::run(&topo, &flows, CcKind::None, &p, |_, _, _| {})
        .unwrap()
        .report;
    assert_eq!((r.unfinished, r.drops, r.retransmits), (0, 0, 0));
    assert_eq!(r.bytes_delivered, r.bytes_offered);
    assert!(r.pfc_pauses > 0 && r.pfc_pause_ns > 0);
    assert!(r.utilisation > 0.95, "{}", r.utilisation);
    // Each ingress link holds at most XOFF plus what was in flight when it paused.
    assert!(r.queue_max <= 8 * (100_000 + 20_000), "{}", r.queue_max);
}

/// More flows at once than a NIC has QPs (`MAX_QPS`): hosts 1 and 2 each start
/// 2100 flows of 10 KB into host 0 at the same instant, so host 0 runs out of
/// QPs and the flows beyond its 4096 wait and retry. A retry that finds one end
/// full gives back the QP it opened at the other, so every flow still completes
/// and every QP is closed at the end.
#[test]
fn flows_beyond_a_nics_qps_wait_and_leak_no_qp() {
    let per_src = 2100;
    let flows: Vec<Flow> = (0..2 * per_src)
        .map(|i| Flow {
            src: 1 + i % 2,
            dst: 0,
            bytes: 10_000,
            start_ns: 1_000,
        })
        .collect();
    assert!(flows.len() > sim::nic::MAX_QPS as usize);
    let mut p = params(1);
    p.max_time_ns = 200_000_000;
    let r = scenario::run(&star(3), &flows, CcKind::None, &p, |_, _, _| {}).unwrap();
    assert!(r.totals.qp_exhausted > 0, "no flow waited for a QP");
    assert_eq!(r.report.unfinished, 0);
    assert_eq!(r.report.bytes_delivered, r.report.bytes_offered);
    assert_eq!(r.totals.qps_open_at_end, 0);
}
