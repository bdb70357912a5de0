//! Where a 4 KiB frame's payload time goes on the RX path, per frame: the
//! ICRC pass alone (`crc32fast`, as `verify_icrc_in_place` and the chained
//! path's `IcrcHasher` run it), the copy into a memory region alone, and the
//! two as the NIC does them (verify the whole frame, then place it), against
//! the same two interleaved per 1 KiB chunk (one pass over memory: what
//! "the ICRC in the copy pass" would buy), and TX's copy mode (copy, then
//! CRC the copy). Payloads are walked in order through an arena larger than
//! the last-level cache (`cold`, as a stream of frames from a peer arrives)
//! and over one frame (`warm`). Batches of the variants alternate, as in
//! `icrc_ratio`, so that the ratios survive a noisy machine.
//! Run: `cargo bench -p rdma --bench rx_pass` (`RX_PASS_MIB`: arena size).

use std::hint::black_box;
use std::time::Instant;

const FRAME: usize = 4096;
const BATCH: usize = 256;
const ROUNDS: usize = 60;

type Variant = (&'static str, fn(&[u8], &mut [u8]) -> u32);

fn crc(src: &[u8], _dst: &mut [u8]) -> u32 {
    crc32fast::hash(src)
}

fn copy(src: &[u8], dst: &mut [u8]) -> u32 {
    dst.copy_from_slice(src);
    u32::from(dst[0])
}

fn crc_then_copy(src: &[u8], dst: &mut [u8]) -> u32 {
    let c = crc32fast::hash(src);
    dst.copy_from_slice(src);
    c
}

fn chunked(src: &[u8], dst: &mut [u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for (s, d) in src.chunks(1024).zip(dst.chunks_mut(1024)) {
        h.update(s);
        d.copy_from_slice(s);
    }
    h.finalize()
}

fn copy_then_crc(src: &[u8], dst: &mut [u8]) -> u32 {
    dst.copy_from_slice(src);
    crc32fast::hash(dst)
}

fn main() {
    let mib: usize = std::env::var("RX_PASS_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let frames = (mib << 20) / FRAME;
    let src: Vec<u8> = (0..frames * FRAME).map(|i| ((i * 31) >> 3) as u8).collect();
    // Touched before timing (a fresh zeroed vec faults its pages in on first write).
    let mut dst = vec![1u8; frames * FRAME];
    let variants: [Variant; 5] = [
        ("crc", crc),
        ("copy", copy),
        ("crc_then_copy", crc_then_copy),
        ("chunked_1k", chunked),
        ("copy_then_crc", copy_then_crc),
    ];
    // The variants agree on the CRC.
    let one = &src[..FRAME];
    let mut d = vec![0u8; FRAME];
    for v in [crc_then_copy, chunked, copy_then_crc] {
        assert_eq!(v(one, &mut d), crc(one, &mut d));
    }
    for cold in [true, false] {
        let mut at = 0usize;
        let mut ns: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for _ in 0..ROUNDS {
            for (i, (_, f)) in variants.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..BATCH {
                    let k = if cold { at } else { 0 };
                    at = (at + 1) % frames;
                    let r = k * FRAME..(k + 1) * FRAME;
                    black_box(f(black_box(&src[r.clone()]), &mut dst[r]));
                }
                ns[i].push(t.elapsed().as_nanos() as f64 / BATCH as f64);
            }
        }
        for v in ns.iter_mut() {
            v.sort_by(|x, y| x.total_cmp(y));
        }
        let med = |v: &[f64]| v[v.len() / 2];
        let base = med(&ns[0]);
        let what = if cold { "cold" } else { "warm" };
        for (i, (name, _)) in variants.iter().enumerate() {
            println!(
                "{what} {FRAME} B  {name:14} median {:7.1} ns  min {:7.1} ns  {:.2}x crc",
                med(&ns[i]),
                ns[i][0],
                med(&ns[i]) / base
            );
        }
    }
}
