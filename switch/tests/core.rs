//! Behaviour of the switch core against the specs: the WRED law (LDCP 004 section 2.1),
//! Not-ECT drop at K (004 section 2.3), INT hop records (HPCC++ 000 section 3, INT-MD
//! v2.0), shaping at B, strict priority for ACK/NAK/CNP, malformed input.

mod common;

use common::*;
use rdma::wire::int::{IntPacket, MdFlags};
use rdma::wire::{verify_icrc, Ecn, HopRecord, Ipv4Packet};
use switch::{
    Class, Config, ConfigError, DropReason, FrameBuf, PacketBuf, Rng, Switch, SwitchSettings,
};

fn int_of(f: &[u8]) -> IntPacket<&[u8]> {
    IntPacket::new_checked(&f[42..]).expect("INT container")
}

#[test]
fn example_config_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/two-port.toml");
    let s = Config::from_file(&path).unwrap().validate().unwrap();
    assert_eq!(s.switch_id, 1);
    assert_eq!(s.int_dscp, 0x18);
    assert_eq!(s.seed, 7);
    assert_eq!(s.ports.len(), 2);
    let p0 = &s.ports[0];
    assert_eq!(p0.speed_bps, 25_000_000_000);
    assert_eq!(p0.buf_max, 1 << 20);
    assert_eq!((p0.k_min, p0.k_max, p0.k_drop), (5120, 204_800, 102_400));
    assert_eq!(p0.p_max, 0.01);
    assert_eq!(p0.mac, [2, 0, 0, 0, 1, 0]);
    assert_eq!(s.ports[1].speed_bps, 10_000_000_000);
    assert_eq!(s.routes.len(), 3);
    assert_eq!(s.routes[2].len, 32);
    let sw: Switch<Vec<u8>> = Switch::new(&s);
    assert_eq!(sw.port_ids().collect::<Vec<_>>(), vec![0, 1]);
}

fn base_toml(extra_port: &str, extra_route: &str) -> String {
    format!(
        r#"
switch_id = 3
[defaults]
speed = "100Gbps"
[[port]]
id = 0
mac = "02:00:00:00:00:01"
{extra_port}
[[route]]
prefix = "10.0.0.0/8"
port = 0
next_hop_mac = "02:00:00:00:00:09"
{extra_route}
"#
    )
}

