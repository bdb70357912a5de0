//! The DPDK shell end to end on in-process ring pairs (docs/design.md §10: two ports
//! cabled back to back with `rte_eth_from_rings`):
//!
//! ```text
//! host A (ring end a) <-> switch port 0 (ring end b)
//! switch port 1 (ring end b) <-> host B (ring end a)
//! ```
//!
//! The switch runs its real poll loop ([`Dataplane::run`]) on a pinned lcore; the test
//! thread plays both hosts through the other ring ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{lcore, Burst, Eal, Mbuf, Mempool, Port, TscClock};
use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
use rdma::wire::{
    parse_frame, BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, ParseOptions,
    RethRepr,
};
use switch::dataplane::{Dataplane, PortIo, StatsSink};
use switch::{Config, PortCounters, Switch};

const HOST_A_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const HOST_B_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const SW_MAC1: [u8; 6] = [0x02, 0, 0, 0, 1, 0x01];

/// The switch configuration for the DPDK port ids the ring pairs got (they depend on
/// what else this process opened): port 1 (towards host B) at `port1_speed`.
fn config_for(p0: u16, p1: u16, port1_speed: &str) -> Config {
    let mut cfg = Config::two_hosts_100g(p0, p1);
    cfg.switch_id = 9;
    cfg.ports[1].own.speed = Some(port1_speed.into());
    cfg
}

/// A RoCEv2 RDMA WRITE Only from host A to host B (payload bytes `seq`-tagged), ECT(0),
/// with an empty INT container when `int` is set; valid ICRC (FrameBuilder).
fn write_frame(seq: u32, payload: usize, int: bool) -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress(HOST_A_MAC),
            dst_mac: EthernetAddress([0x02, 0, 0, 0, 1, 0x00]),
            src_ip: Ipv4Address([10, 0, 0, 1]),
            dst_ip: Ipv4Address([10, 0, 1, 2]),
            udp_src_port: 0xC000,
            dscp: 3,
            ttl: 64,
        },
        int: int.then_some(IntInsert {
            int_dscp: 0x18,
            max_hops: 8,
        }),
    };
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x11, seq & 0xFF_FFFF));
    p.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x42,
        dma_len: payload as u32,
    });
    let data: Vec<u8> = (0..payload).map(|i| (i as u32 ^ seq) as u8).collect();
    let mut buf = vec![0u8; payload + 256];
    let n = fb.emit_frame(&p, &data, Ecn::Ect0, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

struct Quiet;
impl StatsSink for Quiet {
    fn report(&mut self, _: &Switch<Mbuf>, _: &[u16], _: &[PortCounters], _: u64) {}
}

struct Rig {
    host_a: (dpdk::RxQueue, dpdk::TxQueue),
    host_b: (dpdk::RxQueue, dpdk::TxQueue),
    _ports: Vec<Port>,
    stop: Arc<AtomicBool>,
    worker: std::thread::JoinHandle<Dataplane>,
    pool: Arc<Mempool>,
}

fn rig(name: &str, port1_speed: &str) -> Rig {
    let eal = Eal::for_tests();
    let pool = Mempool::new(eal, name, 16383, 128, Mempool::DEFAULT_DATA_ROOM).expect("pool");
    let (mut a, mut s0) = Port::ring_pair(eal, &format!("{name}a"), 4096).expect("ring pair a");
    let (mut s1, mut b) = Port::ring_pair(eal, &format!("{name}b"), 4096).expect("ring pair b");
    let host_a = a.configure_single(&pool).expect("cfg a");
    let host_b = b.configure_single(&pool).expect("cfg b");
    let (rx0, tx0) = s0.configure_single(&pool).expect("cfg s0");
    let (rx1, tx1) = s1.configure_single(&pool).expect("cfg s1");
    let cfg = config_for(s0.id(), s1.id(), port1_speed);
    let sw: Switch<Mbuf> = Switch::from_config(&cfg).expect("config");
    let ios = vec![
        PortIo::new(s0.id(), rx0, tx0),
        PortIo::new(s1.id(), rx1, tx1),
    ];
    let mut dp = Dataplane::new(sw, ios, TscClock::new(eal));
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let worker = lcore::spawn_pinned(eal, "sw-test", None, move || {
        dp.run(&s2, 0, &mut Quiet);
        dp
    })
    .expect("spawn");
    Rig {
        host_a,
        host_b,
        _ports: vec![a, s0, s1, b],
        stop,
        worker,
        pool,
    }
}

fn mbuf(pool: &Mempool, frame: &[u8]) -> Mbuf {
    let mut m = pool.alloc().expect("alloc");
    m.extend_from_slice(frame).expect("fits");
    m
}

/// Sends `frames` from host A, retrying what the ring did not take.
fn send_all(pool: &Mempool, tx: &mut dpdk::TxQueue, frames: &[Vec<u8>]) {
    let mut burst: Burst = Burst::new();
    let mut it = frames.iter();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        while !burst.is_full() {
            match it.next() {
                Some(f) => {
                    let _ = burst.push(mbuf(pool, f));
                }
                None => break,
            }
        }
        if burst.is_empty() {
            return;
        }
        tx.send(&mut burst);
        assert!(Instant::now() < deadline, "host A could not send");
    }
}

