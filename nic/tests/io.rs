//! Frames built into mbufs (copied and zero-copy payloads) cross a ring pair
//! and parse back with a valid ICRC and the exact payload.

use std::sync::Arc;

use dpdk::{Burst, Eal, ExtBuf, Mempool, Port};
use nic::io::{build_frame, contiguous, parse_rx, Payload, TxPools, MAX_FRAME};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::RethRepr;
use rdma::wire::{BthRepr, Ecn, Opcode, ParseOptions};

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

#[test]
fn built_frames_cross_a_ring_pair_with_valid_icrc() {
    let eal = Eal::for_tests();
    let mut pools = TxPools::new(
        Mempool::new(eal, "io_hdr", 1024, 32, Mempool::DEFAULT_DATA_ROOM).unwrap(),
        Mempool::new(eal, "io_bare", 1024, 32, 0).unwrap(),
        nic::io::COPY_THRESHOLD,
    )
    .unwrap();
    let rxpool: Arc<Mempool> =
        Mempool::new(eal, "io_rx", 1024, 32, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let start = (
        pools.hdr.handed_out(),
        pools.bare.handed_out(),
        rxpool.in_use(),
    );
    let mem_bytes: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 7) as u8).collect();
    {
        let mem = ExtBuf::new(mem_bytes.clone().into_boxed_slice());
        let (mut a, mut b) = Port::ring_pair(eal, "io", 1024).unwrap();
        let (_arx, mut atx) = a.configure_single(&rxpool).unwrap();
        let (mut brx, _btx) = b.configure_single(&rxpool).unwrap();
        let fb = builder();
        // (payload length, zero-copy?) covering every pad value, the copy
        // threshold, a multi-segment 4 KiB frame, and no payload.
        let cases: Vec<(usize, bool)> = vec![
            (0, false),
            (1, false),
            (2, true),
            (3, false),
            (255, true),
            (257, true),
            (1024, true),
            (4096, true),
            (4095, false),
        ];
        let mut out: Burst = Burst::new();
        for (i, &(len, ext)) in cases.iter().enumerate() {
            let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x11, i as u32));
            pkt.reth = Some(RethRepr {
                va: 0x1000,
                rkey: 0xabc,
                dma_len: len as u32,
            });
            let off = i * 100;
            let payload = if ext {
                Payload::Ext {
                    mem: &mem,
                    offset: off,
                    len,
                }
            } else {
                Payload::Copy(&mem_bytes[off..off + len])
            };
            out.push(build_frame(&fb, &pkt, Ecn::Ect0, payload, &mut pools).unwrap())
                .unwrap();
        }
        assert!(
            build_frame(
                &fb,
                &RoceRepr::new(BthRepr::new(Opcode::SendOnly, 1, 0)),
                Ecn::Ect0,
                Payload::Ext {
                    mem: &mem,
                    offset: 65000,
                    len: 1000
                },
                &mut pools
            )
            .is_err(),
            "a window outside registered memory is refused"
        );
        assert_eq!(atx.send(&mut out), cases.len());
        let mut inb: Burst = Burst::new();
        assert_eq!(brx.recv(&mut inb), cases.len());
        let mut scratch = vec![0u8; MAX_FRAME];
        for (i, m) in inb.drain().enumerate() {
            let (len, ext) = cases[i];
            if ext && len > nic::io::COPY_THRESHOLD {
                assert!(m.nb_segs() >= 2, "long payloads go zero-copy");
            }
            let bytes = contiguous(&m, &mut scratch).unwrap().to_vec();
            let f = parse_rx(&bytes, &ParseOptions::default(), |_| false)
                .expect("valid frame and ICRC");
            assert_eq!(f.bth.psn, i as u32);
            assert_eq!(f.payload, &mem_bytes[i * 100..i * 100 + len]);
            // Flip one payload bit: the ICRC must catch it.
            if len > 0 {
                let mut bad = bytes.clone();
                bad[f.payload_offset] ^= 1;
                assert!(parse_rx(&bad, &ParseOptions::default(), |_| false).is_err());
            }
        }
        assert_eq!(mem.refs(), 1, "attached segments released");
    }
    assert_eq!(
        (
            pools.hdr.handed_out(),
            pools.bare.handed_out(),
            rxpool.in_use()
        ),
        start,
        "mbuf leak"
    );
}

