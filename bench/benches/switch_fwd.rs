//! One switch core forwarding real RoCEv2 frames with WRED and the INT push on, against
//! `dpdk-testpmd --forward-mode=io`, both on the **same PMDs**: two `net_null` ports
//! with `size=1114`, one forwarding core, burst 32, an 8191-mbuf pool with cache 250,
//! alternating rounds in one run (docs/design.md §9: ratios, same run).
//!
//! What each side does per frame:
//! - testpmd io: `net_null` RX (mbuf alloc, set lengths), TX burst on the other port
//!   (`net_null` TX: free). It never touches the packet data.
//! - ours: the same `net_null` RX and TX (the same mbuf alloc and free), and in
//!   between, per frame: the benchmark's RX hook writes the first 64 bytes (Ethernet,
//!   IPv4, UDP, INT shim + MD header, BTH) and the 4-byte ICRC of a real RDMA WRITE Only
//!   frame (RETH, 1024-byte payload, INT-MD container with room for 8 hops, ECT(0)) into
//!   the mbuf, as a NIC's DMA would (the payload was written into every mbuf of the pool
//!   once before the run, and nothing changes it, so every frame is byte for byte a
//!   valid frame with a correct ICRC); then the whole switch core:
//!   [`Switch::receive`] (Ethernet/IPv4 checksum/UDP/INT container/BTH parse, LPM route,
//!   WRED decision with a random draw whenever the queue is between K_min and K_max,
//!   MAC/TTL rewrite with incremental checksum, enqueue) and [`Switch::dequeue`]
//!   (shaper, INT hop record push: 16 bytes of headroom, 58-byte header move, lengths
//!   and IPv4 checksum fixed). Port 0 receives frames for 10.0.1.2 (routed to port 1),
//!   port 1 frames for 10.0.0.2 (routed to port 0), so both directions forward, as in
//!   testpmd io. Rate = frames sent by the switch per second (sum over both ports),
//!   against testpmd's summed Rx-pps.
//!
//! The ports are shaped at 400 Gbit/s (43 Mpps of these frames, more than one core
//! switches) with a 1 MiB burst credit, so the shaper books every frame but never holds
//! one back; the queue between receive and dequeue of one loop turn is up to ~35 KiB,
//! so most frames draw in WRED's random region (K_min 5 KiB, K_max 200 KiB, P_max 0.01).
//!
//! `cargo bench -p bench --bench switch_fwd` (SWITCH_FWD_SECS: seconds per side and
//! round, default 5; SWITCH_FWD_ROUNDS: rounds, default 2; SWITCH_FWD_NO_TESTPMD=1 runs
//! our side only, for profiling).

use bench::testpmd::{median, Rounds};
use std::time::{Duration, Instant};

use dpdk::{lcore, Eal, Mbuf, Mempool, Port, TscClock};
use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, RethRepr};
use switch::config::PortDefaults;
use switch::dataplane::{Dataplane, PortIo};
use switch::{Config, Switch};

/// Bytes of the frame the switch rewrites (Ethernet .. INT MD header is 58; the INT
/// push moves those 58 bytes 16 bytes forward into the headroom), rounded up to a
/// cache line. The hook restores them and the ICRC on every received frame.
const HDR: usize = 64;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// RDMA WRITE Only with RETH, 1024-byte payload, INT container with room for 8 hops
/// (DSCP 0x18), ECT(0), to `dst`.
fn template(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([0x02, 0, 0, 0, 0, src[3]]),
            dst_mac: EthernetAddress([0x02, 0, 0, 0, 1, 0x00]),
            src_ip: Ipv4Address(src),
            dst_ip: Ipv4Address(dst),
            udp_src_port: 0xC000,
            dscp: 3,
            ttl: 64,
        },
        int: Some(IntInsert {
            int_dscp: 0x18,
            max_hops: 8,
        }),
    };
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x11, 0));
    p.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x42,
        dma_len: 1024,
    });
    let data = vec![0xA5u8; 1024];
    let mut buf = vec![0u8; 2048];
    let n = fb.emit_frame(&p, &data, Ecn::Ect0, &mut buf).expect("emit");
    buf.truncate(n);
    rdma::wire::verify_icrc(&buf, 14, 16).expect("template ICRC");
    buf
}

