//! The switch: classify, route, WRED/ECN, enqueue on receive; shape, push INT and
//! transmit on dequeue (DESIGN.md section 6).
//!
//! Time is an argument (ns); nothing reads a clock. All queues are allocated when the
//! switch is built; `receive` and `dequeue` allocate nothing (for packet types whose
//! `prepend` does not, e.g. an mbuf or [`crate::FrameBuf`]).

use crate::config::{Config, ConfigError, PortSettings, SwitchSettings};
use crate::counters::{PortCounters, StatsLine};
use crate::fib::Fib;
use crate::packet::PacketBuf;
use crate::queue::{Meta, PktQueue};
use crate::shaper::{wire_bytes, Shaper};
use crate::shared_buffer::SharedBuffer;

use crate::wred::{Rng, Wred, WredAction};
use rdma::wire::int::{self, HopRecord};
use rdma::wire::ROCEV2_UDP_PORT;

/// Ethernet header length (no VLAN tag: tagged frames are not IPv4 to this core).
const L3_OFF: usize = 14;
/// EtherType IPv4.
const ETHERTYPE_IPV4: u16 = 0x0800;
/// BTH length.
const BTH_LEN: usize = 12;
/// Queue tag bit: the frame carries an INT container (push at dequeue).
const TAG_INT: u8 = 1;
/// Queue tag bits 4..7: the frame's IPv4 IHL, so the push at dequeue finds the
/// container without parsing the headers again.
const TAG_IHL_SHIFT: u8 = 4;

/// BTH opcodes that go to the strict high-priority class: RC ACKNOWLEDGE (ACK and
/// every NAK), ATOMIC ACKNOWLEDGE, and the RoCEv2 CNP (DESIGN.md sections 4 and 6).
pub const CTRL_OPCODES: [u8; 3] = [0x11, 0x12, 0x81];

/// The traffic class a frame was queued in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Everything else: WRED/ECN applies.
    Data,
    /// ACK/NAK/CNP: strict priority, no WRED, own buffer.
    Control,
}

/// A frame accepted by [`Switch::receive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// Egress port id.
    pub port: u16,
    /// Class it was queued in.
    pub class: Class,
    /// WRED set CE on it.
    pub ce_marked: bool,
    /// It carries an INT container (a hop record is pushed at dequeue).
    pub int: bool,
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// `port_in` is not a configured port.
    UnknownPort,
    /// Truncated or inconsistent Ethernet/IPv4/UDP/INT/BTH, bad IPv4 checksum.
    Malformed,
    /// Not an IPv4 frame.
    NotIpv4,
    /// TTL 0 or 1 on arrival.
    TtlExpired,
    /// No route.
    Unroutable,
    /// Not-ECT at queue >= K (LDCP 004 section 2.3).
    WredNotEct,
    /// Data queue would exceed `buf_max`.
    TailDrop,
    /// Control queue would exceed `ctrl_buf_max`.
    CtrlTailDrop,
}

/// A dropped frame, handed back so the shell can free it in bulk.
#[derive(Debug)]
pub struct Rejected<P> {
    /// The frame.
    pub pkt: P,
    /// Why.
    pub reason: DropReason,
}

#[derive(Debug)]
struct Port<P> {
    id: u16,
    mac: [u8; 6],
    /// The link speed in the hop record's 100 Mbit/s units (computed once, not per frame).
    link_100m: u16,
    wred: Wred,
    rng: Rng,
    shaper: Shaper,
    data: PktQueue<P>,
    ctrl: PktQueue<P>,
    counters: PortCounters,
}

impl<P: PacketBuf> Port<P> {
    fn new(s: &PortSettings, seed: u64, idx: usize) -> Self {
        Self {
            id: s.id,
            mac: s.mac,
            link_100m: HopRecord::from_units(0, 0, 0, 0, 0, s.speed_bps).link_100m,
            wred: Wred::new(s.k_min, s.k_max, s.p_max, s.k_drop),
            // One stream per port so a port's decisions do not depend on the others'.
            rng: Rng::new(seed ^ (idx as u64).wrapping_mul(0xA24B_AED4_963E_E407)),
            shaper: Shaper::new(s.speed_bps, s.burst),
            data: PktQueue::for_packets(s.buf_max),
            ctrl: PktQueue::for_packets(s.ctrl_buf_max),
            counters: PortCounters::default(),
        }
    }

    #[inline]
    fn note_queue(&mut self) {
        let c = &mut self.counters;
        c.queue_bytes = self.data.bytes() + self.ctrl.bytes();
        c.queue_packets = (self.data.len() + self.ctrl.len()) as u64;
        c.queue_max_bytes = c.queue_max_bytes.max(c.queue_bytes);
    }
}

