//! The burst interface is the per-frame interface in stages: `receive_burst` and
//! `dequeue_burst` must queue, drop, mark, rewrite and push INT exactly as `receive`
//! and `dequeue` called frame by frame, with the same counters, for every burst size.

mod common;

use common::*;
use rdma::wire::Ecn;
use switch::{DropReason, FrameBuf, PacketBuf, PortCounters, Switch, BURST};

/// A mix of every path: INT data in each ECN codepoint, plain data, control frames,
/// non-RoCE UDP, not IPv4, truncated, unroutable, TTL 1 (with its checksum fixed).
fn frames() -> Vec<Vec<u8>> {
    let mut ttl1 = udp_frame(200, 2);
    ttl1[14 + 8] = 1;
    ttl1[24] = 0;
    ttl1[25] = 0;
    let c = rdma::wire::internet_checksum(&ttl1[14..34]);
    ttl1[24..26].copy_from_slice(&c.to_be_bytes());
    let mut truncated = write_frame(64, Ecn::Ect0, Some(4));
    truncated.truncate(40);
    vec![
        write_frame(1000, Ecn::Ect0, Some(4)),
        write_frame(1000, Ecn::Ect1, Some(8)),
        write_frame(500, Ecn::NotEct, Some(4)),
        write_frame(700, Ecn::Ce, None),
        write_frame(64, Ecn::Ect0, Some(0)),
        roce_raw(0x11, 4, Some(2)),
        roce_raw(0x81, 16, None),
        udp_frame(300, 0),
        udp_frame_to(120, 2, 0, 9, [10, 9, 9, 9], &[]),
        ttl1,
        truncated,
        vec![0u8; 20],
    ]
}

/// Everything a run leaves observable: frames out (bytes, in order), drop reasons (in
/// order of the frames' arrival), counters of both ports.
#[derive(Debug, PartialEq)]
struct Run {
    sent: Vec<Vec<u8>>,
    dropped: Vec<(usize, DropReason)>,
    counters: [PortCounters; 2],
}

/// Feeds `n_frames` frames (cycling through the mix) into port 0 in chunks of `chunk`,
/// draining port 1 after each chunk: per frame if `burst` is false, else through the
/// burst calls (dequeue bursts of at most `chunk`).
fn run(chunk: usize, burst: bool, n_frames: usize) -> Run {
    // A small buffer: WRED marks, Not-ECT frames drop at K, the tail drops.
    let mut s = settings(10_000_000_000, 24 * 1024);
    s.ports[1].p_max = 0.5;
    let mut sw: Switch<FrameBuf> = Switch::new(&s);
    let mix = frames();
    let mut r = Run {
        sent: Vec::new(),
        dropped: Vec::new(),
        counters: Default::default(),
    };
    let mut now = 0u64;
    let mut i = 0;
    while i < n_frames {
        let ids: Vec<usize> = (i..(i + chunk).min(n_frames)).collect();
        i += ids.len();
        // Each frame's id rides in its IPv4 identification field, so drops handed back
        // out of order can be matched to arrival order.
        let pkts: Vec<FrameBuf> = ids
            .iter()
            .map(|&id| {
                let mut f = mix[id % mix.len()].clone();
                if f.len() >= 34 && f[12] == 8 {
                    let old = u16::from_be_bytes([f[18], f[19]]);
                    f[18..20].copy_from_slice(&(id as u16).to_be_bytes());
                    let hc = u16::from_be_bytes([f[24], f[25]]);
                    // RFC 1624 eq. 3, as the switch does.
                    let mut x = u32::from(!hc) + u32::from(!old) + id as u32;
                    x = (x & 0xFFFF) + (x >> 16);
                    x = (x & 0xFFFF) + (x >> 16);
                    f[24..26].copy_from_slice(&(!(x as u16)).to_be_bytes());
                }
                FrameBuf::from_frame(&f).unwrap()
            })
            .collect();
        let id_of = |p: &FrameBuf, fallback: usize| {
            let b = p.bytes();
            if b.len() >= 34 && b[12] == 8 {
                usize::from(u16::from_be_bytes([b[18], b[19]]))
            } else {
                fallback
            }
        };
        let mut dropped = Vec::new();
        if burst {
            let mut k = 0;
            sw.receive_burst(0, pkts, now, |rej| {
                dropped.push((id_of(&rej.pkt, usize::MAX - k), rej.reason));
                k += 1;
            });
        } else {
            for (k, p) in pkts.into_iter().enumerate() {
                if let Err(rej) = sw.receive(0, p, now) {
                    dropped.push((id_of(&rej.pkt, usize::MAX - k), rej.reason));
                }
            }
        }
        // Frames without an id (not IPv4) cannot be matched: order them last by kind.
        dropped.sort_by_key(|&(id, reason)| (id >= usize::MAX - BURST * 4, id, reason as u8));
        for d in dropped.iter_mut() {
            if d.0 >= usize::MAX - BURST * 4 {
                d.0 = usize::MAX;
            }
        }
        r.dropped.extend(dropped);
        // Offer about four times the link rate: the queue builds up to the tail.
        now += 100 * chunk as u64;
        if burst {
            while sw.dequeue_burst(1, now, chunk, |p| r.sent.push(p.bytes().to_vec())) > 0 {}
        } else {
            while let Some(p) = sw.dequeue(1, now) {
                r.sent.push(p.bytes().to_vec());
            }
        }
    }
    r.counters = [*sw.counters(0).unwrap(), *sw.counters(1).unwrap()];
    r
}

#[test]
fn bursts_decide_as_frame_by_frame() {
    let n = 3000;
    for chunk in [1, 5, BURST, BURST + 13, 100] {
        let (one, many) = (run(chunk, false, n), run(chunk, true, n));
        assert_eq!(one.counters, many.counters, "chunk {chunk}");
        assert_eq!(one.dropped, many.dropped, "chunk {chunk}");
        assert_eq!(one.sent.len(), many.sent.len(), "chunk {chunk}");
        assert!(
            one.sent == many.sent,
            "chunk {chunk}: different frames sent"
        );
        // The run went down every path.
        let c = &one.counters;
        let (rx, tx) = (&c[0], &c[1]);
        assert!(
            tx.ce_marked > 0 && tx.int_pushed > 0 && tx.int_e_set > 0,
            "{tx:?}"
        );
        assert!(
            tx.enqueued_ctrl > 0 && tx.wred_drops > 0 && tx.tail_drops > 0,
            "{tx:?}"
        );
        assert!(rx.rx_malformed > 0 && rx.rx_not_ipv4 > 0, "{rx:?}");
        assert!(rx.rx_unroutable > 0 && rx.rx_ttl_expired > 0, "{rx:?}");
        assert_eq!(rx.rx_packets, n as u64);
    }
}

#[test]
fn unknown_port_burst_is_counted_and_handed_back() {
    let mut sw: Switch<FrameBuf> = Switch::new(&settings(10_000_000_000, 64 * 1024));
    let pkts: Vec<FrameBuf> = (0..40)
        .map(|_| FrameBuf::from_frame(&write_frame(64, Ecn::Ect0, None)).unwrap())
        .collect();
    let mut back = 0;
    let q = sw.receive_burst(9, pkts, 0, |r| {
        assert_eq!(r.reason, DropReason::UnknownPort);
        back += 1;
    });
    assert_eq!((q, back, sw.unknown_port_rx()), (0, 40, 40));
    assert_eq!(sw.dequeue_burst(9, 0, 32, |_| panic!("no such port")), 0);
}