fn config(p0: u16, p1: u16) -> Config {
    let mut cfg = Config::two_hosts(
        p0,
        p1,
        PortDefaults {
            speed: Some("400Gbps".into()),
            burst: Some("1MiB".into()),
            buf_max: Some("1MiB".into()),
            k_min: Some("5KiB".into()),
            k_max: Some("200KiB".into()),
            p_max: Some(0.01),
            ..PortDefaults::default()
        },
    );
    cfg.switch_id = 1;
    cfg
}

/// What the "NIC" writes per port: the frame's first [`HDR`] bytes and its ICRC.
#[derive(Clone)]
struct Dma {
    port: u16,
    len: usize,
    head: [u8; HDR],
    icrc: [u8; 4],
}

impl Dma {
    fn new(port: u16, frame: &[u8]) -> Self {
        let mut head = [0u8; HDR];
        head.copy_from_slice(&frame[..HDR]);
        let mut icrc = [0u8; 4];
        icrc.copy_from_slice(&frame[frame.len() - 4..]);
        Self {
            port,
            len: frame.len(),
            head,
            icrc,
        }
    }

    #[inline]
    fn write(&self, m: &mut Mbuf) {
        let d = m.data_mut();
        if d.len() == self.len {
            d[..HDR].copy_from_slice(&self.head);
            d[self.len - 4..].copy_from_slice(&self.icrc);
        }
    }
}

/// Frames the switch has sent, summed over its ports.
fn sent(dp: &Dataplane, ids: &[u16]) -> u64 {
    ids.iter()
        .filter_map(|&i| dp.switch.counters(i))
        .map(|c| c.tx_packets)
        .sum()
}

/// Runs the switch loop for `secs`; returns (median Mpps over the seconds after the
/// first, the dataplane back).
fn run_ours(
    eal: &'static Eal,
    core: usize,
    mut dp: Dataplane,
    dma: [Dma; 2],
    secs: u64,
) -> (f64, Dataplane) {
    let worker = lcore::spawn_pinned(eal, "switch_fwd", Some(core), move || {
        let clock = *dp.clock();
        let ids = [dma[0].port, dma[1].port];
        let mut rates = Vec::new();
        let mut last = (Instant::now(), sent(&dp, &ids));
        let end = Instant::now() + Duration::from_secs(secs);
        let mut turns: u32 = 0;
        loop {
            dp.poll_with(clock.now_ns(), |port, frames| {
                let d = if port == dma[0].port {
                    &dma[0]
                } else {
                    &dma[1]
                };
                for m in frames.iter_mut() {
                    d.write(m);
                }
            });
            turns = turns.wrapping_add(1);
            if turns.is_multiple_of(1024) {
                let now = Instant::now();
                if now.duration_since(last.0) >= Duration::from_secs(1) {
                    let n = sent(&dp, &ids);
                    rates.push((n - last.1) as f64 / now.duration_since(last.0).as_secs_f64());
                    last = (now, n);
                }
                if now >= end {
                    break;
                }
            }
        }
        let steady: Vec<f64> = rates.into_iter().skip(1).collect();
        (median(steady) / 1e6, dp)
    })
    .expect("spawn");
    worker.join().expect("switch thread")
}

