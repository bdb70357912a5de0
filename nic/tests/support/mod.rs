//! Set-up shared by the `nic` integration tests (each test file has
//! `mod support;`): a device pair on a ring pair, connected QPs, work
//! requests over whole regions, a fake peer that plays a requester by hand
//! on the wire, and one test per congestion control.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use cc::CcKind;
use dpdk::{Burst, Eal, Mempool, Port, RxQueue, TxQueue};
use nic::verbs::RemoteQp;
use nic::verbs::{CompletionQueue, Device, DeviceConfig, MemoryRegion, QpOptions, QueuePair};
use rdma::transport::{Access, RecvWr, SendOp, SendWr};
use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::{AethSyndrome, RethRepr};
use rdma::wire::{BthRepr, Ecn, Opcode, ParseOptions};

/// Host A's address (the first device of a pair, the fake peer).
pub const IP_A: [u8; 4] = [10, 0, 0, 1];
/// Host B's address (the second device, the device under test).
pub const IP_B: [u8; 4] = [10, 0, 0, 2];

/// Every access a test region needs.
pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Two devices on the ends of a new ring pair `name` of `depth` slots, A at
/// [`IP_A`] and B at [`IP_B`], each configured by `cfg` from the default.
pub fn device_pair(
    name: &str,
    depth: u32,
    cfg: impl Fn(DeviceConfig) -> DeviceConfig,
) -> (Device, Device) {
    let eal = Eal::for_tests();
    let (pa, pb) = Port::ring_pair(eal, name, depth).unwrap();
    let a = Device::open(eal, pa, cfg(DeviceConfig::new(IP_A))).unwrap();
    let b = Device::open(eal, pb, cfg(DeviceConfig::new(IP_B))).unwrap();
    (a, b)
}

/// Two devices on ports `pa` (A, at [`IP_A`]) and `pb` (B, at [`IP_B`]) with
/// both engines on one poll-mode thread (`Device::open_group`).
pub fn device_group(pa: Port, pb: Port) -> (Device, Device) {
    let mut devs = Device::open_group(
        Eal::for_tests(),
        vec![(pa, DeviceConfig::new(IP_A)), (pb, DeviceConfig::new(IP_B))],
        None,
    )
    .unwrap();
    let b = devs.pop().unwrap();
    let a = devs.pop().unwrap();
    (a, b)
}

/// Devices on `ports` (each at its address) whose engines park when idle
/// (`DeviceConfig::idle_yield`), all turned by one thread
/// (`Device::open_group`), pinned to `core` if given.
pub fn parking_group(
    eal: &'static Eal,
    ports: Vec<(Port, [u8; 4])>,
    core: Option<usize>,
) -> Vec<Device> {
    let cfgs = ports
        .into_iter()
        .map(|(p, ip)| {
            let mut c = DeviceConfig::new(ip);
            c.idle_yield = true;
            (p, c)
        })
        .collect();
    Device::open_group(eal, cfgs, core).unwrap()
}

/// WRITE `i` (8 bytes, signaled): `i` from the start of `m` to offset 64
/// of `peer`.
pub fn write8(q: &mut QueuePair, i: u64, m: &MemoryRegion, peer: &MemoryRegion) {
    m.write(0, &i.to_le_bytes());
    q.post_send(write_wr(i, m, 0, peer, 64, 8)).unwrap();
}

/// The next completion on `cq`, within 5 s, is WRITE `i`'s, a success.
pub fn completes(cq: &mut CompletionQueue, i: u64) {
    let wc = cq
        .wait(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("WRITE {i}: no completion (a lost wake-up?)"));
    assert_eq!(
        (wc.wr_id, wc.status),
        (i, rdma::transport::WcStatus::Success)
    );
}

