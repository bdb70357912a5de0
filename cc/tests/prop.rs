//! Property tests: arbitrary event sequences (odd values included: zero RTT, zero
//! bytes, wrapped and random counters, zero capacity, empty telemetry, zero path
//! parameters) never produce a NaN, zero or out-of-range window or rate, and never
//! panic.

use cc::{
    AckEvent, AnyCc, CcConfig, CcKind, CongestionControl, HpccConfig, IntHop, NakEvent, PathConfig,
    RxDataEvent, SendEvent, TelemetryMode, TimerKind,
};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Ev {
    Send {
        bytes: u32,
        last: bool,
    },
    Ack {
        delta: u32,
        rtt: u64,
        ece: bool,
        pkts: u32,
        tel: Vec<IntHop>,
        rxw: Option<u64>,
    },
    Nak,
    Cnp,
    Rto,
    Timer(TimerKind),
    Probe(Vec<IntHop>),
    Rx {
        ce: bool,
        tel: Vec<IntHop>,
    },
    /// Inputs a buggy or hostile peer could cause: any LSN, any byte count.
    RawSend {
        lsn: u64,
        bytes: u32,
    },
    RawAck {
        lsn: u64,
        bytes: u32,
        rtt: u64,
        ece: bool,
        pkts: u32,
    },
    RawNak {
        lsn: u64,
    },
}

fn hop() -> impl Strategy<Value = IntHop> {
    (
        0u16..3,
        0u16..2,
        any::<u32>(),
        any::<u32>(),
        prop_oneof![Just(0u32), 0u32..200_000, any::<u32>()],
        prop_oneof![Just(0u64), Just(100_000_000_000u64), any::<u64>()],
    )
        .prop_map(|(s, p, ts, tx, q, b)| IntHop {
            switch_id: s,
            port_id: p,
            ts_ns: ts,
            tx_bytes: tx,
            qlen_bytes: q,
            link_bps: b,
        })
}

fn tel() -> impl Strategy<Value = Vec<IntHop>> {
    prop::collection::vec(hop(), 0..4)
}

fn ev() -> impl Strategy<Value = Ev> {
    let kind = prop_oneof![
        Just(TimerKind::LdcpTick),
        Just(TimerKind::DcqcnAlpha),
        Just(TimerKind::DcqcnRateIncrease),
        Just(TimerKind::ProbeTimeout),
    ];
    prop_oneof![
        4 => (prop_oneof![Just(0u32), 1u32..5000], any::<bool>())
            .prop_map(|(bytes, last)| Ev::Send { bytes, last }),
        4 => (0u32..10_000, prop_oneof![Just(0u64), 1u64..1_000_000], any::<bool>(), 0u32..5, tel(),
              prop::option::of(prop_oneof![Just(0u64), any::<u64>()]))
            .prop_map(|(delta, rtt, ece, pkts, tel, rxw)| Ev::Ack { delta, rtt, ece, pkts, tel, rxw }),
        1 => Just(Ev::Nak),
        1 => Just(Ev::Cnp),
        1 => Just(Ev::Rto),
        2 => kind.prop_map(Ev::Timer),
        1 => tel().prop_map(Ev::Probe),
        2 => (any::<bool>(), tel()).prop_map(|(ce, tel)| Ev::Rx { ce, tel }),
        1 => (any::<u64>(), any::<u32>()).prop_map(|(lsn, bytes)| Ev::RawSend { lsn, bytes }),
        1 => (any::<u64>(), any::<u32>(), any::<u64>(), any::<bool>(), any::<u32>())
            .prop_map(|(lsn, bytes, rtt, ece, pkts)| Ev::RawAck { lsn, bytes, rtt, ece, pkts }),
        1 => any::<u64>().prop_map(|lsn| Ev::RawNak { lsn }),
    ]
}

fn path() -> impl Strategy<Value = PathConfig> {
    (
        prop_oneof![
            Just(0u64),
            Just(100_000_000_000u64),
            1u64..1_000_000_000_000
        ],
        prop_oneof![Just(0u64), Just(5_000u64), 1u64..200_000],
        prop_oneof![Just(0u32), Just(1024u32), 1u32..9000],
    )
        .prop_map(|(l, t, m)| PathConfig {
            line_rate_bps: l,
            base_rtt_ns: t,
            mtu_bytes: m,
        })
}

fn config() -> impl Strategy<Value = CcConfig> {
    (path(), 0usize..6).prop_map(|(p, k)| {
        if k == 5 {
            let mut h = HpccConfig::for_path(p);
            h.mode = TelemetryMode::Probe;
            CcConfig::Hpcc(h)
        } else {
            CcKind::ALL[k].default_config(p)
        }
    })
}

