//! The switch: on receive, parse, route, WRED/ECN and enqueue; on dequeue, the shaper,
//! this hop's INT record and transmit (docs/design.md §6).
//!
//! Work goes in bursts, stage by stage, as in VPP's vector processing: a receive burst
//! is parsed whole ([`crate::classify`]), then routed whole (one table lookup per run
//! of frames to the same destination), then admitted in arrival order (WRED with
//! randomness drawn in batches, tail drop, the rewrite from a per-route template,
//! enqueue), with the queue counters written once per burst. A dequeue burst books
//! each frame on the shaper and pushes its INT hop record ([`crate::int_push`]), with
//! the port's counters written once at the end. [`Switch::receive`] and
//! [`Switch::dequeue`] are the same stages for one frame (the simulator's interface).
//!
//! Time is an argument (ns); nothing reads a clock. All queues are allocated when the
//! switch is built; nothing here allocates per frame (for packet types whose `prepend`
//! does not, e.g. an mbuf or [`crate::FrameBuf`]).

use rdma::wire::int::HopRecord;

use crate::classify::{classify, Classified};
use crate::config::{Config, ConfigError, PortSettings, SwitchSettings};
use crate::counters::{PortCounters, StatsLine};
pub use crate::drop_reason::DropReason;
use crate::fib::{ecmp_hash, Fib, Group};
use crate::int_push::{push_int, IntPush};
use crate::packet::PacketBuf;
use crate::queue::{Meta, PktQueue};
use crate::rewrite::{rewrite, L2Rewrite};
use crate::shaper::{wire_bytes, Shaper};
use crate::shared_buffer::SharedBuffer;
use crate::wred::{Rng, RngBatch, Wred, WredAction};

/// Frames [`Switch::receive_burst`] takes through its stages at a time (DPDK's usual
/// RX burst).
pub const BURST: usize = 32;

/// Queue tag bit: the frame carries an INT container (push at dequeue).
const TAG_INT: u8 = 1;
/// Queue tag bits 4..7: the frame's IPv4 IHL, so the push at dequeue finds the
/// container without parsing the headers again.
const TAG_IHL_SHIFT: u8 = 4;

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
    rng: RngBatch,
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
            rng: RngBatch::new(Rng::new(
                seed ^ (idx as u64).wrapping_mul(0xA24B_AED4_963E_E407),
            )),
            shaper: Shaper::new(s.speed_bps, s.burst),
            data: PktQueue::for_packets(s.buf_max),
            ctrl: PktQueue::for_packets(s.ctrl_buf_max),
            counters: PortCounters::default(),
        }
    }

    /// Writes the queue gauges (occupancy and its maximum) into the counters: once per
    /// burst, since within a receive burst the queues only grow and within a dequeue
    /// burst they only shrink.
    #[inline]
    fn note_queue(&mut self) {
        let c = &mut self.counters;
        c.queue_bytes = self.data.bytes() + self.ctrl.bytes();
        c.queue_packets = (self.data.len() + self.ctrl.len()) as u64;
        c.queue_max_bytes = c.queue_max_bytes.max(c.queue_bytes);
    }
}

/// The egress of a routed frame: the port index and the Ethernet addresses to write.
#[derive(Debug, Clone, Copy, Default)]
struct Egress {
    port_idx: usize,
    l2: L2Rewrite,
}

/// Ports whose queue gauges a burst changed (a bit per port index below 64; ports
/// beyond are noted at once).
#[derive(Debug, Default)]
struct Touched(u64);

impl Touched {
    #[inline]
    fn note<P: PacketBuf>(&mut self, ports: &mut [Port<P>], idx: usize) {
        if idx < 64 {
            self.0 |= 1 << idx;
        } else {
            ports[idx].note_queue();
        }
    }

    #[inline]
    fn flush<P: PacketBuf>(self, ports: &mut [Port<P>]) {
        let mut m = self.0;
        while m != 0 {
            ports[m.trailing_zeros() as usize].note_queue();
            m &= m - 1;
        }
    }
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
        let mut fib = Fib::new(&s.routes, |id| {
            id_to_idx
                .get(usize::from(id))
                .filter(|&&i| i != u32::MAX)
                .map(|&i| i as usize)
        });
        fib.set_source_macs(|idx| ports[idx].mac);
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
    pub fn receive(&mut self, port_in: u16, pkt: P, now: u64) -> Result<Enqueued, Rejected<P>> {
        let Some(ii) = self.idx(port_in) else {
            self.unknown_port_rx += 1;
            return Err(Rejected {
                pkt,
                reason: DropReason::UnknownPort,
            });
        };
        let ic = &mut self.ports[ii].counters;
        ic.rx_packets += 1;
        ic.rx_bytes += pkt.len() as u64;
        let c = match self.parse(&pkt) {
            Ok(c) => c,
            Err(r) => return Err(self.reject(ii, pkt, r)),
        };
        let e = match self.route(c, &mut None) {
            Ok(e) => e,
            Err(r) => return Err(self.reject(ii, pkt, r)),
        };
        let r = self.admit(pkt, c, &e, now);
        self.ports[e.port_idx].note_queue();
        r
    }

