//! The poll loop: one turn of an engine ([`Engine::poll_turn`]), an engine
//! on its own thread ([`Engine::run`]) and several engines sharing one
//! thread ([`run_group`]).

use super::{Engine, QpSlot};
use crate::counters::Counters;

/// Poll turns between two visits of the slow path (and of the stop flag).
const SLOW_PATH_EVERY: u64 = 256;
/// Idle poll turns (no packet in or out, no doorbell) before an engine with
/// `DeviceConfig::idle_yield` yields its core once.
const IDLE_TURNS_BEFORE_YIELD: u32 = 64;
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
        let before = (self.counters.rx_packets, self.counters.tx_packets);

        let rung = self.doorbells(); // 1. posted work requests
        self.receive(now); // 2. RX burst -> QPs -> CC and CQs
        self.timers(now); // 3. due retransmit, RNR and CC timers
        if !self.cq_waiting.is_empty() {
            self.retry_completions(); // completions a full CQ held back
        }
        self.transmit(now); // 4. TX burst: control first, then round robin

        let busy = rung || before != (self.counters.rx_packets, self.counters.tx_packets);
        self.idle(busy);
        if now.saturating_sub(self.last_publish_ns) > PUBLISH_EVERY_NS {
            self.publish();
            self.last_publish_ns = now;
        }
        true
    }

    /// Counts idle turns; after [`IDLE_TURNS_BEFORE_YIELD`] of them lets a
    /// thread that shares this core run (`DeviceConfig::idle_yield`), never
    /// while there is work.
    fn idle(&mut self, busy: bool) {
        if busy {
            self.idle_turns = 0;
        } else if self.idle_yield {
            self.idle_turns += 1;
            if self.idle_turns >= IDLE_TURNS_BEFORE_YIELD && self.txb.is_empty() {
                self.idle_turns = 0;
                std::thread::yield_now();
            }
        }
    }

    /// Publishes the engine's counters, with the QPs' transport counters
    /// summed in and the control plane's, for the API handles to read. The
    /// QPs' sums are brought up to date [`SYNC_QPS_PER_PUBLISH`] QPs at a
    /// time (a sweep over every QP each millisecond would cost a cache miss
    /// per QP: most of an engine's time with 16k QPs).
    pub(super) fn publish(&mut self) {
        let n = self.connected.len();
        for _ in 0..n.min(SYNC_QPS_PER_PUBLISH) {
            if self.sync_cursor >= self.connected.len() {
                self.sync_cursor = 0;
            }
            let i = self.connected[self.sync_cursor];
            self.sync_cursor += 1;
            self.sync_qp_counters(i);
        }
        self.publish_synced();
    }

    /// Publishes the counters with every QP's brought up to date (when the
    /// engine stops).
    pub(super) fn publish_all(&mut self) {
        for k in 0..self.connected.len() {
            self.sync_qp_counters(self.connected[k]);
        }
        self.publish_synced();
    }

    fn publish_synced(&mut self) {
        let mut c = self.counters;
        c.capture_drops = self.capture.as_ref().map_or(0, |p| p.drops());
        c.set_control(self.control.counters());
        self.qp_sums.add_to(&mut c);
        self.shared.counters.publish(&c);
    }

    /// Adds what QP `i`'s transport counters gained since its last sync to
    /// the engine's sums.
    pub(super) fn sync_qp_counters(&mut self, i: usize) {
        if let Some(s) = self.qps[i].as_deref_mut() {
            let now = QpSums::of(s);
            self.qp_sums.add_delta(&now, &s.synced);
            s.synced = now;
        }
    }
}

/// QPs whose transport counters one publication brings up to date: all of
/// them up to this many; beyond, a sweep over every QP takes
/// `QPs / SYNC_QPS_PER_PUBLISH` ms (16 ms for 2048 QPs).
const SYNC_QPS_PER_PUBLISH: usize = 128;

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
    pub(super) fn of(s: &QpSlot) -> QpSums {
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
    let mut live: Vec<Hosted> = engines.into_iter().map(|e| Hosted(Some(e))).collect();
    while !live.is_empty() {
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
    }
}
