//! NIC counters, named like `ethtool -S` and `rdma statistic` show them.
//!
//! The engine counts into a plain [`Counters`] (no atomics on the hot path)
//! and publishes a copy into [`SharedCounters`] every so often, from where
//! any thread reads a [`Counters`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Every counter of one device. Plain integers: owned by the engine thread.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            /// `(name, value)` for every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name), )*].into_iter()
            }

            /// Adds `o` counter by counter (a sharded device sums its engines).
            pub fn accumulate(&mut self, o: &Counters) {
                $( self.$name = self.$name.wrapping_add(o.$name); )*
            }
        }

        /// The published copy of [`Counters`], readable from any thread.
        #[derive(Debug, Default)]
        pub struct SharedCounters {
            $( $name: AtomicU64, )*
        }

        impl SharedCounters {
            /// Publishes `c` (single writer: plain stores).
            pub fn publish(&self, c: &Counters) {
                $( self.$name.store(c.$name, Ordering::Relaxed); )*
            }

            /// The last published values.
            pub fn snapshot(&self) -> Counters {
                Counters { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Frames received from the port.
    rx_packets,
    /// Bytes received from the port.
    rx_bytes,
    /// Frames sent to the port.
    tx_packets,
    /// Bytes sent to the port.
    tx_bytes,
    /// RoCEv2 data packets received (requests and READ responses).
    rx_data_packets,
    /// RoCEv2 data packets sent (first transmissions and retransmissions).
    tx_data_packets,
    /// ACKs received.
    rx_acks,
    /// ACKs sent.
    tx_acks,
    /// NAKs received (any syndrome).
    rx_naks,
    /// NAKs sent (any syndrome).
    tx_naks,
    /// PSN sequence error NAKs sent (one per gap).
    tx_seq_naks,
    /// RNR NAKs sent.
    tx_rnr_naks,
    /// Remote access error NAKs sent.
    tx_access_naks,
    /// Packets retransmitted (go-back-N after a NAK or a timeout).
    retransmits,
    /// Retransmission timeouts.
    timeouts,
    /// Go-back-N rounds (sequence error NAKs, retransmit timeouts) that cut
    /// the window of a QP without CC (crate::gbn_backoff).
    gbn_backoffs,
    /// Duplicate requests received (re-ACKed or replayed).
    rx_duplicates,
    /// Out-of-sequence requests dropped silently after the NAK.
    rx_out_of_sequence,
    /// CNPs sent (DCQCN notification point).
    tx_cnps,
    /// CNPs received (DCQCN reaction point).
    rx_cnps,
    /// Data packets received with ECN CE set.
    rx_ce_marked,
    /// Frames dropped: ICRC mismatch.
    rx_drop_icrc,
    /// Frames dropped: malformed or truncated.
    rx_drop_malformed,
    /// Frames dropped: neither RoCEv2 (IPv4/UDP 4791) nor for the control
    /// plane (ARP, ICMP echo to our address).
    rx_drop_not_roce,
    /// Frames dropped: unknown destination QP.
    rx_drop_unknown_qp,
    /// CM MADs received on QP 1 (engine/gsi.rs).
    rx_cm_mads,
    /// Frames to QP 1 dropped: not a UD SEND with the GSI Q_Key, or not a CM MAD.
    rx_drop_gsi,
    /// REQs dropped unanswered: the port's CM held its most half-open
    /// connections (`rdma::cm::CmConfig::max_half_open`; the peer retries).
    rx_drop_cm_req,
    /// CM MADs sent to a peer's QP 1.
    tx_cm_mads,
    /// CM MADs not sent: the peer's MAC could not be resolved, or the frame not built.
    tx_drop_gsi,
    /// Frames dropped: QP not in a state that accepts them.
    rx_drop_qp_state,
    /// Frames dropped: to a connected QP from another source IPv4 address
    /// than its peer's (the address vector check of rxe's `check_addr`).
    rx_drop_wrong_source,
    /// Frames dropped: larger than the RX path handles.
    rx_drop_too_long,
    /// Frames not sent: no mbuf.
    tx_drop_no_mbuf,
    /// Frames not sent: the port's TX queue was full.
    tx_drop_queue_full,
    /// UD datagrams not sent: their address handle was destroyed while
    /// the work request waited (the send completes; UD is unreliable).
    tx_drop_no_ah,
    /// Work completions with an error status.
    completion_errors,
    /// Capture records dropped because the capture ring was full.
    capture_drops,
    /// Async events dropped because the program did not read them
    /// (`Device::events`) and the queue was full.
    async_event_drops,
    /// QPs that exist on the engine (a gauge: created and not destroyed).
    qps_live,
    /// Frames a sharded device dropped because the ring to the QP's shard
    /// was full (like a NIC's per-queue RX overflow; crate::shard).
    rx_drop_shard_full,
    /// Frames that arrived on another shard's queue and were handed to
    /// their own shard (a device with a queue pair per shard, crate::shard).
    rx_steered,
    /// Frames for the port's own MAC and IP handed back to its receive path inside
    /// the NIC instead of the wire (two QPs of one port: loopback, as a
    /// hardware RoCE NIC and Linux rxe do). Counted in `tx_packets` when
    /// built and in `rx_packets` when received, as any frame.
    tx_loopback,
    /// Looped-back frames dropped because the loopback queue was full (as
    /// a NIC drops on a full RX queue; the transport recovers them).
    rx_drop_loopback_full,
    /// ARP requests received (for any address).
    rx_arp_requests,
    /// ARP replies received.
    rx_arp_replies,
    /// ARP requests sent (resolutions, retries, the gratuitous one at start).
    tx_arp_requests,
    /// ARP replies sent (to requests for our address).
    tx_arp_replies,
    /// Peer MACs found in the ARP cache.
    arp_cache_hits,
    /// Peer MACs not in the ARP cache (a resolution started).
    arp_cache_misses,
    /// Resolutions that got no ARP reply (or found the cache full).
    arp_resolve_failures,
    /// ICMP echo requests to our address received.
    rx_icmp_echo_requests,
    /// ICMP echo replies sent.
    tx_icmp_echo_replies,
    /// ARP or ICMP frames dropped: malformed, bad checksum, or a kind the
    /// control plane does not speak.
    rx_drop_control,
    /// Times the engine's thread parked, idle (`DeviceConfig::idle_yield`;
    /// crate::park): each engine of a group counts its thread's parks.
    engine_parks,
}

impl Counters {
    /// Takes the control plane's counters (crate::control) into these.
    pub fn set_control(&mut self, c: &crate::control::ControlCounters) {
        self.rx_arp_requests = c.rx_arp_requests;
        self.rx_arp_replies = c.rx_arp_replies;
        self.tx_arp_requests = c.tx_arp_requests;
        self.tx_arp_replies = c.tx_arp_replies;
        self.arp_cache_hits = c.arp_cache_hits;
        self.arp_cache_misses = c.arp_cache_misses;
        self.arp_resolve_failures = c.arp_resolve_failures;
        self.rx_icmp_echo_requests = c.rx_icmp_echo_requests;
        self.tx_icmp_echo_replies = c.tx_icmp_echo_replies;
        self.rx_drop_control = c.rx_drop_control;
    }
}

impl std::fmt::Display for Counters {
    /// One `name: value` per line, like `ethtool -S`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in self.iter() {
            writeln!(f, "     {k}: {v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_and_snapshot_round_trip_every_counter() {
        let mut c = Counters::default();
        // A distinct value per counter, so a swapped or missing field fails.
        let names: Vec<&str> = c.iter().map(|(k, _)| k).collect();
        assert!(names.len() >= 30);
        c.rx_packets = 1;
        c.tx_cnps = 2;
        c.rx_drop_icrc = 3;
        c.capture_drops = 4;
        let s = SharedCounters::default();
        s.publish(&c);
        assert_eq!(s.snapshot(), c);
        let text = c.to_string();
        assert!(text.contains("     rx_drop_icrc: 3\n"));
        assert!(text.contains("     tx_cnps: 2\n"));
        assert_eq!(text.lines().count(), names.len());
    }
}
