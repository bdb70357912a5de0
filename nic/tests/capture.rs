//! The optional pcapng capture of a port: tshark opens the file and decodes
//! the RoCEv2 headers of what the NIC sent and received (and its gratuitous
//! ARP); frames longer than the snap length keep their true length, so
//! tshark reports none of them malformed.

use std::process::Command;
use std::time::Duration;

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, Sge, WcStatus};

#[test]
fn capture_file_decodes_as_rocev2_in_tshark() {
    let eal = Eal::for_tests();
    let path = std::env::temp_dir().join(format!("rsnic-capture-{}.pcapng", std::process::id()));
    let (pa, pb) = Port::ring_pair(eal, "cap", 1024).unwrap();
    let mut cfg = DeviceConfig::new([10, 0, 0, 1]);
    cfg.pcap = Some(path.clone());
    let a = Device::open(eal, pa, cfg).unwrap();
    let b = Device::open(eal, pb, DeviceConfig::new([10, 0, 0, 2])).unwrap();
    let mut cqa = a.create_cq(64).unwrap();
    let cqb = b.create_cq(64).unwrap();
    let mut qa = a.create_qp(&cqa, &cqa, QpOptions::default()).unwrap();
    let mut qb = b.create_qp(&cqb, &cqb, QpOptions::default()).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let src = a.reg_mr(16384, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(
            16384,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    // A WRITE and a READ of 10000 B, and a READ of 4 KiB whose response
    // is one 4 KiB frame, far above the 512 B kept of each frame.
    for (i, (op, len)) in [
        (
            SendOp::Write {
                remote_va: dst.va(),
                rkey: dst.rkey(),
            },
            10000,
        ),
        (
            SendOp::Read {
                remote_va: dst.va(),
                rkey: dst.rkey(),
            },
            10000,
        ),
        (
            SendOp::Read {
                remote_va: dst.va(),
                rkey: dst.rkey(),
            },
            4096,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        qa.post_send(SendWr {
            wr_id: i as u64,
            op,
            sge: Sge {
                addr: src.va(),
                len,
                lkey: src.lkey(),
            },
            signaled: true,
            solicited: false,
        })
        .unwrap();
        let wc = cqa.wait(Duration::from_secs(10)).expect("completion");
        assert_eq!(wc.status, WcStatus::Success);
    }
    // b's ACK of the last READ request may still be on its way to a's counters.
    std::thread::sleep(Duration::from_millis(20));
    let sent = a.counters().tx_packets;
    let received = a.counters().rx_packets;
    a.close();
    b.close();

    let text = tshark(
        &path,
        &[
            "frame.interface_name",
            "infiniband.bth.opcode",
            "arp.opcode",
            "frame.len",
            "frame.cap_len",
        ],
        None,
    );
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(
        lines.len() as u64,
        sent + received,
        "every frame captured:\n{text}"
    );
    let opcodes: Vec<u32> = lines.iter().filter_map(|l| l[1].parse().ok()).collect();
    let arps = lines.iter().filter(|l| !l[2].is_empty()).count();
    assert!(arps >= 2, "a's and b's gratuitous ARP:\n{text}");
    assert_eq!(
        opcodes.len() + arps,
        lines.len(),
        "every frame decoded as RoCEv2 or ARP:\n{text}"
    );
    // 10000 B at MTU 4096: WRITE First (6), Middle (7), Last (8); ACK (17);
    // READ Request (12); READ Response First (13), Middle (14), Last (15),
    // Only (16).
    for op in [6, 7, 8, 17, 12, 13, 14, 15, 16] {
        assert!(opcodes.contains(&op), "opcode {op} missing:\n{text}");
    }
    assert!(
        lines.iter().any(|l| l[0].contains("-tx")) && lines.iter().any(|l| l[0].contains("-rx"))
    );
    // Frames cut at the snap length keep their length on the wire: the
    // 4 KiB READ response (received) and the WRITE's (sent) are there in
    // full length, and tshark finds no frame malformed.
    let longest = |dir: &str| {
        lines
            .iter()
            .filter(|l| l[0].ends_with(dir))
            .filter_map(|l| Some((l[3].parse::<u32>().ok()?, l[4].parse::<u32>().ok()?)))
            .max()
            .unwrap_or_default()
    };
    for dir in ["-tx", "-rx"] {
        let (len, cap) = longest(dir);
        assert!(
            len > 4096 && cap == 512,
            "{dir}: longest frame {len} B, {cap} B kept:\n{text}"
        );
    }
    let malformed = tshark(&path, &["frame.number"], Some("_ws.malformed"));
    assert!(
        malformed.trim().is_empty(),
        "malformed frames: {malformed}\nall:\n{text}"
    );
    let _ = std::fs::remove_file(&path);
}

/// `fields` of every frame of the capture at `path` (those matching
/// `filter`), one tab-separated line per frame.
fn tshark(path: &std::path::Path, fields: &[&str], filter: Option<&str>) -> String {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(path).args(["-T", "fields"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    if let Some(f) = filter {
        cmd.args(["-Y", f]);
    }
    let out = cmd
        .output()
        .expect("tshark is needed (scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
