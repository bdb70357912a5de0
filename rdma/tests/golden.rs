//! Golden packets of every opcode we emit, decoded by tools we did not write
//! (docs/design.md §8): tshark decodes the fields, scapy recomputes the ICRC.
//!
//! These tests FAIL (they do not skip) when tshark or python3+scapy are missing: run
//! `scripts/setup.sh` to install them. Not built under Miri (`scripts/miri.sh`),
//! which cannot spawn processes.
#![cfg(not(miri))]

use rdma::wire::frame::{FrameBuilder, NetHeaders, RoceRepr};
use rdma::wire::transport_hdrs::*;
use rdma::wire::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes a classic pcap (microsecond timestamps, LINKTYPE_ETHERNET = 1).
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        out.extend_from_slice(f);
    }
    std::fs::write(path, out).unwrap();
}

fn builder() -> FrameBuilder {
    FrameBuilder {
        net: NetHeaders::new(
            [0x02, 0, 0, 0, 0, 1],
            [0x02, 0, 0, 0, 0, 2],
            [192, 168, 7, 1],
            [192, 168, 7, 2],
            49153,
        ),
        int: None,
    }
}

/// What we expect tshark to decode.
#[derive(Debug, Clone, Default)]
struct Expect {
    opcode: u8,
    psn: u32,
    qp: u32,
    reth: Option<RethRepr>,
    aeth: Option<(u8, u32)>,
    atomic: Option<AtomicEthRepr>,
    atomic_ack: Option<u64>,
    imm: Option<u32>,
    deth: Option<DethRepr>,
    ieth: Option<u32>,
}