    /// [`Switch::receive`] for every frame of `pkts` (arrived on `port_in` at `now`),
    /// [`BURST`] frames at a time and stage by stage: all parsed (their headers
    /// prefetched as they are taken, see [`PacketBuf::prefetch`]), then all routed,
    /// then each admitted in arrival order. Every dropped frame goes to `rejected`
    /// (counted, as by `receive`). Returns the number of frames queued.
    ///
    /// The decisions are those of `receive` called on each frame in order: routing
    /// does not depend on queue state, and admission runs in order.
    pub fn receive_burst<I>(
        &mut self,
        port_in: u16,
        pkts: I,
        now: u64,
        mut rejected: impl FnMut(Rejected<P>),
    ) -> usize
    where
        I: IntoIterator<Item = P>,
    {
        let mut it = pkts.into_iter();
        let Some(ii) = self.idx(port_in) else {
            for pkt in it {
                self.unknown_port_rx += 1;
                rejected(Rejected {
                    pkt,
                    reason: DropReason::UnknownPort,
                });
            }
            return 0;
        };
        let mut queued = 0;
        loop {
            let mut frames: [Option<P>; BURST] = [const { None }; BURST];
            let mut n = 0;
            for slot in frames.iter_mut() {
                let Some(p) = it.next() else { break };
                p.prefetch();
                *slot = Some(p);
                n += 1;
            }
            if n == 0 {
                break;
            }
            queued += self.receive_stages(ii, &mut frames[..n], now, &mut rejected);
            // The stages took every frame (each was queued or handed to `rejected`):
            // the array holds only `None`, so skip its drop loop.
            debug_assert!(frames.iter().all(Option::is_none));
            std::mem::forget(frames);
            if n < BURST {
                break;
            }
        }
        queued
    }

    /// The stages of [`Switch::receive_burst`] over one burst of `frames` (all `Some`)
    /// from the port at index `ii`.
    #[inline]
    fn receive_stages(
        &mut self,
        ii: usize,
        frames: &mut [Option<P>],
        now: u64,
        rejected: &mut impl FnMut(Rejected<P>),
    ) -> usize {
        // Stage 1: parse every frame.
        let mut cls = [Classified(0); BURST];
        let mut rx_bytes = 0u64;
        for (slot, c) in frames.iter_mut().zip(cls.iter_mut()) {
            let Some(p) = slot.as_ref() else { continue };
            rx_bytes += p.len() as u64;
            match self.parse(p) {
                Ok(x) => *c = x,
                Err(r) => {
                    if let Some(p) = slot.take() {
                        rejected(self.reject(ii, p, r));
                    }
                }
            }
        }
        let ic = &mut self.ports[ii].counters;
        ic.rx_packets += frames.len() as u64;
        ic.rx_bytes += rx_bytes;
        // Stage 2: route every frame still in (one table lookup per run of frames to
        // the same destination).
        let mut egress = [Egress::default(); BURST];
        let mut last: Option<(u32, Group)> = None;
        for ((slot, c), e) in frames.iter_mut().zip(cls.iter()).zip(egress.iter_mut()) {
            if slot.is_none() {
                continue;
            }
            match self.route(*c, &mut last) {
                Ok(x) => *e = x,
                Err(r) => {
                    if let Some(p) = slot.take() {
                        rejected(self.reject(ii, p, r));
                    }
                }
            }
        }
        // Stage 3: admit in arrival order (WRED and tail drop see the queue each
        // earlier frame left), rewrite, enqueue.
        let mut touched = Touched::default();
        let mut queued = 0;
        for ((slot, c), e) in frames.iter_mut().zip(cls.iter()).zip(egress.iter()) {
            let Some(p) = slot.take() else { continue };
            match self.admit(p, *c, e, now) {
                Ok(_) => queued += 1,
                Err(r) => rejected(r),
            }
            touched.note(&mut self.ports, e.port_idx);
        }
        touched.flush(&mut self.ports);
        queued
    }

    /// Stage 1 for one frame: [`classify`], and a length the queues can account.
    #[inline(always)]
    fn parse(&self, pkt: &P) -> Result<Classified, DropReason> {
        if u32::try_from(pkt.len()).is_err() {
            return Err(DropReason::Malformed);
        }
        classify(pkt.bytes(), self.int_dscp)
    }

    /// Stage 2 for one frame: the route (the group for `c.dst()` from `last` when it is
    /// the same destination, else from the table, remembered in `last`), the ECMP
    /// member, the TTL check.
    #[inline(always)]
    fn route(&self, c: Classified, last: &mut Option<(u32, Group)>) -> Result<Egress, DropReason> {
        let g = match *last {
            Some((dst, g)) if dst == c.dst() => g,
            _ => {
                let g = self.fib.group(c.dst()).ok_or(DropReason::Unroutable)?;
                *last = Some((c.dst(), g));
                g
            }
        };
        let seed = self.ecmp_seed;
        let nh = self.fib.member(g, || ecmp_hash(c.sport(), seed));
        if c.ttl() <= 1 {
            return Err(DropReason::TtlExpired);
        }
        Ok(Egress {
            port_idx: nh.port_idx,
            l2: nh.l2,
        })
    }

