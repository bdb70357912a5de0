//! receive + dequeue per frame through the switch core, WRED in its linear (random)
//! region and INT push on, with mbuf-like [`FrameBuf`] packets (headroom, no allocation).
//!
//! Run: `CARGO_TARGET_DIR=target-switch cargo bench -p switch --bench core`
//! Figures are recorded in docs/switch.md.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, RethRepr};
use std::time::Duration;
use switch::{FrameBuf, PacketBuf, PortSettings, Route, Switch, SwitchSettings};

fn write_frame(payload: usize, int: bool) -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 1, 0]),
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
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x11, 5));
    p.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x42,
        dma_len: payload as u32,
    });
    let data = vec![0x5Au8; payload];
    let mut buf = vec![0u8; payload + 256];
    let n = fb.emit_frame(&p, &data, Ecn::Ect0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn switch() -> Switch<FrameBuf> {
    let port = |id: u16| PortSettings {
        id,
        mac: [2, 0, 0, 0, 1, id as u8],
        speed_bps: 100_000_000_000,
        buf_max: 4 << 20,
        k_min: 1024,
        k_max: 2 << 20,
        p_max: 0.5,
        k_drop: 2 << 20,
        ctrl_buf_max: 64 << 10,
        burst: 16 << 10,
    };
    Switch::new(&SwitchSettings {
        switch_id: 1,
        int_dscp: 0x18,
        seed: 1,
        fcs_in_frame: false,
        ports: vec![port(0), port(1)],
        routes: vec![Route {
            net: 0x0A00_0100,
            len: 24,
            port: 1,
            next_hop_mac: [2, 0, 0, 0, 0, 2],
        }],
    })
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("switch_core");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .throughput(Throughput::Elements(1));
    for (name, payload, int, depth) in [
        ("write64_int_wred", 64usize, true, 256usize << 10),
        ("write1k_int_wred", 1024, true, 256 << 10),
        ("write64_plain", 64, false, 256 << 10),
        ("write1k_plain", 1024, false, 256 << 10),
        ("write64_int_shallow", 64, true, 0),
        ("write1k_int_shallow", 1024, true, 0),
    ] {
        let tmpl = write_frame(payload, int);
        let mut sw = switch();
        // Keep `depth` bytes queued (256 KiB: every arrival falls in WRED's random
        // region and the dequeued frame is cold in cache, as behind a standing queue;
        // 0: the frame goes straight through, hot in cache).
        let mut q = 0;
        while q < depth {
            sw.receive(0, FrameBuf::from_frame(&tmpl).unwrap(), 0)
                .unwrap();
            q += tmpl.len();
        }
        let mut pkt = Some(FrameBuf::from_frame(&tmpl).unwrap());
        let mut now = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut p = pkt.take().unwrap();
                p.reset(&tmpl, FrameBuf::HEADROOM);
                let _ = black_box(sw.receive(0, p, now));
                now += 1_000_000;
                pkt = sw.dequeue(1, now);
            })
        });
    }
    // Baseline: the per-iteration frame copy alone.
    let tmpl = write_frame(1024, true);
    let mut p = FrameBuf::from_frame(&tmpl).unwrap();
    g.bench_function("reset_only_1k", |b| {
        b.iter(|| {
            p.reset(black_box(&tmpl), FrameBuf::HEADROOM);
            black_box(p.len());
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
