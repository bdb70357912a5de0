//! Cost of one flow-scheduler decision (docs/design.md §5: "O(1) per decision at
//! 16k QPs") and of timer-wheel operations. Figures: docs/benchmarks.md.
//!
//! `cargo bench -p nic --bench pure_scheduler`

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use nic::scheduler::{Decision, Scheduler, WINDOW_UNLIMITED};
use nic::timer_wheel::{TimerKey, TimerKind, TimerWheel};

const QPS: u32 = 16_384;

fn sched(c: &mut Criterion) {
    // 16k active, unpaced QPs with an open window: pure round-robin step.
    let mut s: Scheduler = Scheduler::new(QPS, 65_536, 1024);
    for qp in 0..QPS {
        s.mark_ready(qp, 4096).unwrap();
    }
    let mut now = 0u64;
    c.bench_function("sched_next_on_sent_16k_unpaced", |b| {
        b.iter(|| {
            now += 1;
            if let Decision::Qp { qp, bytes } = s.next(black_box(now)) {
                s.on_sent(qp, bytes, now).unwrap();
                s.on_acked(qp, bytes as u64).unwrap();
            }
        })
    });

    // 16k paced QPs at 20 Mbit/s each (328 Gbit/s in all) behind a
    // 400 Gbit/s virtual link: QPs run out of credit, sleep on the pacing
    // wheel and wake up again, so this includes block / wake-up churn, idle
    // gaps and window accounting. One iteration = one packet sent.
    let mut s: Scheduler = Scheduler::new(QPS, 8192, 1024);
    for qp in 0..QPS {
        s.set_rate(qp, 20_000_000, 0).unwrap();
        s.set_window_state(qp, 0, WINDOW_UNLIMITED).unwrap();
        s.mark_ready(qp, 4096).unwrap();
    }
    let mut now = 0u64;
    let mut idles = 0u64;
    let mut sent = 0u64;
    c.bench_function("sched_next_on_sent_16k_paced", |b| {
        b.iter(|| loop {
            match s.next(black_box(now)) {
                Decision::Qp { qp, bytes } => {
                    s.on_sent(qp, bytes, now).unwrap();
                    s.on_acked(qp, bytes as u64).unwrap();
                    now += 82; // 4096 B at 400 Gbit/s
                    sent += 1;
                    break;
                }
                Decision::Idle { wake_at } => {
                    idles += 1;
                    now = wake_at.unwrap_or(now + 1).max(now + 1);
                }
                Decision::Control(_) => {}
            }
        })
    });
    eprintln!(
        "paced: {sent} packets, {idles} idle decisions, {} QPs credit-limited at the end",
        s.credit_limited_len()
    );
}

fn wheel(c: &mut Criterion) {
    // Re-arming a retransmit timer on every ACK: reschedule of one of 64k
    // pending timers, plus advancing time by 100 ns.
    let mut w: TimerWheel<TimerKey> = TimerWheel::new(1_000, 4096, 65_536);
    let mut hs: Vec<_> = (0..65_536u32)
        .map(|i| {
            w.schedule(
                1_000_000 + i as u64 * 61,
                TimerKey {
                    qp: i % QPS,
                    kind: TimerKind::Retransmit,
                    gen: 0,
                },
            )
            .unwrap()
        })
        .collect();
    let mut i = 0usize;
    let mut now = 0u64;
    c.bench_function("wheel_reschedule_64k_pending", |b| {
        b.iter(|| {
            i = (i + 7919) & 65_535;
            now += 100;
            // A timer that fired meanwhile is armed again.
            if w.reschedule(hs[i], now + 4_000_000).is_err() {
                let key = TimerKey {
                    qp: i as u32 % QPS,
                    kind: TimerKind::Retransmit,
                    gen: 0,
                };
                hs[i] = w.schedule(now + 4_000_000, key).unwrap();
            }
            w.advance(now, &mut |k| {
                black_box(k);
            });
        })
    });
}

criterion_group!(benches, sched, wheel);
criterion_main!(benches);
