//! The NIC's TX pipeline alone: build valid 64 B RDMA WRITE packets
//! (Ethernet/IPv4/UDP/BTH/RETH, payload, ICRC, into mbufs) and burst them
//! into a `net_null` port, against `dpdk-testpmd --forward-mode=txonly`
//! (64 B packets) on the same vdev, alternating in the same run, one core
//! each.
//!
//! `cargo bench -p bench --bench tx_pipeline` (TXP_SECS per side and round,
//! default 6; TXP_ROUNDS, default 2).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{lcore, Burst, Eal, Mempool, Port};
use nic::io::{build_frame, Payload, TxPools};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::RethRepr;
use rdma::wire::{BthRepr, Ecn, EthernetAddress, Ipv4Address, Opcode};

const EAL_COMMON: &[&str] = &[
    "--no-huge",
    "-m",
    "1024",
    "--no-pci",
    "--no-shconf",
    "--no-telemetry",
];

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let secs = env("TXP_SECS", 6).max(3);
    let rounds = env("TXP_ROUNDS", 2).max(1);
    let cores = lcore::available_cores();
    let (main_core, tx_core) = (*cores.first().unwrap(), *cores.last().unwrap());
    let lcores = format!("{main_core},{tx_core}");
    let mut tp_eal: Vec<&str> = vec!["-l", &lcores];
    tp_eal.extend_from_slice(EAL_COMMON);
    tp_eal.extend_from_slice(&["--vdev", "net_null0"]);
    let tp_app = [
        "--forward-mode=txonly",
        "--txpkts=64",
        "--nb-cores=1",
        "--burst=32",
        "--txd=1024",
        "--mbcache=250",
    ];

    let mut args = vec!["tx_pipeline"];
    args.extend_from_slice(EAL_COMMON);
    let eal = Eal::init(&args).expect("EAL");
    let pools = TxPools {
        hdr: Mempool::new(eal, "txp_hdr", 16384, 250, Mempool::DEFAULT_DATA_ROOM).unwrap(),
        bare: Mempool::new(eal, "txp_bare", 1024, 32, 0).unwrap(),
        copy_threshold: nic::io::COPY_THRESHOLD,
    };
    let mut port = Port::open(eal, "net_null0").expect("net_null0");
    let (_rx, tx) = port.configure_single(&pools.hdr).expect("configure");
    let mut tx = Some(tx);

    println!("TX pipeline: valid 64 B RoCEv2 WRITE frames into net_null, 1 core, burst 32, {secs} s per side, {rounds} rounds");
    let (mut theirs, mut ours) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        // testpmd txonly reports Tx-pps; the parser reads Rx-pps lines, so
        // count its TX side by running the same parser on Tx-pps.
        let tp = bench::testpmd::run_tx(&tp_eal, &tp_app, secs).unwrap_or_else(|e| panic!("{e}"));
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c2, s2, pools2) = (count.clone(), stop.clone(), pools.clone());
        let mut txq = tx.take().unwrap();
        let worker = lcore::spawn_pinned(eal, "txp", Some(tx_core), move || {
            let fb = FrameBuilder {
                net: NetHeaders {
                    src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
                    dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
                    src_ip: Ipv4Address([10, 0, 0, 1]),
                    dst_ip: Ipv4Address([10, 0, 0, 2]),
                    udp_src_port: 0xC011,
                    dscp: 26,
                    ttl: 64,
                },
                int: None,
            };
            // 14 + 20 + 8 + 12 + 16 = 70 B of headers + 4 B ICRC already
            // exceed 64 B: the smallest valid WRITE carries no payload.
            // Use a 1-byte WRITE, as perftest's smallest message.
            let payload = [0xA5u8; 1];
            let mut burst: Burst = Burst::new();
            let mut psn = 0u32;
            let mut sent = 0u64;
            while !s2.load(Ordering::Relaxed) {
                while !burst.is_full() {
                    let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x12, psn));
                    pkt.reth = Some(RethRepr {
                        va: 0x1000,
                        rkey: 0x100,
                        dma_len: 1,
                    });
                    match build_frame(&fb, &pkt, Ecn::Ect0, Payload::Copy(&payload), &pools2) {
                        Ok(m) => {
                            let _ = burst.push(m);
                        }
                        Err(_) => break,
                    }
                    psn = (psn + 1) & 0xFF_FFFF;
                }
                sent += txq.send(&mut burst) as u64;
                c2.store(sent, Ordering::Relaxed);
            }
            burst.clear();
            txq
        })
        .unwrap();
        let mut rates = Vec::new();
        let mut last = (Instant::now(), 0u64);
        for _ in 0..secs {
            std::thread::sleep(Duration::from_secs(1));
            let now = (Instant::now(), count.load(Ordering::Relaxed));
            rates.push((now.1 - last.1) as f64 / now.0.duration_since(last.0).as_secs_f64());
            last = now;
        }
        stop.store(true, Ordering::Relaxed);
        tx = Some(worker.join().unwrap());
        let mpps = median(rates.into_iter().skip(1).collect()) / 1e6;
        println!(
            "  round {round}: dpdk-testpmd txonly {:7.2} Mpps | ours {:7.2} Mpps | ratio {:.3}",
            tp.mpps,
            mpps,
            mpps / tp.mpps
        );
        theirs.push(tp.mpps);
        ours.push(mpps);
    }
    let (t, o) = (median(theirs), median(ours));
    println!("  median: dpdk-testpmd txonly {t:7.2} Mpps | ours {o:7.2} Mpps");
    println!("  ratio ours/testpmd: {:.3}", o / t);
}
