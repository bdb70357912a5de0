//! A two-host in-memory harness for the RC transport: each host has a QP, an MR table and
//! a `VecMemory`; frames are really built, parsed (ICRC checked) and delivered through a
//! link that can lose, duplicate and reorder them, in virtual time.
#![allow(dead_code)]

use rdma::transport::*;
use rdma::wire::frame::{FrameBuilder, NetHeaders};
use rdma::wire::*;

pub struct Host {
    pub qp: Qp,
    pub mrs: MrTable,
    pub mem: VecMemory,
    pub fb: FrameBuilder,
    pub mr: Mr,
    pub cq: Vec<WorkCompletion>,
    pub events: Vec<QpEvent>,
}

pub const A_BASE: u64 = 0x10_0000;
pub const B_BASE: u64 = 0x80_0000;
pub const MEM_LEN: usize = 256 * 1024;

fn net(i: u8) -> NetHeaders {
    NetHeaders {
        src_mac: EthernetAddress([2, 0, 0, 0, 0, i]),
        dst_mac: EthernetAddress([2, 0, 0, 0, 0, 3 - i]),
        src_ip: Ipv4Address([10, 0, 0, i]),
        dst_ip: Ipv4Address([10, 0, 0, 3 - i]),
        udp_src_port: 0xC000 + u16::from(i),
        dscp: 26,
        ttl: 64,
    }
}

impl Host {
    pub fn new(i: u8, cfg: QpConfig, base: u64) -> Host {
        let mut qp = Qp::new(cfg).unwrap();
        qp.modify(QpState::Init).unwrap();
        qp.modify(QpState::Rtr).unwrap();
        qp.modify(QpState::Rts).unwrap();
        let mut mrs = MrTable::new();
        let mr = mrs
            .register(
                base,
                MEM_LEN as u64,
                Access::LOCAL_WRITE
                    | Access::REMOTE_WRITE
                    | Access::REMOTE_READ
                    | Access::REMOTE_ATOMIC,
            )
            .unwrap();
        Host {
            qp,
            mrs,
            mem: VecMemory::new(base, MEM_LEN),
            fb: FrameBuilder {
                net: net(i),
                int: None,
            },
            mr,
            cq: vec![],
            events: vec![],
        }
    }

    pub fn drain(&mut self) {
        while let Some(c) = self.qp.poll_cq() {
            self.cq.push(c);
        }
        while let Some((e, _)) = self.qp.poll_event() {
            self.events.push(e);
        }
    }
}

/// Two connected QPs (A: qpn 0x11, B: qpn 0x22).
pub fn pair(pmtu: u32, cc_ext: bool, sq_psn: u32) -> (Host, Host) {
    pair_with(pmtu, cc_ext, sq_psn, 1)
}

/// Two connected QPs with responder ACK coalescing `ack_coalesce`.
pub fn pair_with(pmtu: u32, cc_ext: bool, sq_psn: u32, ack_coalesce: u16) -> (Host, Host) {
    let base = QpConfig {
        pmtu,
        cc_ext,
        ack_read_responses: cc_ext,
        timeout_ns: 40_000,
        ..Default::default()
    };
    pair_from(base, sq_psn, ack_coalesce)
}

/// Two connected QPs configured as `base` (QPNs and PSNs set here).
pub fn pair_from(base: QpConfig, sq_psn: u32, ack_coalesce: u16) -> (Host, Host) {
    let a = QpConfig {
        qpn: 0x11,
        dest_qpn: 0x22,
        sq_psn,
        rq_psn: 0x100,
        ..base
    };
    let b = QpConfig {
        qpn: 0x22,
        dest_qpn: 0x11,
        sq_psn: 0x100,
        rq_psn: sq_psn,
        ..base
    };
    let (mut ha, mut hb) = (Host::new(1, a, A_BASE), Host::new(2, b, B_BASE));
    ha.qp.set_peer_ip(hb.fb.net.src_ip.0);
    hb.qp.set_peer_ip(ha.fb.net.src_ip.0);
    hb.qp.set_ack_coalesce(ack_coalesce);
    (ha, hb)
}

/// Deterministic xorshift for link faults.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
}

