//! docs/design.md §3 / the hot-path rule: once QPs are connected and warmed up,
//! moving data allocates nothing, in any thread (the engines' poll loops,
//! this thread posting work requests and polling completions). A counting
//! global allocator watches a window of WRITEs, READs and SENDs between two
//! engines on a ring pair. It counts every thread, so the test stays short:
//! libtest's own thread allocates only for its 60 s "still running" notice.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cc::CcKind;
use dpdk::{Eal, Port};
use nic::verbs::{CompletionQueue, Device, DeviceConfig, QpOptions, QueuePair};
use rdma::transport::{Access, RecvWr, SendOp, SendWr, Sge, WcStatus};

struct Counting;
static ON: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if ON.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Runs `n` operations of each kind, 16 in flight; panics on a failed one.
fn traffic(
    qa: &mut QueuePair,
    qb: &mut QueuePair,
    cqa: &mut CompletionQueue,
    cqb: &mut CompletionQueue,
    src: (u64, u32),
    dst: (u64, u32, u32),
    n: u64,
) {
    let (sva, slkey) = src;
    let (dva, drkey, dlkey) = dst;
    for (k, op) in [
        SendOp::Write {
            remote_va: dva,
            rkey: drkey,
        },
        SendOp::Read {
            remote_va: dva,
            rkey: drkey,
        },
        SendOp::Send,
    ]
    .into_iter()
    .enumerate()
    {
        let (mut posted, mut done, mut received) = (0u64, 0u64, 0u64);
        while done < n {
            while let Some(wc) = cqb.poll_one() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                received += 1;
            }
            while posted < n && posted - done < 16 {
                if k == 2 {
                    qb.post_recv(RecvWr {
                        wr_id: posted,
                        sge: Sge {
                            addr: dva + 8192,
                            len: 4096,
                            lkey: dlkey,
                        },
                    })
                    .unwrap();
                }
                qa.post_send(SendWr {
                    wr_id: posted,
                    op,
                    sge: Sge {
                        addr: sva,
                        len: 4096,
                        lkey: slkey,
                    },
                    signaled: true,
                    solicited: false,
                })
                .unwrap();
                posted += 1;
            }
            let wc = cqa.wait(Duration::from_secs(10)).expect("completion");
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            done += 1;
        }
        if k == 2 {
            while received < n {
                let wc = cqb.wait(Duration::from_secs(10)).expect("receive");
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                received += 1;
            }
        }
    }
}

#[test]
fn moving_data_allocates_nothing() {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, "noalloc", 1024).unwrap();
    let a = Device::open(eal, pa, DeviceConfig::new([10, 0, 0, 1])).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    for cc in [CcKind::Dcqcn, CcKind::Hpcc, CcKind::Ldcp] {
        let (mut cqa, mut cqb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
        let opts = QpOptions {
            cc,
            ..QpOptions::default()
        };
        let mut qa = a.create_qp(&cqa, &cqa, opts).unwrap();
        let mut qb = b.create_qp(&cqb, &cqb, opts).unwrap();
        qa.connect(&qb.remote_info()).unwrap();
        qb.connect(&qa.remote_info()).unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let src = a.reg_mr(16384, all).unwrap();
        let dst = b.reg_mr(16384, all).unwrap();
        let s = (src.va(), src.lkey());
        let d = (dst.va(), dst.rkey(), dst.lkey());
        // Warm-up: queues and rings reach their working size.
        traffic(&mut qa, &mut qb, &mut cqa, &mut cqb, s, d, 500);
        ALLOCS.store(0, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
        traffic(&mut qa, &mut qb, &mut cqa, &mut cqb, s, d, 1000);
        ON.store(false, Ordering::Relaxed);
        assert_eq!(
            ALLOCS.load(Ordering::Relaxed),
            0,
            "{cc:?}: allocations while moving data"
        );
    }
    a.close();
    b.close();

    // Sharded devices (nic::shard), behind dispatchers (one queue pair)
    // and on a queue pair per shard: the steering and the rings between
    // shards allocate nothing either; QPs on both shards.
    for queues in [1u16, 2] {
        let name = format!("noalloc_sh{queues}");
        let (pa, pb) = Port::ring_pair_queues(eal, &name, 1024, queues).unwrap();
        let cfg = |ip| {
            let mut c = DeviceConfig::new([10, 0, 0, ip]);
            c.pool_size = 4095;
            c.idle_yield = true;
            c
        };
        let a = Device::open_sharded(eal, pa, cfg(1), &[None, None]).unwrap();
        let b = Device::open_sharded(eal, pb, cfg(2), &[None, None]).unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let src = a.reg_mr(16384, all).unwrap();
        let dst = b.reg_mr(16384, all).unwrap();
        let s = (src.va(), src.lkey());
        let d = (dst.va(), dst.rkey(), dst.lkey());
        let mut pairs = Vec::new();
        for _ in 0..2 {
            let (cqa, cqb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
            let opts = QpOptions {
                cc: CcKind::Hpcc,
                ..QpOptions::default()
            };
            let mut qa = a.create_qp(&cqa, &cqa, opts).unwrap();
            let mut qb = b.create_qp(&cqb, &cqb, opts).unwrap();
            qa.connect(&qb.remote_info()).unwrap();
            qb.connect(&qa.remote_info()).unwrap();
            pairs.push((qa, qb, cqa, cqb));
        }
        assert_ne!(
            pairs[0].0.qpn() >> 14,
            pairs[1].0.qpn() >> 14,
            "one QP per shard"
        );
        for (qa, qb, cqa, cqb) in pairs.iter_mut() {
            traffic(qa, qb, cqa, cqb, s, d, 500);
        }
        ALLOCS.store(0, Ordering::Relaxed);
        ON.store(true, Ordering::Relaxed);
        for (qa, qb, cqa, cqb) in pairs.iter_mut() {
            traffic(qa, qb, cqa, cqb, s, d, 1000);
        }
        ON.store(false, Ordering::Relaxed);
        assert_eq!(
            ALLOCS.load(Ordering::Relaxed),
            0,
            "sharded ({queues} queue pairs): allocations while moving data"
        );
        assert_eq!(a.has_dispatcher(), queues == 1);
        drop(pairs);
        a.close();
        b.close();
    }
}
