//! A device's QPs sharded over several poll-mode cores (docs/design.md §5:
//! "the same build runs on one core (all stages in one loop) or several
//! (TX, RX, scheduler apart, QPs sharded)").
//!
//! # Layout
//!
//! ```text
//!              +--------------------+   ring (SP/SC)   +---------------------+
//!  port RX --> |                    | ---------------> | shard 0: engine     |
//!              |     dispatcher     | <--------------- | (QPNs base0 ..)     |
//!  port TX <-- |  (the port's only  |                  +---------------------+
//!              |   RX and TX queue) | ---------------> | shard 1: engine     |
//!              |                    | <--------------- | (QPNs base1 ..)     |
//!              +--------------------+                  +---------------------+
//! ```
//!
//! Each shard is a whole [`crate::engine::Engine`] (RX pipeline, flow
//! scheduler, TX pipeline, CC, timers) for its own range of QPNs
//! ([`shard_base`]), on its own lcore; instead of a port queue it reads and
//! writes two single-producer/single-consumer DPDK rings. The dispatcher owns
//! the port: it steers every received frame to the shard that owns the
//! frame's destination QPN (read from the BTH, past an INT container when
//! there is one: [`dest_qpn`]) and sends what the shards built, taking from
//! each in turn. It is the software form of a NIC's flow director: it works
//! on any PMD, including those with one queue (rings, TAP, null).
//!
//! A frame that is not RoCEv2 or names no shard goes to shard 0, whose
//! engine counts it as it would unsharded (not RoCE, unknown QP, ...). A
//! frame for a shard whose ring is full is dropped and counted
//! (`rx_drop_shard_full`), as a NIC drops on a full RX queue; the transport
//! recovers it like any loss.
//!
//! Nothing here allocates, locks or makes a syscall per frame: the rings
//! and bursts are made before the loop starts. An idle dispatcher parks
//! (`Dispatcher::run`, crate::park), and a parked one is woken by a shard
//! that hands it frames; it wakes a parked shard when it hands that shard
//! frames. On the busy path each side pays a fence and a load per burst.
//!
//! # A queue pair per shard
//!
//! Where the port offers a queue pair per shard (a multi-queue ring pair,
//! `net_tap` with queues, a NIC's RSS or `rte_flow` queues), there is no
//! dispatcher: shard `k`'s engine owns RX and TX queue `k` (`Steer`). The
//! sender's choice (a ring pair cabled queue to queue), the kernel's flow
//! hash (TAP) or the NIC's steering decides which queue a frame arrives on;
//! a frame on the wrong shard's queue (and every frame that is not RoCEv2,
//! for shard 0's control plane) goes to its shard through that shard's
//! steering ring, counted as `rx_steered` and, on a full ring, dropped and
//! counted as `rx_drop_shard_full`. With queues cabled as the shards own
//! QPs (roce-perf's loopback), no frame takes that path, and nothing is
//! shared between the shards on the data path.

use std::sync::Arc;
use std::time::Duration;

use dpdk::{Burst, Mempool, Port, Ring, RingConsumer, RingProducer, RxQueue, TscClock, TxQueue};
use rdma::wire::int;

use crate::contract::{EngineShared, MAX_QPS, QPN_BASE};
use crate::counters::Counters;
use crate::park::{Parker, SPIN_BEFORE_PARK, UNWOKEN_PARK_NS};

/// UDP destination port of RoCEv2 (IBA Annex A17).
const ROCEV2_PORT: u16 = 4791;

/// The first QPN of shard `k`: each shard owns [`MAX_QPS`] QPNs.
pub fn shard_base(k: usize) -> u32 {
    QPN_BASE + (k * MAX_QPS) as u32
}

/// The shard (of `shards`) that owns `qpn`; `None` for a QPN outside every
/// shard's range.
pub fn shard_of_qpn(qpn: u32, shards: usize) -> Option<usize> {
    let k = (qpn.checked_sub(QPN_BASE)? as usize) / MAX_QPS;
    (k < shards).then_some(k)
}

