//! The DPDK shell of the switch (docs/design.md §2 "functional core, imperative
//! shell", section 6): owned mbufs go into the pure [`Switch`] core and come out of it
//! onto the ports. Everything that decides anything (routing, WRED/ECN, shaping, INT)
//! is in the core; this module only moves packets and reads the clock.
//!
//! Per loop turn (docs/design.md §3): the TSC is read and converted to ns; every
//! port is polled for one RX burst of up to [`BURST_SIZE`] frames, handed whole to
//! [`Switch::receive_burst`] (a rejected frame is freed by dropping it; the core has
//! counted it); then, at a second clock reading (only when something arrived), every port
//! drains what its shaper releases ([`Switch::dequeue_burst`]) into a per-port TX burst and
//! sends it, so a frame can leave in the turn it arrived in. Frames the driver does not take stay in that burst
//! and are retried first on the next turn; while any are pending the port takes no new
//! frames from the core, so back-pressure shows up as queue depth (and WRED/ECN) in the
//! core instead of silent loss. No allocation, lock, syscall or print per packet.

use std::sync::atomic::{AtomicBool, Ordering};

use dpdk::{Burst, Mbuf, RxQueue, TscClock, TxQueue, BURST_SIZE};

use crate::{PacketBuf, PortCounters, Switch};

/// An owned mbuf as the core's packet handle.
///
/// The core sees the **first segment** only: `len`/`bytes`/`bytes_mut` are the first
/// segment's `data_len` bytes. Classification (Ethernet, IPv4, UDP, INT container,
/// BTH) and the INT push need the headers there; that holds for every frame we build
/// and for every frame a PMD receives into the default 2 KiB data room at MTU 1500. A
/// frame whose IPv4 total length runs past the first segment is counted `Malformed` by
/// the core and dropped (never forwarded half-parsed). `prepend`/`trim_front` are
/// `rte_pktmbuf_prepend`/`rte_pktmbuf_adj`: pointer moves in the 128-byte headroom,
/// so the INT push (docs/switch.md "INT push") moves only the ~58 header bytes.
impl PacketBuf for Mbuf {
    #[inline]
    fn len(&self) -> usize {
        self.data_len()
    }

    #[inline]
    fn bytes(&self) -> &[u8] {
        self.data()
    }

    #[inline]
    fn bytes_mut(&mut self) -> &mut [u8] {
        self.data_mut()
    }

    #[inline]
    fn prepend(&mut self, n: usize) -> bool {
        Mbuf::prepend(self, n).is_ok()
    }

    #[inline]
    fn trim_front(&mut self, n: usize) {
        // The trait allows clamping; `adj` refuses n > data_len, so clamp first.
        let n = n.min(self.data_len());
        let _ = self.adj(n);
    }

    #[inline]
    fn prefetch(&self) {
        self.prefetch_data();
    }
}

/// One switch port as the poll loop sees it: its RX and TX queues (unique handles, so
/// the loop bursts without locks) and the frames the driver has not taken yet.
pub struct PortIo {
    /// The port id the core knows it by (the DPDK port id, INT `port_ID`).
    pub id: u16,
    rx: RxQueue,
    tx: TxQueue,
    pending: Burst,
}

impl PortIo {
    /// A port from its queues; `id` must be a port of the switch's configuration.
    pub fn new(id: u16, rx: RxQueue, tx: TxQueue) -> Self {
        Self {
            id,
            rx,
            tx,
            pending: Burst::new(),
        }
    }

    /// Frames dequeued from the core that the driver has not taken yet (counted as
    /// sent by the core; they leave on a later turn).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Gives the queues back (e.g. to reuse them between benchmark rounds). Pending
    /// frames are freed.
    pub fn into_queues(self) -> (RxQueue, TxQueue) {
        (self.rx, self.tx)
    }
}

impl std::fmt::Debug for PortIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PortIo({}, {} pending)", self.id, self.pending.len())
    }
}

/// What one call to [`Dataplane::poll`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Turn {
    /// Frames received from the ports.
    pub rx: usize,
    /// Frames the drivers took.
    pub tx: usize,
}

/// The switch core plus its ports: the whole state of one switching lcore.
pub struct Dataplane {
    /// The pure core (counters, queues, shaper state).
    pub switch: Switch<Mbuf>,
    /// The ports, polled in this order.
    pub ports: Vec<PortIo>,
    clock: TscClock,
    rx_burst: Burst,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("ports", &self.ports)
            .finish()
    }
}

/// Periodic statistics: called from the poll loop every `interval_ns` (not per packet).
pub trait StatsSink {
    /// `sw` is the core; `prev[i]` the counters of `ports[i]` at the previous call,
    /// `interval_ns` the time since then. Format with [`Switch::stats_line`].
    fn report(&mut self, sw: &Switch<Mbuf>, ports: &[u16], prev: &[PortCounters], interval_ns: u64);
}

/// A sink that prints one [`Switch::stats_line`] per port on stdout (the binary's
/// periodic line; printing happens once per interval, off the per-packet path).
#[derive(Debug, Default, Clone, Copy)]
pub struct PrintStats;

impl StatsSink for PrintStats {
    fn report(
        &mut self,
        sw: &Switch<Mbuf>,
        ports: &[u16],
        prev: &[PortCounters],
        interval_ns: u64,
    ) {
        for (&id, p) in ports.iter().zip(prev) {
            if let Some(line) = sw.stats_line(id, p, interval_ns) {
                println!("{line}");
            }
        }
    }
}