pub struct Link {
    pub rng: Rng,
    pub loss: u64,
    pub dup: u64,
    pub jitter_ns: u64,
    pub delay_ns: u64,
    pub up: bool,
    /// (deliver_at, seq, to, frame)
    pub q: Vec<(u64, u64, usize, Vec<u8>)>,
    seq: u64,
    pub mark_ce: u64,
    pub sent: u64,
    /// Every frame offered to the link, if capturing (for pcap golden tests).
    pub capture: Option<Vec<Vec<u8>>>,
    /// Drop exactly the n-th frame offered (1-based), if set.
    pub drop_nth: Option<u64>,
}

impl Link {
    pub fn new(seed: u64, loss: u64, dup: u64, jitter_ns: u64) -> Link {
        Link {
            rng: Rng(seed | 1),
            loss,
            dup,
            jitter_ns,
            delay_ns: 2_000,
            up: true,
            q: vec![],
            seq: 0,
            mark_ce: 0,
            sent: 0,
            capture: None,
            drop_nth: None,
        }
    }

    fn push(&mut self, now: u64, to: usize, f: Vec<u8>) {
        let j = if self.jitter_ns > 0 {
            self.rng.next() % self.jitter_ns
        } else {
            0
        };
        self.seq += 1;
        self.q.push((now + self.delay_ns + j, self.seq, to, f));
    }

    pub fn send(&mut self, now: u64, to: usize, mut f: Vec<u8>) {
        self.sent += 1;
        if let Some(c) = &mut self.capture {
            c.push(f.clone());
        }
        if !self.up || self.rng.chance(self.loss) || self.drop_nth == Some(self.sent) {
            return;
        }
        if self.mark_ce > 0 && self.rng.chance(self.mark_ce) {
            let mut ip = Ipv4Packet::new_checked(&mut f[14..]).unwrap();
            ip.set_ecn(Ecn::Ce);
            ip.fill_checksum();
        }
        if self.rng.chance(self.dup) {
            self.push(now, to, f.clone());
        }
        self.push(now, to, f);
    }

    pub fn due(&mut self, now: u64) -> Vec<(usize, Vec<u8>)> {
        self.q.sort_by_key(|(t, s, _, _)| (*t, *s));
        let n = self.q.iter().take_while(|(t, ..)| *t <= now).count();
        self.q.drain(..n).map(|(_, _, to, f)| (to, f)).collect()
    }

    pub fn next_time(&self) -> Option<u64> {
        self.q.iter().map(|(t, ..)| *t).min()
    }
}

/// Runs both hosts until `done` or `limit_ns` of virtual time. Returns the end time.
pub fn run(
    hosts: &mut [Host; 2],
    link: &mut Link,
    start: u64,
    limit_ns: u64,
    mut done: impl FnMut(&[Host; 2]) -> bool,
) -> u64 {
    let mut now = start;
    let mut buf = vec![0u8; 8192];
    while now < start + limit_ns {
        let mut busy = false;
        for (i, h) in hosts.iter_mut().enumerate() {
            h.qp.on_timer(now);
            let mut burst = 0;
            while burst < 16 {
                let Some(p) = h.qp.poll_tx(now) else { break };
                // A QP that negotiated no extension is plain RoCEv2 on the wire.
                if !h.qp.config().cc_ext {
                    assert!(p.repr.ccext.is_none() && (p.repr.bth.opcode as u8) < 0x80);
                }
                let gather = h.qp.gather_list(&p.payload);
                let n = p
                    .build_frame_gather(&h.fb, &h.mem, gather, &mut buf)
                    .unwrap();
                link.send(now, 1 - i, buf[..n].to_vec());
                burst += 1;
                busy = true;
            }
            h.drain();
        }
        for (to, f) in link.due(now) {
            busy = true;
            let h = &mut hosts[to];
            let cc = h.qp.config().cc_ext;
            let fr = parse_frame(&f, &ParseOptions::default(), |_| cc)
                .expect("frames on the link are well formed");
            if std::env::var_os("RDMA_TRACE").is_some() {
                eprintln!(
                    "t={now} ->{to} {:?} psn={:#x} aeth={:?} len={}",
                    fr.bth.opcode,
                    fr.bth.psn,
                    fr.aeth.map(|a| a.syndrome),
                    fr.payload.len()
                );
            }
            let Host { qp, mrs, mem, .. } = h;
            qp.on_rx(&fr, now, mrs, mem);
            h.drain();
        }
        if done(hosts) {
            return now;
        }
        // Advance: 500 ns steps while busy, else jump to the next event.
        let mut next = now + 500;
        let idle = link.q.is_empty() && !busy;
        if idle {
            let t = hosts.iter().filter_map(|h| h.qp.next_timer()).min();
            if let Some(t) = t {
                next = next.max(t);
            }
        }
        now = next;
    }
    now
}

