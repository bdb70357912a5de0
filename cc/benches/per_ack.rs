//! Per-event cost of each algorithm as the NIC calls it: through `AnyCc` (enum
//! dispatch), with realistic, changing inputs (advancing LSNs, telemetry timestamps and
//! counters, a marking pattern).
//!
//! `cargo bench -p cc --bench per_ack -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use cc::{AckEvent, AnyCc, CcKind, CongestionControl, IntHop, PathConfig, RxDataEvent, SendEvent};
use criterion::{criterion_group, criterion_main, Criterion};

const PKT: u32 = 1000;
const RING: usize = 1024;

/// A ring of telemetry snapshots of `hops` hops, as a flow at ~95 % of 100G sees them
/// one packet apart (84 ns, 1000 B), with a small varying queue.
fn telemetry(hops: usize) -> Vec<[IntHop; 3]> {
    (0..RING)
        .map(|i| {
            let mut r = [IntHop::default(); 3];
            for (h, rec) in r.iter_mut().enumerate().take(hops) {
                *rec = IntHop {
                    switch_id: h as u16 + 1,
                    port_id: 1,
                    ts_ns: (i as u32).wrapping_mul(84),
                    tx_bytes: (i as u32).wrapping_mul(PKT),
                    qlen_bytes: ((i * 7919) % 5) as u32 * PKT,
                    link_bps: 100_000_000_000,
                };
            }
            r
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let path = PathConfig {
        line_rate_bps: 100_000_000_000,
        base_rtt_ns: 8_000,
        mtu_bytes: PKT,
    };
    let mut g = c.benchmark_group("per_ack");

    for (name, kind, hops) in [
        ("none", CcKind::None, 0usize),
        ("dcqcn", CcKind::Dcqcn, 0),
        ("ldcp", CcKind::Ldcp, 0),
        ("hpcc_1hop", CcKind::Hpcc, 1),
        ("hpcc_3hop", CcKind::Hpcc, 3),
        ("rx-hpcc_sender", CcKind::RxHpcc, 0),
    ] {
        let tel = telemetry(hops.max(1));
        let mut cc: AnyCc = kind.build(path);
        // get LDCP out of fast start so that PAWA runs
        if kind == CcKind::Ldcp {
            past_fast_start(&mut cc);
        }
        let mut i: u64 = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let k = (i as usize) & (RING - 1);
                let ev = AckEvent {
                    now_ns: i * 84,
                    acked_lsn: (1 << 40) + i * PKT as u64,
                    acked_bytes: PKT,
                    acked_pkts: 1,
                    rtt_ns: 8_000 + (i & 255),
                    // LDCP: roughly 1 in 16 ACKs marked keeps cw in a steady range
                    ecn_echo: i & 15 == 0,
                    telemetry: &tel[k][..hops],
                    rx_window: (kind == CcKind::RxHpcc && i & 63 == 0).then_some(50_000),
                };
                let a = cc.on_ack(black_box(&ev));
                black_box((a, cc.window_bytes(), cc.rate_bps()))
            })
        });
    }

    // Many QPs, round robin: the NIC interleaves QPs, so one QP's loop-carried
    // dependencies (LDCP's cw += alpha/cw) overlap with the others'.
    for (name, kind, hops) in [
        ("ldcp_64qp", CcKind::Ldcp, 0usize),
        ("hpcc_1hop_64qp", CcKind::Hpcc, 1),
    ] {
        let tel = telemetry(1);
        let mut qps: Vec<AnyCc> = (0..64).map(|_| kind.build(path)).collect();
        for cc in qps.iter_mut() {
            past_fast_start(cc);
        }
        let mut i: u64 = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i += 1;
                let q = (i & 63) as usize;
                let k = ((i >> 6) as usize) & (RING - 1);
                let cc = &mut qps[q];
                let ev = AckEvent {
                    now_ns: i * 84,
                    acked_lsn: (1 << 40) + (i >> 6) * PKT as u64,
                    acked_bytes: PKT,
                    acked_pkts: 1,
                    rtt_ns: 8_000 + (i & 255),
                    ecn_echo: (i >> 6) & 15 == 0,
                    telemetry: &tel[k][..hops],
                    rx_window: None,
                };
                let a = cc.on_ack(black_box(&ev));
                black_box((a, cc.window_bytes(), cc.rate_bps()))
            })
        });
    }

    // Receiver side of Rx-HPCC: NewINT per data packet (000 fig. 8).
    {
        let tel = telemetry(1);
        let mut cc = CcKind::RxHpcc.build(path);
        let mut i: u64 = 0;
        g.bench_function("rx-hpcc_receiver_new_int", |b| {
            b.iter(|| {
                i += 1;
                let k = (i as usize) & (RING - 1);
                let ev = RxDataEvent {
                    now_ns: i * 84,
                    lsn: i * PKT as u64,
                    bytes: PKT,
                    ce: false,
                    telemetry: &tel[k][..1],
                };
                black_box(cc.on_rx_data(black_box(&ev)))
            })
        });
    }

    // DCQCN reacts to CNPs and counts bytes on send, not to ACKs.
    {
        let mut cc = CcKind::Dcqcn.build(path);
        let mut i: u64 = 0;
        g.bench_function("dcqcn_cnp", |b| {
            b.iter(|| {
                i += 1;
                black_box(cc.on_cnp(black_box(i * 5_000)))
            })
        });
        let mut i: u64 = 0;
        g.bench_function("dcqcn_send", |b| {
            b.iter(|| {
                i += 1;
                let ev = SendEvent {
                    now_ns: i * 84,
                    lsn: i * PKT as u64,
                    bytes: PKT,
                    ..Default::default()
                };
                black_box(cc.on_send(black_box(&ev)))
            })
        });
    }
    g.finish();
}

/// One packet sent and acknowledged far ahead: LDCP leaves fast start.
fn past_fast_start(cc: &mut AnyCc) {
    cc.on_send(&SendEvent {
        now_ns: 0,
        lsn: 0,
        bytes: PKT,
        ..Default::default()
    });
    cc.on_ack(&AckEvent {
        acked_lsn: 1 << 40,
        ..Default::default()
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