#[test]
fn config_errors_are_typed() {
    let e = |p: &str, r: &str| Config::load_str(&base_toml(p, r)).unwrap_err();
    assert!(Config::load_str(&base_toml("", "")).is_ok());
    // Integers where floats are expected, and negative sizes, are handled.
    let ok = Config::load_str(&base_toml("p_max = 1\nspeed = 2.5e10", "")).unwrap();
    assert_eq!(
        (ok.ports[0].p_max, ok.ports[0].speed_bps),
        (1.0, 25_000_000_000)
    );
    assert!(matches!(e("buf_max = -5", ""), ConfigError::BadSize { .. }));
    assert!(matches!(
        e("k_min = 9000\nk_max = 8000", ""),
        ConfigError::KminAboveKmax {
            port: 0,
            k_min: 9000,
            k_max: 8000
        }
    ));
    assert!(matches!(
        e("p_max = 1.5", ""),
        ConfigError::PmaxOutOfRange { .. }
    ));
    assert!(matches!(
        e("p_max = -0.1", ""),
        ConfigError::PmaxOutOfRange { .. }
    ));
    assert!(matches!(
        e("speed = \"fast\"", ""),
        ConfigError::BadSpeed { .. }
    ));
    assert!(matches!(
        e("buf_max = \"lots\"", ""),
        ConfigError::BadSize { .. }
    ));
    assert!(matches!(
        e("buf_max = 100", ""),
        ConfigError::BufferTooSmall { .. }
    ));
    assert!(matches!(
        e("ctrl_buf_max = \"1GiB\"", ""),
        ConfigError::BufferTooLarge {
            key: "ctrl_buf_max",
            ..
        }
    ));
    assert!(matches!(
        e("buf_max = 100000\nk_max = 200000", ""),
        ConfigError::AboveBufMax { key: "k_max", .. }
    ));
    assert!(matches!(
        e("k_drop = \"2MiB\"", ""),
        ConfigError::AboveBufMax { key: "k_drop", .. }
    ));
    let r = "[[route]]\nprefix = \"10.1.0.0/16\"\nport = 5\nnext_hop_mac = \"02:00:00:00:00:09\"";
    assert!(matches!(e("", r), ConfigError::UnknownPort { port: 5, .. }));
    let r = "[[route]]\nprefix = \"10.1.0.1/16\"\nport = 0\nnext_hop_mac = \"02:00:00:00:00:09\"";
    assert!(matches!(e("", r), ConfigError::BadPrefix { .. }));
    let r = "[[route]]\nprefix = \"10.0.0.0/8\"\nport = 0\nnext_hop_mac = \"02:00:00:00:00:09\"";
    assert!(matches!(e("", r), ConfigError::DuplicateRoute(_)));
    let r = "[[route]]\nprefix = \"11.0.0.0/8\"\nport = 0\nnext_hop_mac = \"02:00:00\"";
    assert!(matches!(e("", r), ConfigError::BadMac { .. }));
    let p = "[[port]]\nid = 0\nmac = \"02:00:00:00:00:02\"";
    assert!(matches!(e(p, ""), ConfigError::DuplicatePort(0)));
    assert!(matches!(e("kmin = 5", ""), ConfigError::Toml(_)));
    assert!(matches!(
        Config::load_str("switch_id = 1"),
        Err(ConfigError::NoPorts)
    ));
    assert!(matches!(
        Config::load_str("switch_id = 1\nint_dscp = 64\n[[port]]\nid=0\nmac=\"02:00:00:00:00:01\"\nspeed=1000000"),
        Err(ConfigError::BadDscp(64))
    ));
    assert!(matches!(
        Config::load_str("switch_id = 1\n[[port]]\nid=0\nmac=\"02:00:00:00:00:01\""),
        Err(ConfigError::Missing {
            port: 0,
            key: "speed"
        })
    ));
    assert!(matches!(
        Config::from_file(std::path::Path::new("/nonexistent/x.toml")),
        Err(ConfigError::Io { .. })
    ));
    // Errors print something a user can act on.
    let msg = e("k_min = 9000\nk_max = 8000", "").to_string();
    assert!(msg.contains("k_min 9000 > k_max 8000"), "{msg}");
}

/// A switch whose port 1 has the given WRED law, a fast link and no burst limit issues.
fn wred_switch(k_min: u64, k_max: u64, p_max: f64, k_drop: u64, buf_max: u64) -> Switch<Vec<u8>> {
    let mut s = settings(100_000_000_000, buf_max);
    for p in &mut s.ports {
        p.k_min = k_min;
        p.k_max = k_max;
        p.p_max = p_max;
        p.k_drop = k_drop;
    }
    Switch::new(&s)
}

/// LDCP 004 section 2.1: at several queue depths the measured marking frequency of
/// ECT(0) frames matches the law within 4 binomial standard deviations.
#[test]
fn marking_probability_follows_the_law() {
    let (k_min, k_max, p_max) = (10_000u64, 50_000u64, 0.2);
    let frame = udp_frame(1000, 2);
    let trials = 8_000u64;
    for depth_pkts in [0u64, 5, 10, 15, 20, 30, 40, 49, 50, 60] {
        let mut sw = wred_switch(k_min, k_max, p_max, 200_000, 1 << 20);
        // Fill to the depth with Not-ECT frames (below K, never marked).
        for _ in 0..depth_pkts {
            sw.receive(0, udp_frame(1000, 0), 0).unwrap();
        }
        let q = depth_pkts * 1000;
        assert_eq!(sw.queue_bytes(1), Some(q));
        let p = sw.mark_probability(1, q).unwrap();
        let expect = if q < k_min {
            0.0
        } else if q >= k_max {
            1.0
        } else {
            (q - k_min) as f64 / (k_max - k_min) as f64 * p_max
        };
        assert!((p - expect).abs() < 1e-9, "law at q={q}: {p} vs {expect}");
        let mut marks = 0u64;
        let mut now = 0;
        let mut pkt = frame.clone();
        for _ in 0..trials {
            pkt.copy_from_slice(&frame);
            let v = sw.receive(0, pkt, now).unwrap();
            marks += u64::from(v.ce_marked);
            now += 1_000_000;
            pkt = sw.dequeue(1, now).unwrap();
        }
        let n = trials as f64;
        let sigma = (n * p * (1.0 - p)).sqrt();
        let dev = (marks as f64 - n * p).abs();
        assert!(
            dev <= 4.0 * sigma + 1e-9,
            "q={q}: {marks} marks of {trials}, expected {:.1} +- {:.1}",
            n * p,
            4.0 * sigma
        );
        assert_eq!(sw.counters(1).unwrap().ce_marked, marks);
        assert_eq!(sw.counters(1).unwrap().wred_drops, 0);
    }
}

