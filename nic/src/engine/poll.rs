//! The poll loop: one turn of an engine ([`Engine::poll_turn`]), an engine
//! on its own thread ([`Engine::run`]) and several engines sharing one
//! thread ([`run_group`]), which parks when they are all idle.
//!
//! # Parking (`DeviceConfig::idle_yield`)
//! A thread whose engines have had nothing to do for [`SPIN_BEFORE_PARK`]
//! sleeps on its parker (crate::park) until something gives it work: a
//! doorbell rung on one of its QPs, a slow-path command, the stop; or until
//! its next timer is due. A frame is work too: where every frame an engine
//! receives comes from the other end of a ring pair turned on the same
//! thread, nothing arrives while the thread sleeps and the park is bounded
//! by the timers only; a shard behind a dispatcher is woken by the
//! dispatcher when it hands the shard frames (crate::shard). Any other port
//! (a TAP, `net_af_xdp`, a real NIC, a ring pair whose other end runs
//! elsewhere, a shard's own queue of a multi-queue port) has no way to
//! wake us: those parks end after at most
//! [`UNWOKEN_PARK_NS`], so a frame that arrives during one waits that long
//! at worst, and only after the engine was idle for [`SPIN_BEFORE_PARK`]
//! (never in the middle of a stream of frames). Without `idle_yield` (a
//! poll-mode core, `--busy_poll`) the thread spins and never sleeps.

use std::time::Duration;

use super::{Engine, QpSlot};
use crate::counters::Counters;
use crate::park::{SPIN_BEFORE_PARK, UNWOKEN_PARK_NS};

/// Poll turns between two visits of the slow path (and of the stop flag).
const SLOW_PATH_EVERY: u64 = 256;
/// How often the counters are published for the API to read, ns.
const PUBLISH_EVERY_NS: u64 = 1_000_000;

impl Engine {
    /// Runs the poll loop until the device is asked to stop; the engine is
    /// then published, dropped and marked done (as one engine of a group).
    pub fn run(self) {
        run_group(vec![self]);
    }

    /// One turn of the poll loop (module docs of [`crate::engine`]); `false`
    /// once the device has been asked to stop (the caller then drops the
    /// engine, which releases the port). [`run_group`] turns several
    /// engines on one core.
    pub fn poll_turn(&mut self) -> bool {
        if self.turn.is_multiple_of(SLOW_PATH_EVERY) {
            if self.shared.stopping() {
                return false;
            }
            self.slow_path();
        }
        self.turn = self.turn.wrapping_add(1);
        let now = self.clock.now_ns();
        self.turn_ns = now;
        let before = (self.counters.rx_packets, self.counters.tx_packets);

        let rung = self.doorbells(); // 1. posted work requests
        self.receive(now); // 2. RX burst -> QPs -> CC and CQs
        self.timers(now); // 3. due retransmit, RNR and CC timers
        if !self.cq_waiting.is_empty() {
            self.retry_completions(); // completions a full CQ held back
        }
        self.transmit(now); // 4. TX burst: control first, then round robin

        let busy = rung || before != (self.counters.rx_packets, self.counters.tx_packets);
        if busy {
            self.last_busy_ns = now;
        }
        if now.saturating_sub(self.last_publish_ns) > PUBLISH_EVERY_NS {
            self.publish();
            self.last_publish_ns = now;
        }
        true
    }

    /// Whether the engine has been idle for `ns` before its last turn (no
    /// packet in or out, no doorbell in any turn that started since).
    fn idle_for(&self, ns: u64) -> bool {
        self.last_busy_ns < self.turn_ns.saturating_sub(ns)
    }

    /// How long the engine's thread may sleep now that its last turn (the
    /// re-check after [`crate::park::Parker::prepare`]) found nothing to do:
    /// `None` if that turn had work or [`Self::wake_by`] says it must not
    /// sleep, else the ns until it must run again (`u64::MAX`: none). On
    /// the engine's own clock, as every time it compares.
    fn park_ns(&self) -> Option<u64> {
        if self.last_busy_ns == self.turn_ns {
            return None;
        }
        let by = self.wake_by(self.turn_ns)?;
        Some(if by == u64::MAX {
            u64::MAX
        } else {
            by.saturating_sub(self.clock.now_ns())
        })
    }