fn check(cc: &AnyCc, path: PathConfig, what: &str) {
    let path = path.sanitized();
    let line = path.line_rate_bps;
    let r = cc.rate_bps();
    assert!(r > 0, "{what}: zero rate");
    assert!(r <= line, "{what}: rate {r} above line {line}");
    match cc {
        AnyCc::Hpcc(h) => {
            let c = h.core();
            assert!(
                c.w.is_finite() && c.wc.is_finite() && c.u.is_finite(),
                "{what}: {c:?}"
            );
            assert!(c.w >= 1.0 && cc.window_bytes() >= 1, "{what}: {c:?}");
            // W within [W_min, W_max = line-rate BDP]
            assert!(cc.window_bytes() <= path.bdp_bytes(), "{what}: {c:?}");
        }
        AnyCc::RxHpcc(x) => {
            assert!(cc.window_bytes() >= 1, "{what}");
            assert!(cc.window_bytes() <= path.bdp_bytes(), "{what}");
            assert!(x.receiver_core().w.is_finite() && x.receiver_core().u.is_finite());
        }
        AnyCc::Ldcp(l) => {
            // cw within [gamma, 4 x BDP] packets (defaults)
            let max = 4.0 * path.bdp_bytes() as f64 / path.mtu_bytes as f64;
            assert!(l.cw().is_finite(), "{what}: cw {}", l.cw());
            assert!(
                l.cw() >= 0.125 - 1e-12 && l.cw() <= max.max(1.0) + 1e-9,
                "{what}: cw {}",
                l.cw()
            );
        }
        AnyCc::Dcqcn(d) => {
            assert!(
                (0.0..=1.0).contains(&d.alpha()),
                "{what}: alpha {}",
                d.alpha()
            );
            assert!(d.target_rate_bps() <= line);
        }
        AnyCc::None(_) => assert!(cc.window_bytes() >= 1),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn windows_and_rates_stay_sane(cfg in config(), evs in prop::collection::vec((0u64..50_000, ev()), 0..200)) {
        let line = match cfg {
            CcConfig::None(c) => c.path,
            CcConfig::Dcqcn(c) => c.path,
            CcConfig::Hpcc(c) | CcConfig::RxHpcc(c) => c.path,
            CcConfig::Ldcp(c) => c.path,
        };
        let mut cc = AnyCc::new(&cfg);
        let (mut now, mut snd_nxt, mut snd_una) = (0u64, 0u64, 0u64);
        check(&cc, line, "initial");
        for (dt, e) in evs {
            now += dt;
            let a = match &e {
                Ev::Send { bytes, last } => {
                    let a = cc.on_send(&SendEvent { now_ns: now, lsn: snd_nxt, bytes: *bytes, last_of_message: *last, retransmit: false });
                    snd_nxt += *bytes as u64;
                    a
                }
                Ev::Ack { delta, rtt, ece, pkts, tel, rxw } => {
                    let newly = (*delta as u64).min(snd_nxt - snd_una);
                    snd_una += newly;
                    cc.on_ack(&AckEvent { now_ns: now, acked_lsn: snd_una, acked_bytes: newly as u32, acked_pkts: *pkts, rtt_ns: *rtt, ecn_echo: *ece, telemetry: tel, rx_window: *rxw })
                }
                Ev::Nak => { snd_nxt = snd_una; cc.on_nak(&NakEvent { now_ns: now, expected_lsn: snd_una }) }
                Ev::Cnp => cc.on_cnp(now),
                Ev::Rto => { snd_nxt = snd_una; cc.on_rto(now) }
                Ev::Timer(k) => cc.on_timer(now, *k),
                Ev::Probe(tel) => cc.on_probe_response(now, tel),
                Ev::Rx { ce, tel } => cc.on_rx_data(&RxDataEvent { now_ns: now, lsn: 0, bytes: 1000, ce: *ce, telemetry: tel }),
                Ev::RawSend { lsn, bytes } => cc.on_send(&SendEvent { now_ns: now, lsn: *lsn, bytes: *bytes, last_of_message: false, retransmit: false }),
                Ev::RawAck { lsn, bytes, rtt, ece, pkts } => cc.on_ack(&AckEvent { now_ns: now, acked_lsn: *lsn, acked_bytes: *bytes, acked_pkts: *pkts, rtt_ns: *rtt, ecn_echo: *ece, telemetry: &[], rx_window: None }),
                Ev::RawNak { lsn } => cc.on_nak(&NakEvent { now_ns: now, expected_lsn: *lsn }),
            };
            for t in a.timers() {
                prop_assert!(t.deadline_ns >= now, "timer in the past: {t:?} at {now}");
            }
            if let Some(w) = a.feedback_window {
                prop_assert!(w >= 1);
            }
            check(&cc, line, &format!("{e:?}"));
        }
    }
}