fn golden_set() -> Vec<(Vec<u8>, Expect)> {
    let b = builder();
    let mut v = Vec::new();
    let mut psn = 0xFF_FFF0u32; // crosses the 24-bit wrap on purpose
    let qp = 0x00AB_CDEF & 0xFF_FFFF;
    for op in [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastImm,
        Opcode::SendOnly,
        Opcode::SendOnlyImm,
        Opcode::WriteFirst,
        Opcode::WriteMiddle,
        Opcode::WriteLast,
        Opcode::WriteLastImm,
        Opcode::WriteOnly,
        Opcode::WriteOnlyImm,
        Opcode::ReadRequest,
        Opcode::ReadResponseFirst,
        Opcode::ReadResponseMiddle,
        Opcode::ReadResponseLast,
        Opcode::ReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::SendLastInv,
        Opcode::SendOnlyInv,
        Opcode::Cnp,
        Opcode::UcSendFirst,
        Opcode::UcSendMiddle,
        Opcode::UcSendLast,
        Opcode::UcSendLastImm,
        Opcode::UcSendOnly,
        Opcode::UcSendOnlyImm,
        Opcode::UcWriteFirst,
        Opcode::UcWriteMiddle,
        Opcode::UcWriteLast,
        Opcode::UcWriteLastImm,
        Opcode::UcWriteOnly,
        Opcode::UcWriteOnlyImm,
        Opcode::UdSendOnly,
        Opcode::UdSendOnlyImm,
    ] {
        let syndromes: &[AethSyndrome] = if op == Opcode::Acknowledge {
            &[
                AethSyndrome::ACK,
                AethSyndrome::Nak(NakCode::PsnSequenceError),
                AethSyndrome::Nak(NakCode::InvalidRequest),
                AethSyndrome::Nak(NakCode::RemoteAccessError),
                AethSyndrome::Nak(NakCode::RemoteOperationalError),
                AethSyndrome::RnrNak { timer: 14 },
            ]
        } else {
            &[AethSyndrome::ACK]
        };
        for &syn in syndromes {
            let this_psn = if op == Opcode::Cnp { 0 } else { psn };
            let mut bth = BthRepr::new(op, qp, this_psn);
            bth.ack_req = op.service() == Service::Rc && (op.is_last() || op.is_only());
            let mut r = RoceRepr::new(bth);
            let mut e = Expect {
                opcode: op as u8,
                psn: this_psn,
                qp,
                ..Default::default()
            };
            let payload_len = if op.is_first() || op.is_middle() {
                256
            } else if op.has_payload() {
                13 + (psn as usize % 5)
            } else {
                0
            };
            if op.has_reth() {
                let x = RethRepr {
                    va: 0x0000_7F00_1234_5000 + u64::from(psn),
                    rkey: 0x1234_5678,
                    dma_len: 4096 + psn % 7,
                };
                r.reth = Some(x);
                e.reth = Some(x);
            }
            if op.has_deth() {
                let d = DethRepr {
                    qkey: 0x8765_4321 ^ psn,
                    src_qp: 0x00_1234 + (psn & 0xFF),
                };
                r.deth = Some(d);
                e.deth = Some(d);
            }
            if op.has_aeth() {
                let msn = 0x00_0100 + (psn & 0xFF);
                r.aeth = Some(AethRepr { syndrome: syn, msn });
                e.aeth = Some((syn.to_u8(), msn));
            }
            if op.has_immdt() {
                r.immdt = Some(ImmDtRepr(0xCAFE_0000 | (psn & 0xFFFF)));
                e.imm = Some(0xCAFE_0000 | (psn & 0xFFFF));
            }
            if op.has_ieth() {
                r.ieth = Some(IethRepr(0x0012_3400 | (psn & 0xFF)));
                e.ieth = Some(0x0012_3400 | (psn & 0xFF));
            }
            if op.has_atomic_eth() {
                let a = AtomicEthRepr {
                    va: 0x10_0008,
                    rkey: 0x4242,
                    swap_add: 0x1111_2222_3333_4444,
                    compare: 0x5555_6666_7777_8888,
                };
                r.atomic = Some(a);
                e.atomic = Some(a);
            }
            if op.has_atomic_ack_eth() {
                r.atomic_ack = Some(AtomicAckEthRepr {
                    orig: 0x0102_0304_0506_0708,
                });
                e.atomic_ack = Some(0x0102_0304_0506_0708);
            }
            let payload: Vec<u8> = (0..payload_len).map(|i| (i as u8) ^ (psn as u8)).collect();
            let mut buf = vec![0u8; 512];
            let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
            buf.truncate(n);
            // Our own parser must agree before anyone else looks.
            let f = parse_frame(&buf, &ParseOptions::default(), |_| false).unwrap();
            assert_eq!(f.payload, &payload[..]);
            v.push((buf, e));
            psn = (psn + 1) & 0xFF_FFFF;
        }
    }
    v
}

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn num(s: &str) -> u64 {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x") {
        u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {s:?}"))
    } else {
        s.parse().unwrap_or_else(|_| panic!("bad number {s:?}"))
    }
}

fn opt(s: &str) -> Option<u64> {
    if s.trim().is_empty() {
        None
    } else {
        Some(num(s))
    }
}