    /// How long the engine's thread may sleep from `now`: `None` if it must
    /// not (parking is off, or work is waiting: frames the port refused,
    /// control packets, a doorbell, a command, the stop), else the time
    /// (ns) by which it must run again, `u64::MAX` for none (module docs).
    fn wake_by(&self, now: u64) -> Option<u64> {
        if !self.park_when_idle
            || !self.txb.is_empty()
            || !self.lo.is_empty()
            || self.sched.control_len() > 0
            || !self.shared.no_doorbells()
            || !self.cmd.is_empty()
            || self.shared.stopping()
        {
            return None;
        }
        let mut by = self.wheel.next_deadline().unwrap_or(u64::MAX);
        // Nothing wakes us for: a frame from a port that cannot, room the
        // program polls free in a full CQ, data a QP could send once paced
        // or once its window opens, an ARP resolution the slow path retries.
        let unwoken = !self.rx_wakes
            || !self.cq_waiting.is_empty()
            || self.sched.active_len() > 0
            || self.sched.credit_limited_len() > 0
            || !self.resolving.is_empty()
            || self.gsi_deadline().is_some()
            || self.gsi_pending();
        if unwoken {
            by = by.min(now.saturating_add(UNWOKEN_PARK_NS));
        }
        Some(by)
    }

    /// Before the thread sleeps: the counters as they are now (a reader
    /// waits for no publication while we sleep).
    fn before_park(&mut self) {
        // A parked engine holds no mbufs ahead: the pools' in-use counts are
        // the frames in flight (leak checks), and another engine may use them.
        self.pools.release();
        self.counters.engine_parks += 1;
        self.publish();
        self.last_publish_ns = self.clock.now_ns();
    }

    /// After the thread slept: the next turn serves the slow path (a
    /// command or the stop may be what woke us).
    fn after_park(&mut self) {
        self.turn = self.turn.next_multiple_of(SLOW_PATH_EVERY);
    }

    /// Publishes the engine's counters, with the QPs' transport counters
    /// summed in and the control plane's, for the API handles to read. The
    /// QPs' sums are already up to date: every visit that can move a QP's
    /// counters ends with [`sync_counters`], while the QP's lines are still
    /// in the cache (a sync here, a millisecond later, would read lines of
    /// each QP that had done work, cold by then with thousands of QPs).
    pub(super) fn publish(&mut self) {
        let mut c = self.counters;
        c.capture_drops = self.capture.as_ref().map_or(0, |p| p.drops());
        c.set_control(self.control.counters());
        self.qp_sums.add_to(&mut c);
        self.shared.counters.publish(&c);
    }

    /// Publishes the counters after a last sync of every connected QP (when
    /// the engine stops).
    pub(super) fn publish_all(&mut self) {
        for k in 0..self.connected.len() {
            self.sync_qp_counters(self.connected[k]);
        }
        self.publish();
    }

    /// Brings QP `i`'s share of the engine's sums up to date (a QP that is
    /// about to go: what its transport counted stays in the sums).
    pub(super) fn sync_qp_counters(&mut self, i: usize) {
        if let Some(s) = self.qps[i].as_deref_mut() {
            sync_counters(s, &mut self.qp_sums);
        }
    }
}

/// Adds what QP `s`'s transport counters gained since its last sync to the
/// engine's `sums`. Called at the end of every visit that may have moved
/// them (a frame, a timer, a doorbell, a packet sent), so the published sums
/// are exact and no publication has to come back to a QP gone cold.
#[inline]
pub(super) fn sync_counters(s: &mut QpSlot, sums: &mut QpSums) {
    let mark = SyncMark::of(s);
    if mark == s.synced_mark {
        // None of the counters in the sums moved: the usual case, and only
        // lines the visit touched were read.
        return;
    }
    let now = QpSums::of(s);
    sums.add_delta(&now, &s.synced);
    s.synced = now;
    s.synced_mark = mark;
}

/// Takes QP `s`'s counters as they are now as the baseline of its next sync:
/// only what its transport counts from here on is added to the sums (a new
/// transport, after `connect` or `reset`).
pub(super) fn take_baseline(s: &mut QpSlot) {
    s.synced = QpSums::of(s);
    s.synced_mark = SyncMark::of(s);
}

/// What moves whenever a counter in [`QpSums`] does: the transport's
/// `error_events` (which counts every move of its nine error counters) and
/// the go-back-N rounds. Equal marks, equal sums: the sync reads nothing else.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct SyncMark {
    errors: u64,
    rounds: u64,
}

impl SyncMark {
    fn of(s: &QpSlot) -> SyncMark {
        SyncMark {
            errors: s.core.qp.as_ref().map_or(0, |q| q.counters().error_events),
            rounds: s.core.backoff.map_or(0, |b| b.rounds()),
        }
    }
}