/// Delivers a packet built from `p` (payload read from `from`'s memory) to `to` at
/// time `now`, through a real frame (built, parsed, ICRC checked).
pub fn deliver_at(from: &Host, p: &TxPacket, to: &mut Host, now: u64) {
    let payload: Vec<u8> = match p.payload {
        Payload::None => vec![],
        Payload::Local { va, len, .. } | Payload::Remote { va, len, .. } => {
            from.mem.read(va, len as usize).to_vec()
        }
        Payload::Gather { offset, len, .. } => {
            sgl::pieces(from.qp.gather_list(&p.payload), offset, len)
                .flat_map(|s| from.mem.read(s.addr, s.len as usize).to_vec())
                .collect()
        }
    };
    let mut buf = vec![0u8; 8192];
    let n = from
        .fb
        .emit_frame(&p.repr, &payload, p.ecn, &mut buf)
        .unwrap();
    let cc = to.qp.config().cc_ext;
    let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| cc).unwrap();
    let Host { qp, mrs, mem, .. } = to;
    qp.on_rx(&f, now, mrs, mem);
    to.drain();
}

/// [`deliver_at`] at time 0.
pub fn deliver(from: &Host, p: &TxPacket, to: &mut Host) {
    deliver_at(from, p, to, 0);
}

/// Runs A and B in lockstep without a link (time 0): every packet A sends goes through
/// `tamper` and to B, and what B answers goes to A before A's next packet, until both
/// are quiet. Returns what B sent.
pub fn exchange(a: &mut Host, b: &mut Host, tamper: impl FnMut(&mut TxPacket)) -> Vec<TxPacket> {
    exchange_filtered(a, b, tamper, |_| true)
}

/// [`exchange`] where B's packets reach A only if `keep` says so (all are returned).
pub fn exchange_filtered(
    a: &mut Host,
    b: &mut Host,
    mut tamper: impl FnMut(&mut TxPacket),
    mut keep: impl FnMut(&TxPacket) -> bool,
) -> Vec<TxPacket> {
    let mut answers = vec![];
    let mut b_to_a = |a: &mut Host, b: &mut Host, answers: &mut Vec<TxPacket>| {
        let mut any = false;
        while let Some(p) = b.qp.poll_tx(0) {
            any = true;
            if keep(&p) {
                deliver(b, &p, a);
            }
            answers.push(p);
        }
        any
    };
    for _ in 0..1000 {
        let mut quiet = !b_to_a(a, b, &mut answers);
        while let Some(mut p) = a.qp.poll_tx(0) {
            quiet = false;
            tamper(&mut p);
            deliver(a, &p, b);
            b_to_a(a, b, &mut answers);
        }
        if quiet {
            break;
        }
    }
    a.drain();
    b.drain();
    answers
}

/// Feeds a request built by hand to `h`, as if from its peer, and returns what it
/// answers.
pub fn feed(h: &mut Host, r: rdma::wire::frame::RoceRepr, payload: &[u8]) -> Vec<TxPacket> {
    let mut buf = vec![0u8; 2048];
    let me = h.fb.net;
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: me.dst_mac,
            dst_mac: me.src_mac,
            src_ip: me.dst_ip,
            dst_ip: me.src_ip,
            ..me
        },
        int: None,
    };
    let n = fb
        .emit_frame(&r, payload, rdma::wire::Ecn::Ect0, &mut buf)
        .unwrap();
    let f = rdma::wire::parse_frame(&buf[..n], &Default::default(), |_| false).unwrap();
    let Host { qp, mrs, mem, .. } = h;
    qp.on_rx(&f, 0, mrs, mem);
    let mut out = vec![];
    while let Some(p) = h.qp.poll_tx(0) {
        out.push(p);
    }
    out
}

/// A signaled send WR with one SGE.
pub fn wr(id: u64, op: SendOp, addr: u64, len: u32, lkey: u32) -> SendWr {
    SendWr {
        wr_id: id,
        op,
        sge: Sge { addr, len, lkey },
        signaled: true,
        solicited: false,
    }
}

/// Writes a recognisable pattern of `len` bytes at `va`; returns it.
pub fn fill(h: &mut Host, va: u64, len: usize, seed: u8) -> Vec<u8> {
    let d: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    h.mem.write(va, &d);
    d
}