#[test]
fn tshark_decodes_every_opcode() {
    let set = golden_set();
    let path = out_dir().join("golden_tshark.pcap");
    write_pcap(
        &path,
        &set.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>(),
    );
    let fields = [
        "infiniband.bth.opcode",
        "infiniband.bth.psn",
        "infiniband.bth.destqp",
        "infiniband.reth.va",
        "infiniband.reth.r_key",
        "infiniband.reth.dmalen",
        "infiniband.aeth.syndrome",
        "infiniband.aeth.msn",
        "infiniband.atomiceth.swapdt",
        "infiniband.atomiceth.cmpdt",
        "infiniband.atomicacketh.origremdt",
        "infiniband.immdt",
        "udp.dstport",
        "infiniband.deth.q_key",
        "infiniband.deth.srcqp",
        "infiniband.ieth",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("tshark not runnable ({e}); run scripts/setup.sh to install it")
    });
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), set.len(), "tshark output:\n{text}");
    for (i, (line, (_, e))) in lines.iter().zip(set.iter()).enumerate() {
        let c: Vec<&str> = line.split('|').collect();
        assert_eq!(c.len(), fields.len(), "packet {i}: {line}");
        let ctx = format!("packet {i} {e:?}: {line}");
        assert_eq!(num(c[0]), u64::from(e.opcode), "{ctx}");
        if e.opcode != Opcode::Cnp as u8 {
            assert_eq!(num(c[1]), u64::from(e.psn), "{ctx}");
        }
        assert_eq!(num(c[2]), u64::from(e.qp), "{ctx}");
        match e.reth {
            Some(r) => {
                assert_eq!(num(c[3]), r.va, "{ctx}");
                assert_eq!(num(c[4]), u64::from(r.rkey), "{ctx}");
                assert_eq!(num(c[5]), u64::from(r.dma_len), "{ctx}");
            }
            // tshark shows the AtomicETH VA under infiniband.reth.va.
            None => assert_eq!(opt(c[3]), e.atomic.map(|a| a.va), "{ctx}"),
        }
        match e.aeth {
            Some((s, m)) => {
                assert_eq!(num(c[6]), u64::from(s), "{ctx}");
                assert_eq!(num(c[7]), u64::from(m), "{ctx}");
            }
            None => assert_eq!(opt(c[6]), None, "{ctx}"),
        }
        if let Some(a) = e.atomic {
            assert_eq!(num(c[8]), a.swap_add, "{ctx}");
            assert_eq!(num(c[9]), a.compare, "{ctx}");
        }
        if let Some(a) = e.atomic_ack {
            assert_eq!(num(c[10]), a, "{ctx}");
        }
        if let Some(imm) = e.imm {
            // tshark lists the field once per occurrence; take the first.
            let got = c[11].split(',').next().unwrap().trim().replace(':', "");
            assert_eq!(
                u64::from_str_radix(got.trim_start_matches("0x"), 16).unwrap(),
                u64::from(imm),
                "{ctx}"
            );
        }
        assert_eq!(num(c[12]), 4791, "{ctx}");
        // UD: tshark finds the DETH where IBA 9.3.2 puts it.
        assert_eq!(opt(c[13]), e.deth.map(|d| u64::from(d.qkey)), "{ctx}");
        assert_eq!(opt(c[14]), e.deth.map(|d| u64::from(d.src_qp)), "{ctx}");
        // SEND with Invalidate: tshark shows the IETH's R_Key as 4 bytes
        // (listed once per occurrence: the first).
        let ieth = (!c[15].is_empty()).then(|| {
            let first = c[15].split(',').next().unwrap().replace(':', "");
            u64::from_str_radix(&first, 16).expect("IETH bytes")
        });
        assert_eq!(ieth, e.ieth.map(u64::from), "{ctx}");
    }
}

/// Runs the scapy ICRC script on `frames`; panics with its output on failure.
pub fn scapy_check(name: &str, frames: &[Vec<u8>]) {
    let path = out_dir().join(name);
    write_pcap(&path, frames);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scapy_icrc.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("python3 not runnable ({e}); run scripts/setup.sh"));
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    if se.contains("No module named") {
        panic!("scapy is missing for python3 ({se}); run scripts/setup.sh to install it");
    }
    assert!(out.status.success(), "scapy ICRC check failed:\n{so}\n{se}");
    assert!(
        so.contains(&format!("packets={} mismatches=0", frames.len())),
        "{so}"
    );
}

#[test]
fn scapy_recomputes_our_icrc() {
    let set: Vec<Vec<u8>> = golden_set().into_iter().map(|(f, _)| f).collect();
    scapy_check("golden_scapy.pcap", &set);
}