/// The transport counters the engine publishes summed over its QPs.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct QpSums {
    gbn_backoffs: u64,
    retransmits: u64,
    timeouts: u64,
    rx_duplicates: u64,
    rx_out_of_sequence: u64,
    tx_seq_naks: u64,
    tx_rnr_naks: u64,
    tx_access_naks: u64,
    rx_drop_qp_state: u64,
    rx_drop_wrong_source: u64,
}

impl QpSums {
    /// One QP's counters (zero without a transport).
    fn of(s: &QpSlot) -> QpSums {
        let mut v = QpSums {
            gbn_backoffs: s.core.backoff.map_or(0, |b| b.rounds()),
            ..QpSums::default()
        };
        if let Some(q) = s.core.qp.as_ref().map(|qp| qp.counters()) {
            v.retransmits = q.tx_retransmits;
            v.timeouts = q.timeouts;
            v.rx_duplicates = q.rx_duplicates;
            v.rx_out_of_sequence = q.rx_out_of_sequence;
            v.tx_seq_naks = q.nak_seq_sent;
            v.tx_rnr_naks = q.rnr_nak_sent;
            v.tx_access_naks = q.nak_error_sent;
            v.rx_drop_qp_state = q.rx_dropped_state;
            v.rx_drop_wrong_source = q.rx_wrong_source;
        }
        v
    }

    /// `self += now - then`, field by field (a QP's counters only grow
    /// between two syncs: `then` is its last synced value).
    fn add_delta(&mut self, now: &QpSums, then: &QpSums) {
        let d = |a: u64, b: u64| a.wrapping_sub(b);
        self.gbn_backoffs = self
            .gbn_backoffs
            .wrapping_add(d(now.gbn_backoffs, then.gbn_backoffs));
        self.retransmits = self
            .retransmits
            .wrapping_add(d(now.retransmits, then.retransmits));
        self.timeouts = self.timeouts.wrapping_add(d(now.timeouts, then.timeouts));
        self.rx_duplicates = self
            .rx_duplicates
            .wrapping_add(d(now.rx_duplicates, then.rx_duplicates));
        self.rx_out_of_sequence = self
            .rx_out_of_sequence
            .wrapping_add(d(now.rx_out_of_sequence, then.rx_out_of_sequence));
        self.tx_seq_naks = self
            .tx_seq_naks
            .wrapping_add(d(now.tx_seq_naks, then.tx_seq_naks));
        self.tx_rnr_naks = self
            .tx_rnr_naks
            .wrapping_add(d(now.tx_rnr_naks, then.tx_rnr_naks));
        self.tx_access_naks = self
            .tx_access_naks
            .wrapping_add(d(now.tx_access_naks, then.tx_access_naks));
        self.rx_drop_qp_state = self
            .rx_drop_qp_state
            .wrapping_add(d(now.rx_drop_qp_state, then.rx_drop_qp_state));
        self.rx_drop_wrong_source = self
            .rx_drop_wrong_source
            .wrapping_add(d(now.rx_drop_wrong_source, then.rx_drop_wrong_source));
    }

    /// Adds the sums into the counters the engine publishes.
    fn add_to(&self, c: &mut Counters) {
        c.gbn_backoffs += self.gbn_backoffs;
        c.retransmits += self.retransmits;
        c.timeouts += self.timeouts;
        c.rx_duplicates += self.rx_duplicates;
        c.rx_out_of_sequence += self.rx_out_of_sequence;
        c.tx_seq_naks += self.tx_seq_naks;
        c.tx_rnr_naks += self.tx_rnr_naks;
        c.tx_access_naks += self.tx_access_naks;
        c.rx_drop_qp_state += self.rx_drop_qp_state;
        c.rx_drop_wrong_source += self.rx_drop_wrong_source;
    }
}

