//! Ten times overload (issue 14): the switch's poll loop (what `roce-switch`
//! runs) with an egress shaped to a tenth of what arrives, and a NIC whose
//! receive path gets ten hostile frames for every real one. Both must keep
//! counting, account for every frame, and neither may crash or leak.
//! Real DPDK ring-pair ports, real frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bench::chaos::{message_seed, pattern_fill, pattern_mismatch};
use dpdk::{lcore, Burst, Eal, Mbuf, Mempool, Port, TscClock};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, WcStatus};
use rdma::wire::frame::{NetHeaders, RoceRepr};
use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, RethRepr};
use switch::dataplane::{Dataplane, PortIo, StatsSink};
use switch::{Config, PortCounters, Switch};

/// One at a time: each test runs busy threads.
static SERIAL: Mutex<()> = Mutex::new(());

/// A RoCEv2 WRITE Only of `payload` bytes from 10.0.0.1 to `dst`, QP
/// `qpn`, valid ICRC.
fn write_frame(dst: [u8; 4], dst_mac: [u8; 6], qpn: u32, psn: u32, payload: usize) -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x01]),
            dst_mac: EthernetAddress(dst_mac),
            src_ip: Ipv4Address([10, 0, 0, 1]),
            dst_ip: Ipv4Address(dst),
            udp_src_port: 0xC000,
            dscp: 3,
            ttl: 64,
        },
        int: None,
    };
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qpn, psn & 0xFF_FFFF));
    p.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x42,
        dma_len: payload as u32,
    });
    let data = vec![0x5Au8; payload];
    let mut buf = vec![0u8; payload + 256];
    let n = fb.emit_frame(&p, &data, Ecn::Ect0, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

fn mbuf(pool: &Mempool, frame: &[u8]) -> Option<Mbuf> {
    let mut m = pool.alloc().ok()?;
    m.extend_from_slice(frame).ok()?;
    Some(m)
}

/// Keeps each periodic report of the switch loop.
struct Keep(Arc<Mutex<Vec<PortCounters>>>, u16);
impl StatsSink for Keep {
    fn report(&mut self, sw: &Switch<Mbuf>, _: &[u16], _: &[PortCounters], _: u64) {
        if let Some(c) = sw.counters(self.1) {
            self.0.lock().unwrap().push(*c);
        }
    }
}

/// Host A offers 500 Mbit/s of 1 KiB RoCE frames for 3 s to a switch port
/// shaped at 50 Mbit/s: the switch forwards at the shaped rate, drops the
/// rest at the tail of its 256 KiB buffer, counts every frame (received =
/// sent + dropped + queued), its counters grow every report, and the
/// switch loop is still alive at the end with every mbuf back.
#[test]
fn switch_under_ten_times_overload_keeps_counting() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let pool = Mempool::new(eal, "ovsw", 16383, 128, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let (mut a, mut s0) = Port::ring_pair(eal, "ovswa", 4096).unwrap();
    let (mut s1, mut b) = Port::ring_pair(eal, "ovswb", 4096).unwrap();
    let (_, mut a_tx) = a.configure_single(&pool).unwrap();
    let (mut b_rx, _) = b.configure_single(&pool).unwrap();
    let (rx0, tx0) = s0.configure_single(&pool).unwrap();
    let (rx1, tx1) = s1.configure_single(&pool).unwrap();
    let (p0, p1) = (s0.id(), s1.id());
    let mut cfg = Config::two_hosts_100g(p0, p1);
    cfg.ports[1].own.speed = Some("50Mbps".into());
    let sw: Switch<Mbuf> = Switch::from_config(&cfg).unwrap();
    let mut dp = Dataplane::new(
        sw,
        vec![PortIo::new(p0, rx0, tx0), PortIo::new(p1, rx1, tx1)],
        TscClock::new(eal),
    );
    let reports = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let (s2, r2) = (stop.clone(), reports.clone());
    let worker = lcore::spawn_pinned(eal, "ovsw", None, move || {
        dp.run(&s2, 250_000_000, &mut Keep(r2, p1));
        dp
    })
    .unwrap();

    let frame = write_frame([10, 0, 1, 2], [0x02, 0, 0, 0, 1, 0], 0x11, 0, 1024);
    let offered_bps = 500_000_000u64;
    let wire_bits = (frame.len() as u64 + 24) * 8;
    let (mut sent, mut received) = (0u64, 0u64);
    let start = Instant::now();
    let mut inb: Burst = Burst::new();
    let mut out: Burst = Burst::new();
    while start.elapsed() < Duration::from_secs(3) {
        // Pace host A at the offered rate; drain host B.
        let due = (start.elapsed().as_nanos() as u64 * offered_bps / 1_000_000_000) / wire_bits;
        // Catch up after a descheduled turn: bursts until the ring is full.
        loop {
            while sent < due && !out.is_full() {
                match mbuf(&pool, &frame) {
                    Some(m) => {
                        let _ = out.push(m);
                        sent += 1;
                    }
                    None => break,
                }
            }
            if a_tx.send(&mut out) == 0 || sent >= due {
                break;
            }
        }
        received += b_rx.recv(&mut inb) as u64;
        inb.clear();
        std::thread::sleep(Duration::from_micros(100));
    }
    let offered = sent * wire_bits;
    let secs = start.elapsed().as_secs_f64();
    // Let the queue drain.
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        a_tx.send(&mut out);
        received += b_rx.recv(&mut inb) as u64;
        inb.clear();
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let dp = worker.join().expect("the switch loop survived");
    let c = *dp.switch.counters(p1).unwrap();
    let c0 = *dp.switch.counters(p0).unwrap();
    let reports = reports.lock().unwrap().clone();
    eprintln!(
        "switch 10x: offered {:.0} Mbit/s for {secs:.1} s to a 50 Mbit/s port: received {} frames, sent {}, tail drops {}, WRED {}; host B got {received}; {} reports",
        offered as f64 / secs / 1e6,
        c0.rx_packets,
        c.tx_packets,
        c.tail_drops,
        c.wred_drops,
        reports.len()
    );
    assert!(
        offered as f64 / secs >= 9.0 * 50e6,
        "host A offered less than 10x"
    );
    assert_eq!(
        c0.rx_packets, sent,
        "the switch missed frames on its ingress"
    );
    assert_eq!(
        c0.rx_packets,
        c.tx_packets + c.tail_drops + c.wred_drops + c.ctrl_tail_drops,
        "a frame is unaccounted for: {c:?}"
    );
    assert_eq!(received, c.tx_packets);
    assert!(c.tail_drops + c.wred_drops > sent / 2, "{c:?}");
    // The shaper held 50 Mbit/s (what left over the run, within 30 %).
    let out_bps = c.tx_wire_bytes as f64 * 8.0 / secs;
    assert!(out_bps < 65e6, "{out_bps}");
    // It kept counting: drops rose from one report to the next while A sent.
    let busy: Vec<&PortCounters> = reports.iter().take(10).collect();
    assert!(busy.len() >= 8, "{} reports", busy.len());
    for w in busy.windows(2).skip(1) {
        assert!(w[1].tail_drops + w[1].wred_drops > w[0].tail_drops + w[0].wred_drops);
        assert!(w[1].tx_packets > w[0].tx_packets);
    }
    drop(dp);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
}

/// NIC B receives a 64 MiB WRITE from NIC A while a flood stage puts ten
/// hostile frames on B's wire for every real one: WRITEs to a QP that does
/// not exist, frames with a flipped payload bit (bad ICRC), truncated
/// frames, and plain UDP. The transfer completes byte-exact, B counts
/// every frame it got and every drop by cause, its counters grow each
/// sample, and nothing leaks.
#[test]
fn nic_under_ten_times_hostile_load_keeps_counting_and_delivers() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = Eal::for_tests();
    let (pa, mut m1) = Port::ring_pair(eal, "ovnica", 4096).unwrap();
    let (mut m2, pb) = Port::ring_pair(eal, "ovnicb", 4096).unwrap();
    let pool = Mempool::new(eal, "ovnic", 16383, 64, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let (mut r1, mut t1) = m1.configure_single(&pool).unwrap();
    let (mut r2, mut t2) = m2.configure_single(&pool).unwrap();
    let mut ca = DeviceConfig::new([10, 0, 0, 1]);
    ca.mac = Some([0x02, 0, 0, 0, 0, 0x01]);
    let mut cb = DeviceConfig::new([10, 0, 0, 2]);
    cb.mac = Some([0x02, 0, 0, 0, 0, 0x02]);
    let mut devs = Device::open_group(eal, vec![(pa, ca), (pb, cb)], None).unwrap();
    let (b, a) = (devs.pop().unwrap(), devs.pop().unwrap());

    // The flood stage: A -> B with ten hostile frames after each real one,
    // B -> A as is. It counts what B's ring accepted, by kind.
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let p2 = pool.clone();
    let stage = std::thread::spawn(move || {
        let junk_unknown = write_frame([10, 0, 0, 2], [0x02, 0, 0, 0, 0, 0x02], 0x7FFF, 1, 512);
        let mut junk_icrc = junk_unknown.clone();
        junk_icrc[100] ^= 0x10;
        let junk_short = junk_unknown[..40].to_vec();
        let mut junk_udp = junk_unknown.clone();
        junk_udp[36] = 0; // UDP destination port 4791 -> 183
        let kinds = [junk_unknown, junk_icrc, junk_short, junk_udp];
        let mut accepted = [0u64; 5]; // real, unknown QP, bad ICRC, short, not RoCE
        let (mut inb, mut out): (Burst, Burst<512>) = (Burst::new(), Burst::new());
        let mut kind_of: Vec<usize> = Vec::with_capacity(512);
        let mut k = 0usize;
        while !s2.load(Ordering::Relaxed) {
            // Take from A only what fits with its ten companions: the stage
            // never drops a real frame, only hostile ones B had no room for.
            if out.len() + 11 * 32 <= 512 {
                r1.recv(&mut inb);
            }
            for m in inb.drain() {
                if out.push(m).is_ok() {
                    kind_of.push(0);
                }
                for _ in 0..10 {
                    k = (k + 1) % kinds.len();
                    if let Some(j) = mbuf(&p2, &kinds[k]) {
                        if out.push(j).is_ok() {
                            kind_of.push(k + 1);
                        }
                    }
                }
            }
            if !out.is_empty() {
                let n = t2.send(&mut out);
                for &kind in &kind_of[..n] {
                    accepted[kind] += 1;
                }
                kind_of.drain(..n);
                // What B's ring refused is dropped here, as a full NIC
                // queue drops: only the hostile frames, the real ones wait.
                let mut keep: Burst<512> = Burst::new();
                let mut keep_kind = Vec::new();
                for (m, kind) in out.drain().zip(kind_of.drain(..)) {
                    if kind == 0 {
                        let _ = keep.push(m);
                        keep_kind.push(0);
                    }
                }
                for m in keep.drain() {
                    let _ = out.push(m);
                }
                kind_of = keep_kind;
            }
            r2.recv(&mut inb);
            let mut back: Burst = Burst::new();
            for m in inb.drain() {
                let _ = back.push(m);
            }
            while !back.is_empty() {
                t1.send(&mut back);
            }
        }
        drop((m1, m2));
        accepted
    });

    let len = 64 << 20;
    let msg = 64 << 10;
    let src = a.reg_mr(len, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut cq = a.create_cq(256).unwrap();
    let cq_b = b.create_cq(256).unwrap();
    let opts = QpOptions {
        mtu: 1024,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&cq, &cq, opts).unwrap();
    let mut qb = b.create_qp(&cq_b, &cq_b, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let seed = message_seed(0xF1, 0);
    let mut data = vec![0u8; len];
    pattern_fill(seed, &mut data);
    src.write(0, &data);
    let mut samples = Vec::new();
    let mut next_sample = Instant::now() + Duration::from_millis(250);
    let (mut posted, mut done) = (0usize, 0usize);
    let n = len / msg;
    let end = Instant::now() + Duration::from_secs(120);
    while done < n && Instant::now() < end {
        while posted < n && posted - done < 8 {
            let off = (posted * msg) as u64;
            let op = SendOp::Write {
                remote_va: dst.va() + off,
                rkey: dst.rkey(),
            };
            let wr = SendWr::signaled(posted as u64, op, src.sge(off, msg as u32));
            qa.post_send(wr).unwrap();
            posted += 1;
        }
        if let Some(wc) = cq.poll_one() {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(250);
            samples.push(b.counters());
        }
    }
    assert_eq!(done, n, "the transfer did not finish under the flood");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let acc = stage.join().unwrap();
    let c = b.counters();
    let mut back = vec![0u8; len];
    dst.read(0, &mut back);
    eprintln!(
        "NIC 10x: B's wire took {} real and {} hostile frames ({:?}); B counted rx {}, unknown QP {}, ICRC {}, malformed {}, not RoCE {}; {} samples",
        acc[0],
        acc[1..].iter().sum::<u64>(),
        &acc[1..],
        c.rx_packets,
        c.rx_drop_unknown_qp,
        c.rx_drop_icrc,
        c.rx_drop_malformed,
        c.rx_drop_not_roce,
        samples.len()
    );
    assert_eq!(pattern_mismatch(seed, &back), None, "bytes differ");
    let hostile: u64 = acc[1..].iter().sum();
    assert!(hostile >= 9 * acc[0], "the flood was not 10x: {acc:?}");
    assert_eq!(c.rx_packets, acc.iter().sum::<u64>(), "B missed frames");
    assert_eq!(c.rx_drop_unknown_qp, acc[1]);
    assert_eq!(c.rx_drop_icrc, acc[2]);
    assert_eq!(c.rx_drop_malformed, acc[3]);
    assert_eq!(c.rx_drop_not_roce, acc[4]);
    for w in samples.windows(2) {
        assert!(w[1].rx_packets > w[0].rx_packets, "B stopped counting");
    }
    drop((qa, qb, cq, cq_b, src, dst));
    a.close();
    b.close();
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
}