/// Receives up to `n` frames at host B within `timeout`, giving up earlier once frames
/// have arrived and none came for 500 ms (the switch may drop some).
fn recv_n(rx: &mut dpdk::RxQueue, n: usize, timeout: Duration) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut burst: Burst = Burst::new();
    let deadline = Instant::now() + timeout;
    let mut last = Instant::now();
    while out.len() < n && Instant::now() < deadline {
        if rx.recv(&mut burst) == 0 {
            if !out.is_empty() && last.elapsed() > Duration::from_millis(500) {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        last = Instant::now();
        for m in burst.drain() {
            out.push(m.to_vec());
        }
    }
    out
}

#[test]
fn dpdk_ring_forwards_roce_and_pushes_int() {
    let mut r = rig("fw", "100Gbps");
    let n = 200usize;
    let frames: Vec<Vec<u8>> = (0..n as u32)
        .map(|i| write_frame(i, 256, i % 2 == 0))
        .collect();
    send_all(&r.pool, &mut r.host_a.1, &frames);
    let got = recv_n(&mut r.host_b.0, n, Duration::from_secs(10));
    r.stop.store(true, Ordering::Relaxed);
    let dp = r.worker.join().expect("switch lcore");
    assert_eq!(got.len(), n, "every frame forwarded");
    let opts = ParseOptions {
        int_dscp: Some(0x18),
        verify_icrc: true,
    };
    let sw_port1 = dp.ports[1].id;
    for (i, f) in got.iter().enumerate() {
        let p = parse_frame(f, &opts, |_| false)
            .unwrap_or_else(|e| panic!("frame {i}: {e:?} (ICRC or layout broken)"));
        assert_eq!(p.eth.dst.0, HOST_B_MAC, "next-hop MAC");
        assert_eq!(p.eth.src.0, SW_MAC1, "egress port MAC");
        assert_eq!(p.ip.ttl, 63, "TTL decremented");
        // Order is kept, so frame i is the i-th sent.
        assert_eq!(p.bth.psn, i as u32, "order");
        let expect: Vec<u8> = (0..256).map(|k| (k as u32 ^ i as u32) as u8).collect();
        assert_eq!(p.payload, &expect[..], "payload intact");
        if i % 2 == 0 {
            let int = p.int.as_ref().expect("INT container kept");
            assert_eq!(int.hop_count(), 1, "one hop record pushed");
            let hop = int.hop(0).expect("hop 0");
            assert_eq!(hop.switch_id, 9);
            assert_eq!(hop.port_id, sw_port1);
            assert_eq!(hop.link_100m, 1000, "100 Gbit/s");
            assert_eq!(f.len(), frames[i].len() + 16);
        } else {
            assert!(p.int.is_none());
            assert_eq!(f.len(), frames[i].len());
        }
    }
    let c = dp.switch.counters(sw_port1).expect("port 1");
    assert_eq!(c.tx_packets, n as u64);
    assert_eq!(c.int_pushed, n as u64 / 2);
    assert_eq!(c.drops(), 0);
    drop(dp);
}

#[test]
fn dpdk_ring_queue_builds_above_link_speed() {
    // Port 1 is a 1 Gbit/s link; host A offers 2000 x 1 KiB frames as fast as a ring
    // takes them (far above 1 Gbit/s), so the queue must build and WRED must mark.
    let mut r = rig("qb", "1Gbps");
    let n = 2000usize;
    let frames: Vec<Vec<u8>> = (0..n as u32).map(|i| write_frame(i, 1024, true)).collect();
    let t0 = Instant::now();
    send_all(&r.pool, &mut r.host_a.1, &frames);
    let got = recv_n(&mut r.host_b.0, n, Duration::from_secs(20));
    let elapsed = t0.elapsed();
    r.stop.store(true, Ordering::Relaxed);
    let dp = r.worker.join().expect("switch lcore");
    let port1 = dp.ports[1].id;
    let c = *dp.switch.counters(port1).expect("port 1");
    // 256 KiB buffer: some frames may be tail-dropped; the rest arrive.
    assert_eq!(got.len() as u64 + c.tail_drops, n as u64, "{c:?}");
    assert!(c.queue_max_bytes > 64 * 1024, "queue built: {c:?}");
    assert!(c.ce_marked > 0, "WRED marked CE above K_min: {c:?}");
    // The shaper holds the rate at 1 Gbit/s: the frames that left took at least their
    // wire time (1134 + 24 bytes each at 1 Gbit/s = 9.26 us), minus the burst credit.
    let wire_ns = c.tx_wire_bytes * 8;
    assert!(
        elapsed.as_nanos() as u64 + 200_000 >= wire_ns,
        "sent {} wire bytes in {elapsed:?}: faster than 1 Gbit/s",
        c.tx_wire_bytes
    );
    // The INT hop records report the queue that built.
    let opts = ParseOptions::default();
    let max_q = got
        .iter()
        .filter_map(|f| parse_frame(f, &opts, |_| false).ok())
        .filter_map(|p| p.int.as_ref().and_then(|i| i.hop(0)))
        .map(|h| h.qlen_bytes())
        .max()
        .unwrap_or(0);
    assert!(max_q > 32 * 1024, "INT qlen saw the queue: {max_q}");
    let ce = got
        .iter()
        .filter_map(|f| parse_frame(f, &opts, |_| false).ok())
        .filter(|p| p.ip.ecn == rdma::wire::Ecn::Ce)
        .count() as u64;
    assert_eq!(ce, c.ce_marked, "CE marks visible on the wire");
}