/// Device `d`'s QP gauge once it reads `want`, or what it reads after 2 s
/// (the engine publishes it at most a millisecond late).
pub fn qps_live(d: &Device, want: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let n = d.counters().qps_live;
        if n == want || Instant::now() > end {
            return n;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A QP on `a` (CQ `ca` for sends and receives) connected to one on `b`
/// (CQ `cb`), both with `opts`.
pub fn connect_qps(
    a: &Device,
    b: &Device,
    ca: &CompletionQueue,
    cb: &CompletionQueue,
    opts: QpOptions,
) -> (QueuePair, QueuePair) {
    let mut qa = a.create_qp(ca, ca, opts).unwrap();
    let mut qb = b.create_qp(cb, cb, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    (qa, qb)
}

/// QP options with congestion control `cc`, the rest default.
pub fn with_cc(cc: CcKind) -> QpOptions {
    QpOptions {
        cc,
        ..QpOptions::default()
    }
}

/// A signaled WRITE of `len` bytes from `src_off` of `src` to `dst_off` of
/// `dst`.
pub fn write_wr(
    wr_id: u64,
    src: &MemoryRegion,
    src_off: u64,
    dst: &MemoryRegion,
    dst_off: u64,
    len: u32,
) -> SendWr {
    let op = SendOp::Write {
        remote_va: dst.va() + dst_off,
        rkey: dst.rkey(),
    };
    SendWr::signaled(wr_id, op, src.sge(src_off, len))
}

/// A receive of up to `len` bytes at the start of `mr`.
pub fn recv_wr(wr_id: u64, mr: &MemoryRegion, len: u32) -> RecvWr {
    RecvWr {
        wr_id,
        sge: mr.sge(0, len),
    }
}

/// A requester played by hand: the test holds one end of a ring pair and
/// builds frames with `rdma::wire`; the device under test owns the other
/// end and has one QP connected to the peer's QPN.
pub struct FakePeer {
    /// The device under test, at [`IP_B`].
    pub dut: Device,
    /// Its CQ (the QP's send and receive CQ).
    pub cq: CompletionQueue,
    /// Its QP, connected to [`FakePeer::QPN`].
    pub qp: QueuePair,
    /// The DUT QP's number (the destination QP of the peer's frames).
    pub dut_qpn: u32,
    /// Headers from the peer (at [`IP_A`]) to the DUT.
    pub fb: FrameBuilder,
    rx: RxQueue,
    tx: TxQueue,
    _port: Port,
    pool: std::sync::Arc<Mempool>,
}

impl FakePeer {
    /// The peer's QPN.
    pub const QPN: u32 = 0x99;
    /// The peer's MAC.
    pub const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0x99];

    /// A DUT on ring pair `name`, its QP connected to the peer, which starts
    /// at PSN `psn`.
    pub fn new(name: &str, psn: u32) -> FakePeer {
        let eal = Eal::for_tests();
        let pool_name = format!("{name}_peer");
        let pool = Mempool::new(eal, &pool_name, 1024, 32, Mempool::DEFAULT_DATA_ROOM).unwrap();
        let (mut me, dut_port) = Port::ring_pair(eal, name, 1024).unwrap();
        let (rx, tx) = me.configure_single(&pool).unwrap();
        let dut = Device::open(eal, dut_port, DeviceConfig::new(IP_B)).unwrap();
        let cq = dut.create_cq(64).unwrap();
        let qp = Self::connect_qp(&dut, &cq, psn);
        let dut_qpn = qp.remote_info().qpn;
        let fb = FrameBuilder {
            net: NetHeaders::new(Self::MAC, dut.mac(), IP_A, IP_B, 0xC099),
            int: None,
        };
        FakePeer {
            dut,
            cq,
            qp,
            dut_qpn,
            fb,
            rx,
            tx,
            _port: me,
            pool,
        }
    }

    /// A new QP of `dut` on `cq`, connected to the peer, which starts at PSN
    /// `psn`.
    pub fn connect_qp(dut: &Device, cq: &CompletionQueue, psn: u32) -> QueuePair {
        let mut qp = dut.create_qp(cq, cq, QpOptions::default()).unwrap();
        qp.connect(&RemoteQp {
            qpn: Self::QPN,
            psn,
            ip: IP_A,
            mac: Some(Self::MAC),
            mtu: 4096,
            cc: CcKind::None,
        })
        .unwrap();
        qp
    }

    /// A WRITE Only frame to QP `qpn` at `psn`, asking for an ACK, placing
    /// `payload` at `va` under `rkey`.
    pub fn write_frame(&self, qpn: u32, psn: u32, va: u64, rkey: u32, payload: &[u8]) -> Vec<u8> {
        write_only_frame(&self.fb, qpn, psn, va, rkey, payload)
    }

    /// Sends `frame` to the DUT as a chain of mbufs cut at `cuts` (offsets,
    /// increasing; none: one mbuf).
    pub fn send(&mut self, frame: &[u8], cuts: &[usize]) {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(frame.len());
        let mut head = self.pool.alloc().unwrap();
        head.extend_from_slice(&frame[bounds[0]..bounds[1]])
            .unwrap();
        for w in bounds[1..].windows(2) {
            let mut seg = self.pool.alloc().unwrap();
            seg.extend_from_slice(&frame[w[0]..w[1]]).unwrap();
            head.chain(seg).map_err(|(e, _)| e).unwrap();
        }
        assert_eq!(head.nb_segs() as usize, cuts.len() + 1);
        let mut b: Burst = Burst::new();
        b.push(head).unwrap();
        assert_eq!(self.tx.send(&mut b), 1);
    }

    /// Waits (up to 5 s) for the DUT's next acknowledgement to the peer and
    /// returns its AETH syndrome.
    pub fn next_aeth(&mut self) -> AethSyndrome {
        let end = Instant::now() + Duration::from_secs(5);
        let mut b: Burst = Burst::new();
        while Instant::now() < end {
            self.rx.recv(&mut b);
            // The DUT's gratuitous ARP at start is not what we wait for.
            if let Some(m) = b.drain().find(|m| nic::control::is_rocev2(m.data())) {
                let bytes = m.to_vec();
                let f =
                    rdma::wire::parse_frame(&bytes, &ParseOptions::default(), |_| false).unwrap();
                assert_eq!(f.bth.opcode, Opcode::Acknowledge);
                assert_eq!(f.bth.dest_qp, Self::QPN);
                return f.aeth.unwrap().syndrome;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!(
            "no answer from the DUT; its counters:\n{}",
            self.dut.counters()
        );
    }
}

/// A WRITE Only frame with `fb`'s headers to QP `qpn` at `psn`, asking for
/// an ACK, placing `payload` at `va` under `rkey`.
pub fn write_only_frame(
    fb: &FrameBuilder,
    qpn: u32,
    psn: u32,
    va: u64,
    rkey: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut pkt = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, qpn, psn));
    pkt.bth.ack_req = true;
    pkt.reth = Some(RethRepr {
        va,
        rkey,
        dma_len: payload.len() as u32,
    });
    let mut buf = vec![0u8; 9000];
    let n = fb.emit_frame(&pkt, payload, Ecn::Ect0, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// One `#[test]` per congestion control, each calling `$run(CcKind::..)`:
/// `per_cc!(run: name_none, name_dcqcn, name_hpcc, name_rx_hpcc, name_ldcp)`.
#[macro_export]
macro_rules! per_cc {
    ($run:ident: $none:ident, $dcqcn:ident, $hpcc:ident, $rx_hpcc:ident, $ldcp:ident) => {
        #[test]
        fn $none() {
            $run(cc::CcKind::None);
        }
        #[test]
        fn $dcqcn() {
            $run(cc::CcKind::Dcqcn);
        }
        #[test]
        fn $hpcc() {
            $run(cc::CcKind::Hpcc);
        }
        #[test]
        fn $rx_hpcc() {
            $run(cc::CcKind::RxHpcc);
        }
        #[test]
        fn $ldcp() {
            $run(cc::CcKind::Ldcp);
        }
    };
}

/// Waits until `ok` holds for `dev`'s counters (published every ms).
pub fn counters_until(dev: &Device, what: &str, ok: impl Fn(&nic::counters::Counters) -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    while !ok(&dev.counters()) {
        assert!(
            Instant::now() < end,
            "{what}; counters:\n{}",
            dev.counters()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