fn main() {
    let secs = env("SWITCH_FWD_SECS", 5).max(3);
    let rounds = env("SWITCH_FWD_ROUNDS", 2).max(1);
    // For profiling our side alone (no ratio then).
    let no_testpmd = env("SWITCH_FWD_NO_TESTPMD", 0) != 0;
    let cores = lcore::available_cores();
    let fwd_core = *cores.last().expect("no CPU");
    let main_core = *cores.first().expect("no CPU");
    // Port 0 receives frames for host B (10.0.1.2), port 1 frames for host A.
    let to_b = template([10, 0, 0, 1], [10, 0, 1, 2]);
    let to_a = template([10, 0, 1, 2], [10, 0, 0, 1]);
    assert_eq!(to_a.len(), to_b.len());
    let flen = to_b.len();
    let size = format!("size={flen}");
    let lcores = format!("{main_core},{fwd_core}");
    let null0 = format!("net_null0,{size}");
    let null1 = format!("net_null1,{size}");
    let mut tp_eal: Vec<&str> = vec!["-l", &lcores];
    tp_eal.extend_from_slice(&["--vdev", &null0, "--vdev", &null1]);
    let tp_app = [
        "--forward-mode=io",
        "--nb-cores=1",
        "--burst=32",
        "--rxd=1024",
        "--txd=1024",
        "--mbcache=250",
    ];

    let (eal, mem) = bench::memory::init_eal("switch_fwd", 128, 1024);
    let pool =
        Mempool::new(eal, "switch_fwd", 8191, 250, Mempool::DEFAULT_DATA_ROOM).expect("pool");
    // Write a valid frame into every mbuf of the pool once (net_null RX hands out
    // mbufs without touching their data; the hook rewrites only what the switch edits).
    {
        let mut all = Vec::new();
        while let Ok(mut m) = pool.alloc() {
            m.extend_from_slice(&to_b).expect("frame fits");
            all.push(m);
        }
        assert_eq!(all.len(), pool.capacity() as usize);
    }
    let mut p0 = Port::open(eal, &null0).expect("net_null0");
    let mut p1 = Port::open(eal, &null1).expect("net_null1");
    let (id0, id1) = (p0.id(), p1.id());
    let (rx0, tx0) = p0.configure_single(&pool).expect("configure");
    let (rx1, tx1) = p1.configure_single(&pool).expect("configure");
    let sw: Switch<Mbuf> = Switch::from_config(&config(id0, id1)).expect("switch");
    let mut dp = Dataplane::new(
        sw,
        vec![PortIo::new(id0, rx0, tx0), PortIo::new(id1, rx1, tx1)],
        TscClock::new(eal),
    );
    let dma = [Dma::new(id0, &to_b), Dma::new(id1, &to_a)];

    println!(
        "switch forwarding vs dpdk-testpmd io, 2 x net_null size={flen} (RoCEv2 WRITE + INT \
         container), WRED + INT push on, 400 Gbit/s ports, 1 forwarding core, burst 32, \
         {secs} s per side, {rounds} rounds, ours on {mem}"
    );
    let mut report = Rounds::new("dpdk-testpmd io");
    for round in 1..=rounds {
        let tp = if no_testpmd {
            bench::testpmd::TestpmdRate {
                mpps: f64::NAN,
                samples: 0,
                mode: mem,
            }
        } else {
            bench::testpmd::run(&tp_eal, &tp_app, secs).unwrap_or_else(|e| panic!("{e}"))
        };
        let (mpps, d) = run_ours(eal, fwd_core, dp, dma.clone(), secs);
        dp = d;
        report.record(round, &tp, mpps, "");
    }
    // The frames were real: every one parsed, routed and got a hop record.
    for id in [id0, id1] {
        let c = dp.switch.counters(id).copied().unwrap_or_default();
        println!(
            "  switch port {id}: rx {} tx {} int_pushed {} int_errors {} ce {} drops {} \
             malformed {} max queue {} B",
            c.rx_packets,
            c.tx_packets,
            c.int_pushed,
            c.int_errors,
            c.ce_marked,
            c.drops(),
            c.rx_malformed + c.rx_not_ipv4 + c.rx_unroutable + c.rx_ttl_expired,
            c.queue_max_bytes
        );
        assert_eq!(
            c.rx_malformed + c.rx_not_ipv4 + c.rx_unroutable + c.rx_ttl_expired + c.int_errors,
            0,
            "frames were not valid RoCEv2 + INT: the benchmark is void"
        );
        assert_eq!(
            c.int_pushed, c.tx_packets,
            "every frame must get a hop record"
        );
    }
    // And what the switch received was byte for byte the template: take used mbufs
    // back from the pool (their data still holds what the switch left there: moved
    // headers, hop records), give them the frame length as net_null RX does, apply
    // the hook and compare.
    let mut checked = 0;
    let mut held = Vec::new();
    for _ in 0..256 {
        let Ok(mut m) = pool.alloc() else { break };
        if m.append(flen).is_ok() {
            for (d, want) in dma.iter().zip([&to_b, &to_a]) {
                d.write(&mut m);
                assert_eq!(m.data(), &want[..], "hook does not restore the frame");
                checked += 1;
            }
        }
        held.push(m);
    }
    drop(held);
    println!(
        "  hook check: {} used mbufs x 2 directions restored byte for byte to the valid frame",
        checked / 2
    );
    report.finish();
    drop(dp);
    drop((p0, p1));
}