/// Several engines on one poll-mode thread, turned round robin (one
/// [`Engine::poll_turn`] each), so that many NICs share few cores (a testbed
/// with N hosts on a 2-core machine). An engine asked to stop is published,
/// dropped (its port released) and marked done; the loop ends with the last.
pub fn run_group(engines: Vec<Engine>) {
    /// Marks an engine done once it is dropped, also when the thread unwinds,
    /// so that `Device::close` never waits for an engine that is gone.
    struct Hosted(Option<Engine>);
    impl Drop for Hosted {
        fn drop(&mut self) {
            if let Some(e) = self.0.take() {
                let shared = e.shared.clone();
                drop(e);
                shared.mark_done();
            }
        }
    }
    let mut engines = engines;
    mark_rx_wakes(&mut engines);
    let parker = engines.first().map(|e| e.shared.parker.clone());
    let mut live: Vec<Hosted> = engines.into_iter().map(|e| Hosted(Some(e))).collect();
    let turn_all = |live: &mut Vec<Hosted>| {
        live.retain_mut(|h| match h.0.as_mut() {
            Some(e) => {
                if e.poll_turn() {
                    return true;
                }
                e.publish_all();
                false
            }
            None => false,
        });
    };
    let Some(parker) = parker else { return };
    // Where this thread runs, for the programs that wait on its work
    // (crate::verbs::CompletionQueue::wait): noted again after each park
    // and every `NOTE_CPU_TURNS` turns, in case the kernel moved it, and
    // taken back when the thread ends (the parker may live on in a CQ).
    const NOTE_CPU_TURNS: u32 = 64;
    struct Noted<'a>(&'a crate::park::Parker);
    impl Drop for Noted<'_> {
        fn drop(&mut self) {
            self.0.note_cpu(None);
        }
    }
    let _noted = Noted(&parker);
    parker.note_cpu(crate::sys::current_cpu());
    if !live
        .iter()
        .filter_map(|h| h.0.as_ref())
        .all(|e| e.park_when_idle)
    {
        // A poll-mode thread: spins, never sleeps.
        while !live.is_empty() {
            turn_all(&mut live);
        }
        return;
    }
    let spin_ns = SPIN_BEFORE_PARK.as_nanos() as u64;
    let mut slack_set = false;
    let mut turns = 0u32;
    while !live.is_empty() {
        turn_all(&mut live);
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(NOTE_CPU_TURNS) {
            parker.note_cpu(crate::sys::current_cpu());
        }
        // Idle for the whole spin, every engine? Each is asked on its own
        // clock: a group's engines were started one after another, and a
        // time on one engine's clock is not a time on another's.
        if !live
            .iter()
            .filter_map(|h| h.0.as_ref())
            .all(|e| e.idle_for(spin_ns))
        {
            continue;
        }
        // Announce the park, then turn every engine once more: whatever
        // came before the announcement is found now (and cancels the
        // park), whatever comes after it wakes us (crate::park).
        parker.prepare();
        turn_all(&mut live);
        if live.is_empty() {
            // The re-check turn saw the stop (its wake may have come before
            // the announcement): nothing is left to wake us.
            parker.cancel();
            break;
        }
        // A frame one engine sent in the re-check turn to another that
        // had already turned makes the sender busy, and the park is off.
        let park_ns = live
            .iter()
            .filter_map(|h| h.0.as_ref())
            .try_fold(u64::MAX, |t, e| e.park_ns().map(|p| p.min(t)));
        let Some(park_ns) = park_ns else {
            parker.cancel();
            continue;
        };
        if !slack_set {
            crate::verbs::wake_quickly();
            slack_set = true;
        }
        live.iter_mut()
            .filter_map(|h| h.0.as_mut())
            .for_each(Engine::before_park);
        let timeout = (park_ns != u64::MAX).then(|| Duration::from_nanos(park_ns));
        parker.park(timeout);
        parker.note_cpu(crate::sys::current_cpu());
        live.iter_mut()
            .filter_map(|h| h.0.as_mut())
            .for_each(Engine::after_park);
    }
}

/// Marks the engines whose every frame comes with a wake-up: the two ends
/// of one ring pair turned by the same group, and a shard behind a
/// dispatcher, which wakes the shard when it hands it frames (module docs);
/// and those whose frames another thread wrote: a shard behind a
/// dispatcher, an end of a ring pair whose other end is not in the group.
fn mark_rx_wakes(engines: &mut [Engine]) {
    let keys: Vec<Option<usize>> = engines.iter().map(|e| e.io.ring_pair_key()).collect();
    for (i, e) in engines.iter_mut().enumerate() {
        let behind_dispatcher = matches!(e.io, super::port::PacketIo::Shard { .. });
        let both_ends_here = keys[i].is_some_and(|k| {
            keys.iter()
                .enumerate()
                .any(|(j, other)| j != i && *other == Some(k))
        });
        e.rx_wakes = behind_dispatcher || both_ends_here;
        e.rx_cross_core = behind_dispatcher || (keys[i].is_some() && !both_ends_here);
    }
}
