//! The safe layer on real PMDs: net_ring pairs, net_null, net_tap.
//!
//! Every test builds its own mempool and checks, after its ports are gone,
//! that the pool's in-use count is back where it started (no mbuf leak).

#![deny(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{lcore, Burst, Eal, Error, ExtBuf, Mempool, Port, PortConfig, Ring, TscClock};

fn pool(name: &str, n: u32) -> Arc<Mempool> {
    Mempool::new(Eal::for_tests(), name, n, 64, Mempool::DEFAULT_DATA_ROOM).expect("mempool")
}

/// A frame whose payload encodes `seq`, so the receiver can check contents
/// and order: broadcast, ethertype 0x88B5 (local experimental), then
/// `seq` as 8 bytes and a pattern derived from it.
fn frame(seq: u64, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..22].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[22..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    f
}

/// Without hugepages and with IOVA as VA (how the tests run), the pool packs
/// mbufs back to back instead of one per 4 KiB page, so that a burst's mbufs
/// do not all sit at one page offset (one L1 cache set); they are the usual
/// mbufs (headroom, data room) and go back to the pool.
#[test]
fn pool_packs_mbufs_and_they_behave_as_usual() {
    let pool = pool("t_packed", 512);
    assert!(pool.is_packed(), "the tests' EAL runs IOVA as VA");
    let start = pool.in_use();
    {
        let ms: Vec<_> = (0..64).map(|_| pool.alloc().unwrap()).collect();
        let offsets: std::collections::HashSet<usize> =
            ms.iter().map(|m| m.as_ptr() as usize % 4096).collect();
        assert!(
            offsets.len() > 16,
            "mbufs at {} page offsets only",
            offsets.len()
        );
        for m in &ms {
            assert_eq!(m.headroom(), 128);
            assert_eq!(m.tailroom(), 2048);
        }
        let mut b: Burst = Burst::new();
        assert_eq!(pool.alloc_bulk(&mut b).unwrap(), 32);
        for m in b.as_mut_slice() {
            m.extend_from_slice(&frame(7, 1500)).unwrap();
            assert_eq!(m.to_vec(), frame(7, 1500));
        }
    }
    assert_eq!(pool.in_use(), start);
}

/// `Burst::move_front_into` is a FIFO: the oldest mbufs move, in order,
/// as many as the target has room for; the rest move up; none is lost or
/// freed twice (the pool's count comes back).
#[test]
fn a_burst_moves_its_front_into_another_in_order() {
    let pool = pool("t_movefront", 1024);
    let start = pool.in_use();
    {
        let mut q: Burst<64> = Burst::new();
        for i in 0..40u8 {
            let mut m = pool.alloc().unwrap();
            m.extend_from_slice(&[i]).unwrap();
            q.push(m).unwrap();
        }
        let mut b: Burst = Burst::new();
        let mut first = pool.alloc().unwrap();
        first.extend_from_slice(&[200]).unwrap();
        b.push(first).unwrap();
        assert_eq!(q.move_front_into(&mut b), 31, "the room left in b");
        let tags = |s: &[dpdk::Mbuf]| s.iter().map(|m| m.data()[0]).collect::<Vec<_>>();
        let want: Vec<u8> = std::iter::once(200).chain(0..31).collect();
        assert_eq!(tags(b.as_slice()), want);
        assert_eq!(tags(q.as_slice()), (31..40).collect::<Vec<_>>());
        assert_eq!(q.move_front_into(&mut b), 0, "b is full");
        b.clear();
        assert_eq!(q.move_front_into(&mut b), 9);
        assert!(q.is_empty());
        assert_eq!(tags(b.as_slice()), (31..40).collect::<Vec<_>>());
    }
    assert_eq!(pool.in_use(), start);
}

