//! The engine's side of the port's control plane (crate::control): frames
//! that are not RoCEv2 go to it, the replies it writes go out with the TX
//! burst, and slow-path requests for a peer's MAC wait here until ARP
//! answers or gives up. The logic itself (what to answer, the ARP cache)
//! is pure and lives in crate::control.

use dpdk::Burst;

use crate::contract::{EngineError, Reply, CAPTURE_SNAP};
use crate::control::{Handled, Resolution};
use crate::counters::Counters;
use crate::io::copy_frame;
use crate::io::TxPools;
use crate::pcapng::CaptureProducer;

use super::rx::CAPTURE_RX;
use super::tx::CAPTURE_TX;
use super::Engine;

impl Engine {
    /// A received frame that is not RoCEv2: answered and counted by the
    /// control plane, or counted here as neither RoCEv2 nor control.
    pub(super) fn control_frame(&mut self, frame: &[u8], now: u64) {
        if let Some(cap) = self.capture.as_mut() {
            cap.capture(CAPTURE_RX, now, frame);
        }
        let mut out = std::mem::take(&mut self.control_out);
        match self.control.on_frame(frame, now, &mut out) {
            Handled::Reply(n) => self.send_frame(&out[..n], now),
            Handled::Taken => {}
            Handled::NotControl if crate::control::is_truncated_ipv4(frame) => {
                self.counters.rx_drop_malformed += 1
            }
            Handled::NotControl => self.counters.rx_drop_not_roce += 1,
        }
        self.control_out = out;
    }

    /// Queues a control-plane frame for the next TX burst ([`push_frame`]).
    pub(super) fn send_frame(&mut self, frame: &[u8], now: u64) {
        push_frame(
            &mut self.txb,
            &mut self.pools,
            &mut self.counters,
            &mut self.capture,
            frame,
            now,
        );
    }

    /// [`crate::contract::Command::ResolveMac`]: answered now from the cache,
    /// or kept until ARP answers (a request goes out for a new resolution).
    pub(super) fn resolve_mac(&mut self, ip: [u8; 4], reply: Reply<[u8; 6]>, now: u64) {
        let mut out = std::mem::take(&mut self.control_out);
        match self.control.resolve(ip, now, &mut out) {
            Resolution::Known(mac) => {
                let _ = reply.send(Ok(mac));
            }
            Resolution::Pending(request) => {
                if let Some(n) = request {
                    self.send_frame(&out[..n], now);
                }
                self.resolving.push((ip, reply));
            }
            Resolution::Failed => {
                let _ = reply.send(Err(EngineError::ArpCacheFull(ip.into())));
            }
        }
        self.control_out = out;
    }

    /// The control plane's slow work: the gratuitous ARP once at start,
    /// retries of resolutions under way, and answers to the requests that
    /// waited for one that completed or failed.
    pub(super) fn control_slow_path(&mut self, now: u64) {
        let mut out = std::mem::take(&mut self.control_out);
        if !self.announced {
            self.announced = true;
            if let Some(n) = self.control.gratuitous(&mut out) {
                self.send_frame(&out[..n], now);
            }
        }
        if self.control.cache().is_empty() {
            self.control_out = out;
            return;
        }
        let (txb, pools, counters, capture) = (
            &mut self.txb,
            &mut self.pools,
            &mut self.counters,
            &mut self.capture,
        );
        self.control.poll(
            now,
            &mut out,
            |f| push_frame(txb, pools, counters, capture, f, now),
            |_| {},
        );
        // A resolution that is neither resolved nor under way any more has
        // failed (the cache drops it after its last request).
        let control = &self.control;
        self.resolving.retain(|(ip, reply)| {
            if let Some(mac) = control.lookup(*ip, now) {
                let _ = reply.send(Ok(mac));
                false
            } else if !control.cache().is_pending(*ip) {
                let _ = reply.send(Err(EngineError::ArpFailed((*ip).into())));
                false
            } else {
                true
            }
        });
        self.control_out = out;
    }
}

/// Puts `frame` (copied into an mbuf) into the TX burst, capturing and
/// counting it; a frame with no mbuf or no room in the burst is counted as
/// dropped (the control plane's peers retry, as with any lost frame).
fn push_frame(
    txb: &mut Burst,
    pools: &mut TxPools,
    counters: &mut Counters,
    capture: &mut Option<CaptureProducer<CAPTURE_SNAP>>,
    frame: &[u8],
    now: u64,
) {
    let Ok(m) = copy_frame(frame, &mut pools.hdr) else {
        counters.tx_drop_no_mbuf += 1;
        return;
    };
    if txb.push(m).is_err() {
        counters.tx_drop_queue_full += 1;
        return;
    }
    if let Some(cap) = capture.as_mut() {
        cap.capture(CAPTURE_TX, now, frame);
    }
    counters.tx_packets += 1;
    counters.tx_bytes += frame.len() as u64;
}