/// The destination QPN of a RoCEv2 frame (Ethernet / IPv4 / UDP 4791 /
/// [INT container when the DSCP is `int_dscp`] / BTH), from its first bytes;
/// `None` for anything else or a frame too short to tell. It reads only
/// what steering needs: the shard's engine parses and verifies the frame.
pub fn dest_qpn(frame: &[u8], int_dscp: u8) -> Option<u32> {
    const L3: usize = 14;
    if frame.get(12..14)? != [0x08, 0x00] {
        return None;
    }
    let vihl = *frame.get(L3)?;
    if vihl >> 4 != 4 || *frame.get(L3 + 9)? != 17 {
        return None;
    }
    let udp = L3 + usize::from(vihl & 0x0F) * 4;
    let dport = u16::from_be_bytes(frame.get(udp + 2..udp + 4)?.try_into().ok()?);
    if dport != ROCEV2_PORT {
        return None;
    }
    let dscp = frame.get(L3 + 1)? >> 2;
    let bth = if dscp == int_dscp {
        // The container's own length (shim byte 1, in words; rdma::wire::int),
        // not a check of the whole frame: the first segment of a chained
        // frame holds the headers only.
        let shim = frame.get(udp + 8..udp + 8 + int::SHIM_LEN)?;
        let len = usize::from(shim[1]) * 4;
        if shim[0] >> 4 != int::TYPE_INT_MD || len < int::HEADER_LEN {
            return None;
        }
        udp + 8 + len
    } else {
        udp + 8
    };
    let q = frame.get(bth + 5..bth + 8)?;
    Some(u32::from_be_bytes([0, q[0], q[1], q[2]]))
}

/// The shard that owns a received frame: the one whose QPN range holds
/// its destination QP; shard 0 for anything else (module docs).
#[inline]
pub fn owner(frame: &[u8], int_dscp: u8, shards: usize) -> usize {
    dest_qpn(frame, int_dscp)
        .and_then(|q| shard_of_qpn(q, shards))
        .unwrap_or(0)
}

/// One shard's side of a device with a queue pair per shard (module docs):
/// hands frames that arrived on this shard's queue but belong to another
/// shard to that shard's ring, and takes what the others handed here.
pub(crate) struct Steer {
    shard: usize,
    int_dscp: u8,
    /// Every shard's steering ring, by shard (many producers: the other
    /// shards; one consumer: its own shard).
    rings: Arc<[Ring]>,
}

impl Steer {
    /// Shard `shard`'s side, over the rings of all shards.
    pub(crate) fn new(shard: usize, int_dscp: u8, rings: Arc<[Ring]>) -> Self {
        Steer {
            shard,
            int_dscp,
            rings,
        }
    }

    /// After `b` was filled from this shard's RX queue: moves the frames of
    /// other shards to their rings (counted), then fills the rest of `b`
    /// from this shard's own ring. A frame that finds its shard's ring full
    /// is dropped and counted, as a NIC drops on a full RX queue.
    #[inline]
    pub(crate) fn exchange(&mut self, b: &mut Burst, counters: &mut Counters) {
        let shards = self.rings.len();
        let mine = |m: &dpdk::Mbuf| owner(m.data(), self.int_dscp, shards) == self.shard;
        if !b.as_slice().iter().all(mine) {
            let mut keep = Burst::new();
            for m in b.drain() {
                let k = owner(m.data(), self.int_dscp, shards);
                if k == self.shard {
                    // `keep` has the room of the burst it came from.
                    let _ = keep.push(m);
                    continue;
                }
                let mut one: Burst<1> = Burst::new();
                let _ = one.push(m);
                counters.rx_steered += 1;
                if self.rings[k].enqueue(&mut one) == 0 {
                    counters.rx_drop_shard_full += one.clear() as u64;
                }
            }
            *b = keep;
        }
        self.rings[self.shard].dequeue(b);
    }
}

/// The dispatcher of a sharded device (module docs): owns the port's queues
/// and the rings to and from every shard.
pub(crate) struct Dispatcher {
    rx: RxQueue,
    tx: TxQueue,
    to_shard: Vec<RingProducer>,
    from_shard: Vec<RingConsumer>,
    /// Each shard's parker, by shard: frames handed to a parked shard wake it.
    shard_parkers: Vec<Arc<Parker>>,
    /// Frames of one RX burst, by shard, before they go into the rings.
    staged: Vec<Burst>,
    rxb: Burst,
    txb: Burst,
    /// The shard the TX side takes from first next time (round robin).
    next_shard: usize,
    /// The port's MAC and IP: frames the shards send to them go back to
    /// the shard that owns the destination QP, not to the wire (loopback).
    mac: [u8; 6],
    ip: [u8; 4],
    int_dscp: u8,
    park_when_idle: bool,
    clock: TscClock,
    turn: u64,
    counters: Counters,
    shared: Arc<EngineShared>,
    // Dropped after the rings and bursts above (declaration order), so that
    // frames still in them go back to pools that exist.
    _pools: Vec<[Arc<Mempool>; 2]>,
    _rx_pool: Arc<Mempool>,
    _port: Port,
}