/// What the classifier learned about a frame, packed in one word (destination address,
/// ECN, TTL, control class, INT container): built with shifts, so it travels in a
/// register. A struct of bytes was assembled on the stack and read back wider, a
/// store-forwarding stall on every frame (perf: the hottest instruction of `receive`).
#[derive(Debug, Clone, Copy)]
struct Classified(u64);

impl Classified {
    #[inline(always)]
    fn new(dst: u32, ecn: u8, ttl: u8, ctrl: bool, int: bool, ihl: u8, sport: u16) -> Self {
        Self(
            u64::from(dst)
                | u64::from(ecn & 3) << 32
                | u64::from(ttl) << 34
                | u64::from(ctrl) << 42
                | u64::from(int) << 43
                | u64::from(ihl & 0xF) << 44
                | u64::from(sport) << 48,
        )
    }
    #[inline(always)]
    fn dst(self) -> u32 {
        self.0 as u32
    }
    #[inline(always)]
    fn ecn(self) -> u8 {
        (self.0 >> 32) as u8 & 3
    }
    #[inline(always)]
    fn ttl(self) -> u8 {
        (self.0 >> 34) as u8
    }
    #[inline(always)]
    fn ctrl(self) -> bool {
        self.0 >> 42 & 1 != 0
    }
    #[inline(always)]
    fn int(self) -> bool {
        self.0 >> 43 & 1 != 0
    }
    /// IPv4 header length in 32-bit words (IHL).
    #[inline(always)]
    fn ihl(self) -> u8 {
        (self.0 >> 44) as u8 & 0xF
    }
    /// UDP source port (0 for non-UDP): the ECMP flow key.
    #[inline(always)]
    fn sport(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

/// Parses just enough of the frame to forward and classify it: Ethernet, IPv4 (version,
/// IHL, total length, header checksum), UDP length, and for RoCEv2 the INT container
/// (INT v2.0 section 5.6: type, length, version, HopML, as `int::IntPacket::new_checked`)
/// and the BTH opcode. The same checks as the `rdma::wire` views (a test compares the
/// two on random and mutated frames), written on the bytes at fixed offsets so the
/// whole parse inlines into [`Switch::receive`] without a call or a view per layer;
/// every read is inside a slice whose length was checked first.
///
/// The result is built once at the end from locals into one word (see [`Classified`]).
#[inline(always)]
fn classify(b: &[u8], int_dscp: u8) -> Result<Classified, DropReason> {
    use DropReason::Malformed;
    if b.len() < L3_OFF {
        return Err(Malformed);
    }
    if u16::from_be_bytes([b[12], b[13]]) != ETHERTYPE_IPV4 {
        return Err(DropReason::NotIpv4);
    }
    let ip = &b[L3_OFF..];
    if ip.len() < rdma::wire::ipv4::HEADER_LEN || ip[0] >> 4 != 4 {
        return Err(Malformed);
    }
    let hl = usize::from(ip[0] & 0xF) * 4;
    let tl = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if hl < rdma::wire::ipv4::HEADER_LEN || hl > ip.len() || tl < hl || tl > ip.len() {
        return Err(Malformed);
    }
    if ipv4_header_checksum(&ip[..hl]) != 0 {
        return Err(Malformed);
    }
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    let (tos, ttl, proto) = (ip[1], ip[8], ip[9]);
    let ff = u16::from_be_bytes([ip[6], ip[7]]);
    let ihl = (hl / 4) as u8;
    let done = |ctrl: bool, int: bool, sport: u16| {
        Ok(Classified::new(dst, tos & 3, ttl, ctrl, int, ihl, sport))
    };
    // Only unfragmented UDP can be RoCEv2 (RoCEv2 never fragments); other IPv4 is
    // forwarded without looking further.
    if proto != rdma::wire::ipv4::PROTO_UDP || ff & 0x3FFF != 0 {
        return done(false, false, 0);
    }
    let l4 = &ip[hl..tl];
    if l4.len() < rdma::wire::udp::HEADER_LEN {
        return Err(Malformed);
    }
    let ul = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
    if ul < rdma::wire::udp::HEADER_LEN || ul > l4.len() {
        return Err(Malformed);
    }
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    if u16::from_be_bytes([l4[2], l4[3]]) != ROCEV2_UDP_PORT {
        return done(false, false, sport);
    }
    let udp = &l4[..ul];
    let mut bth_off = rdma::wire::udp::HEADER_LEN;
    let int = tos >> 2 == int_dscp;
    if int {
        // INT-MD over UDP: shim + MD header + hop stack before BTH.
        let c = &udp[bth_off..];
        if c.len() < int::HEADER_LEN
            || c[0] >> 4 != int::TYPE_INT_MD
            || c[4] >> 4 != int::MD_VERSION
            || c[6] & 0x1F != int::HOP_ML_WORDS
        {
            return Err(Malformed);
        }
        let words = c[1];
        if words < 4 || (words - 4) % int::HOP_ML_WORDS != 0 || usize::from(words) * 4 > c.len() {
            return Err(Malformed);
        }
        bth_off += usize::from(words) * 4;
    }
    if bth_off + BTH_LEN > udp.len() {
        return Err(Malformed);
    }
    done(CTRL_OPCODES.contains(&udp[bth_off]), int, sport)
}

/// The ECMP flow hash of a UDP source port under a switch's seed (a splitmix64 finaliser:
/// every input bit reaches every output bit, so `hash % members` spreads evenly).
#[inline]
pub fn ecmp_hash(sport: u16, seed: u64) -> u32 {
    let mut z = u64::from(sport) ^ seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// RFC 1624 eq. 3 incremental checksum update for one 16-bit word.
#[inline(always)]
fn csum_adjust(hc: u16, old: u16, new: u16) -> u16 {
    let mut s = u32::from(!hc) + u32::from(!old) + u32::from(new);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    !(s as u16)
}

/// Next-hop MAC rewrite, TTL decrement and optional CE mark, with the IPv4 checksum
/// updated incrementally. TTL and ECN are masked in the ICRC (IBA A17.2.3 / rxe), so
/// the frame's ICRC stays valid. `b` was validated by [`classify`].
#[inline(always)]
fn rewrite(b: &mut [u8], dst_mac: &[u8; 6], src_mac: &[u8; 6], set_ce: bool) {
    b[0..6].copy_from_slice(dst_mac);
    b[6..12].copy_from_slice(src_mac);
    let ip = &mut b[L3_OFF..];
    let mut hc = u16::from_be_bytes([ip[10], ip[11]]);
    let w0 = u16::from_be_bytes([ip[0], ip[1]]);
    if set_ce {
        ip[1] |= 3;
        hc = csum_adjust(hc, w0, u16::from_be_bytes([ip[0], ip[1]]));
    }
    let w4 = u16::from_be_bytes([ip[8], ip[9]]);
    ip[8] = ip[8].wrapping_sub(1);
    hc = csum_adjust(hc, w4, u16::from_be_bytes([ip[8], ip[9]]));
    ip[10..12].copy_from_slice(&hc.to_be_bytes());
}

/// Bytes up to the end of the INT MD header when IPv4 has no options: Ethernet 14,
/// IPv4 20, UDP 8, shim + MD header 16.
const MD_END_NO_OPTIONS: usize = L3_OFF + 20 + rdma::wire::udp::HEADER_LEN + int::HEADER_LEN;

/// Outcome of this hop's INT push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntPush {
    Pushed,
    Full,
    Error,
}

/// The IPv4 header checksum over `h` (a whole header, a multiple of 4 bytes): the
/// ones' complement sum taken over 32-bit words and folded, which is the same value as
/// `rdma::wire::internet_checksum` (2^16 = 1 modulo 2^16 - 1) in a third of the steps.
/// Verifying a header: the result over the header including its checksum is 0.
#[inline(always)]
fn ipv4_header_checksum(h: &[u8]) -> u16 {
    let mut s: u64 = 0;
    for w in h.chunks_exact(4) {
        s += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    s = (s & 0xFFFF_FFFF) + (s >> 32);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    !(s as u16)
}

/// Pushes `hop` after the MD header of a frame that [`classify`] accepted with an INT
/// container, its IPv4 header `ihl` words long (INT v2.0 section 5.7, the same bytes
/// as `rdma::wire::int::push_hop_front`): the headers up to the MD header move 16
/// bytes into the headroom that [`PacketBuf::prepend`] opens, the payload stays; shim
/// length +4 words, RemainingHopCnt -1, IPv4 total length and UDP length +16, UDP
/// checksum 0 (RoCEv2 sends none), IPv4 checksum updated incrementally (RFC 1624).
/// E is set instead when RemainingHopCnt is 0 or the stack is full. A frame without
/// headroom, or whose lengths would overflow, is an `Error` and untouched.
///
/// `classify` checked the container (type, version, HopML, length within UDP) and
/// nothing has changed those bytes since, so only the offsets are computed here.
#[inline]
fn push_int<P: PacketBuf>(pkt: &mut P, hop: &HopRecord, ihl: u8) -> IntPush {
    let udp_off = L3_OFF + usize::from(ihl) * 4;
    let int_off = udp_off + rdma::wire::udp::HEADER_LEN;
    let md_end = int_off + int::HEADER_LEN;
    let b = pkt.bytes();
    if b.len() < md_end {
        return IntPush::Error;
    }
    let int_len = usize::from(b[int_off + 1]) * 4;
    if b[int_off + int::SHIM_LEN + 3] == 0
        || int_len + int::HOP_LEN > int::MAX_HOPS_WIRE * int::HOP_LEN + int::HEADER_LEN
    {
        pkt.bytes_mut()[int_off + int::SHIM_LEN] |= (int::MdFlags::E.bits() >> 24) as u8;
        return IntPush::Full;
    }
    let tl = u16::from_be_bytes([b[L3_OFF + 2], b[L3_OFF + 3]]);
    let ul = u16::from_be_bytes([b[udp_off + 4], b[udp_off + 5]]);
    let (Some(ntl), Some(nul)) = (
        tl.checked_add(int::HOP_LEN as u16),
        ul.checked_add(int::HOP_LEN as u16),
    ) else {
        return IntPush::Error;
    };
    if !pkt.prepend(int::HOP_LEN) {
        return IntPush::Error;
    }
    let b = pkt.bytes_mut();
    if md_end == MD_END_NO_OPTIONS {
        // The common case, a constant length: a few vector moves instead of a memmove
        // call (the source and destination overlap; the copy goes through registers).
        let mut hdr = [0u8; MD_END_NO_OPTIONS];
        hdr.copy_from_slice(&b[int::HOP_LEN..int::HOP_LEN + MD_END_NO_OPTIONS]);
        b[..MD_END_NO_OPTIONS].copy_from_slice(&hdr);
    } else {
        b.copy_within(int::HOP_LEN..int::HOP_LEN + md_end, 0);
    }
    let mut rec = [0u8; int::HOP_LEN];
    let _ = hop.emit(&mut rec);
    b[md_end..md_end + int::HOP_LEN].copy_from_slice(&rec);
    b[int_off + 1] += int::HOP_ML_WORDS;
    b[int_off + int::SHIM_LEN + 3] -= 1;
    let hc = u16::from_be_bytes([b[L3_OFF + 10], b[L3_OFF + 11]]);
    b[L3_OFF + 10..L3_OFF + 12].copy_from_slice(&csum_adjust(hc, tl, ntl).to_be_bytes());
    b[L3_OFF + 2..L3_OFF + 4].copy_from_slice(&ntl.to_be_bytes());
    b[udp_off + 4..udp_off + 6].copy_from_slice(&nul.to_be_bytes());
    b[udp_off + 6] = 0;
    b[udp_off + 7] = 0;
    IntPush::Pushed
}

/// The switch core over packets of type `P`.
#[derive(Debug)]
pub struct Switch<P> {
    switch_id: u16,
    int_dscp: u8,
    fcs_in_frame: bool,
    /// Port id -> index into `ports` (`u32::MAX`: none).
    id_to_idx: Box<[u32]>,
    ports: Box<[Port<P>]>,
    fib: Fib,
    /// Per-switch ECMP hash seed (from the settings' seed), so that the layers of a
    /// fabric do not all pick the same member for a flow (hash polarisation).
    ecmp_seed: u64,
    unknown_port_rx: u64,
    /// The data queues' shared pool with its dynamic threshold, if configured.
    shared: Option<SharedBuffer>,
}

impl<P: PacketBuf> Switch<P> {
    /// Builds a switch from validated settings; all queues are allocated here.
    pub fn new(s: &SwitchSettings) -> Self {
        let max_id = s.ports.iter().map(|p| p.id).max().unwrap_or(0);
        let mut id_to_idx = vec![u32::MAX; usize::from(max_id) + 1].into_boxed_slice();
        let mut ports = Vec::with_capacity(s.ports.len());
        for (i, p) in s.ports.iter().enumerate() {
            if id_to_idx[usize::from(p.id)] == u32::MAX {
                id_to_idx[usize::from(p.id)] = i as u32;
            }
            ports.push(Port::new(p, s.seed, i));
        }
        let fib = Fib::new(&s.routes, |id| {
            id_to_idx
                .get(usize::from(id))
                .filter(|&&i| i != u32::MAX)
                .map(|&i| i as usize)
        });
        Self {
            switch_id: s.switch_id,
            int_dscp: s.int_dscp,
            fcs_in_frame: s.fcs_in_frame,
            id_to_idx,
            ports: ports.into_boxed_slice(),
            fib,
            ecmp_seed: s.seed ^ u64::from(s.switch_id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            unknown_port_rx: 0,
            shared: None,
        }
    }

    /// Validates `cfg` and builds the switch.
    pub fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        Ok(Self::new(&cfg.validate()?))
    }

    #[inline]
    fn idx(&self, port: u16) -> Option<usize> {
        match self.id_to_idx.get(usize::from(port)) {
            Some(&i) if i != u32::MAX => Some(i as usize),
            _ => None,
        }
    }

    /// Takes a frame that arrived on `port_in` at `now` (ns): parses it, looks up the
    /// route, applies WRED/ECN (LDCP 004 section 2.1; Not-ECT drop at K, section 2.3) or
    /// the control class, rewrites MACs/TTL (and CE), and queues it on the egress port.
    /// Every drop is counted and the frame handed back.
    ///
    /// `now` is the frame's arrival time: on an idle link it starts from then (see
    /// [`Shaper::start_time`]), so a late poll loses no link time and the INT `ts` is
    /// the departure time an ideal port would stamp.
    pub fn receive(&mut self, port_in: u16, mut pkt: P, now: u64) -> Result<Enqueued, Rejected<P>> {
        let Some(ii) = self.idx(port_in) else {
            self.unknown_port_rx += 1;
            return Err(Rejected {
                pkt,
                reason: DropReason::UnknownPort,
            });
        };
        let len = pkt.len();
        let ic = &mut self.ports[ii].counters;
        ic.rx_packets += 1;
        ic.rx_bytes += len as u64;
        let reject = |ic: &mut PortCounters, pkt: P, reason: DropReason| {
            match reason {
                DropReason::Malformed => ic.rx_malformed += 1,
                DropReason::NotIpv4 => ic.rx_not_ipv4 += 1,
                DropReason::TtlExpired => ic.rx_ttl_expired += 1,
                _ => ic.rx_unroutable += 1,
            }
            Err(Rejected { pkt, reason })
        };
        let c = match classify(pkt.bytes(), self.int_dscp) {
            Ok(c) => c,
            Err(r) => return reject(ic, pkt, r),
        };
        let Ok(len32) = u32::try_from(len) else {
            return reject(ic, pkt, DropReason::Malformed);
        };
        let seed = self.ecmp_seed;
        let Some(nh) = self.fib.lookup(c.dst(), || ecmp_hash(c.sport(), seed)) else {
            return reject(ic, pkt, DropReason::Unroutable);
        };
        if c.ttl() <= 1 {
            return reject(ic, pkt, DropReason::TtlExpired);
        }
        let out = &mut self.ports[nh.port_idx];
        let tag = if c.int() {
            TAG_INT | c.ihl() << TAG_IHL_SHIFT
        } else {
            0
        };
        let (class, mark) = if c.ctrl() {
            if !out.ctrl.fits(u64::from(len32)) {
                out.counters.ctrl_tail_drops += 1;
                return Err(Rejected {
                    pkt,
                    reason: DropReason::CtrlTailDrop,
                });
            }
            (Class::Control, false)
        } else {
            let q = out.data.bytes();
            let act = out.wred.decide(q, c.ecn() != 0, &mut out.rng);
            if act == WredAction::Drop {
                out.counters.wred_drops += 1;
                return Err(Rejected {
                    pkt,
                    reason: DropReason::WredNotEct,
                });
            }
            let shared_full = self.shared.is_some_and(|b| !b.admits(q, u64::from(len32)));
            if shared_full || !out.data.fits(u64::from(len32)) {
                out.counters.tail_drops += 1;
                return Err(Rejected {
                    pkt,
                    reason: DropReason::TailDrop,
                });
            }
            // Already-CE frames stay CE and are not counted as marked here.
            (Class::Data, act == WredAction::Mark && c.ecn() != 3)
        };
        rewrite(pkt.bytes_mut(), &nh.mac, &out.mac, mark);
        let q = if class == Class::Control {
            &mut out.ctrl
        } else {
            &mut out.data
        };
        let meta = Meta {
            len: len32,
            tag,
            arrival: now,
        };
        if let Err(pkt) = q.push(pkt, meta) {
            // `fits` said yes just above; keep the accounting honest anyway.
            out.counters.tail_drops += 1;
            return Err(Rejected {
                pkt,
                reason: DropReason::TailDrop,
            });
        }
        if let (Some(b), Class::Data) = (self.shared.as_mut(), class) {
            b.take(u64::from(len32));
        }
        let oc = &mut out.counters;
        oc.enqueued += 1;
        if class == Class::Control {
            oc.enqueued_ctrl += 1;
        }
        if mark {
            oc.ce_marked += 1;
        }
        out.note_queue();
        Ok(Enqueued {
            port: out.id,
            class,
            ce_marked: mark,
            int: c.int(),
        })
    }

    /// The next frame to send on `port_out` at `now`, if the shaper lets one start by
    /// `now`: control class first (strict priority), then data. A frame carrying an INT
    /// container gets this hop's record (HPCC++ 000 section 3: ts = departure time in
    /// the shaper's schedule, i.e. `now` unless the poll is late, qlen after
    /// this dequeue, txBytes before this frame, B, switch_ID, port_ID).
    pub fn dequeue(&mut self, port_out: u16, now: u64) -> Option<P> {
        let idx = self.idx(port_out)?;
        let (switch_id, fcs) = (self.switch_id, self.fcs_in_frame);
        let port = &mut self.ports[idx];
        if !port.shaper.ready(now) {
            return None;
        }
        let (mut pkt, meta) = match port.ctrl.pop() {
            Some(x) => x,
            None => {
                let x = port.data.pop()?;
                if let Some(b) = self.shared.as_mut() {
                    b.give(u64::from(x.1.len));
                }
                x
            }
        };
        port.note_queue();
        let start = port.shaper.start_time(now, meta.arrival);
        if meta.tag & TAG_INT != 0 {
            // ts: the frame's departure time on the shaped link (== `now` when the poll
            // loop is on time), so consecutive records of a saturated port differ by
            // exactly their wire time and txRate / B is 1 however late or bursty the
            // shell polls.
            // HopRecord::from_units, with the link units computed once per port.
            let hop = HopRecord {
                switch_id,
                port_id: port.id,
                ts_ns: start as u32,
                tx_bytes: port.counters.tx_wire_bytes as u32,
                qlen_64b: (port.counters.queue_bytes / 64).min(0xFFFF) as u16,
                link_100m: port.link_100m,
            };
            match push_int(&mut pkt, &hop, meta.tag >> TAG_IHL_SHIFT) {
                IntPush::Pushed => port.counters.int_pushed += 1,
                IntPush::Full => port.counters.int_e_set += 1,
                IntPush::Error => port.counters.int_errors += 1,
            }
        }
        let wire = wire_bytes(pkt.len(), fcs);
        port.shaper.commit(start, wire);
        let c = &mut port.counters;
        c.tx_packets += 1;
        c.tx_bytes += pkt.len() as u64;
        c.tx_wire_bytes += wire;
        Some(pkt)
    }

    /// When a frame could next leave `port_out`: `None` if its queues are empty (or the
    /// port is unknown), else the shaper's next free time (possibly already past).
    pub fn next_departure(&self, port_out: u16) -> Option<u64> {
        let p = &self.ports[self.idx(port_out)?];
        if p.data.is_empty() && p.ctrl.is_empty() {
            None
        } else {
            Some(p.shaper.next_free())
        }
    }

    /// When `port_out`'s link is free again (the end of the frame last sent, per its
    /// shaper), whether or not frames wait: where a frame just dequeued ends on the wire.
    pub fn port_free_at(&self, port_out: u16) -> Option<u64> {
        Some(self.ports[self.idx(port_out)?].shaper.next_free())
    }

    /// Makes the data queues draw on one shared pool with a dynamic threshold (a
    /// port's `buf_max` still bounds it); call before any frame is queued.
    pub fn set_shared_buffer(&mut self, b: Option<SharedBuffer>) {
        self.shared = b;
    }

    /// The shared pool and its occupancy, if configured.
    pub fn shared_buffer(&self) -> Option<&SharedBuffer> {
        self.shared.as_ref()
    }

    /// Counters of a port.
    pub fn counters(&self, port: u16) -> Option<&PortCounters> {
        self.idx(port).map(|i| &self.ports[i].counters)
    }

    /// Frames received on ports that are not configured.
    pub fn unknown_port_rx(&self) -> u64 {
        self.unknown_port_rx
    }

    /// Configured port ids, in configuration order.
    pub fn port_ids(&self) -> impl Iterator<Item = u16> + '_ {
        self.ports.iter().map(|p| p.id)
    }

    /// Bytes queued on a port (data + control).
    pub fn queue_bytes(&self, port: u16) -> Option<u64> {
        self.idx(port)
            .map(|i| self.ports[i].data.bytes() + self.ports[i].ctrl.bytes())
    }

    /// Bytes queued on a port per class: `(data, control)`.
    pub fn class_bytes(&self, port: u16) -> Option<(u64, u64)> {
        self.idx(port)
            .map(|i| (self.ports[i].data.bytes(), self.ports[i].ctrl.bytes()))
    }

    /// The WRED marking probability a port applies at queue `q` bytes.
    pub fn mark_probability(&self, port: u16, q: u64) -> Option<f64> {
        self.idx(port)
            .map(|i| self.ports[i].wred.mark_probability(q))
    }

    /// A stats line for `port` against an earlier snapshot `prev` taken `interval_ns`
    /// ago (`None` for an unknown port).
    pub fn stats_line<'a>(
        &'a self,
        port: u16,
        prev: &'a PortCounters,
        interval_ns: u64,
    ) -> Option<StatsLine<'a>> {
        let cur = self.counters(port)?;
        Some(StatsLine {
            port_id: port,
            cur,
            prev,
            interval_ns,
        })
    }