/// The header-template path (`build_frame_tpl`, `fill_frame_tpl` into bulk
/// allocated mbufs) puts the same bytes on the wire as `build_frame`, for
/// copied, zero-copy and chained payloads, with and without INT, and for a
/// packet to another QP (which the template hands to the general path).
#[test]
fn template_frames_equal_build_frame() {
    use nic::io::{build_frame_tpl, fill_frame_tpl};
    use rdma::wire::frame::IntInsert;
    use rdma::wire::HeaderTemplate;

    let eal = Eal::for_tests();
    let mut pools = TxPools::new(
        Mempool::new(eal, "tpl_hdr", 1024, 32, Mempool::DEFAULT_DATA_ROOM).unwrap(),
        Mempool::new(eal, "tpl_bare", 1024, 32, 0).unwrap(),
        nic::io::COPY_THRESHOLD,
    )
    .unwrap();
    let start = (pools.hdr.handed_out(), pools.bare.handed_out());
    let mem_bytes: Vec<u8> = (0..65536u32).map(|i| (i * 29 + 3) as u8).collect();
    {
        let mem = ExtBuf::new(mem_bytes.clone().into_boxed_slice());
        for int in [false, true] {
            let mut fb = builder();
            fb.int = int.then_some(IntInsert {
                int_dscp: 0x18,
                max_hops: 4,
            });
            let tpl = HeaderTemplate::new(fb, 0x11, rdma::wire::bth::DEFAULT_PKEY).unwrap();
            let cases = [
                (0usize, false),
                (1, false),
                (2, true),
                (3, false),
                (255, true),
                (257, true),
                (1024, true),
                (4095, false),
                (4096, true),
            ];
            let mut bulk: Burst = Burst::new();
            pools.hdr.pool().alloc_bulk(&mut bulk).unwrap();
            for (i, &(len, ext)) in cases.iter().enumerate() {
                for qp in [0x11, 0x12] {
                    let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qp, i as u32 * 7));
                    pkt.reth = Some(RethRepr {
                        va: 0x1000 + i as u64,
                        rkey: 0xabc,
                        dma_len: len as u32,
                    });
                    let off = i * 100;
                    let payload = if ext {
                        Payload::Ext {
                            mem: &mem,
                            offset: off,
                            len,
                        }
                    } else {
                        Payload::Copy(&mem_bytes[off..off + len])
                    };
                    let want = build_frame(&fb, &pkt, Ecn::Ect0, payload, &mut pools)
                        .unwrap()
                        .to_vec();
                    let got = build_frame_tpl(&tpl, &pkt, Ecn::Ect0, payload, &mut pools).unwrap();
                    assert_eq!(got.to_vec(), want, "len {len} ext {ext} int {int}");
                    let m = &mut bulk.as_mut_slice()[i];
                    if qp == 0x11 {
                        fill_frame_tpl(m, &tpl, &pkt, Ecn::Ect0, payload, &mut pools).unwrap();
                        assert_eq!(m.to_vec(), want);
                        let opts = ParseOptions::default();
                        let mut scratch = vec![0u8; MAX_FRAME];
                        let bytes = contiguous(m, &mut scratch).unwrap();
                        let f = parse_rx(bytes, &opts, |_| false).expect("valid ICRC");
                        assert_eq!(f.payload, &mem_bytes[off..off + len]);
                    }
                }
            }
            assert!(build_frame_tpl(
                &tpl,
                &RoceRepr::new(BthRepr::new(Opcode::SendOnly, 0x11, 0)),
                Ecn::Ect0,
                Payload::Ext {
                    mem: &mem,
                    offset: 65000,
                    len: 1000
                },
                &mut pools
            )
            .is_err());
        }
        assert_eq!(mem.refs(), 1, "attached segments released");
    }
    assert_eq!(
        (pools.hdr.handed_out(), pools.bare.handed_out()),
        start,
        "mbuf leak"
    );
}