impl Dataplane {
    /// The loop state: `switch` built from the configuration, `ports` opened and
    /// started, `clock` the TSC clock (its zero is the switch's time zero).
    pub fn new(switch: Switch<Mbuf>, ports: Vec<PortIo>, clock: TscClock) -> Self {
        Self {
            switch,
            ports,
            clock,
            rx_burst: Burst::new(),
        }
    }

    /// The clock the loop reads.
    pub fn clock(&self) -> &TscClock {
        &self.clock
    }

    /// One loop turn at time `now` (ns on the switch's clock): RX and classify on every
    /// port (arrival time `now`), then TX what each port's shaper releases by the time
    /// the RX phase ends (the clock is read again if anything was received).
    #[inline]
    pub fn poll(&mut self, now: u64) -> Turn {
        self.poll_with(now, |_, _| {})
    }

    /// As [`Dataplane::poll`], with `rx_hook(port_id, frames)` called on every received
    /// burst before the core sees it (the `switch_fwd` benchmark uses it to play the
    /// NIC's DMA writing the frame headers; `poll` passes a no-op, which compiles away).
    #[inline]
    pub fn poll_with<F: FnMut(u16, &mut [Mbuf])>(&mut self, now: u64, mut rx_hook: F) -> Turn {
        let mut turn = Turn::default();
        for p in self.ports.iter_mut() {
            let n = p.rx.recv(&mut self.rx_burst);
            if n == 0 {
                continue;
            }
            turn.rx += n;
            rx_hook(p.id, self.rx_burst.as_mut_slice());
            // A rejected frame is handed back; dropping it frees the mbuf.
            self.switch
                .receive_burst(p.id, self.rx_burst.drain(), now, drop);
        }
        // Frames received in this turn may leave in it: the TX phase reads the clock
        // again (the shaper still never starts a frame before its arrival `now`).
        let now_tx = if turn.rx > 0 {
            self.clock.now_ns().max(now)
        } else {
            now
        };
        for p in self.ports.iter_mut() {
            turn.tx += Self::flush_port(&mut self.switch, p, now_tx);
        }
        turn
    }

    /// Sends what is pending on `p`, then, only if the driver took all of it, fills the
    /// TX burst from the core and sends again (frames left over stay pending).
    #[inline]
    fn flush_port(sw: &mut Switch<Mbuf>, p: &mut PortIo, now: u64) -> usize {
        let mut sent = 0;
        if !p.pending.is_empty() {
            sent += p.tx.send(&mut p.pending);
            if !p.pending.is_empty() {
                return sent;
            }
        }
        loop {
            let room = LOOP_BURST - p.pending.len();
            let pending = &mut p.pending;
            sw.dequeue_burst(p.id, now, room, |m| {
                // Cannot fail: at most `room` frames come.
                let _ = pending.push(m);
            });
            if p.pending.is_empty() {
                return sent;
            }
            let full = p.pending.is_full();
            sent += p.tx.send(&mut p.pending);
            // Keep going only while whole bursts leave (more may be due this turn).
            if !full || !p.pending.is_empty() {
                return sent;
            }
        }
    }

    /// Polls until `stop` is set, reading the TSC once per turn. Every
    /// `stats_interval_ns` (if non-zero) the sink gets the counters; it gets a last
    /// report when the loop stops.
    pub fn run(&mut self, stop: &AtomicBool, stats_interval_ns: u64, sink: &mut dyn StatsSink) {
        let ids: Vec<u16> = self.ports.iter().map(|p| p.id).collect();
        let snapshot = |sw: &Switch<Mbuf>| -> Vec<PortCounters> {
            ids.iter()
                .map(|&i| sw.counters(i).copied().unwrap_or_default())
                .collect()
        };
        let mut prev = snapshot(&self.switch);
        let mut last = self.clock.now_ns();
        let mut turns: u32 = 0;
        loop {
            let now = self.clock.now_ns();
            self.poll(now);
            turns = turns.wrapping_add(1);
            // Check the flag and the stats timer every 256 turns: a relaxed load is
            // cheap, but there is no need to do it per burst.
            if turns % 256 == 0 {
                if stats_interval_ns > 0 && now.saturating_sub(last) >= stats_interval_ns {
                    sink.report(&self.switch, &ids, &prev, now - last);
                    prev = snapshot(&self.switch);
                    last = now;
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
        // Give the drivers a last chance to take pending frames (bounded: a port
        // that takes nothing must not hang the shutdown).
        for _ in 0..1000 {
            let now = self.clock.now_ns();
            let mut left = 0;
            for p in self.ports.iter_mut() {
                Self::flush_port(&mut self.switch, p, now);
                left += p.pending.len();
            }
            if left == 0 {
                break;
            }
        }
        let now = self.clock.now_ns();
        sink.report(&self.switch, &ids, &prev, now.saturating_sub(last));
    }
}

/// Frames the driver has not taken, summed over ports (for tests and the final report).
pub fn pending_total(ports: &[PortIo]) -> usize {
    ports.iter().map(PortIo::pending).sum()
}

/// Default RX/TX burst size of the loop.
pub const LOOP_BURST: usize = BURST_SIZE;