#[test]
fn scapy_agrees_on_big_and_ecn_marked_packets() {
    // A 4 KiB WRITE and a CE-marked, TTL-decremented copy (masked fields).
    let b = builder();
    let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 7, 9));
    r.reth = Some(RethRepr {
        va: 0,
        rkey: 1,
        dma_len: 4096,
    });
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 31) as u8).collect();
    let mut buf = vec![0u8; 4300];
    let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
    buf.truncate(n);
    let mut ce = buf.clone();
    {
        let mut ip = Ipv4Packet::new_checked(&mut ce[14..]).unwrap();
        ip.set_ecn(Ecn::Ce);
        ip.fill_checksum();
    }
    ce[22] -= 1;
    {
        let mut ip = Ipv4Packet::new_checked(&mut ce[14..]).unwrap();
        ip.fill_checksum();
    }
    verify_icrc(&ce, 14, 0).unwrap();
    scapy_check("golden_big.pcap", &[buf, ce]);
}

#[test]
fn scapy_recomputes_icrc_of_cc_extension_and_probe_packets() {
    use rdma::wire::ccext::CcExtFlags;
    use rdma::wire::int::HopRecord;
    let b = builder();
    let mut frames = Vec::new();
    // WRITE FIRST with a data CC extension (LSN, fast start).
    let mut w = RoceRepr::new(BthRepr::new(Opcode::WriteFirst, 0x33, 100));
    w.ccext = Some(CcExtRepr::data(0xFFFF_FF00, CcExtFlags::FAST_START));
    w.reth = Some(RethRepr {
        va: 0x2000,
        rkey: 5,
        dma_len: 1024,
    });
    // ACK with window and two echoed hops.
    let mut ack = RoceRepr::new(BthRepr::new(Opcode::Acknowledge, 0x33, 100));
    let mut e = CcExtRepr::data(256, CcExtFlags::ACK);
    e.ce_count = 2;
    e.window = Some(65536);
    e.n_hops = 2;
    e.hops[0] = HopRecord::from_units(1, 2, 3, 4, 5, 100_000_000_000);
    e.hops[1] = HopRecord::from_units(6, 7, 8, 9, 10, 25_000_000_000);
    ack.ccext = Some(e);
    ack.aeth = Some(AethRepr {
        syndrome: AethSyndrome::ACK,
        msn: 1,
    });
    // Probe and probe response.
    let mut probe = RoceRepr::new(BthRepr::new(Opcode::Probe, 0x33, 101));
    probe.ccext = Some(CcExtRepr::data(1024, CcExtFlags::PROBE));
    let mut presp = RoceRepr::new(BthRepr::new(Opcode::ProbeResponse, 0x33, 101));
    presp.ccext = Some(CcExtRepr {
        flags: CcExtFlags::PROBE | CcExtFlags::ACK,
        ..e
    });
    for (r, len) in [(w, 256usize), (ack, 0), (probe, 0), (presp, 0)] {
        let payload = vec![0x5Au8; len];
        let mut buf = vec![0u8; 1024];
        let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
        buf.truncate(n);
        let f = parse_frame(&buf, &ParseOptions::default(), |_| true).unwrap();
        assert_eq!(f.ccext, r.ccext);
        frames.push(buf);
    }
    scapy_check("golden_ccext.pcap", &frames);
}

#[path = "common/mod.rs"]
mod common;

