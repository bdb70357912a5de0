//! Connects an RC QP to an rdma_cm listener through the IB CM on QP 1 (issue 41): the
//! REQ carries rdma_cm's `cma_hdr` and the TCP port space's service ID, so a Linux
//! rdma_cm server (perftest's `ib_write_bw -R` on rxe, rping) takes it for one of its
//! own; the REP's QPN and PSN connect our QP, the RTU establishes the connection, and
//! (with `--disconnect`) a DREQ releases it. Prints each CM event. With
//! `--loss-recovery sr` the QP wants selective repeat: the REQ (or REP) offers it in
//! its private data's tail (`rdma::cm::ext`), and the QP runs it only if the peer's
//! CM agreed; the loss recovery the QP runs is printed once it is connected
//! (`scripts/interop.sh sr`: a Linux peer never agrees, so `gbn`).
//!
//! `cargo run --release -p nic --example cm_connect -- --dev net_tap0,iface=rsnic-tap0
//! --ip 10.0.0.1 --peer 10.0.0.2 --port 18515 --disconnect`

use std::net::Ipv4Addr;
use std::time::Duration;

use clap::Parser;
use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::cm::CmEvent;
use rdma::wire::cm::{service_id, CmaHdr, RDMA_PS_TCP};

#[derive(Parser)]
struct Args {
    /// The DPDK port (a vdev string: net_tap0,iface=...).
    #[arg(long)]
    dev: String,
    /// This NIC's IPv4 address.
    #[arg(long)]
    ip: Ipv4Addr,
    /// The listener's address (with `--listen`: ignored).
    #[arg(long, default_value = "0.0.0.0")]
    peer: Ipv4Addr,
    /// Be the passive side: listen on `--port`, accept the first request, wait for
    /// its RTU.
    #[arg(long)]
    listen: bool,
    /// The listener's port (TCP port space).
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// Release the connection (DREQ) once established.
    #[arg(long)]
    disconnect: bool,
    /// Write every frame sent and received to this pcapng file.
    #[arg(long)]
    pcap: Option<std::path::PathBuf>,
    /// The QP's loss recovery: gbn or sr (run only where the peer's CM agrees).
    #[arg(long, default_value = "gbn")]
    loss_recovery: rdma::transport::LossRecovery,
}

/// Prints the loss recovery the connected QP runs (from its describe line).
fn print_mode(qp: &nic::verbs::QueuePair) -> Result<(), Box<dyn std::error::Error>> {
    let d = qp.describe()?;
    let mode = d
        .split("loss_recovery ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?");
    println!("cm_connect: loss recovery {mode}");
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Args::parse();
    let eal = Eal::init(&dpdk::tool_args("cm_connect", &[] as &[&str], false))?;
    let port = Port::open(eal, &a.dev)?;
    let ip = a.ip.octets();
    let mut cfg = DeviceConfig::new(ip);
    if a.dev.starts_with("net_tap") {
        cfg.mac = Some([0x02, 0x52, 0x53, ip[1], ip[2], ip[3]]);
    }
    cfg.pcap = a.pcap.clone();
    let dev = Device::open(eal, port, cfg)?;
    let cq = dev.create_cq(64)?;
    let opts = QpOptions {
        loss_recovery: a.loss_recovery,
        ..QpOptions::default()
    };
    let mut qp = dev.create_qp(&cq, &cq, opts)?;
    let sid = service_id(RDMA_PS_TCP, a.port);
    if a.listen {
        dev.cm_listen(sid)?;
        println!(
            "cm_connect: listening (service {sid:#018x}), QPN {:#x}",
            qp.qpn()
        );
        loop {
            let evs = dev.cm_wait(Duration::from_secs(30))?;
            if evs.is_empty() {
                return Err("no CM event in 30 s".into());
            }
            for e in evs {
                match e {
                    CmEvent::ConnectRequest { id, peer_ip, req } => {
                        let hdr = CmaHdr::parse(&req.private_data)?;
                        println!(
                            "cm_connect: REQ from {} port {} (QPN {:#x}, PSN {:#x})",
                            Ipv4Addr::from(peer_ip),
                            hdr.src_port,
                            req.local_qpn,
                            req.starting_psn
                        );
                        let params = qp.cm_params();
                        let remote =
                            qp.cm_remote(peer_ip, req.local_qpn, req.starting_psn, req.path_mtu)?;
                        qp.connect(&remote)?;
                        print_mode(&qp)?;
                        dev.cm_accept(id, params, &[])?;
                    }
                    CmEvent::Established { .. } => {
                        println!("cm_connect: established");
                        return Ok(());
                    }
                    other => println!("cm_connect: {other:?}"),
                }
            }
        }
    }
    let mut pd = [0u8; CmaHdr::LEN];
    CmaHdr::ipv4(
        ip,
        40000 + (std::process::id() % 20000) as u16,
        a.peer.octets(),
    )
    .emit(&mut pd)?;
    let id = dev.cm_connect(a.peer.octets(), sid, qp.cm_params(), &pd)?;
    println!(
        "cm_connect: REQ {id:#x} to {}:{} (service {sid:#018x}), QPN {:#x}",
        a.peer,
        a.port,
        qp.qpn()
    );
    let mut established = false;
    loop {
        let evs = dev.cm_wait(Duration::from_secs(30))?;
        if evs.is_empty() {
            return Err("no CM event in 30 s".into());
        }
        for e in evs {
            match e {
                CmEvent::ConnectReply { rep, .. } => {
                    println!(
                        "cm_connect: REP from QPN {:#x}, PSN {:#x}",
                        rep.local_qpn, rep.starting_psn
                    );
                    let remote =
                        qp.cm_remote(a.peer.octets(), rep.local_qpn, rep.starting_psn, 3)?;
                    qp.connect(&remote)?;
                    print_mode(&qp)?;
                    dev.cm_ready(id)?;
                }
                CmEvent::Established { .. } => {
                    println!("cm_connect: established");
                    established = true;
                    if a.disconnect {
                        dev.cm_disconnect(id, &[])?;
                    } else {
                        return Ok(());
                    }
                }
                CmEvent::Rejected { reason, .. } => {
                    return Err(format!("rejected, reason {reason}").into());
                }
                CmEvent::TimedOut { .. } => {
                    return Err("no answer from the peer's CM (timed out)".into());
                }
                CmEvent::Disconnected { .. } | CmEvent::DisconnectRequest { .. } => {
                    println!("cm_connect: released");
                    return if established {
                        Ok(())
                    } else {
                        Err("released before established".into())
                    };
                }
                other => println!("cm_connect: {other:?}"),
            }
        }
    }
}