/// What a dispatcher is built from.
pub(crate) struct DispatcherParts {
    /// The port (kept open while the dispatcher runs).
    pub port: Port,
    /// Its only RX queue.
    pub rx: RxQueue,
    /// Its only TX queue.
    pub tx: TxQueue,
    /// The pool the port receives into.
    pub rx_pool: Arc<Mempool>,
    /// Rings to each shard's engine, by shard.
    pub to_shard: Vec<RingProducer>,
    /// Rings from each shard's engine, by shard.
    pub from_shard: Vec<RingConsumer>,
    /// Each shard's parker, by shard (what wakes its engine).
    pub shard_parkers: Vec<Arc<Parker>>,
    /// Each shard's TX pools (frames in the rings come from them).
    pub pools: Vec<[Arc<Mempool>; 2]>,
    /// The port's MAC and IP (frames to them loop back to their shard).
    pub mac: [u8; 6],
    /// The port's IP.
    pub ip: [u8; 4],
    /// DSCP that announces an INT container.
    pub int_dscp: u8,
    /// Park when idle (`DeviceConfig::idle_yield`).
    pub park_when_idle: bool,
    /// The time source of the idle spin.
    pub clock: TscClock,
    /// The dispatcher's stop/done flags, counters and parker (which the
    /// shards wake when they hand it frames).
    pub shared: Arc<EngineShared>,
}

impl Dispatcher {
    pub(crate) fn new(p: DispatcherParts) -> Self {
        Dispatcher {
            rx: p.rx,
            tx: p.tx,
            staged: (0..p.to_shard.len()).map(|_| Burst::new()).collect(),
            to_shard: p.to_shard,
            from_shard: p.from_shard,
            shard_parkers: p.shard_parkers,
            rxb: Burst::new(),
            txb: Burst::new(),
            next_shard: 0,
            mac: p.mac,
            ip: p.ip,
            int_dscp: p.int_dscp,
            park_when_idle: p.park_when_idle,
            clock: p.clock,
            turn: 0,
            counters: Counters::default(),
            shared: p.shared,
            _pools: p.pools,
            _rx_pool: p.rx_pool,
            _port: p.port,
        }
    }

    /// Runs until the device is asked to stop, then publishes its counters
    /// and marks itself done (the port is released when it is dropped).
    ///
    /// Idle for [`SPIN_BEFORE_PARK`] (and `park_when_idle`), the thread
    /// parks as an engine's does (crate::engine::poll): a shard handing it
    /// frames or the stop wakes it; a frame arriving at the port cannot,
    /// so the park ends after [`UNWOKEN_PARK_NS`] at most.
    pub(crate) fn run(mut self) {
        let spin_ns = SPIN_BEFORE_PARK.as_nanos() as u64;
        let mut last_busy = self.clock.now_ns();
        let mut slack_set = false;
        while let Some(work) = self.poll_turn() {
            let now = self.clock.now_ns();
            if work > 0 || !self.txb.is_empty() {
                last_busy = now;
                continue;
            }
            if !self.park_when_idle || now.saturating_sub(last_busy) < spin_ns {
                continue;
            }
            // Announce the park, then look once more: what came before the
            // announcement is found now, what comes after it wakes us.
            let parker = self.shared.parker.clone();
            parker.prepare();
            if self.shared.stopping() || self.steer() + self.transmit() > 0 || !self.txb.is_empty()
            {
                parker.cancel();
                last_busy = now;
                continue;
            }
            if !slack_set {
                crate::verbs::wake_quickly();
                slack_set = true;
            }
            self.counters.engine_parks += 1;
            self.shared.counters.publish(&self.counters);
            parker.park(Some(Duration::from_nanos(UNWOKEN_PARK_NS)));
        }
        self.shared.counters.publish(&self.counters);
        let shared = self.shared.clone();
        drop(self);
        shared.mark_done();
    }

    /// One turn: steer a burst from the port into the shards' rings, then
    /// send what the shards built. The frames moved, or `None` once asked
    /// to stop.
    fn poll_turn(&mut self) -> Option<usize> {
        if self.turn.is_multiple_of(256) {
            if self.shared.stopping() {
                return None;
            }
            self.shared.counters.publish(&self.counters);
        }
        self.turn = self.turn.wrapping_add(1);
        let got = self.steer();
        let sent = self.transmit();
        Some(got + sent)
    }

    /// Port RX -> the rings of the shards that own the frames' QPs.
    fn steer(&mut self) -> usize {
        let n = self.rx.recv(&mut self.rxb);
        if n == 0 {
            return 0;
        }
        self.stage_rxb();
        n
    }

    /// The frames in the RX burst -> the rings of the shards that own their
    /// QPs.
    fn stage_rxb(&mut self) {
        let shards = self.staged.len();
        for m in self.rxb.drain() {
            let k = owner(m.data(), self.int_dscp, shards);
            // A staged burst holds a whole RX burst: never full here.
            if let Err(m) = self.staged[k].push(m) {
                self.counters.rx_drop_shard_full += 1;
                drop(m);
            }
        }
        let rings = self.to_shard.iter_mut().zip(&self.shard_parkers);
        for ((ring, parker), staged) in rings.zip(&mut self.staged) {
            if !staged.is_empty() {
                if ring.enqueue(staged) > 0 {
                    parker.wake();
                }
                self.counters.rx_drop_shard_full += staged.clear() as u64;
            }
        }
    }