#[test]
fn tshark_decodes_what_the_transport_emits() {
    use common::*;
    use rdma::transport::*;
    // A plain RoCEv2 QP pair (no CC extension) doing every operation, with one RNR and
    // one lost packet so that RNR NAK and NAK go over the link too.
    let (mut a, b) = pair(256, false, 0xFF_FFFE);
    let (ak, bk, blk) = (a.mr.lkey, b.mr.rkey, b.mr.lkey);
    let s = |addr, len| Sge {
        addr,
        len,
        lkey: ak,
    };
    let w = |id, op, sge| SendWr {
        wr_id: id,
        op,
        sge,
        signaled: true,
        solicited: false,
    };
    a.qp.post_send(w(1, SendOp::Send, s(A_BASE, 600)), &a.mrs)
        .unwrap();
    a.qp.post_send(
        w(
            2,
            SendOp::WriteImm {
                remote_va: B_BASE,
                rkey: bk,
                imm: 9,
            },
            s(A_BASE, 700),
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        w(
            3,
            SendOp::Read {
                remote_va: B_BASE,
                rkey: bk,
            },
            s(A_BASE + 0x1000, 600),
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        w(
            4,
            SendOp::CompareSwap {
                remote_va: B_BASE + 0x800,
                rkey: bk,
                compare: 0,
                swap: 1,
            },
            s(A_BASE + 0x2000, 8),
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(
        w(
            5,
            SendOp::FetchAdd {
                remote_va: B_BASE + 0x800,
                rkey: bk,
                add: 1,
            },
            s(A_BASE + 0x2008, 8),
        ),
        &a.mrs,
    )
    .unwrap();
    a.qp.post_send(w(6, SendOp::SendImm(3), s(A_BASE, 10)), &a.mrs)
        .unwrap();
    a.qp.post_send(
        w(
            7,
            SendOp::Write {
                remote_va: B_BASE + 0x1000,
                rkey: bk,
            },
            s(A_BASE, 100),
        ),
        &a.mrs,
    )
    .unwrap();
    let mut hosts = [a, b];
    let mut link = Link::new(7, 0, 0, 0);
    link.capture = Some(vec![]);
    link.drop_nth = Some(2); // the SEND MIDDLE: the responder NAKs the gap
                             // No receive posted yet: RNR NAK; then post receives and finish.
    let t = run(&mut hosts, &mut link, 0, 100_000, |h| {
        h[1].qp.counters().rnr_nak_sent > 0
    });
    for i in 0..3u64 {
        let Host { qp, mrs, .. } = &mut hosts[1];
        qp.post_recv(
            RecvWr {
                wr_id: i,
                sge: Sge {
                    addr: B_BASE + 0x4000 + i * 0x1000,
                    len: 0x1000,
                    lkey: blk,
                },
            },
            mrs,
        )
        .unwrap();
    }
    run(&mut hosts, &mut link, t, 20_000_000, |h| h[0].cq.len() >= 7);
    assert!(
        hosts[0].cq.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        hosts[0].cq
    );
    let frames = link.capture.take().unwrap();
    let path = out_dir().join("transport_tshark.pcap");
    write_pcap(&path, &frames);
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.aeth.syndrome",
        ])
        .output()
        .unwrap_or_else(|e| {
            panic!("tshark not runnable ({e}); run scripts/setup.sh to install it")
        });
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), frames.len());
    let mut seen = std::collections::BTreeSet::new();
    for (line, f) in lines.iter().zip(&frames) {
        let ours = parse_frame(f, &ParseOptions::default(), |_| false).unwrap();
        let c: Vec<&str> = line.split('|').collect();
        assert_eq!(num(c[0]), ours.bth.opcode as u64, "{line}");
        assert_eq!(num(c[1]), u64::from(ours.bth.psn), "{line}");
        assert_eq!(num(c[2]), u64::from(ours.bth.dest_qp), "{line}");
        if let Some(a) = ours.aeth {
            assert_eq!(num(c[3]), u64::from(a.syndrome.to_u8()), "{line}");
            seen.insert(format!("aeth:{:#04x}", a.syndrome.to_u8() & 0xE0));
        }
        seen.insert(format!("{:?}", ours.bth.opcode));
    }
    for must in [
        "SendFirst",
        "SendMiddle",
        "SendLast",
        "SendOnlyImm",
        "WriteFirst",
        "WriteMiddle",
        "WriteLastImm",
        "WriteOnly",
        "ReadRequest",
        "ReadResponseFirst",
        "ReadResponseMiddle",
        "ReadResponseLast",
        "Acknowledge",
        "AtomicAcknowledge",
        "CompareSwap",
        "FetchAdd",
        "aeth:0x20",
        "aeth:0x60",
    ] {
        assert!(seen.contains(must), "{must} not seen in {seen:?}");
    }
    scapy_check("transport_scapy.pcap", &frames);
}

