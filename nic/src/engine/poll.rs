//! The poll loop: one turn of an engine ([`Engine::poll_turn`]), an engine
//! on its own thread ([`Engine::run`]) and several engines sharing one
//! thread ([`run_group`]).

use super::Engine;

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
    /// summed in and the control plane's, for the API handles to read.
    pub(super) fn publish(&mut self) {
        let mut c = self.counters;
        c.capture_drops = self.capture.as_ref().map_or(0, |p| p.drops());
        c.set_control(self.control.counters());
        for &i in &self.connected {
            let Some(s) = self.qps[i].as_deref() else {
                continue;
            };
            c.gbn_backoffs += s.backoff.map_or(0, |b| b.rounds());
            if let Some(q) = s.qp.as_ref().map(|qp| qp.counters()) {
                c.retransmits += q.tx_retransmits;
                c.timeouts += q.timeouts;
                c.rx_duplicates += q.rx_duplicates;
                c.rx_out_of_sequence += q.rx_out_of_sequence;
                c.tx_seq_naks += q.nak_seq_sent;
                c.tx_rnr_naks += q.rnr_nak_sent;
                c.tx_access_naks += q.nak_error_sent;
                c.rx_drop_qp_state += q.rx_dropped_state;
            }
        }
        self.shared.counters.publish(&c);
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
                e.publish();
                false
            }
            None => false,
        });
    }
}