    /// Frames the shards sent to the port's own MAC and IP go back to the shard
    /// that owns their destination QP, as received frames (the engine's
    /// `loop_back` for a device with a dispatcher).
    fn loop_back(&mut self) {
        let (mac, ip) = (self.mac, self.ip);
        let to_self = |m: &dpdk::Mbuf| crate::io::is_for_self(m.data(), &mac, &ip);
        if !self.txb.as_slice().iter().any(to_self) {
            return;
        }
        let mut wire = Burst::new();
        for m in self.txb.drain() {
            if to_self(&m) {
                self.counters.tx_loopback += 1;
                // The RX burst is empty between turns: room for a burst.
                if let Err(m) = self.rxb.push(m) {
                    self.counters.rx_drop_loopback_full += 1;
                    drop(m);
                }
            } else {
                let _ = wire.push(m);
            }
        }
        self.txb = wire;
        self.stage_rxb();
    }

    /// The shards' frames -> port TX, taking from each shard in turn; what
    /// the port does not take waits in the burst (the shards' rings then
    /// fill and their engines hold their frames, as with a full TX queue).
    fn transmit(&mut self) -> usize {
        let mut sent = 0;
        if !self.txb.is_empty() {
            sent += self.tx.send(&mut self.txb);
            if !self.txb.is_empty() {
                return sent;
            }
        }
        let shards = self.from_shard.len();
        for j in 0..shards {
            if self.txb.is_full() {
                break;
            }
            let k = (self.next_shard + j) % shards;
            self.from_shard[k].dequeue(&mut self.txb);
        }
        self.next_shard = (self.next_shard + 1) % shards;
        self.loop_back();
        if !self.txb.is_empty() {
            sent += self.tx.send(&mut self.txb);
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma::wire::frame::{IntInsert, RoceRepr};
    use rdma::wire::{BthRepr, Ecn, Opcode};

    fn frame(qpn: u32, int: bool) -> Vec<u8> {
        let fb = crate::io::test_frame_builder(int.then_some(IntInsert {
            int_dscp: 0x18,
            max_hops: 4,
        }));
        let mut buf = vec![0u8; 512];
        let pkt = RoceRepr::new(BthRepr::new(Opcode::SendOnly, qpn, 7));
        let n = fb
            .emit_frame(&pkt, &[1, 2, 3], Ecn::Ect0, &mut buf)
            .unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn finds_the_destination_qpn_with_and_without_int() {
        for qpn in [QPN_BASE, shard_base(1) + 5, 0xFF_FFFF] {
            assert_eq!(dest_qpn(&frame(qpn, false), 0x18), Some(qpn));
            assert_eq!(dest_qpn(&frame(qpn, true), 0x18), Some(qpn));
        }
    }

    /// A chained frame's first segment holds the headers only: the QPN is
    /// found from them, with and without INT.
    #[test]
    fn finds_the_qpn_in_the_headers_of_a_chained_frame() {
        for int in [false, true] {
            let f = frame(shard_base(1) + 3, int);
            let headers = 14 + 20 + 8 + if int { int::HEADER_LEN } else { 0 } + 12;
            assert_eq!(dest_qpn(&f[..headers], 0x18), Some(shard_base(1) + 3));
        }
    }

    #[test]
    fn refuses_what_is_not_rocev2_or_too_short() {
        let f = frame(0x1234, true);
        for cut in 0..f.len().min(14 + 20 + 8 + 8 + 8) {
            // A cut inside the headers never reads out of bounds.
            let _ = dest_qpn(&f[..cut], 0x18);
        }
        assert_eq!(dest_qpn(&f[..20], 0x18), None);
        let mut not_ip = f.clone();
        not_ip[12] = 0x86;
        assert_eq!(dest_qpn(&not_ip, 0x18), None);
        let mut other_port = frame(0x1234, false);
        other_port[14 + 20 + 3] ^= 1;
        assert_eq!(dest_qpn(&other_port, 0x18), None);
    }

    #[test]
    fn shards_own_contiguous_qpn_ranges() {
        assert_eq!(shard_of_qpn(QPN_BASE, 3), Some(0));
        assert_eq!(shard_of_qpn(shard_base(1) - 1, 3), Some(0));
        assert_eq!(shard_of_qpn(shard_base(1), 3), Some(1));
        assert_eq!(shard_of_qpn(shard_base(2) + 77, 3), Some(2));
        assert_eq!(shard_of_qpn(shard_base(3), 3), None);
        assert_eq!(shard_of_qpn(QPN_BASE - 1, 3), None);
    }
}