/// A marked frame leaves with CE, a valid IPv4 checksum and a still-valid ICRC (ECN and
/// TTL are masked in the ICRC).
#[test]
fn ce_mark_keeps_checksum_and_icrc() {
    let mut sw = wred_switch(0, 1, 1.0, 1 << 19, 1 << 20);
    sw.receive(0, udp_frame(1000, 2), 0).unwrap(); // q = 1000 >= K_max afterwards
    let v = sw.receive(0, write_frame(256, Ecn::Ect0, None), 0).unwrap();
    assert!(v.ce_marked);
    sw.dequeue(1, 0).unwrap();
    let f = sw.dequeue(1, 1_000_000).unwrap();
    let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
    assert_eq!(ip.ecn(), Ecn::Ce);
    assert_eq!(ip.header().ttl, 63);
    assert!(ip.verify_checksum());
    assert_eq!(&f[..6], &NH_MAC);
    assert_eq!(&f[6..12], &PORT1_MAC);
    verify_icrc(&f, 14, 0).unwrap();
}

/// LDCP 004 section 2.3 Eq. 3: Not-ECT dropped exactly when q >= K.
#[test]
fn not_ect_dropped_exactly_at_k() {
    let k = 20_000u64;
    for (q, dropped) in [(0u64, false), (k - 1, false), (k, true), (k + 1, true)] {
        let mut sw = wred_switch(1 << 18, 1 << 19, 0.0, k, 1 << 20);
        // Fill with ECT frames of 1000 B and one remainder frame (>= 60 B).
        let mut left = q;
        while left > 0 {
            let l = if left >= 1060 || left == 1000 {
                1000
            } else {
                left.min(1000)
            };
            let l = if left - l != 0 && left - l < 60 {
                l - 60
            } else {
                l
            };
            sw.receive(0, udp_frame(l as usize, 1), 0).unwrap();
            left -= l;
        }
        assert_eq!(sw.queue_bytes(1), Some(q));
        let r = sw.receive(0, udp_frame(100, 0), 0);
        assert_eq!(r.is_err(), dropped, "q = {q}");
        if let Err(e) = r {
            assert_eq!(e.reason, DropReason::WredNotEct);
        }
        assert_eq!(sw.counters(1).unwrap().wred_drops, u64::from(dropped));
        // ECT is still accepted at the same depth.
        assert!(sw.receive(0, udp_frame(100, 2), 0).is_ok());
    }
}

/// ECT frames are never dropped below buf_max; the first drop is a tail drop when the
/// frame would not fit, and the queue never exceeds buf_max.
#[test]
fn ect_dropped_only_at_buf_max() {
    let buf = 100_000u64;
    let mut sw = wred_switch(0, 1, 1.0, 5000, buf);
    let mut rng = Rng::new(3);
    let mut accepted = 0u64;
    loop {
        let l = 60 + (rng.next_u32() % 1400) as usize;
        let q = sw.queue_bytes(1).unwrap();
        match sw.receive(0, udp_frame(l, 2), 0) {
            Ok(_) => accepted += 1,
            Err(e) => {
                assert_eq!(e.reason, DropReason::TailDrop);
                assert!(q + l as u64 > buf, "dropped at q={q} len={l}");
                break;
            }
        }
        assert!(sw.queue_bytes(1).unwrap() <= buf);
    }
    let c = sw.counters(1).unwrap();
    assert_eq!((c.wred_drops, c.tail_drops, c.enqueued), (0, 1, accepted));
    assert_eq!(c.ce_marked, accepted - 1); // all but the first (q = 0) were marked
}

