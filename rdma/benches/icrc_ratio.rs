//! ICRC speed as a ratio to raw `crc32fast` over the same bytes, measured interleaved
//! (variants alternate in 1000-iteration batches, 300 rounds, minimum and median kept)
//! so that the ratio survives a noisy shared machine better than sequential criterion
//! groups do. Run: `cargo bench -p rdma --bench icrc_ratio`.

use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::*;
use std::hint::black_box;
use std::time::Instant;

type Variant<'a> = (&'static str, Box<dyn Fn() -> u32 + 'a>);

fn main() {
    let b = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
            src_ip: Ipv4Address([10, 0, 0, 1]),
            dst_ip: Ipv4Address([10, 0, 0, 2]),
            udp_src_port: 0xC001,
            dscp: 26,
            ttl: 64,
        },
        int: None,
    };
    for size in [64usize, 4096] {
        let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x42, 7));
        pkt.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x77,
            dma_len: size as u32,
        });
        let mut frame = vec![0u8; size + 128];
        let n = b.emit_frame(&pkt, &payload, Ecn::Ect0, &mut frame).unwrap();
        frame.truncate(n);
        let mut hdr = [0u8; 128];
        let l = b.emit_headers(&pkt, size, Ecn::Ect0, &mut hdr).unwrap();
        let f = &frame;
        let fm = std::cell::RefCell::new(frame.clone());
        let variants: Vec<Variant> = vec![
            (
                "crc32fast_raw",
                Box::new(|| crc32fast::hash(black_box(&f[6..n - 4]))),
            ),
            (
                "icrc_frame",
                Box::new(|| icrc_frame(black_box(f), 14, 0).unwrap()),
            ),
            (
                "icrc_in_place",
                Box::new(|| {
                    icrc_frame_in_place(black_box(&mut fm.borrow_mut()[..]), 14, 0).unwrap()
                }),
            ),
            (
                "icrc_incremental",
                Box::new(|| {
                    let mut h = b.icrc_start(black_box(&hdr), &l).unwrap();
                    h.update(black_box(&payload));
                    let mut t = [0u8; 8];
                    FrameBuilder::finish_icrc(h, &l, &mut t).unwrap();
                    u32::from_le_bytes([t[l.pad], t[l.pad + 1], t[l.pad + 2], t[l.pad + 3]])
                }),
            ),
        ];
        assert_eq!(variants[1].1(), variants[2].1());
        assert_eq!(variants[1].1(), variants[3].1());
        let mut all: Vec<Vec<f64>> = vec![vec![]; variants.len()];
        for _ in 0..300 {
            for (i, (_, v)) in variants.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..1000 {
                    black_box(v());
                }
                all[i].push(t.elapsed().as_nanos() as f64 / 1000.0);
            }
        }
        for a in all.iter_mut() {
            a.sort_by(|x, y| x.total_cmp(y));
        }
        let base_min = all[0][0];
        let base_med = all[0][all[0].len() / 2];
        for (i, (name, _)) in variants.iter().enumerate() {
            let (mn, md) = (all[i][0], all[i][all[i].len() / 2]);
            println!(
                "{size:5} B  {name:17} min {mn:7.1} ns  median {md:7.1} ns  speed vs raw: min {:.3}x  median {:.3}x",
                base_min / mn,
                base_med / md
            );
        }
    }
}