/// The communication manager's MADs (IBA 12.6) as QP1 carries them on RoCE v2 (a UD
/// SEND Only to QP 1 with the GSI Q_Key): Wireshark's InfiniBand dissector decodes
/// the MAD header, each message's fields and rdma_cm's IP private data where
/// `rdma::wire::cm` put them.
#[test]
fn tshark_decodes_cm_mads() {
    use rdma::wire::cm::*;
    use rdma::wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 0, 0, 1]);
    let mut pd = [0u8; 92];
    CmaHdr::ipv4([10, 0, 0, 1], 40001, [10, 0, 0, 2])
        .emit(&mut pd)
        .unwrap();
    let req = CmReq {
        local_comm_id: 0x1111_2222,
        vendor_id: 0,
        service_id: service_id(RDMA_PS_TCP, 18515),
        local_ca_guid: 0x0202_03ff_fe04_0506,
        local_qkey: 0,
        local_qpn: 0x00_1234,
        responder_resources: 16,
        initiator_depth: 16,
        remote_cm_response_timeout: 20,
        transport: 0,
        e2e_flow_control: false,
        starting_psn: 0xAB_CDEF,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 3,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        primary: CmPath {
            local_lid: 0xFFFF,
            remote_lid: 0xFFFF,
            local_gid: gid,
            remote_gid: gid,
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 18,
        },
        alternate: CmPath::default(),
        private_data: pd,
    };
    let rep = CmRep {
        local_comm_id: 0x3333_4444,
        remote_comm_id: 0x1111_2222,
        local_qkey: 0,
        local_qpn: 0x00_5678,
        vendor_id: 0,
        starting_psn: 0x12_3456,
        responder_resources: 16,
        initiator_depth: 16,
        target_ack_delay: 15,
        failover_accepted: 0,
        e2e_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 7,
        private_data: [0u8; 196],
    };
    let ids = CmIds {
        local_comm_id: 0x1111_2222,
        remote_comm_id: 0x3333_4444,
        private_data: [0u8; 224],
    };
    let rej = CmRej {
        local_comm_id: 0x5555_6666,
        remote_comm_id: 0x1111_2222,
        message_rejected: 0,
        ari_len: 0,
        reason: rej_reason::CONSUMER_DEFINED,
        ari: [0u8; 72],
        private_data: [0u8; 148],
    };
    let dreq = CmDreq {
        local_comm_id: 0x1111_2222,
        remote_comm_id: 0x3333_4444,
        remote_qpn: 0x00_5678,
        private_data: [0u8; 220],
    };
    let msgs = [
        CmMessage::Req(Box::new(req)),
        CmMessage::Rep(Box::new(rep)),
        CmMessage::Rtu(Box::new(ids)),
        CmMessage::Rej(Box::new(rej)),
        CmMessage::Dreq(Box::new(dreq)),
    ];
    let b = builder();
    let frames: Vec<Vec<u8>> = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut mad = [0u8; MAD_LEN];
            CmMad {
                tid: 0x0000_00AB_0000_0000 | i as u64,
                attr_mod: 0,
                msg: m.clone(),
            }
            .emit(&mut mad)
            .unwrap();
            let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnly, GSI_QPN, i as u32));
            r.deth = Some(DethRepr {
                qkey: GSI_QKEY,
                src_qp: GSI_QPN,
            });
            let mut buf = vec![0u8; 512];
            let n = b.emit_frame(&r, &mad, Ecn::Ect0, &mut buf).unwrap();
            buf.truncate(n);
            buf
        })
        .collect();
    let path = out_dir().join("golden_cm.pcap");
    write_pcap(&path, &frames);
    let fields = [
        "infiniband.mad.mgmtclass",
        "infiniband.mad.attributeid",
        "infiniband.mad.transactionid",
        "infiniband.cm.req.serviceid",
        "infiniband.cm.req.localqpn",
        "infiniband.cm.req.startpsn",
        "infiniband.cm.req.pppmtu",
        "infiniband.cm.req.retrcount",
        "infiniband.cm.req.prim_hoplim",
        "infiniband.cm.req.prim_localacktout",
        "infiniband.cm.req.ip_cm.sport",
        "infiniband.cm.req.ip_cm.sip4",
        "infiniband.cm.req.ip_cm.dip4",
        "infiniband.cm.rep.remotecommid",
        "infiniband.cm.rep.localqpn",
        "infiniband.cm.rep.startpsn",
        "infiniband.cm.rtu.localcommid",
        "infiniband.cm.rtu.remotecommid",
        "infiniband.cm.rej.reason",
        "infiniband.cm.dreq.localcommid",
    ];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("tshark not runnable ({e}); run scripts/setup.sh"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('|').collect()).collect();
    assert_eq!(rows.len(), msgs.len(), "{text}");
    let col =
        |r: usize, name: &str| -> &str { rows[r][fields.iter().position(|f| *f == name).unwrap()] };
    for (i, m) in msgs.iter().enumerate() {
        assert_eq!(num(col(i, "infiniband.mad.mgmtclass")), 7, "{text}");
        assert_eq!(
            num(col(i, "infiniband.mad.attributeid")),
            m.attr() as u64,
            "{text}"
        );
        assert_eq!(
            num(col(i, "infiniband.mad.transactionid")),
            0x0000_00AB_0000_0000 | i as u64
        );
    }
    assert_eq!(num(col(0, "infiniband.cm.req.serviceid")), 0x0106_4853);
    assert_eq!(num(col(0, "infiniband.cm.req.localqpn")), 0x1234);
    assert_eq!(num(col(0, "infiniband.cm.req.startpsn")), 0xAB_CDEF);
    assert_eq!(num(col(0, "infiniband.cm.req.pppmtu")), 3);
    assert_eq!(num(col(0, "infiniband.cm.req.retrcount")), 7);
    assert_eq!(num(col(0, "infiniband.cm.req.prim_hoplim")), 64);
    assert_eq!(num(col(0, "infiniband.cm.req.prim_localacktout")), 18);
    assert_eq!(
        num(col(0, "infiniband.cm.req.ip_cm.sport")),
        40001,
        "{text}"
    );
    assert_eq!(col(0, "infiniband.cm.req.ip_cm.sip4"), "10.0.0.1", "{text}");
    assert_eq!(col(0, "infiniband.cm.req.ip_cm.dip4"), "10.0.0.2", "{text}");
    assert_eq!(num(col(1, "infiniband.cm.rep.remotecommid")), 0x1111_2222);
    assert_eq!(num(col(1, "infiniband.cm.rep.localqpn")), 0x5678);
    assert_eq!(num(col(1, "infiniband.cm.rep.startpsn")), 0x12_3456);
    assert_eq!(num(col(2, "infiniband.cm.rtu.localcommid")), 0x1111_2222);
    assert_eq!(num(col(2, "infiniband.cm.rtu.remotecommid")), 0x3333_4444);
    assert_eq!(num(col(3, "infiniband.cm.rej.reason")), 28);
    assert_eq!(num(col(4, "infiniband.cm.dreq.localcommid")), 0x1111_2222);
    // Our parser reads back what tshark read.
    for (f, m) in frames.iter().zip(&msgs) {
        let p = parse_frame(f, &ParseOptions::default(), |_| false).unwrap();
        assert_eq!(&CmMad::parse(p.payload).unwrap().msg, m);
    }
}
