//! Property tests: no input panics the core, and queue accounting always balances
//! (enqueued = dequeued + resident, received = enqueued + dropped, bytes <= buf_max).

mod common;

use common::*;
use proptest::prelude::*;
use rdma::wire::Ecn;
use switch::{FrameBuf, PacketBuf, PortCounters, Switch};

fn small_switch<P: PacketBuf>(buf_max: u64) -> Switch<P> {
    let mut s = settings(1_000_000_000, buf_max);
    for p in &mut s.ports {
        p.ctrl_buf_max = 4_000;
        p.k_min = buf_max / 8;
        p.k_max = buf_max / 2;
        p.k_drop = buf_max / 3;
    }
    Switch::new(&s)
}

fn check_accounting<P: PacketBuf>(sw: &Switch<P>, buf_max: u64) -> Result<(), TestCaseError> {
    let mut rx = 0;
    let mut fate = 0;
    for id in sw.port_ids() {
        let c: &PortCounters = sw.counters(id).unwrap();
        prop_assert_eq!(c.enqueued, c.tx_packets + c.queue_packets);
        let (d, k) = sw.class_bytes(id).unwrap();
        prop_assert!(d <= buf_max, "data bytes {} > buf_max {}", d, buf_max);
        prop_assert!(k <= 4_000);
        prop_assert_eq!(c.queue_bytes, d + k);
        prop_assert!(c.queue_max_bytes >= c.queue_bytes);
        rx += c.rx_packets;
        fate += c.enqueued + c.drops();
    }
    prop_assert_eq!(rx, fate);
    Ok(())
}

/// A frame of one of several kinds, sometimes corrupted.
fn arb_frame() -> impl Strategy<Value = Vec<u8>> {
    let valid = (0u8..6, 0usize..1200, 0u8..4).prop_map(|(kind, n, ecn)| match kind {
        0 => udp_frame(60 + n, ecn),
        1 => write_frame(n, Ecn::from_bits(ecn), Some(3)),
        2 => write_frame(n, Ecn::from_bits(ecn), None),
        3 => roce_raw(0x11, n % 64, None),
        4 => roce_raw(0x81, n % 64, Some(1)),
        _ => write_frame(n, Ecn::NotEct, Some(0)),
    });
    (
        valid,
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        proptest::option::of(any::<usize>()),
    )
        .prop_map(|(mut f, flips, cut)| {
            for (i, v) in flips {
                let l = f.len();
                f[i % l] ^= v;
            }
            if let Some(c) = cut {
                f.truncate(c % (f.len() + 1));
            }
            f
        })
}

#[derive(Debug, Clone)]
enum Op {
    Rx(u16, Vec<u8>),
    Tx(u16, u64),
}

fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            3 => (0u16..3, arb_frame()).prop_map(|(p, f)| Op::Rx(p, f)),
            1 => (0u16..3, 0u64..20_000).prop_map(|(p, dt)| Op::Tx(p, dt)),
        ],
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160),
                                port in 0u16..3, t in any::<u64>()) {
        let mut sw: Switch<Vec<u8>> = small_switch(20_000);
        let _ = sw.receive(port, bytes.clone(), t);
        // Also with the frame forced to look like IPv4 to get past the EtherType.
        let mut b = bytes;
        if b.len() >= 14 {
            b[12] = 0x08;
            b[13] = 0x00;
        }
        let _ = sw.receive(port, b, t);
        while sw.dequeue(1, t).is_some() {}
        while sw.dequeue(0, t).is_some() {}
        check_accounting(&sw, 20_000)?;
    }

    #[test]
    fn accounting_balances(ops in arb_ops()) {
        let buf = 12_000;
        let mut sw: Switch<Vec<u8>> = small_switch(buf);
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Rx(p, f) => {
                    let _ = sw.receive(p, f, now);
                }
                Op::Tx(p, dt) => {
                    now += dt;
                    while let Some(f) = sw.dequeue(p, now) {
                        // Whatever leaves has a valid IPv4 checksum (it was checked on
                        // the way in and every edit kept it valid).
                        let ip = rdma::wire::Ipv4Packet::new_checked(&f[14..]);
                        prop_assert!(ip.map(|i| i.verify_checksum()).unwrap_or(false));
                    }
                }
            }
            check_accounting(&sw, buf)?;
        }
    }

    #[test]
    fn headroom_buffers_behave_like_vecs(frames in proptest::collection::vec(arb_frame(), 1..30)) {
        let mut a: Switch<Vec<u8>> = small_switch(50_000);
        let mut b: Switch<FrameBuf> = small_switch(50_000);
        for f in &frames {
            let ra = a.receive(0, f.clone(), 0).map(|_| ());
            let rb = b.receive(0, FrameBuf::from_frame(f).unwrap(), 0).map(|_| ());
            prop_assert_eq!(ra.is_ok(), rb.is_ok());
        }
        let mut now = 0;
        loop {
            let x = a.dequeue(1, now);
            let y = b.dequeue(1, now);
            prop_assert_eq!(x.as_deref(), y.as_ref().map(|f| f.bytes()));
            if x.is_none() {
                match a.next_departure(1) {
                    Some(t) => now = t.max(now + 1),
                    None => break,
                }
            }
        }
        prop_assert_eq!(a.counters(1), b.counters(1));
    }
}