#[test]
fn ring_pair_moves_100k_packets_intact_and_in_order() {
    let eal = Eal::for_tests();
    let pool = pool("t_ring100k", 4096);
    let start = pool.in_use();
    {
        let (mut a, mut b) = Port::ring_pair(eal, "t100k", 1024).unwrap();
        assert!(!a.dma_from_mbufs_only() && !b.dma_from_mbufs_only());
        let (_arx, mut atx) = a.configure_single(&pool).unwrap();
        let (mut brx, _btx) = b.configure_single(&pool).unwrap();
        const TOTAL: u64 = 100_000;
        let (mut sent, mut received) = (0u64, 0u64);
        let mut out: Burst = Burst::new();
        let mut inb: Burst = Burst::new();
        let mut buf = vec![0u8; 1514];
        while received < TOTAL {
            while sent < TOTAL && !out.is_full() {
                let len = 60 + (sent as usize * 7) % 1400;
                let mut m = pool.alloc().unwrap();
                m.extend_from_slice(&frame(sent, len)).unwrap();
                out.push(m).unwrap();
                sent += 1;
            }
            atx.send(&mut out);
            brx.recv(&mut inb);
            for m in inb.drain() {
                let len = 60 + (received as usize * 7) % 1400;
                assert_eq!(m.pkt_len(), len, "packet {received} length");
                m.read(0, &mut buf[..len]).unwrap();
                assert_eq!(
                    &buf[..len],
                    &frame(received, len)[..],
                    "packet {received} contents"
                );
                received += 1;
            }
        }
        assert_eq!(received, TOTAL);
        let sa = a.stats().unwrap();
        let sb = b.stats().unwrap();
        assert_eq!(sa.tx_packets, TOTAL);
        assert_eq!(sb.rx_packets, TOTAL);
    }
    assert_eq!(pool.in_use(), start, "mbuf leak");
}

#[test]
fn null_pmd_bursts_are_full_and_tx_frees() {
    let eal = Eal::for_tests();
    let pool = pool("t_null", 2048);
    let start = pool.in_use();
    {
        let mut p = Port::open(eal, "net_null_t0,size=128").unwrap();
        let (mut rx, mut tx) = p.configure(&PortConfig::default(), &pool).unwrap();
        let mut b: Burst = Burst::new();
        for _ in 0..100 {
            assert_eq!(rx[0].recv(&mut b), 32, "net_null fills every burst");
            assert!(b.as_slice().iter().all(|m| m.pkt_len() == 128));
            assert_eq!(tx[0].send(&mut b), 32);
            assert!(b.is_empty());
        }
        let s = p.stats().unwrap();
        assert_eq!(s.rx_packets, 3200);
        assert_eq!(s.tx_packets, 3200);
        p.mac().expect("net_null has a MAC address");
        assert!(
            !p.dma_from_mbufs_only(),
            "a virtual device copies with the CPU: registered memory may be attached"
        );
        assert!(p.link().unwrap().up, "a started net_null port is up");
    }
    assert_eq!(pool.in_use(), start, "mbuf leak");
}

#[test]
fn unknown_port_and_bad_devargs_are_clear_errors() {
    let eal = Eal::for_tests();
    match Port::open(eal, "0000:ff:1f.7") {
        Err(Error::NoSuchPort(msg)) => assert!(msg.contains("0000:ff:1f.7"), "{msg}"),
        other => panic!("expected NoSuchPort, got {other:?}"),
    }
    match Port::open(eal, "net_null_bad0,nonsense_key=1") {
        Err(Error::Dpdk { op, text, .. }) => {
            assert_eq!(op, "rte_vdev_init");
            assert!(!text.is_empty());
        }
        other => panic!("expected a DPDK error, got {other:?}"),
    }
    assert!(matches!(
        Port::open(eal, ""),
        Err(Error::InvalidArgument(..))
    ));
    // A second EAL init with other arguments is refused, not silently ignored.
    assert!(matches!(
        Eal::init(&["x", "--no-huge"]),
        Err(Error::EalAlreadyInitialised(_))
    ));
}

