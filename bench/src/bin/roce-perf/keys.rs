//! The key exchange of a session (see [`crate::setup`]): this end's QPs and buffer
//! told to the peer and the peer's read back, in perftest's key messages or in our
//! `RSNIC1` lines, each checked.

use std::io::Write;
use std::net::TcpStream;

use bench::perftest::AddressLine;
use nic::verbs::{Device, MemoryRegion, QpOptions, QueuePair};
use oob::exchange::{check_compatible, ConnInfo};
use oob::perftest::{KeyMsg, PerftestConn};

use crate::cli::{Opts, Test};
use crate::link::{read_line, Layout, Link, Remote};
use crate::Res;

/// What this end tells the peer about its QPs.
pub(super) struct Mine<'a> {
    pub(super) qps: &'a [QueuePair],
    pub(super) qopts: &'a QpOptions,
    pub(super) mr: &'a MemoryRegion,
    pub(super) layout: &'a Layout,
    pub(super) mtu: u32,
    pub(super) server: bool,
}

/// What the key exchange gave: the link for the rest of the session, the peer's
/// QPs, the address lines to print (local, remote) per QP, and the peer's MACs
/// (our exchange carries them; perftest's does not: ARP).
pub(super) struct Exchanged {
    pub(super) link: Link,
    pub(super) remotes: Vec<Remote>,
    pub(super) lines: Vec<(AddressLine, AddressLine)>,
    pub(super) macs: Vec<[u8; 6]>,
}

/// perftest's key exchange, one key message per QP each way (write_lat and
/// read_lat shake hands once before the keys).
pub(super) fn exchange_perftest(
    test: &Test,
    o: &Opts,
    mut conn: PerftestConn<TcpStream>,
    me: &Mine<'_>,
) -> Res<Exchanged> {
    let mine: Vec<KeyMsg> = me
        .qps
        .iter()
        .enumerate()
        .map(|(q, qp)| {
            let ri = qp.remote_info();
            KeyMsg {
                lid: 0,
                out_reads: u16::from(me.qopts.max_rd_atomic),
                qpn: ri.qpn,
                psn: ri.psn,
                rkey: me.mr.rkey(),
                vaddr: me.mr.va() + me.layout.incoming(q),
                gid: KeyMsg::gid_of(o.ip),
                srqn: 0,
            }
        })
        .collect();
    if matches!(test, Test::write_lat(_) | Test::read_lat(_)) {
        conn.handshake(&mine[0])?;
    }
    let mut remotes = Vec::with_capacity(mine.len());
    for m in &mine {
        let r = conn.handshake(m)?;
        let ip = r.ipv4().ok_or_else(|| {
            format!(
                "the peer's GID {} is not an IPv4 (RoCEv2) one: run it with -x and its RoCEv2 GID index",
                std::net::Ipv6Addr::from(r.gid)
            )
        })?;
        if matches!(test, Test::read_bw(_) | Test::read_lat(_))
            && !me.server
            && r.out_reads < u16::from(me.qopts.max_rd_atomic)
        {
            return Err(format!(
                "the peer takes {} outstanding READs; this NIC issues up to {}",
                r.out_reads, me.qopts.max_rd_atomic
            )
            .into());
        }
        remotes.push(Remote {
            qpn: r.qpn,
            psn: r.psn,
            ip,
            rkey: r.rkey,
            va: r.vaddr,
        });
    }
    let lines = mine
        .iter()
        .zip(&remotes)
        .map(|(m, r)| {
            (
                AddressLine {
                    qpn: m.qpn,
                    psn: m.psn,
                    rkey: m.rkey,
                    vaddr: m.vaddr,
                    ip: o.ip.octets(),
                },
                AddressLine {
                    qpn: r.qpn,
                    psn: r.psn,
                    rkey: r.rkey,
                    vaddr: r.va,
                    ip: r.ip.octets(),
                },
            )
        })
        .collect();
    Ok(Exchanged {
        link: Link::Perftest {
            conn,
            mine: mine[0],
        },
        remotes,
        lines,
        macs: Vec::new(),
    })
}

/// Our exchange: one `RSNIC1` line per QP each way (a server detects it by its
/// first byte: no handshake before it), each pair checked compatible.
pub(super) fn exchange_rsnic(
    o: &Opts,
    stream: TcpStream,
    dev: &Device,
    test_name: &str,
    me: &Mine<'_>,
) -> Res<Exchanged> {
    let mut s = stream;
    let mut ext: Vec<String> = if o.cc.uses_extensions() {
        vec!["cc".into()]
    } else {
        Vec::new()
    };
    if o.loss_recovery == rdma::transport::LossRecovery::Sr {
        // Both ends must run selective repeat: the exchange compares the
        // extensions as sets and refuses a mismatch.
        ext.push("sr".into());
    }
    let link = Link::Rsnic {
        s: s.try_clone()?,
        client: !me.server,
    };
    let (mut remotes, mut lines, mut macs) = (Vec::new(), Vec::new(), Vec::new());
    for (q, qp) in me.qps.iter().enumerate() {
        let ri = qp.remote_info();
        let l = ConnInfo {
            qpn: ri.qpn,
            psn: ri.psn,
            ip: o.ip,
            mac: dev.mac(),
            rkey: me.mr.rkey(),
            va: me.mr.va() + me.layout.incoming(q),
            len: me.layout.unit,
            mtu: me.mtu as u16,
            cc: o.cc,
            ext: ext.clone(),
            udp_sport: 0xC000 | (ri.qpn as u16 & 0x3FFF),
            test: test_name.to_string(),
        };
        let r = if me.server {
            let r = ConnInfo::parse(&read_line(&mut s)?)?;
            s.write_all(l.format()?.as_bytes())?;
            check_compatible(&l, &r)?;
            r
        } else {
            s.write_all(l.format()?.as_bytes())?;
            let r = ConnInfo::parse(&read_line(&mut s)?)?;
            check_compatible(&r, &l)?;
            r
        };
        if r.len < me.layout.unit {
            return Err(format!(
                "the peer's buffer is {} bytes, the test needs {}",
                r.len, me.layout.unit
            )
            .into());
        }
        lines.push((
            AddressLine {
                qpn: l.qpn,
                psn: l.psn,
                rkey: l.rkey,
                vaddr: l.va,
                ip: o.ip.octets(),
            },
            AddressLine {
                qpn: r.qpn,
                psn: r.psn,
                rkey: r.rkey,
                vaddr: r.va,
                ip: r.ip.octets(),
            },
        ));
        remotes.push(Remote {
            qpn: r.qpn,
            psn: r.psn,
            ip: r.ip,
            rkey: r.rkey,
            va: r.va,
        });
        // Our exchange carries the MAC (an override of ARP).
        macs.push(r.mac);
    }
    Ok(Exchanged {
        link,
        remotes,
        lines,
        macs,
    })
}
