//! Build + ICRC + parse of a 64 B and a 4 KiB RDMA WRITE ONLY packet, next to raw
//! `crc32fast` over the same bytes (the ICRC's speed anchor, docs/design.md §9).
//!
//! Run: `cargo bench -p rdma --bench wire -- --warm-up-time 1 --measurement-time 3`
//! (`-- tx_stream` for the header-template group alone).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::*;

fn builder() -> FrameBuilder {
    FrameBuilder {
        net: NetHeaders::new(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            [10, 0, 0, 1],
            [10, 0, 0, 2],
            0xC001,
        ),
        int: None,
    }
}

fn write_only(len: u32) -> RoceRepr {
    let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x42, 7));
    r.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x77,
        dma_len: len,
    });
    r
}

/// `parse_frame` as the engine calls it (`nic::io`): out of line, the whole
/// `RoceFrame` handed on. Inlined into the loop with only `payload.len()` used,
/// the compiler dropped the parsing of every field the bench did not read, and
/// any change to the frame's layout moved the figure by 1.5-2x.
#[inline(never)]
fn parse_as_the_engine_does<'a>(frame: &'a [u8], o: &ParseOptions) -> Option<RoceFrame<'a>> {
    parse_frame(frame, o, |_| false).ok()
}

fn bench(c: &mut Criterion) {
    let b = builder();
    for size in [64usize, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let pkt = write_only(size as u32);
        let mut buf = vec![0u8; size + 128];
        let n = b.emit_frame(&pkt, &payload, Ecn::Ect0, &mut buf).unwrap();
        let frame = buf[..n].to_vec();
        // The ICRC covers 8 + (IP total length - 4) bytes; the raw CRC runs over the same
        // number of bytes in place (the 8 bytes before the IPv4 header onwards).
        let icrc_bytes = 8 + (n - 14 - 4);
        let raw = &frame[6..n - 4];
        assert_eq!(raw.len(), icrc_bytes);

        let mut g = c.benchmark_group(format!("write_{size}B"));
        g.throughput(Throughput::Bytes(icrc_bytes as u64));
        g.bench_function(BenchmarkId::new("crc32fast_raw", size), |bn| {
            bn.iter(|| crc32fast::hash(black_box(raw)))
        });
        g.bench_function(BenchmarkId::new("icrc", size), |bn| {
            bn.iter(|| icrc_frame(black_box(&frame), 14, 0).unwrap())
        });
        g.bench_function(BenchmarkId::new("icrc_in_place", size), |bn| {
            let mut fm = frame.clone();
            bn.iter(|| icrc_frame_in_place(black_box(&mut fm), 14, 0).unwrap())
        });
        g.bench_function(BenchmarkId::new("icrc_incremental", size), |bn| {
            // Header segment + payload segment, as the zero-copy TX path does it.
            let mut hdr = [0u8; 128];
            let l = b
                .emit_headers(&pkt, payload.len(), Ecn::Ect0, &mut hdr)
                .unwrap();
            let mut t = [0u8; 8];
            bn.iter(|| {
                let mut h = b.icrc_start(black_box(&hdr), &l).unwrap();
                h.update(black_box(&payload));
                FrameBuilder::finish_icrc(h, &l, &mut t).unwrap()
            })
        });
        g.bench_function(BenchmarkId::new("build", size), |bn| {
            let mut out = vec![0u8; size + 128];
            bn.iter(|| {
                b.emit_frame(black_box(&pkt), black_box(&payload), Ecn::Ect0, &mut out)
                    .unwrap()
            })
        });
        g.bench_function(BenchmarkId::new("parse_verify", size), |bn| {
            let o = ParseOptions::default();
            bn.iter(|| black_box(parse_as_the_engine_does(black_box(&frame), &o)))
        });
        g.bench_function(BenchmarkId::new("parse_noverify", size), |bn| {
            let o = ParseOptions {
                verify_icrc: false,
                ..Default::default()
            };
            bn.iter(|| black_box(parse_as_the_engine_does(black_box(&frame), &o)))
        });
        g.finish();
    }
}

/// A stream of WRITE Only frames (next PSN, VA advancing), written into 32 rotating
/// buffers as into a burst of mbufs: the general builder against the per-QP header
/// template (rdma::wire::template), for a 1-byte (the TX pipeline benchmark's frame),
/// a 64 B and a 4 KiB payload.
fn template(c: &mut Criterion) {
    let b = builder();
    let tpl = HeaderTemplate::new(b, 0x42, bth::DEFAULT_PKEY).unwrap();
    for size in [1usize, 64, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut bufs = vec![vec![0u8; size + 128]; 32];
        let mut g = c.benchmark_group(format!("tx_stream_{size}B"));
        g.throughput(Throughput::Elements(1));
        let mut run = |name: &str, use_tpl: bool| {
            let (mut psn, mut va, mut i) = (0u32, 0x1000u64, 0usize);
            g.bench_function(BenchmarkId::new(name, size), |bn| {
                bn.iter(|| {
                    let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x42, psn));
                    pkt.reth = Some(RethRepr {
                        va,
                        rkey: 0x77,
                        dma_len: size as u32,
                    });
                    psn = (psn + 1) & 0xFF_FFFF;
                    va += size as u64;
                    i = (i + 1) & 31;
                    let out = &mut bufs[i];
                    if use_tpl {
                        tpl.write_frame(out, black_box(&pkt), Ecn::Ect0, black_box(&payload))
                    } else {
                        b.emit_frame(black_box(&pkt), black_box(&payload), Ecn::Ect0, out)
                    }
                    .unwrap()
                })
            });
        };
        run("emit_frame", false);
        run("template", true);
        g.finish();
    }
}

criterion_group!(benches, bench, template);
criterion_main!(benches);
