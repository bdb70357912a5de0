//! Chained (multi-segment) frames at the NIC's receiver, as a zero-copy
//! sender builds them (headers | payload | pad + ICRC) or a NIC scatters
//! them: parsed without linearising where the headers fill the first
//! segment, linearised otherwise; the ICRC is checked over the segments, a
//! corrupted payload byte is a counted drop, and the bytes land exactly.

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Burst, Eal, Mempool, Port, RxQueue, TxQueue};
use nic::verbs::{Device, DeviceConfig, QpOptions, RemoteQp};
use rdma::transport::Access;
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::{AethSyndrome, RethRepr};
use rdma::wire::{BthRepr, Ecn, EthernetAddress, Ipv4Address, Opcode, ParseOptions};

const PEER_QPN: u32 = 0x77;

/// Sends `frame` as a chain cut at `cuts` (offsets, increasing).
fn send_chain(tx: &mut TxQueue, pool: &Mempool, frame: &[u8], cuts: &[usize]) {
    let mut bounds = vec![0];
    bounds.extend_from_slice(cuts);
    bounds.push(frame.len());
    let mut head = pool.alloc().unwrap();
    head.extend_from_slice(&frame[bounds[0]..bounds[1]])
        .unwrap();
    for w in bounds[1..].windows(2) {
        let mut seg = pool.alloc().unwrap();
        seg.extend_from_slice(&frame[w[0]..w[1]]).unwrap();
        head.chain(seg).map_err(|(e, _)| e).unwrap();
    }
    assert_eq!(head.nb_segs() as usize, cuts.len() + 1);
    let mut b: Burst = Burst::new();
    b.push(head).unwrap();
    assert_eq!(tx.send(&mut b), 1);
}

fn next_ack(rx: &mut RxQueue, dut: &Device) -> AethSyndrome {
    let end = Instant::now() + Duration::from_secs(5);
    let mut b: Burst = Burst::new();
    while Instant::now() < end {
        rx.recv(&mut b);
        // The NIC's gratuitous ARP at start is not what we wait for.
        if let Some(m) = b.drain().find(|m| nic::control::is_rocev2(m.data())) {
            let bytes = m.to_vec();
            let f = rdma::wire::parse_frame(&bytes, &ParseOptions::default(), |_| false).unwrap();
            assert_eq!(f.bth.opcode, Opcode::Acknowledge);
            return f.aeth.unwrap().syndrome;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no answer; counters:\n{}", dut.counters());
}

#[test]
fn chained_frames_are_parsed_in_place_and_checked() {
    let eal = Eal::for_tests();
    let pool = Mempool::new(eal, "chain_pool", 512, 32, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let (mut me, dut_port) = Port::ring_pair(eal, "chain", 1024).unwrap();
    let (mut rx, mut tx) = me.configure_single(&pool).unwrap();
    let dut = Device::open(eal, dut_port, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let cq = dut.create_cq(64).unwrap();
    let mut qp = dut.create_qp(&cq, &cq, QpOptions::default()).unwrap();
    let my_mac = [2, 0, 0, 0, 0, 0x77];
    qp.connect(&RemoteQp {
        qpn: PEER_QPN,
        psn: 0,
        ip: [10, 0, 0, 1],
        mac: Some(my_mac),
        mtu: 4096,
        cc: CcKind::None,
    })
    .unwrap();
    let qpn = qp.remote_info().qpn;
    let mr = dut
        .reg_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    mr.write(0, &[0x5A; 8192]);
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress(my_mac),
            dst_mac: EthernetAddress(dut.mac()),
            src_ip: Ipv4Address([10, 0, 0, 1]),
            dst_ip: Ipv4Address([10, 0, 0, 2]),
            udp_src_port: 0xC077,
            dscp: 26,
            ttl: 64,
        },
        int: None,
    };
    // Headers of a WRITE Only: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16.
    const HDR: usize = 14 + 20 + 8 + 12 + 16;
    let write = |psn: u32, off: u64, payload: &[u8]| -> Vec<u8> {
        let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qpn, psn));
        pkt.bth.ack_req = true;
        pkt.reth = Some(RethRepr {
            va: mr.va() + off,
            rkey: mr.rkey(),
            dma_len: payload.len() as u32,
        });
        let mut buf = vec![0u8; 9000];
        let n = fb.emit_frame(&pkt, payload, Ecn::Ect0, &mut buf).unwrap();
        buf.truncate(n);
        buf
    };
    let data: Vec<u8> = (0..1500u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut expect = vec![0x5Au8; 8192];
    let mut psn = 0;
    // (payload offset in the region, payload length, cuts as a function of
    // the frame length): the sender's shape, two segments, a pad, and a
    // first segment that ends inside the RETH (linearised).
    type Cuts = fn(usize) -> Vec<usize>;
    let cases: [(&str, u64, usize, Cuts); 4] = [
        ("headers|payload|icrc", 0, 1024, |n| vec![HDR, n - 4]),
        ("headers|payload+icrc", 2000, 700, |_| vec![HDR]),
        ("pad: 61 B", 3000, 61, |n| vec![HDR, n - 7]),
        ("cut inside the RETH", 4000, 300, |n| vec![50, n - 4]),
    ];
    for (what, off, len, cuts) in cases {
        let frame = write(psn, off, &data[..len]);
        send_chain(&mut tx, &pool, &frame, &cuts(frame.len()));
        assert!(
            matches!(next_ack(&mut rx, &dut), AethSyndrome::Ack { .. }),
            "{what}"
        );
        expect[off as usize..off as usize + len].copy_from_slice(&data[..len]);
        psn += 1;
    }
    let mut got = vec![0u8; 8192];
    mr.read(0, &mut got);
    assert!(got == expect, "region differs from what was written");

    // A corrupted payload byte in the payload segment: the ICRC over the
    // segments catches it; counted, not written, not answered.
    let drops = dut.counters().rx_drop_icrc;
    let mut bad = write(psn, 6000, &data[..512]);
    bad[HDR + 100] ^= 0x01;
    let n = bad.len();
    send_chain(&mut tx, &pool, &bad, &[HDR, n - 4]);
    let end = Instant::now() + Duration::from_secs(5);
    while dut.counters().rx_drop_icrc == drops {
        assert!(Instant::now() < end, "bad ICRC not counted");
        std::thread::sleep(Duration::from_millis(2));
    }
    mr.read(0, &mut got);
    assert!(got == expect, "a frame with a bad ICRC changed the region");
    // The same frame, intact, still lands (the PSN was not consumed).
    let good = write(psn, 6000, &data[..512]);
    send_chain(&mut tx, &pool, &good, &[HDR, n - 4]);
    assert!(matches!(next_ack(&mut rx, &dut), AethSyndrome::Ack { .. }));
    expect[6000..6512].copy_from_slice(&data[..512]);
    mr.read(0, &mut got);
    assert!(got == expect);
}
