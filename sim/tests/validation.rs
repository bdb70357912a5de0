//! Issue 16 item 5: `roce-sim incast` against the real engines' `roce-testbed incast`
//! (8:1, 1 Gbit/s bottleneck, 1 MB buffer, K_min 20 KB, K_max 100 KB, P_max 0.5,
//! T = 100 us, MTU 1024, 8 MiB per sender as 32 KiB WRITEs, 16 in flight). The
//! testbed's figures are the ranges over its five clean runs in docs/benchmarks.md
//! ("roce-testbed (issue 7)"); the simulator's bottleneck queue p99 and utilisation
//! must fall in that range widened by 20 % on each side.

use cc::CcKind;
use sim::scenario::{self, Params};
use sim::topo::{PortParams, Topology};
use sim::workload;

/// A low-high range.
type Range = (f64, f64);

/// (cc, utilisation % low-high, queue p99 KB low-high) of roce-testbed.
const TESTBED: [(CcKind, Range, Range); 5] = [
    (CcKind::None, (96.7, 99.8), (999.0, 999.2)),
    (CcKind::Dcqcn, (92.5, 94.9), (714.0, 996.0)),
    (CcKind::Hpcc, (91.0, 92.4), (8.8, 8.8)),
    (CcKind::RxHpcc, (90.3, 91.7), (8.8, 8.8)),
    (CcKind::Ldcp, (85.4, 99.4), (63.2, 63.2)),
];

#[test]
fn incast_queue_p99_and_utilisation_within_20_percent_of_roce_testbed() {
    let g1 = 1_000_000_000;
    let port = PortParams {
        speed_bps: 100 * g1,
        buf_max: 1_000_000,
        k_min: 20_000,
        k_max: 100_000,
        p_max: 0.5,
    };
    let topo = Topology::star(9, 100 * g1, g1, 1000, port);
    let flows = workload::incast(8, 8 << 20);
    let p = Params {
        mtu: 1024,
        base_rtt_ns: 100_000,
        seed: 1,
        msg_bytes: 32 << 10,
        outstanding: 16,
        sample_ns: 5_000,
        max_time_ns: 5_000_000_000,
        timeout_ns: 67_108_864,
        ctrl_buf: 256 << 10,
        nic_line_bps: g1,
        pfc: None,
        shared_buffer: None,
        partitions: 0,
        threads: 0,
        sched_quantum: 0,
        loss_recovery: Default::default(),
    };
    let mut bad = Vec::new();
    for (cc, util, q99) in TESTBED {
        let r = scenario::run(&topo, &flows, cc, &p, |_, _, _| {})
            .unwrap()
            .report;
        assert_eq!(r.unfinished, 0, "{cc}");
        let u = r.utilisation * 100.0;
        let q = r.queue_p99 as f64 / 1000.0;
        println!("{cc}: util {u:.1} % (testbed {util:?}), queue p99 {q:.1} KB (testbed {q99:?})");
        let within = |x: f64, (lo, hi): (f64, f64)| x >= lo * 0.8 && x <= hi * 1.2;
        if !within(u, util) || !within(q, q99) {
            bad.push(format!(
                "{cc}: util {u:.1} vs {util:?}, q p99 {q:.1} vs {q99:?}"
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:?}");
}