    /// The INT DSCP in use.
    pub fn int_dscp(&self) -> u8 {
        self.int_dscp
    }

    /// The INT switch_ID.
    pub fn switch_id(&self) -> u16 {
        self.switch_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::wire::int::PushOutcome;
    use rdma::wire::{EthernetPacket, Ipv4Packet, UdpPacket};

    /// A RoCEv2 WRITE frame with an INT container that allows `max_hops` and already
    /// holds `have` records (pushed with rdma's reference implementation).
    fn int_frame(max_hops: u8, have: u8, payload: usize) -> Vec<u8> {
        use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
        use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode};
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
                dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
                src_ip: Ipv4Address([10, 0, 0, 1]),
                dst_ip: Ipv4Address([10, 0, 1, 2]),
                udp_src_port: 0xC001,
                dscp: 3,
                ttl: 64,
            },
            int: Some(IntInsert {
                int_dscp: 0x18,
                max_hops,
            }),
        };
        let p = RoceRepr::new(BthRepr::new(Opcode::SendOnly, 0x11, 7));
        // Room in front for up to 62 records.
        let mut buf = vec![0u8; 4096];
        let n = fb
            .emit_frame(&p, &vec![0x5A; payload], Ecn::Ect0, &mut buf[1200..])
            .unwrap();
        let (mut start, mut len) = (1200, n);
        for i in 0..have {
            let hop =
                HopRecord::from_units(9, u16::from(i), 1000 * u64::from(i), 7, 640, 1e11 as u64);
            match int::push_hop_front(&mut buf, start, len, L3_OFF, 0x18, &hop).unwrap() {
                PushOutcome::Pushed { start: s, len: l } => (start, len) = (s, l),
                PushOutcome::Full => {}
            }
        }
        buf[start..start + len].to_vec()
    }

    #[test]
    fn int_push_through_packet_headroom_equals_push_hop_front() {
        let hop = HopRecord::from_units(3, 2, 123_456_789, 987_654, 12_800, 25e9 as u64);
        let mut cases = 0;
        for (max_hops, have) in [
            (8, 0),
            (8, 3),
            (8, 7),
            (8, 8),
            (2, 2),
            (1, 0),
            (62, 61),
            (62, 62),
        ] {
            for payload in [0, 64, 1024] {
                let frame = int_frame(max_hops, have, payload);
                // Reference: rdma's push into a buffer with 128 bytes of headroom.
                let mut r = vec![0u8; 128 + frame.len()];
                r[128..].copy_from_slice(&frame);
                let want = match int::push_hop_front(&mut r, 128, frame.len(), L3_OFF, 0x18, &hop)
                    .unwrap()
                {
                    PushOutcome::Pushed { start, len } => {
                        (IntPush::Pushed, r[start..start + len].to_vec())
                    }
                    PushOutcome::Full => (IntPush::Full, r[128..].to_vec()),
                };
                // The push trusts what classify found: the container and the IHL.
                let c = classify(&frame, 0x18).unwrap();
                assert!(c.int());
                let mut f = crate::FrameBuf::from_frame(&frame).unwrap();
                let got = push_int(&mut f, &hop, c.ihl());
                assert_eq!(
                    (got, f.bytes().to_vec()),
                    want,
                    "max_hops {max_hops} have {have}"
                );
                // Without headroom: E still set on a full stack, else an error, frame intact.
                let mut f = crate::FrameBuf::new(&frame, 0, frame.len()).unwrap();
                let got = push_int(&mut f, &hop, c.ihl());
                if want.0 == IntPush::Full {
                    assert_eq!((got, f.bytes().to_vec()), want);
                } else {
                    assert_eq!((got, f.bytes()), (IntPush::Error, &frame[..]));
                }
                cases += 1;
            }
        }
        assert_eq!(cases, 24);
        // A truncated frame never gets that far: classify rejects it.
        let frame = int_frame(8, 1, 0);
        for cut in [0, 10, 14, 40, 57, frame.len() - 1] {
            assert!(classify(&frame[..cut], 0x18).is_err(), "cut {cut}");
        }
    }

    /// The classifier written with the `rdma::wire` views: the reference [`classify`]
    /// must agree with.
    fn classify_views(b: &[u8], int_dscp: u8) -> Result<Classified, DropReason> {
        let eth = EthernetPacket::new_checked(b).map_err(|_| DropReason::Malformed)?;
        if eth.header().ethertype.get() != ETHERTYPE_IPV4 {
            return Err(DropReason::NotIpv4);
        }
        let ip = Ipv4Packet::new_checked(&b[L3_OFF..]).map_err(|_| DropReason::Malformed)?;
        if ipv4_header_checksum(&b[L3_OFF..L3_OFF + ip.header_len()]) != 0 {
            return Err(DropReason::Malformed);
        }
        let h = ip.header();
        let dst = u32::from_be_bytes(h.dst);
        let (ecn, ttl) = (h.tos & 3, h.ttl);
        let ihl = (ip.header_len() / 4) as u8;
        let done = |ctrl: bool, int: bool, sport: u16| {
            Ok(Classified::new(dst, ecn, ttl, ctrl, int, ihl, sport))
        };
        // Only unfragmented UDP can be RoCEv2 (RoCEv2 never fragments); other IPv4 is
        // forwarded without looking further.
        let ff = h.flags_frag.get();
        if h.protocol != rdma::wire::ipv4::PROTO_UDP || ff & 0x3FFF != 0 {
            return done(false, false, 0);
        }
        let udp_off = L3_OFF + ip.header_len();
        let ip_end = L3_OFF + ip.total_len() as usize;
        let udp = UdpPacket::new_checked(&b[udp_off..ip_end]).map_err(|_| DropReason::Malformed)?;
        let sport = udp.src_port();
        if udp.dst_port() != ROCEV2_UDP_PORT {
            return done(false, false, sport);
        }
        let udp_end = udp_off + udp.len_field() as usize;
        let mut bth_off = udp_off + rdma::wire::udp::HEADER_LEN;
        let int = ip.dscp() == int_dscp;
        if int {
            // INT-MD over UDP (INT v2.0 section 5.6): shim + MD header + hop stack before BTH.
            // (The same checks as `int::locate`, without parsing IPv4 and UDP again.)
            let c_int = int::IntPacket::new_checked(&b[bth_off..udp_end])
                .map_err(|_| DropReason::Malformed)?;
            bth_off += c_int.len();
        }
        if bth_off + BTH_LEN > udp_end {
            return Err(DropReason::Malformed);
        }
        done(CTRL_OPCODES.contains(&b[bth_off]), int, sport)
    }

    #[test]
    fn classify_agrees_with_the_wire_views() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut kinds = std::collections::HashSet::new();
        for (max_hops, have, payload) in [(8, 0, 0), (8, 3, 64), (8, 8, 16), (1, 0, 1024)] {
            let frame = int_frame(max_hops, have, payload);
            for i in 0..3000 {
                let mut f = frame.clone();
                // Mutate a few bytes of the headers (and sometimes the length).
                for _ in 0..(i % 4) {
                    let at = (rnd() % 80) as usize % f.len();
                    f[at] = rnd() as u8;
                }
                if i % 7 == 0 {
                    f.truncate((rnd() as usize) % (f.len() + 1));
                }
                for dscp in [0x18, 0x03] {
                    let (a, b) = (classify(&f, dscp), classify_views(&f, dscp));
                    assert_eq!(a.map(|c| c.0), b.map(|c| c.0), "frame {f:02x?}");
                    kinds.insert(format!("{:?}", a.map(|c| (c.int(), c.ctrl()))));
                }
            }
        }
        // The mutations reached accepted frames with and without INT, and rejections.
        assert!(kinds.len() >= 4, "{kinds:?}");
    }

    #[test]
    fn fast_ipv4_checksum_equals_internet_checksum() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..2000 {
            let mut h = [0u8; 60];
            for b in h.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            // Include the all-ones and all-zero corner cases.
            if i == 0 {
                h = [0xFF; 60];
            } else if i == 1 {
                h = [0; 60];
            }
            for words in [5usize, 6, 15] {
                let hh = &h[..words * 4];
                assert_eq!(ipv4_header_checksum(hh), rdma::wire::internet_checksum(hh));
            }
        }
    }

    #[test]
    fn incremental_checksum_matches_recompute() {
        let mut h = [
            0x45u8, 0x62, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 1, 2,
        ];
        let c = rdma::wire::internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let mut f = vec![0u8; 14];
        f[12] = 8;
        f.extend_from_slice(&h);
        rewrite(&mut f, &[1; 6], &[2; 6], true);
        assert_eq!(f[14 + 1] & 3, 3);
        assert_eq!(f[14 + 8], 63);
        assert_eq!(rdma::wire::internet_checksum(&f[14..34]), 0);
    }
}