#[test]
fn mbuf_operations_are_bounds_checked() {
    let _eal = Eal::for_tests();
    let pool = pool("t_mbuf", 256);
    let start = pool.in_use();
    {
        let mut m = pool.alloc().unwrap();
        assert_eq!(m.pkt_len(), 0);
        assert!(m.data().is_empty());
        let mut one = [0u8; 1];
        assert!(
            m.read(0, &mut one).is_err(),
            "reading an empty packet fails cleanly"
        );
        assert!(m.adj(1).is_err());
        assert!(m.trim(1).is_err());
        let room = m.tailroom();
        assert!(matches!(
            m.append(room + 1),
            Err(Error::MbufRoom { op: "append", .. })
        ));
        m.extend_from_slice(b"hello world").unwrap();
        let head = m.headroom();
        assert!(m.prepend(head + 1).is_err());
        m.prepend(4).unwrap().copy_from_slice(b"abcd");
        assert_eq!(m.data(), b"abcdhello world");
        m.adj(4).unwrap();
        m.trim(6).unwrap();
        assert_eq!(m.data(), b"hello");
        assert!(m.read(3, &mut [0u8; 3]).is_err(), "read past the end");
        assert!(
            m.read(usize::MAX, &mut [0u8; 2]).is_err(),
            "offset overflow"
        );

        let mut tail = pool.alloc().unwrap();
        tail.extend_from_slice(b", chained").unwrap();
        m.chain(tail).unwrap();
        assert_eq!(m.nb_segs(), 2);
        assert_eq!(m.to_vec(), b"hello, chained");
        // The RX path's staged prefetches walk the chain only as far as it
        // goes (depth 2 and 3 are past this one's end) and change nothing.
        for depth in 0..4 {
            m.prefetch_segment_meta(depth);
            m.prefetch_segment_data(depth);
        }
        assert_eq!(m.to_vec(), b"hello, chained");
        let mut mid = [0u8; 6];
        m.read(3, &mut mid).unwrap();
        assert_eq!(&mid, b"lo, ch");
        assert_eq!(pool.in_use(), start + 2);
    }
    assert_eq!(pool.in_use(), start, "mbuf leak");
}

#[test]
fn external_buffer_is_sent_without_copy_and_freed_after_last_mbuf() {
    let eal = Eal::for_tests();
    let pool = pool("t_ext", 1024);
    let bare = Mempool::new(eal, "t_ext_bare", 256, 0, 0).unwrap();
    let start = (pool.in_use(), bare.in_use());
    {
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        let ext = ExtBuf::new(data.clone().into_boxed_slice());
        let (mut a, mut b) = Port::ring_pair(eal, "text", 256).unwrap();
        let (_arx, mut atx) = a.configure_single(&pool).unwrap();
        let (mut brx, _btx) = b.configure_single(&pool).unwrap();
        let mut out: Burst = Burst::new();
        for i in 0..4 {
            let mut hdr = pool.alloc().unwrap();
            hdr.extend_from_slice(&frame(i, 22)).unwrap();
            let mut payload = bare.alloc().unwrap();
            ext.attach(&mut payload, i as usize * 2048, 2048).unwrap();
            assert!(payload.has_extbuf());
            hdr.chain(payload).map_err(|(e, _)| e).unwrap();
            out.push(hdr).unwrap();
        }
        assert_eq!(ext.refs(), 5, "handle + 4 attached mbufs");
        assert!(ExtBuf::new(vec![0u8; 16].into_boxed_slice())
            .attach(&mut bare.alloc().unwrap(), 8, 9)
            .is_err());
        assert_eq!(atx.send(&mut out), 4);
        let mut inb: Burst = Burst::new();
        assert_eq!(brx.recv(&mut inb), 4);
        for (i, m) in inb.drain().enumerate() {
            let v = m.to_vec();
            assert_eq!(v.len(), 22 + 2048);
            assert_eq!(&v[22..], &data[i * 2048..(i + 1) * 2048]);
        }
        assert_eq!(ext.refs(), 1, "mbufs freed, references returned");
    }
    assert_eq!((pool.in_use(), bare.in_use()), start, "mbuf leak");
}

