//! Loopback inside the NIC (issue 40 item 2): two QPs of one port talk to
//! each other without touching the wire, as a hardware RoCE NIC and Linux rxe
//! loop such traffic back. The peer's address is the port's own; ARP is not
//! asked; WRITE, READ, SEND and both atomics of 1 B to 1 MiB arrive with every
//! byte checked; the kernel side of the TAP receives no frame while they run;
//! the engine counts each looped frame. The same through a sharded device,
//! with the two QPs on different shards, behind a dispatcher and with a queue
//! pair per shard.
//!
//! The TAP test needs root (`rsnic-lo0`, another name with `RSNIC_LO_TAP`).

mod support;

use std::time::Duration;

use dpdk::{Eal, Port};
use nic::contract::RemoteQp;
use nic::verbs::{CompletionQueue, Device, DeviceConfig, MemoryRegion, QueuePair};
use rdma::transport::{Access, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

const IP: [u8; 4] = [10, 214, 0, 2];
const MIB: usize = 1 << 20;
/// The bytes of one op of every size 1 B, 4 B, ... 1 MiB.
const PAYLOAD: u64 = (4 * MIB as u64 - 1) / 3;

/// `len` bytes of a pattern of its own.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ (i >> 8) ^ seed.wrapping_mul(29)) as u8)
        .collect()
}

/// A QP on each of `ca` and `cb` of `dev`, connected to each other through
/// the port's own address with no MAC given (the engine resolves it: its
/// own).
fn self_pair(dev: &Device, ca: &CompletionQueue, cb: &CompletionQueue) -> (QueuePair, QueuePair) {
    let opts = support::with_cc(cc::CcKind::None);
    let mut qa = dev.create_qp(ca, ca, opts).unwrap();
    let mut qb = dev.create_qp(cb, cb, opts).unwrap();
    let unresolved = |r: RemoteQp| RemoteQp { mac: None, ..r };
    qa.connect(&unresolved(qb.remote_info())).unwrap();
    qb.connect(&unresolved(qa.remote_info())).unwrap();
    (qa, qb)
}

fn done(cq: &mut CompletionQueue, wr_id: u64, what: &str) -> u32 {
    let wc = cq
        .wait(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("{what}: no completion"));
    assert_eq!(
        (wc.wr_id, wc.status),
        (wr_id, WcStatus::Success),
        "{what}: {wc:?}"
    );
    wc.byte_len
}

/// WRITE, READ, SEND (into a posted receive) and both atomics from A to B,
/// every size 1 B, 4 B, ... 1 MiB, every byte checked.
fn every_op_every_size(dev: &Device, ca: &mut CompletionQueue, cb: &mut CompletionQueue) {
    let (mut qa, mut qb) = self_pair(dev, ca, cb);
    let all = support::ALL | Access::REMOTE_ATOMIC;
    let (la, lb) = (
        dev.reg_mr(2 * MIB, all).unwrap(),
        dev.reg_mr(2 * MIB, all).unwrap(),
    );
    let mut id = 0u64;
    let mut size = 1usize;
    while size <= MIB {
        id += 1;
        // WRITE A -> B.
        let data = pattern(size, id as usize);
        la.write(0, &data);
        qa.post_send(wr(id, &la, 0, size, write_to(&lb, 0)))
            .unwrap();
        assert_eq!(done(ca, id, "WRITE"), size as u32);
        assert!(read(&lb, 0, size) == data, "WRITE of {size} B: other bytes");
        // READ B -> A.
        let data = pattern(size, id as usize + 1000);
        lb.write(MIB, &data);
        let read_op = SendOp::Read {
            remote_va: lb.va() + MIB as u64,
            rkey: lb.rkey(),
        };
        qa.post_send(wr(id, &la, MIB, size, read_op)).unwrap();
        assert_eq!(done(ca, id, "READ"), size as u32);
        assert!(
            read(&la, MIB, size) == data,
            "READ of {size} B: other bytes"
        );
        // SEND A -> B's receive.
        let data = pattern(size, id as usize + 2000);
        la.write(0, &data);
        qb.post_recv(RecvWr {
            wr_id: id,
            sge: Sge {
                addr: lb.va(),
                len: MIB as u32,
                lkey: lb.lkey(),
            },
        })
        .unwrap();
        qa.post_send(wr(id, &la, 0, size, SendOp::Send)).unwrap();
        done(ca, id, "SEND");
        let wc = cb.wait(Duration::from_secs(10)).expect("RECV completion");
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (id, WcStatus::Success, WcOpcode::Recv, size as u32)
        );
        assert!(read(&lb, 0, size) == data, "SEND of {size} B: other bytes");
        size *= 4;
    }
    // Both atomics on B's word, the original value into A.
    lb.write(64, &40u64.to_le_bytes());
    let faa = SendOp::FetchAdd {
        remote_va: lb.va() + 64,
        rkey: lb.rkey(),
        add: 2,
    };
    qa.post_send(wr(100, &la, 8, 8, faa)).unwrap();
    done(ca, 100, "FETCH_ADD");
    let cas = SendOp::CompareSwap {
        remote_va: lb.va() + 64,
        rkey: lb.rkey(),
        compare: 42,
        swap: 7,
    };
    qa.post_send(wr(101, &la, 16, 8, cas)).unwrap();
    done(ca, 101, "CMP_SWAP");
    assert_eq!(read(&la, 8, 8), 40u64.to_le_bytes(), "FETCH_ADD's original");
    assert_eq!(read(&la, 16, 8), 42u64.to_le_bytes(), "CMP_SWAP's original");
    assert_eq!(read(&lb, 64, 8), 7u64.to_le_bytes(), "B's word after both");
}