    /// Counts a frame dropped before admission on its input port `ii`.
    #[cold]
    fn reject(&mut self, ii: usize, pkt: P, reason: DropReason) -> Rejected<P> {
        let ic = &mut self.ports[ii].counters;
        match reason {
            DropReason::Malformed => ic.rx_malformed += 1,
            DropReason::NotIpv4 => ic.rx_not_ipv4 += 1,
            DropReason::TtlExpired => ic.rx_ttl_expired += 1,
            _ => ic.rx_unroutable += 1,
        }
        Rejected { pkt, reason }
    }

    /// Stage 3 for one frame: the control class's tail drop or WRED/ECN and the data
    /// tail drop (a port's `buf_max`, the shared pool), then the rewrite and the
    /// enqueue. The queue gauges are left to the caller ([`Port::note_queue`]).
    #[inline(always)]
    fn admit(
        &mut self,
        mut pkt: P,
        c: Classified,
        e: &Egress,
        now: u64,
    ) -> Result<Enqueued, Rejected<P>> {
        // `parse` checked the length fits.
        let len32 = pkt.len() as u32;
        let out = &mut self.ports[e.port_idx];
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
            let rng = &mut out.rng;
            let act = out.wred.decide_with(q, c.ecn() != 0, || rng.next_u32());
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
        rewrite(pkt.bytes_mut(), &e.l2, mark);
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
        oc.enqueued_ctrl += u64::from(class == Class::Control);
        oc.ce_marked += u64::from(mark);
        Ok(Enqueued {
            port: out.id,
            class,
            ce_marked: mark,
            int: c.int(),
        })
    }

    /// The next frame to send on `port_out` at `now`, if the shaper lets one start by
    /// `now`: [`Switch::dequeue_burst`] of at most one frame.
    pub fn dequeue(&mut self, port_out: u16, now: u64) -> Option<P> {
        let mut got = None;
        self.dequeue_burst(port_out, now, 1, |p| got = Some(p));
        got
    }

    /// Up to `max` frames for `port_out` at `now`, handed to `out` in sending order,
    /// as long as the shaper lets each start by `now`: control class first (strict
    /// priority), then data. A frame carrying an INT container gets this hop's record
    /// (HPCC++ 000 section 3: ts = departure time in the shaper's schedule, i.e. `now`
    /// unless the poll is late, qlen after this dequeue, txBytes before this frame, B,
    /// switch_ID, port_ID). Returns the number of frames.
    pub fn dequeue_burst(
        &mut self,
        port_out: u16,
        now: u64,
        max: usize,
        mut out: impl FnMut(P),
    ) -> usize {
        let Some(idx) = self.idx(port_out) else {
            return 0;
        };
        let (switch_id, fcs) = (self.switch_id, self.fcs_in_frame);
        let port = &mut self.ports[idx];
        let mut tx_wire = port.counters.tx_wire_bytes;
        let (mut n, mut tx_bytes) = (0usize, 0u64);
        let (mut pushed, mut e_set, mut errors) = (0u64, 0u64, 0u64);
        while n < max && port.shaper.ready(now) {
            let (mut pkt, meta) = match port.ctrl.pop() {
                Some(x) => x,
                None => {
                    let Some(x) = port.data.pop() else { break };
                    if let Some(b) = self.shared.as_mut() {
                        b.give(u64::from(x.1.len));
                    }
                    x
                }
            };
            let start = port.shaper.start_time(now, meta.arrival);
            if meta.tag & TAG_INT != 0 {
                // ts: the frame's departure time on the shaped link (== `now` when the
                // poll loop is on time), so consecutive records of a saturated port
                // differ by exactly their wire time and txRate / B is 1 however late
                // or bursty the shell polls. The link units were computed once per
                // port (as `HopRecord::from_units` would).
                let qlen = port.data.bytes() + port.ctrl.bytes();
                let hop = HopRecord {
                    switch_id,
                    port_id: port.id,
                    ts_ns: start as u32,
                    tx_bytes: tx_wire as u32,
                    qlen_64b: (qlen / 64).min(0xFFFF) as u16,
                    link_100m: port.link_100m,
                };
                match push_int(&mut pkt, &hop, meta.tag >> TAG_IHL_SHIFT) {
                    IntPush::Pushed => pushed += 1,
                    IntPush::Full => e_set += 1,
                    IntPush::Error => errors += 1,
                }
            }
            let len = pkt.len();
            let wire = wire_bytes(len, fcs);
            port.shaper.commit(start, wire);
            tx_wire += wire;
            tx_bytes += len as u64;
            n += 1;
            out(pkt);
        }
        if n > 0 {
            let c = &mut port.counters;
            c.tx_packets += n as u64;
            c.tx_bytes += tx_bytes;
            c.tx_wire_bytes = tx_wire;
            c.int_pushed += pushed;
            c.int_e_set += e_set;
            c.int_errors += errors;
            port.note_queue();
        }
        n
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