#[test]
fn spsc_ring_between_pinned_lcores() {
    let eal = Eal::for_tests();
    let pool = pool("t_spsc", 2048);
    let start = pool.in_use();
    let (mut prod, mut cons) = Ring::spsc(eal, "t_spsc_r", 512).unwrap();
    let cores = lcore::available_cores();
    const N: u64 = 20_000;
    let p2 = pool.clone();
    let producer = lcore::spawn_pinned(eal, "t-prod", cores.first().copied(), move || {
        assert!(lcore::lcore_id().is_some(), "registered as an lcore");
        let mut b: Burst = Burst::new();
        let mut seq = 0u64;
        while seq < N || !b.is_empty() {
            while seq < N && !b.is_full() {
                let mut m = p2.alloc().unwrap();
                m.extend_from_slice(&seq.to_be_bytes()).unwrap();
                b.push(m).unwrap();
                seq += 1;
            }
            prod.enqueue(&mut b);
        }
    })
    .unwrap();
    let consumer = lcore::spawn_pinned(eal, "t-cons", cores.last().copied(), move || {
        let mut b: Burst = Burst::new();
        let mut next = 0u64;
        let deadline = Instant::now() + Duration::from_secs(30);
        while next < N && Instant::now() < deadline {
            cons.dequeue(&mut b);
            for m in b.drain() {
                assert_eq!(m.data(), next.to_be_bytes());
                next += 1;
            }
        }
        next
    })
    .unwrap();
    producer.join().unwrap();
    assert_eq!(consumer.join().unwrap(), N);
    assert_eq!(pool.in_use(), start, "mbuf leak");
}

#[test]
fn mpmc_ring_frees_what_is_left_on_drop() {
    let eal = Eal::for_tests();
    let pool = pool("t_mpmc", 256);
    let start = pool.in_use();
    {
        let ring = Ring::new(eal, "t_mpmc_r", 64).unwrap();
        let mut b: Burst = Burst::new();
        pool.alloc_bulk(&mut b).unwrap();
        assert_eq!(b.len(), 32);
        assert_eq!(ring.enqueue(&mut b), 32);
        assert_eq!(ring.len(), 32);
        pool.alloc_bulk(&mut b).unwrap();
        assert_eq!(ring.enqueue(&mut b), 31, "a 64-slot ring holds 63");
        assert_eq!(b.len(), 1, "what did not fit stays in the burst");
    }
    assert_eq!(pool.in_use(), start, "ring drop frees its mbufs");
}

#[test]
fn tsc_clock_counts_nanoseconds() {
    let eal = Eal::for_tests();
    let clock = TscClock::new(eal);
    assert!(
        clock.hz() > 100_000_000,
        "TSC below 100 MHz: {}",
        clock.hz()
    );
    let t0 = clock.now_ns();
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let dt = clock.now_ns() - t0;
    let wall = w0.elapsed().as_nanos() as f64;
    let ratio = dt as f64 / wall;
    assert!((0.8..1.25).contains(&ratio), "TSC ns / wall ns = {ratio}");
    assert_eq!(
        TscClock::with_hz(2_000_000_000).cycles_to_ns(2_000_000_000),
        1_000_000_000
    );
}

/// Raw AF_PACKET socket bound to one interface, for the Linux side of the
/// tap test.
struct PacketSocket {
    fd: i32,
    ifindex: i32,
}

const ETHERTYPE: u16 = 0x88b5;

impl PacketSocket {
    fn open(iface: &str) -> PacketSocket {
        let name = std::ffi::CString::new(iface).unwrap();
        // SAFETY: C calls with a NUL-terminated name and pointers to live
        // locals sized by `size_of_val`; `sockaddr_ll` is plain C data.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            assert!(ifindex > 0, "interface {iface} not found");
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, (ETHERTYPE.to_be()) as i32);
            assert!(
                fd >= 0,
                "AF_PACKET socket: {}",
                std::io::Error::last_os_error()
            );
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = ETHERTYPE.to_be();
            sll.sll_ifindex = ifindex;
            let rc = libc::bind(
                fd,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of_val(&sll) as u32,
            );
            assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 200_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of_val(&tv) as u32,
            );
            PacketSocket { fd, ifindex }
        }
    }

    fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: receives at most `buf.len()` bytes into `buf`.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        (n > 0).then(|| {
            buf.truncate(n as usize);
            buf
        })
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sends `frame` (live, its length) to a zeroed-then-filled
        // `sockaddr_ll` local sized by `size_of_val`.
        unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = self.ifindex;
            sll.sll_halen = 6;
            sll.sll_addr[..6].copy_from_slice(&frame[..6]);
            let n = libc::sendto(
                self.fd,
                frame.as_ptr().cast(),
                frame.len(),
                0,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of_val(&sll) as u32,
            );
            assert_eq!(
                n as usize,
                frame.len(),
                "sendto: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        // SAFETY: closes the descriptor this socket owns, once.
        unsafe { libc::close(self.fd) };
    }
}