/// INT hop records exact against a hand-computed schedule at 10 Gbit/s (0.8 ns/byte),
/// no burst credit. Frames: WRITE Only with an INT container (16 B), RETH, payload
/// 100 / 1000 / 40 -> 190 / 1090 / 130 bytes; each grows by 16 at this hop, so on the
/// wire (+4 FCS +20 preamble/IFG): 230 / 1130 / 170 bytes = 184 / 904 / 136 ns.
#[test]
fn int_records_match_hand_schedule() {
    let mut s = settings(10_000_000_000, 1 << 20);
    s.ports[1].burst = 0;
    let mut sw: Switch<Vec<u8>> = Switch::new(&s);
    let frames = [
        write_frame(100, Ecn::Ect0, Some(4)),
        write_frame(1000, Ecn::Ect0, Some(4)),
        write_frame(40, Ecn::Ect0, Some(4)),
    ];
    assert_eq!(
        frames.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![190, 1090, 130]
    );
    for f in &frames {
        let v = sw.receive(0, f.clone(), 0).unwrap();
        assert!(v.int);
        assert_eq!(v.class, Class::Data);
    }
    assert_eq!(sw.next_departure(1), Some(0));
    let o1 = sw.dequeue(1, 1000).unwrap();
    assert_eq!(sw.next_departure(1), Some(1184));
    assert!(sw.dequeue(1, 1183).is_none());
    let o2 = sw.dequeue(1, 1184).unwrap();
    assert_eq!(sw.next_departure(1), Some(2088));
    let o3 = sw.dequeue(1, 3000).unwrap();
    assert_eq!(sw.next_departure(1), None);
    let hop = |ts, tx, q| HopRecord {
        switch_id: 7,
        port_id: 1,
        ts_ns: ts,
        tx_bytes: tx,
        qlen_64b: q,
        link_100m: 100,
    };
    // qlen after dequeue: (1090 + 130) / 64 = 19, 130 / 64 = 2, 0.
    let want = [hop(1000, 0, 19), hop(1184, 230, 2), hop(3000, 1360, 0)];
    for ((o, f), w) in [&o1, &o2, &o3].into_iter().zip(&frames).zip(want) {
        assert_eq!(o.len(), f.len() + 16);
        let c = int_of(o);
        assert_eq!(c.hop_count(), 1);
        assert_eq!(c.remaining_hop_cnt(), 3);
        assert_eq!(c.hop(0), Some(w));
        let ip = Ipv4Packet::new_checked(&o[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.total_len() as usize, o.len() - 14);
        assert_eq!(u16::from_be_bytes([o[38], o[39]]) as usize, o.len() - 34);
        assert_eq!(ip.header().ttl, 63);
        assert_eq!(&o[..6], &NH_MAC);
        // The ICRC is computed as if the container were absent: still valid.
        verify_icrc(o, 14, c.len()).unwrap();
        // Payload untouched.
        assert_eq!(&o[o.len() - 4 - 40..], &f[f.len() - 4 - 40..]);
    }
    let c = sw.counters(1).unwrap();
    assert_eq!((c.int_pushed, c.int_e_set, c.int_errors), (3, 0, 0));
    assert_eq!(c.tx_wire_bytes, 230 + 1130 + 170);
    assert_eq!(c.tx_bytes, 206 + 1106 + 146);
}

/// Two hops with room for one record: the second sets E (INT v2.0 section 5.7) and
/// pushes nothing; records are newest first. Works the same through the headroom path.
#[test]
fn int_e_bit_and_stacking() {
    let mut s = settings(100_000_000_000, 1 << 20);
    s.ports[1].burst = 0;
    let mut sw: Switch<FrameBuf> = Switch::new(&s);
    let f = write_frame(64, Ecn::Ect0, Some(2));
    sw.receive(0, FrameBuf::from_frame(&f).unwrap(), 0).unwrap();
    let a = sw.dequeue(1, 10).unwrap();
    assert_eq!(a.headroom(), FrameBuf::HEADROOM - 16);
    sw.receive(0, a, 20).unwrap();
    let b = sw.dequeue(1, 5_000).unwrap();
    sw.receive(0, b, 6_000).unwrap();
    let c = sw.dequeue(1, 10_000).unwrap();
    let p = int_of(c.bytes());
    assert_eq!(p.hop_count(), 2);
    assert_eq!(p.remaining_hop_cnt(), 0);
    assert!(p.flags().contains(MdFlags::E));
    assert_eq!(p.hop(0).unwrap().ts_ns, 5_000);
    assert_eq!(p.hop(1).unwrap().ts_ns, 10);
    assert_eq!(c.len(), f.len() + 32);
    verify_icrc(c.bytes(), 14, p.len()).unwrap();
    let k = sw.counters(1).unwrap();
    assert_eq!((k.int_pushed, k.int_e_set), (2, 1));
    // A container with no room at all: E set on the first hop.
    sw.receive(
        0,
        FrameBuf::from_frame(&write_frame(8, Ecn::Ect0, Some(0))).unwrap(),
        20_000,
    )
    .unwrap();
    let d = sw.dequeue(1, 30_000).unwrap();
    assert!(int_of(d.bytes()).flags().contains(MdFlags::E));
    assert_eq!(int_of(d.bytes()).hop_count(), 0);
    // No headroom: counted as an INT error, the frame still goes out.
    let nh = FrameBuf::new(&write_frame(8, Ecn::Ect0, Some(3)), 0, 512).unwrap();
    sw.receive(0, nh, 40_000).unwrap();
    let e = sw.dequeue(1, 50_000).unwrap();
    assert_eq!(int_of(e.bytes()).hop_count(), 0);
    assert_eq!(sw.counters(1).unwrap().int_errors, 1);
}

/// Measured output rate over 10k frames of mixed sizes within 1% of B, from 1 Mbit/s to
/// 400 Gbit/s, with a poll loop that runs at irregular times (not at the exact departure).
#[test]
fn shaper_rate_within_one_percent() {
    for speed in [
        1_000_000u64,
        10_000_000,
        1_000_000_000,
        25_000_000_000,
        100_000_000_000,
        400_000_000_000,
    ] {
        let mut sw: Switch<Vec<u8>> = Switch::new(&settings(speed, 1 << 20));
        let mut rng = Rng::new(speed);
        let n = 10_000u32;
        let (mut sent, mut received) = (0u32, 0u32);
        let mut now = 1_000u64;
        let mut first = None;
        let (mut last, mut last_wire) = (0u64, 0u64);
        // Mean gap between polls: 0.6 of a 1500-byte frame time.
        let frame_ns = 1524 * 8 * 1_000_000_000 / speed;
        while sent < n {
            while received < n && sw.queue_bytes(1).unwrap() < 20_000 {
                let l = 60 + (rng.next_u32() % 1455) as usize;
                sw.receive(0, udp_frame(l, 2), now).unwrap();
                received += 1;
            }
            while let Some(p) = sw.dequeue(1, now) {
                first.get_or_insert(now);
                last = now;
                last_wire = switch::wire_bytes(p.len(), false);
                sent += 1;
            }
            now += 1 + u64::from(rng.next_u32()) % (frame_ns * 6 / 5 + 1);
        }
        let c = sw.counters(1).unwrap();
        // Wire bytes of all frames but the last, over the time from the first to the
        // last dequeue.
        let dur = (last - first.unwrap()) as f64;
        let measured = (c.tx_wire_bytes - last_wire) as f64 * 8e9 / dur;
        assert!(
            (measured / speed as f64 - 1.0).abs() < 0.01,
            "B = {speed}: measured {measured:.0} bit/s over {dur} ns"
        );
        assert_eq!(c.tx_packets, u64::from(n));
    }
}

/// ACK, NAK and CNP overtake a full data queue (strict priority class).
#[test]
fn control_overtakes_full_data_queue() {
    let mut sw: Switch<Vec<u8>> = Switch::new(&settings(1_000_000_000, 64 * 1024));
    let mut n = 0;
    while sw.receive(0, write_frame(1024, Ecn::Ect0, None), 0).is_ok() {
        n += 1;
    }
    assert!(n > 50);
    assert_eq!(sw.counters(1).unwrap().tail_drops, 1);
    let ack = roce_raw(0x11, 4, None);
    let cnp = roce_raw(0x81, 16, None);
    let aack = roce_raw(0x12, 12, Some(4));
    for f in [&ack, &cnp, &aack] {
        let v = sw.receive(0, f.clone(), 0).unwrap();
        assert_eq!(v.class, Class::Control);
        assert!(!v.ce_marked);
    }
    let a = sw.dequeue(1, 0).unwrap();
    assert_eq!(a[42], 0x11);
    let t = sw.next_departure(1).unwrap();
    assert_eq!(sw.dequeue(1, t).unwrap()[42], 0x81);
    let t = sw.next_departure(1).unwrap();
    let x = sw.dequeue(1, t).unwrap();
    assert_eq!(x[42 + 32], 0x12, "ATOMIC ACK, INT pushed (16 + 16 bytes)");
    let t = sw.next_departure(1).unwrap();
    assert_eq!(
        sw.dequeue(1, t).unwrap().len(),
        write_frame(1024, Ecn::Ect0, None).len()
    );
    assert_eq!(sw.counters(1).unwrap().enqueued_ctrl, 3);
}

/// Malformed, non-IPv4, TTL-expired, unroutable and unknown-port frames are counted and
/// dropped; non-RoCE IPv4 with the INT DSCP is forwarded without INT.
#[test]
fn bad_frames_counted_not_panics() {
    let mut sw: Switch<Vec<u8>> = Switch::new(&settings(1_000_000_000, 1 << 20));
    let good = udp_frame(100, 2);
    let mut cases: Vec<(Vec<u8>, DropReason)> = Vec::new();
    for l in [0, 1, 13, 14, 20, 33] {
        // Truncated Ethernet header or truncated IPv4 header: both malformed.
        cases.push((good[..l].to_vec(), DropReason::Malformed));
    }
    let mut arp = good.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    cases.push((arp, DropReason::NotIpv4));
    let mut ihl = good.clone();
    ihl[14] = 0x44;
    cases.push((ihl, DropReason::Malformed));
    let mut v6 = good.clone();
    v6[14] = 0x65;
    cases.push((v6, DropReason::Malformed));
    let mut tl = good.clone();
    tl[16..18].copy_from_slice(&5000u16.to_be_bytes());
    cases.push((tl, DropReason::Malformed));
    let mut cs = good.clone();
    cs[24] ^= 0xFF;
    cases.push((cs, DropReason::Malformed));
    let mut ttl = udp_frame(100, 2);
    ttl[22] = 1;
    let c = {
        ttl[24] = 0;
        ttl[25] = 0;
        rdma::wire::internet_checksum(&ttl[14..34])
    };
    ttl[24..26].copy_from_slice(&c.to_be_bytes());
    cases.push((ttl, DropReason::TtlExpired));
    cases.push((
        udp_frame_to(100, 2, 0, 9, [192, 168, 0, 1], &[]),
        DropReason::Unroutable,
    ));
    // RoCE with a truncated BTH.
    cases.push((
        udp_frame_to(46, 2, 0, 4791, HOST_B, &[0x0A; 4]),
        DropReason::Malformed,
    ));
    // INT DSCP with a broken container.
    let mut bad_int = roce_raw(0x0A, 32, Some(4));
    bad_int[42] = 0x20;
    cases.push((bad_int, DropReason::Malformed));
    // UDP length beyond the IP payload.
    let mut ul = good.clone();
    ul[38..40].copy_from_slice(&900u16.to_be_bytes());
    cases.push((ul, DropReason::Malformed));
    for (f, why) in &cases {
        let r = sw.receive(0, f.clone(), 0).unwrap_err();
        assert_eq!(r.reason, *why, "{f:02x?}");
    }
    assert_eq!(
        sw.receive(9, good.clone(), 0).unwrap_err().reason,
        DropReason::UnknownPort
    );
    assert_eq!(sw.unknown_port_rx(), 1);
    let c = *sw.counters(0).unwrap();
    assert_eq!(c.rx_packets, cases.len() as u64);
    assert_eq!(c.rx_not_ipv4, 1);
    assert_eq!(c.rx_ttl_expired, 1);
    assert_eq!(c.rx_unroutable, 1);
    assert_eq!(c.rx_malformed, cases.len() as u64 - 3);
    assert_eq!(sw.counters(1).unwrap().enqueued, 0);
    // Non-RoCE UDP with the INT DSCP: forwarded as is, no INT.
    let dns = udp_frame_to(100, 2, 0x18, 53, HOST_B, &[0x10; 16]);
    let v = sw.receive(0, dns.clone(), 0).unwrap();
    assert!(!v.int);
    let o = sw.dequeue(1, 0).unwrap();
    assert_eq!(o.len(), dns.len());
    assert_eq!(&o[34..], &dns[34..]);
    // Non-UDP IPv4 (protocol 6) forwarded.
    let mut tcp = udp_frame(80, 0);
    tcp[23] = 6;
    tcp[24] = 0;
    tcp[25] = 0;
    let c = rdma::wire::internet_checksum(&tcp[14..34]);
    tcp[24..26].copy_from_slice(&c.to_be_bytes());
    assert!(sw.receive(0, tcp, 0).is_ok());
    assert!(sw.dequeue(1, u64::MAX / 2).is_some());
    assert!(sw.dequeue(1, u64::MAX / 2).is_none());
    assert!(sw.dequeue(42, 0).is_none());
    assert_eq!(sw.next_departure(42), None);
}

#[test]
fn stats_line_prints() {
    let mut sw: Switch<Vec<u8>> = Switch::new(&settings(1_000_000_000, 1 << 20));
    let zero = Default::default();
    sw.receive(0, udp_frame(1000, 2), 0).unwrap();
    sw.dequeue(1, 0).unwrap();
    let line = sw.stats_line(1, &zero, 1_000_000).unwrap().to_string();
    assert!(line.starts_with("port 1: "), "{line}");
    assert!(line.contains("tx 0.00 Mpps 0.01 Gb/s"), "{line}");
    assert!(sw.stats_line(5, &zero, 1).is_none());
    let _unused: Option<SwitchSettings> = None;
}

/// With a late, bursty poll loop the INT timestamps still follow the shaped link:
/// a frame arriving at an idle port is stamped with its arrival time, and back-to-back
/// frames differ by exactly their wire time, so txBytes / ts gives B.
#[test]
fn int_timestamps_follow_the_link_not_the_poll() {
    let mut sw: Switch<Vec<u8>> = Switch::new(&settings(10_000_000_000, 1 << 20));
    // Idle link, frame arrives at 10_000, poll at 12_000 (within the 16 KiB burst).
    sw.receive(0, write_frame(1000, Ecn::Ect0, Some(4)), 10_000)
        .unwrap();
    for _ in 0..4 {
        sw.receive(0, write_frame(1000, Ecn::Ect0, Some(4)), 10_500)
            .unwrap();
    }
    let mut hops = Vec::new();
    while let Some(f) = sw.dequeue(1, 12_000) {
        hops.push(int_of(&f).hop(0).unwrap());
    }
    // 1090 + 16 + 4 + 20 = 1130 wire bytes = 904 ns each at 10 Gbit/s; the link is
    // booked from 10_000, so frames starting at or before 12_000 left in this poll.
    assert_eq!(
        hops.iter().map(|h| h.ts_ns).collect::<Vec<_>>(),
        vec![10_000, 10_904, 11_808]
    );
    let t = sw.next_departure(1).unwrap();
    assert_eq!(t, 12_712);
    // Polled much later: the remaining frames keep the link's pace.
    while let Some(f) = sw.dequeue(1, 14_000) {
        hops.push(int_of(&f).hop(0).unwrap());
    }
    assert_eq!(hops.len(), 5);
    for w in hops.windows(2) {
        let dt = w[1].ts_ns.wrapping_sub(w[0].ts_ns);
        let db = w[1].tx_bytes.wrapping_sub(w[0].tx_bytes);
        assert_eq!((dt, db), (904, 1130));
    }
}

/// Incast through two switches in a chain: ports 0 of switch 1 and 2 are 100 Gbit/s
/// (feeding), switch 1's egress is a 10 Gbit/s bottleneck. Two senders offer 2 x 10 Gbit/s
/// of 1 KiB WRITEs: the queue builds at switch 1 only, CE marks appear once it passes
/// K_min, and every frame arriving at the receiver carries two hop records, newest
/// (switch 2) first, with switch 1's qlen equal to its queue after each dequeue.
#[test]
fn incast_through_two_switches() {
    let mut s1 = settings(10_000_000_000, 1 << 20);
    s1.switch_id = 1;
    s1.ports[1].k_min = 20_000;
    s1.ports[1].k_max = 200_000;
    s1.ports[1].p_max = 0.2;
    let mut s2 = settings(100_000_000_000, 1 << 20);
    s2.switch_id = 2;
    let mut sw1: Switch<FrameBuf> = Switch::new(&s1);
    let mut sw2: Switch<FrameBuf> = Switch::new(&s2);
    let frame = write_frame(1024, Ecn::Ect0, Some(4));
    let wire_in = switch::wire_bytes(frame.len(), false);
    // Each sender at 10 Gbit/s: one frame every wire_in * 0.8 ns.
    let gap = wire_in * 8 / 10;
    let (mut t, mut sent) = (0u64, 0u32);
    let mut got = Vec::new();
    let mut max_q = 0;
    while sent < 1_200 || sw1.next_departure(1).is_some() || sw2.next_departure(1).is_some() {
        if sent < 1_200 {
            for _ in 0..2 {
                sw1.receive(0, FrameBuf::from_frame(&frame).unwrap(), t)
                    .unwrap();
                sent += 1;
            }
        }
        while let Some(p) = sw1.dequeue(1, t) {
            let q = sw1.queue_bytes(1).unwrap();
            let h = int_of(p.bytes()).hop(0).unwrap();
            assert_eq!(h.switch_id, 1);
            assert_eq!(u64::from(h.qlen_64b), q / 64);
            max_q = max_q.max(q);
            sw2.receive(0, p, t).unwrap();
        }
        while let Some(p) = sw2.dequeue(1, t) {
            got.push(p);
        }
        t += gap;
    }
    assert_eq!(got.len(), 1_200);
    let c1 = *sw1.counters(1).unwrap();
    let c2 = *sw2.counters(1).unwrap();
    assert_eq!(c1.tail_drops, 0);
    assert!(max_q > 200_000, "queue built at the bottleneck: {max_q}");
    assert!(c1.ce_marked > 100, "{c1:?}");
    assert_eq!(c2.ce_marked, 0, "no queue at the 100 Gbit/s hop");
    assert!(c2.queue_max_bytes < 10_000);
    let mut ce = 0;
    for p in &got {
        let c = int_of(p.bytes());
        assert_eq!(c.hop_count(), 2);
        let (h2, h1) = (c.hop(0).unwrap(), c.hop(1).unwrap());
        assert_eq!((h2.switch_id, h1.switch_id), (2, 1));
        assert_eq!((h2.link_100m, h1.link_100m), (1000, 100));
        assert!(h2.ts_ns >= h1.ts_ns);
        verify_icrc(p.bytes(), 14, c.len()).unwrap();
        let ip = Ipv4Packet::new_checked(&p.bytes()[14..]).unwrap();
        assert_eq!(ip.header().ttl, 62);
        ce += u64::from(ip.ecn() == Ecn::Ce);
    }
    assert_eq!(ce, c1.ce_marked);
}

/// ECT(1) is marked like ECT(0); a frame that arrives CE stays CE and is not counted
/// as a mark; Not-ECT below K is neither marked nor dropped (LDCP 004 section 2.1/2.3).
#[test]
fn ecn_codepoints() {
    let mut sw = wred_switch(0, 1, 1.0, 1 << 19, 1 << 20);
    sw.receive(0, udp_frame(1000, 0), 0).unwrap(); // q = 1000 >= K_max from now on
    let ect1 = sw.receive(0, udp_frame(200, 1), 0).unwrap();
    let ce = sw.receive(0, udp_frame(200, 3), 0).unwrap();
    let not_ect = sw.receive(0, udp_frame(200, 0), 0).unwrap();
    assert!(ect1.ce_marked && !ce.ce_marked && !not_ect.ce_marked);
    assert_eq!(sw.counters(1).unwrap().ce_marked, 1);
    let mut now = 0;
    let mut ecn = Vec::new();
    while let Some(t) = sw.next_departure(1) {
        now = now.max(t);
        let f = sw.dequeue(1, now).unwrap();
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        assert!(ip.verify_checksum());
        ecn.push(ip.ecn());
    }
    assert_eq!(ecn, vec![Ecn::NotEct, Ecn::Ce, Ecn::Ce, Ecn::NotEct]);
}