fn write_to(mr: &MemoryRegion, off: usize) -> SendOp {
    SendOp::Write {
        remote_va: mr.va() + off as u64,
        rkey: mr.rkey(),
    }
}

fn wr(id: u64, mr: &MemoryRegion, off: usize, len: usize, op: SendOp) -> SendWr {
    SendWr::signaled(
        id,
        op,
        Sge {
            addr: mr.va() + off as u64,
            len: len as u32,
            lkey: mr.lkey(),
        },
    )
}

fn read(mr: &MemoryRegion, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v);
    v
}

fn sysfs_count(iface: &str, what: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{what}"))
        .unwrap_or_else(|e| panic!("{iface} {what}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn two_qps_of_one_port_talk_inside_the_nic_and_nothing_reaches_the_tap() {
    Eal::require_root("TAP ports");
    let tap = std::env::var("RSNIC_LO_TAP").unwrap_or_else(|_| "rsnic-lo0".into());
    let eal = Eal::for_tests();
    let port = Port::open(eal, &format!("net_tap_lo,iface={tap}")).expect("TAP port");
    let mut cfg = DeviceConfig::new(IP);
    cfg.idle_yield = true;
    cfg.pool_size = 8191;
    let dev = Device::open(eal, port, cfg).expect("device");
    let up = std::process::Command::new("ip")
        .args(["link", "set", &tap, "up"])
        .status()
        .expect("ip runs");
    assert!(up.success());
    // The start-up gratuitous ARP goes out; what follows must not.
    std::thread::sleep(Duration::from_millis(300));
    let kernel_rx = sysfs_count(&tap, "rx_packets");
    let before = dev.counters();

    let (mut ca, mut cb) = (dev.create_cq(1024).unwrap(), dev.create_cq(1024).unwrap());
    every_op_every_size(&dev, &mut ca, &mut cb);

    let c = dev.counters();
    let looped = c.tx_loopback - before.tx_loopback;
    assert_eq!(
        sysfs_count(&tap, "rx_packets") - kernel_rx,
        0,
        "frames reached the TAP's kernel side; NIC counters:\n{c}"
    );
    // The data of the three ops of every size, in 4 KiB frames, plus ACKs.
    assert!(looped > 1000, "{looped} frames looped back\n{c}");
    assert!(c.rx_bytes - before.rx_bytes > 3 * PAYLOAD, "{c}");
    assert!(c.rx_packets - before.rx_packets >= looped, "{c}");
    assert_eq!(c.rx_drop_loopback_full, 0, "{c}");
    assert_eq!(
        c.tx_arp_requests, before.tx_arp_requests,
        "ARP asked for our own address"
    );
    assert_eq!(c.rx_drop_icrc, 0, "{c}");
    dev.close();
}

/// Two QPs on different shards of one device: their frames loop back to the
/// shard that owns the destination QP, behind a dispatcher (one queue pair)
/// and with a queue pair per shard (steering between shards).
#[test]
fn loopback_reaches_the_shard_of_the_destination_qp() {
    let eal = Eal::for_tests();
    for queues in [1u16, 2] {
        let name = format!("lo_shards{queues}");
        let (pa, _pb) = Port::ring_pair_queues(eal, &name, 4096, queues).unwrap();
        let mut cfg = DeviceConfig::new(IP);
        cfg.idle_yield = true;
        cfg.pool_size = 8191;
        let dev = Device::open_sharded(eal, pa, cfg, &[None, None]).unwrap();
        // CQs go to the shards round robin: one QP on each.
        let (mut ca, mut cb) = (dev.create_cq(1024).unwrap(), dev.create_cq(1024).unwrap());
        every_op_every_size(&dev, &mut ca, &mut cb);
        let c = dev.counters();
        assert!(c.tx_loopback > 1000, "queues {queues}: {c}");
        assert!(c.rx_bytes > 3 * PAYLOAD, "queues {queues}: {c}");
        assert_eq!(c.rx_drop_loopback_full, 0, "queues {queues}: {c}");
        dev.close();
    }
}