#[test]
fn tap_port_exchanges_frames_with_linux() {
    Eal::require_root("a TAP port");
    let eal = Eal::for_tests();
    let pool = pool("t_tap", 2048);
    let start = pool.in_use();
    let iface = "rsnic-tap0";
    {
        let mut port = Port::open(eal, &format!("net_tap_t0,iface={iface}")).unwrap();
        let (mut rx, mut tx) = port.configure(&PortConfig::default(), &pool).unwrap();
        let st = std::process::Command::new("ip")
            .args(["link", "set", "dev", iface, "up"])
            .status()
            .expect("ip");
        assert!(st.success());
        let sock = PacketSocket::open(iface);

        // DPDK -> Linux.
        let out_frame = frame(0xD9D9, 200);
        let mut got = None;
        for _ in 0..20 {
            let mut b: Burst = Burst::new();
            let mut m = pool.alloc().unwrap();
            m.extend_from_slice(&out_frame).unwrap();
            b.push(m).unwrap();
            assert_eq!(tx[0].send(&mut b), 1);
            if let Some(f) = sock.recv() {
                got = Some(f);
                break;
            }
        }
        assert_eq!(
            got.as_deref(),
            Some(&out_frame[..]),
            "Linux received what DPDK sent"
        );

        // Linux -> DPDK.
        let in_frame = frame(0x11AA, 300);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = false;
        let mut b: Burst = Burst::new();
        'outer: while Instant::now() < deadline {
            sock.send(&in_frame);
            for _ in 0..1000 {
                rx[0].recv(&mut b);
                for m in b.drain() {
                    if m.to_vec() == in_frame {
                        seen = true;
                        break 'outer;
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        assert!(seen, "DPDK received what Linux sent");
    }
    assert_eq!(pool.in_use(), start, "mbuf leak");
}

/// Dropping a ring pair releases both port ids (DPDK 22.11 has 32), so a
/// process can make and drop far more pairs than that over its life.
#[test]
fn dropped_ring_pairs_release_their_port_ids() {
    let eal = Eal::for_tests();
    let pool = pool("t_reuse", 256);
    for i in 0..40 {
        let (mut a, mut b) = Port::ring_pair(eal, "treuse", 64)
            .unwrap_or_else(|e| panic!("ring pair {i} (port ids leaked?): {e}"));
        assert_eq!(a.name(), "net_ring_treuse_a");
        let (_arx, mut atx) = a.configure_single(&pool).unwrap();
        let (mut brx, _btx) = b.configure_single(&pool).unwrap();
        let mut out: Burst = Burst::new();
        let mut m = pool.alloc().unwrap();
        m.extend_from_slice(&frame(i, 60)).unwrap();
        out.push(m).unwrap();
        assert_eq!(atx.send(&mut out), 1);
        let mut inb: Burst = Burst::new();
        assert_eq!(brx.recv(&mut inb), 1);
    }
}

/// Two threads attach mbufs to one external buffer and free them, over and
/// over (two NIC shards sending from one registered region): no reference is
/// lost. DPDK updates the count non-atomically when it reads 1, so two
/// attaches racing at "handle only" would both write 2 and the block would
/// be freed under the handle; `ExtBuf` keeps its own count off 1.
#[test]
fn external_buffer_counts_attaches_from_two_threads() {
    let eal = Eal::for_tests();
    let bare = Mempool::new(eal, "ext_race", 1023, 0, 0).unwrap();
    let ext = Arc::new(ExtBuf::new(vec![7u8; 4096].into_boxed_slice()));
    let rounds = if cfg!(debug_assertions) {
        20_000
    } else {
        300_000
    };
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let (ext, bare) = (ext.clone(), bare.clone());
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let mut m = bare.alloc().unwrap();
                    ext.attach(&mut m, t * 64, 64).unwrap();
                    assert_eq!(m.data()[0], 7);
                    drop(m);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(ext.refs(), 1, "only the handle's reference is left");
}

/// A view (`ExtBuf::view`) attaches to the same bytes with a count of its
/// own, and keeps the parent alive until the view and every mbuf attached
/// through it are gone, even after both handles were dropped.
#[test]
fn a_view_counts_its_own_attaches_and_keeps_the_parent_alive() {
    let eal = Eal::for_tests();
    let bare = Mempool::new(eal, "ext_view", 63, 0, 0).unwrap();
    let parent = Arc::new(ExtBuf::new((0..4096).map(|i| i as u8).collect()));
    let view = parent.view();
    assert_eq!(Arc::strong_count(&parent), 2, "the view holds the parent");
    let mut m = bare.alloc().unwrap();
    view.attach(&mut m, 100, 8).unwrap();
    assert_eq!(
        m.data(),
        &(100..108).map(|i| i as u8).collect::<Vec<_>>()[..]
    );
    assert_eq!(
        (view.refs(), parent.refs()),
        (2, 1),
        "counted by the view only"
    );
    let weak = Arc::downgrade(&parent);
    drop((view, parent));
    // The mbuf still reads the bytes: the view's block, and through it the
    // parent, live until it is freed.
    assert!(
        weak.upgrade().is_some(),
        "parent freed under an attached mbuf"
    );
    assert_eq!(m.data()[0], 100);
    drop(m);
    assert!(
        weak.upgrade().is_none(),
        "parent not freed after the last mbuf"
    );
}

/// Attaches take references from the shared count in batches (so that the
/// attaching core writes its cache line once per batch): the count still
/// reads exactly one per attached mbuf, however many batches were taken, and
/// dropping the handle gives back the references taken ahead, so the block
/// goes with its last mbuf, not later and not earlier.
#[test]
fn references_taken_ahead_of_attaches_are_exact_and_given_back() {
    let eal = Eal::for_tests();
    let bare = Mempool::new(eal, "ext_ahead", 511, 0, 0).unwrap();
    let parent = Arc::new(ExtBuf::new(vec![9u8; 4096].into_boxed_slice()));
    let view = parent.view();
    let mut attached = Vec::new();
    for k in 0..300 {
        let mut m = bare.alloc().unwrap();
        view.attach(&mut m, k % 4000, 8).unwrap();
        attached.push(m);
        assert_eq!(view.refs() as usize, 2 + k, "handle + {} mbufs", k + 1);
    }
    // Free some, attach again: the count follows.
    attached.truncate(100);
    assert_eq!(view.refs(), 101);
    for _ in 0..10 {
        let mut m = bare.alloc().unwrap();
        view.attach(&mut m, 0, 8).unwrap();
        attached.push(m);
    }
    assert_eq!(view.refs(), 111);
    let weak = Arc::downgrade(&parent);
    drop((view, parent));
    let last = attached.pop().unwrap();
    drop(attached);
    assert!(weak.upgrade().is_some(), "freed under an attached mbuf");
    assert_eq!(last.data()[0], 9);
    drop(last);
    assert!(weak.upgrade().is_none(), "not freed after the last mbuf");
}

/// An [`dpdk::MbufStash`] hands out mbufs as `Mempool::alloc` does (reset,
/// default headroom, full tailroom) however they were used before, keeps at
/// most `PREFETCH_AHEAD + STASH_REFILL` out of the pool, and gives everything
/// back when dropped.
#[test]
fn a_stash_hands_out_reset_mbufs_and_returns_the_rest_on_drop() {
    use dpdk::{MbufStash, PREFETCH_AHEAD, STASH_REFILL};
    let pool = pool("t_stash", 1024);
    let start = pool.in_use();
    {
        let mut stash = MbufStash::new(pool.clone()).unwrap();
        assert!(stash.is_empty(), "filled on the first allocation");
        assert_eq!(pool.in_use(), start);
        let mut held = Vec::new();
        // Through several refills and wraps of the FIFO; every other mbuf is
        // written and dropped at once, so that it comes back dirty.
        for i in 0..500 {
            let mut m = stash.alloc().unwrap();
            assert_eq!(
                (m.data_len(), m.pkt_len(), m.nb_segs()),
                (0, 0, 1),
                "mbuf {i}"
            );
            assert_eq!((m.headroom(), m.tailroom()), (128, 2048), "mbuf {i}");
            m.extend_from_slice(&frame(i, 300)).unwrap();
            assert_eq!(m.to_vec(), frame(i, 300));
            if i % 2 == 0 {
                held.push(m);
            } else {
                drop(m);
            }
            assert!(stash.len() <= PREFETCH_AHEAD + STASH_REFILL);
            assert_eq!(
                pool.in_use(),
                start + held.len() as u32 + stash.len() as u32
            );
        }
        let distinct: std::collections::HashSet<usize> =
            held.iter().map(|m| m.as_ptr() as usize).collect();
        assert_eq!(distinct.len(), held.len(), "an mbuf handed out twice");
        assert!(!stash.is_empty());
        stash.release();
        assert!(stash.is_empty());
        assert_eq!(
            pool.in_use(),
            start + held.len() as u32,
            "released to the pool"
        );
        assert!(stash.alloc().is_ok(), "refills after a release");
    }
    assert_eq!(pool.in_use(), start, "the stash and its mbufs went back");
}

/// On a pool that runs dry the stash takes what is left (the bulk get is all
/// or nothing, so it asks for less), then reports exhaustion, and works
/// again once mbufs come back.
#[test]
fn a_stash_drains_a_small_pool_and_recovers() {
    let eal = Eal::for_tests();
    // No per-lcore cache: every mbuf is in the pool's ring.
    let pool = Mempool::new(eal, "t_stash_small", 45, 0, Mempool::DEFAULT_DATA_ROOM).unwrap();
    let mut stash = dpdk::MbufStash::new(pool.clone()).unwrap();
    let mut held = Vec::new();
    while let Ok(m) = stash.alloc() {
        held.push(m);
        assert!(held.len() <= 45);
    }
    assert_eq!(held.len(), 45, "every mbuf of the pool was handed out");
    assert!(matches!(stash.alloc(), Err(Error::PoolExhausted(_))));
    held.truncate(40);
    assert!(stash.alloc().is_ok(), "mbufs came back");
    drop(held);
    drop(stash);
    assert_eq!(pool.in_use(), 0);
}

/// `ExtBuf::zeroed_pages` gives zeroed memory at a page boundary (so that two
/// regions line up within their pages), at least one byte, that mbufs attach
/// to like any other and that is freed with the last reference.
#[test]
fn zeroed_pages_are_page_aligned_zeroed_and_attachable() {
    let pool = Mempool::new(Eal::for_tests(), "t_pages", 64, 0, 0).unwrap();
    for len in [0usize, 1, 4095, 4096, 65536 + 17, 3 << 20] {
        let buf = ExtBuf::zeroed_pages(len);
        assert_eq!(buf.len(), len.max(1));
        assert_eq!(buf.base_ptr() as usize % 4096, 0, "len {len}");
        // SAFETY: the buffer is ours and nothing is attached to it.
        let bytes = unsafe { std::slice::from_raw_parts(buf.base_ptr(), buf.len()) };
        assert!(bytes.iter().all(|&b| b == 0), "len {len}");
        let mut m = pool.alloc().unwrap();
        let n = buf.len().min(4000);
        buf.attach(&mut m, 0, n).unwrap();
        assert_eq!(m.data().len(), n);
        assert_eq!(buf.refs(), 2, "the handle and the mbuf");
        drop(m);
        assert_eq!(buf.refs(), 1);
    }
    assert_eq!(pool.in_use(), 0);
}
