//! Two NICs back to back on a DPDK ring pair, driven through the verbs API
//! the way an ibverbs program drives a real RNIC: open the devices, register
//! memory, create completion queues and RC queue pairs, connect them with each
//! other's info, then RDMA WRITE, WRITE with immediate, SEND, READ and the two
//! ATOMICs, each checked against the bytes that arrived.
//!
//! ```text
//! cargo run --release -p nic --example verbs -- --cc hpcc --size 1048576
//! ```
//!
//! Between two hosts, the same calls run on real ports (`Port::open` with a
//! PCI address or `net_tap0,iface=...`) after exchanging [`RemoteQp`] out of
//! band (`nic::exchange`, what `roce-perf` does over TCP).

use std::error::Error;
use std::time::{Duration, Instant};

use cc::CcKind;
use clap::Parser;
use dpdk::{Eal, Port};
use nic::verbs::{
    AsyncEvent, CompletionQueue, Device, DeviceConfig, QpOptions, QpTransition, RemoteQp,
};
use rdma::transport::{Access, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

#[derive(Parser, Debug)]
#[command(about = "RDMA WRITE/READ/SEND/ATOMIC between two rsnic devices on a ring pair")]
struct Args {
    /// Congestion control of both QPs.
    #[arg(long, value_enum, default_value_t = CcKind::Dcqcn)]
    cc: CcKind,
    /// Bytes moved by the WRITE and by the READ.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Path MTU (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
}

/// Waits for one completion (sleeping on the CQ's completion channel if it
/// has one) and checks that it is what the caller expects.
fn expect(cq: &mut CompletionQueue, wr_id: u64, op: WcOpcode) -> Result<WorkCompletion, String> {
    let wc = cq
        .wait_blocking(Duration::from_secs(10))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no completion for wr {wr_id} within 10 s"))?;
    if wc.wr_id != wr_id || wc.opcode != op || wc.status != WcStatus::Success {
        return Err(format!(
            "wr {wr_id}: expected a successful {op:?}, got {wc:?}"
        ));
    }
    Ok(wc)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args = Args::parse();
    let eal = Eal::init(&dpdk::tool_args("verbs", &[] as &[&str], false))?;

    // Two ports wired back to back; one device (engine thread) on each.
    let (pa, pb) = Port::ring_pair(eal, "verbs", 4096)?;
    let a = Device::open(eal, pa, DeviceConfig::new([10, 0, 0, 1]))?;
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2]))?;

    // Memory: A's source and READ destination, B's target of WRITEs,
    // SENDs and atomics.
    let len = args.size.max(4096);
    let local = Access::LOCAL_WRITE;
    let remote = local | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let src = a.reg_mr(2 * len, local)?;
    let dst = b.reg_mr(2 * len, remote)?;

    // A's CQ has a completion channel: `expect` sleeps on its eventfd.
    let mut cq_a = a.create_cq_with_channel(1024)?;
    let mut cq_b = b.create_cq(1024)?;
    let opts = QpOptions {
        mtu: args.mtu,
        cc: args.cc,
        ..QpOptions::default()
    };
    let mut qa = a.create_qp(&cq_a, &cq_a, opts)?;
    let mut qb = b.create_qp(&cq_b, &cq_b, opts)?;
    // What each side would send the other out of band: QPN, PSN, IP, MAC,
    // MTU, CC. Connecting moves the QP through RTR to RTS.
    let (info_a, info_b): (RemoteQp, RemoteQp) = (qa.remote_info(), qb.remote_info());
    qa.connect(&info_b)?;
    qb.connect(&info_a)?;
    println!(
        "QP 0x{:06x} <-> QP 0x{:06x}, cc {:?}, MTU {}",
        qa.qpn(),
        qb.qpn(),
        args.cc,
        args.mtu
    );

    // RDMA WRITE of `size` bytes.
    let pattern: Vec<u8> = (0..args.size).map(|i| (i * 31 + 7) as u8).collect();
    src.write(0, &pattern);
    let t = Instant::now();
    let write = SendOp::Write {
        remote_va: dst.va(),
        rkey: dst.rkey(),
    };
    qa.post_send(SendWr::signaled(1, write, src.sge(0, args.size as u32)))?;
    expect(&mut cq_a, 1, WcOpcode::RdmaWrite)?;
    let dt = t.elapsed();
    let mut got = vec![0u8; args.size];
    dst.read(0, &mut got);
    assert!(got == pattern, "WRITE: bytes differ at the target");
    println!(
        "WRITE      {:>9} B in {:>8.3} ms ({:.2} Gbit/s), contents verified",
        args.size,
        dt.as_secs_f64() * 1e3,
        args.size as f64 * 8.0 / dt.as_secs_f64() / 1e9
    );

    // RDMA WRITE with immediate: consumes a receive at B, which completes
    // with the immediate.
    qb.post_recv(RecvWr {
        wr_id: 20,
        sge: Sge {
            addr: dst.va() + len as u64,
            len: 64,
            lkey: dst.lkey(),
        },
    })?;
    qa.post_send(SendWr {
        wr_id: 2,
        op: SendOp::WriteImm {
            remote_va: dst.va() + len as u64 + 1024,
            rkey: dst.rkey(),
            imm: 0xC0FFEE,
        },
        sge: Sge {
            addr: src.va(),
            len: 16,
            lkey: src.lkey(),
        },
        signaled: true,
        solicited: false,
    })?;
    expect(&mut cq_a, 2, WcOpcode::RdmaWrite)?;
    let wc = expect(&mut cq_b, 20, WcOpcode::RecvRdmaWithImm)?;
    assert_eq!(wc.imm, Some(0xC0FFEE));
    println!(
        "WRITE_IMM  16 B, receive completed with imm 0x{:x}",
        0xC0FFEE
    );

    // SEND into a posted receive.
    let msg = b"a SEND lands in the next posted receive";
    src.write(len, msg);
    qb.post_recv(RecvWr {
        wr_id: 30,
        sge: Sge {
            addr: dst.va() + len as u64,
            len: 256,
            lkey: dst.lkey(),
        },
    })?;
    qa.post_send(SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sge: Sge {
            addr: src.va() + len as u64,
            len: msg.len() as u32,
            lkey: src.lkey(),
        },
        signaled: true,
        solicited: false,
    })?;
    expect(&mut cq_a, 3, WcOpcode::Send)?;
    let wc = expect(&mut cq_b, 30, WcOpcode::Recv)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    dst.read(len, &mut got);
    assert_eq!(got, msg);
    println!(
        "SEND       {} B received: {:?}",
        wc.byte_len,
        String::from_utf8_lossy(&got)
    );

    // RDMA READ back what the WRITE put there, into A's second half.
    let t = Instant::now();
    qa.post_send(SendWr {
        wr_id: 4,
        op: SendOp::Read {
            remote_va: dst.va(),
            rkey: dst.rkey(),
        },
        sge: Sge {
            addr: src.va() + len as u64,
            len: args.size as u32,
            lkey: src.lkey(),
        },
        signaled: true,
        solicited: false,
    })?;
    let wc = expect(&mut cq_a, 4, WcOpcode::RdmaRead)?;
    let dt = t.elapsed();
    let mut got = vec![0u8; args.size];
    src.read(len, &mut got);
    assert!(got == pattern, "READ: bytes differ");
    println!(
        "READ       {:>9} B in {:>8.3} ms ({:.2} Gbit/s), contents verified",
        wc.byte_len,
        dt.as_secs_f64() * 1e3,
        args.size as f64 * 8.0 / dt.as_secs_f64() / 1e9
    );

    // ATOMICs on an 8-byte word of B; the original value comes back to A.
    let word = dst.va() + len as u64 + 512;
    dst.write(len + 512, &40u64.to_ne_bytes());
    let ret = Sge {
        addr: src.va(),
        len: 8,
        lkey: src.lkey(),
    };
    qa.post_send(SendWr {
        wr_id: 5,
        op: SendOp::FetchAdd {
            remote_va: word,
            rkey: dst.rkey(),
            add: 2,
        },
        sge: ret,
        signaled: true,
        solicited: false,
    })?;
    expect(&mut cq_a, 5, WcOpcode::FetchAdd)?;
    qa.post_send(SendWr {
        wr_id: 6,
        op: SendOp::CompareSwap {
            remote_va: word,
            rkey: dst.rkey(),
            compare: 42,
            swap: 7,
        },
        sge: Sge {
            addr: src.va() + 8,
            ..ret
        },
        signaled: true,
        solicited: false,
    })?;
    expect(&mut cq_a, 6, WcOpcode::CompSwap)?;
    let mut w = [0u8; 24];
    src.read(0, &mut w[..16]);
    dst.read(len + 512, &mut w[16..]);
    let v = |i: usize| u64::from_ne_bytes(w[i * 8..i * 8 + 8].try_into().unwrap());
    assert_eq!((v(0), v(1), v(2)), (40, 42, 7));
    println!(
        "FETCH_ADD  40 + 2 (returned {}); CMP_SWAP 42 -> 7 (returned {})",
        v(0),
        v(1)
    );

    // A bad rkey is refused by the responder (remote access error), and
    // the requester's QP goes to the error state, as the IBA says.
    qa.post_send(SendWr {
        wr_id: 7,
        op: SendOp::Write {
            remote_va: dst.va(),
            rkey: dst.rkey() ^ 0x100,
        },
        sge: ret,
        signaled: true,
        solicited: false,
    })?;
    let wc = cq_a
        .wait(Duration::from_secs(10))
        .ok_or("no completion for the bad-rkey WRITE")?;
    assert_eq!(wc.status, WcStatus::RemAccessErr, "{wc:?}");
    println!(
        "bad rkey   completed with {:?}, QP now {:?}",
        wc.status,
        qa.state()?
    );

    // The engine told the program on the device's async event queue.
    let ev = a.events().next_timeout(Duration::from_secs(2));
    assert_eq!(ev, Some(AsyncEvent::QpFatal { qpn: qa.qpn() }));
    println!("async event {ev:?}");

    // The lifecycle: the QP in ERR is reset and brought back to RTS with
    // modify_qp (the peer too, so that both start from fresh PSNs), then
    // works again.
    for q in [&mut qa, &mut qb] {
        q.modify_qp(QpTransition::Reset)?;
        q.modify_qp(QpTransition::Init)?;
    }
    let (info_a, info_b) = (qa.remote_info(), qb.remote_info());
    qa.modify_qp(QpTransition::Rtr(info_b))?;
    qb.modify_qp(QpTransition::Rtr(info_a))?;
    qa.modify_qp(QpTransition::Rts)?;
    qb.modify_qp(QpTransition::Rts)?;
    qa.post_send(SendWr {
        wr_id: 8,
        op: SendOp::Write {
            remote_va: dst.va(),
            rkey: dst.rkey(),
        },
        sge: ret,
        signaled: true,
        solicited: false,
    })?;
    expect(&mut cq_a, 8, WcOpcode::RdmaWrite)?;
    println!("reset      RESET -> INIT -> RTR -> RTS, WRITE completed again");

    let (ca, cb) = (a.counters(), b.counters());
    println!(
        "A: {} packets out, {} retransmits; B: {} packets in, {} ACKs out, {} NAKs out",
        ca.tx_packets, ca.retransmits, cb.rx_packets, cb.tx_acks, cb.tx_naks
    );
    // Everything is freed in the engines: QPs first, then the CQs they
    // used (a CQ still in use would be refused), then the regions.
    a.destroy_qp(qa)?;
    b.destroy_qp(qb)?;
    a.destroy_cq(cq_a)?;
    b.destroy_cq(cq_b)?;
    a.dereg_mr(src)?;
    b.dereg_mr(dst)?;
    a.close();
    b.close();
    Ok(())
}
