//! Per-port counters (one per event and drop reason, docs/design.md §3) and the
//! periodic stats line.

use std::fmt;

/// Counters of one port. Ingress-side events (`rx_*`, malformed, unroutable, TTL) are
/// counted on the port the packet arrived on; queue, drop-at-enqueue and transmit
/// events on the egress port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received (frame bytes).
    pub rx_bytes: u64,
    /// Frames dropped: truncated Ethernet/IPv4/UDP, bad IHL/length/checksum, bad INT
    /// container or truncated BTH.
    pub rx_malformed: u64,
    /// Frames dropped: not IPv4 (ARP, IPv6, VLAN-tagged, ...).
    pub rx_not_ipv4: u64,
    /// Frames dropped: TTL 0 or 1 on arrival.
    pub rx_ttl_expired: u64,
    /// Frames dropped: no route for the destination.
    pub rx_unroutable: u64,

    /// Frames accepted into this port's queues (both classes).
    pub enqueued: u64,
    /// Of which high-priority (ACK/NAK/CNP) frames.
    pub enqueued_ctrl: u64,
    /// Frames marked CE by WRED (LDCP 004 section 2.1).
    pub ce_marked: u64,
    /// Not-ECT frames dropped at q >= K (LDCP 004 section 2.3).
    pub wred_drops: u64,
    /// Frames dropped because the data queue would exceed `buf_max`.
    pub tail_drops: u64,
    /// High-priority frames dropped because `ctrl_buf_max` was full.
    pub ctrl_tail_drops: u64,

    /// Frames transmitted (dequeued).
    pub tx_packets: u64,
    /// Frame bytes transmitted (after INT push).
    pub tx_bytes: u64,
    /// Wire bytes transmitted (frame + FCS + preamble + IFG, padded to 64 B).
    pub tx_wire_bytes: u64,
    /// INT hop records pushed.
    pub int_pushed: u64,
    /// INT containers that were full (RemainingHopCnt 0): E bit set, nothing pushed.
    pub int_e_set: u64,
    /// INT pushes that failed (no headroom, or the container no longer parsed);
    /// the frame is sent without this hop's record.
    pub int_errors: u64,

    /// Bytes now in the queues (data + control).
    pub queue_bytes: u64,
    /// Largest `queue_bytes` seen.
    pub queue_max_bytes: u64,
    /// Frames now in the queues.
    pub queue_packets: u64,
}

impl PortCounters {
    /// Every drop counted on this port.
    pub fn drops(&self) -> u64 {
        self.rx_malformed
            + self.rx_not_ipv4
            + self.rx_ttl_expired
            + self.rx_unroutable
            + self.wred_drops
            + self.tail_drops
            + self.ctrl_tail_drops
    }

    /// `(name, value)` for every counter, `ethtool -S` style.
    pub fn fields(&self) -> [(&'static str, u64); 22] {
        [
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("rx_malformed", self.rx_malformed),
            ("rx_not_ipv4", self.rx_not_ipv4),
            ("rx_ttl_expired", self.rx_ttl_expired),
            ("rx_unroutable", self.rx_unroutable),
            ("enqueued", self.enqueued),
            ("enqueued_ctrl", self.enqueued_ctrl),
            ("ce_marked", self.ce_marked),
            ("wred_drops", self.wred_drops),
            ("tail_drops", self.tail_drops),
            ("ctrl_tail_drops", self.ctrl_tail_drops),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("tx_wire_bytes", self.tx_wire_bytes),
            ("int_pushed", self.int_pushed),
            ("int_e_set", self.int_e_set),
            ("int_errors", self.int_errors),
            ("queue_bytes", self.queue_bytes),
            ("queue_max_bytes", self.queue_max_bytes),
            ("queue_packets", self.queue_packets),
            ("drops", self.drops()),
        ]
    }
}

/// One periodic stats line for a port: rates over the interval since `prev`, queue
/// depth now and max, and the event counters. Formatting allocates nothing itself (it
/// writes into whatever the caller's formatter targets).
///
/// ```text
/// port 1: rx 1.20 Mpps 9.80 Gb/s | tx 1.19 Mpps 9.75 Gb/s (wire 24.90 Gb/s) | q 12345 B max 40000 | ce 120 wred 0 tail 3 ctrl_tail 0 | int 1190000 E 0 err 0 | bad 0 non4 0 ttl 0 noroute 0
/// ```
#[derive(Debug, Clone, Copy)]
pub struct StatsLine<'a> {
    /// Port id.
    pub port_id: u16,
    /// Counters now.
    pub cur: &'a PortCounters,
    /// Counters at the previous line.
    pub prev: &'a PortCounters,
    /// Nanoseconds between the two.
    pub interval_ns: u64,
}

impl fmt::Display for StatsLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.cur;
        let p = self.prev;
        let secs = (self.interval_ns.max(1)) as f64 / 1e9;
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
        write!(
            f,
            "port {}: rx {:.2} Mpps {:.2} Gb/s | tx {:.2} Mpps {:.2} Gb/s (wire {:.2} Gb/s) | \
             q {} B max {} | ce {} wred {} tail {} ctrl_tail {} | int {} E {} err {} | \
             bad {} non4 {} ttl {} noroute {}",
            self.port_id,
            rate(c.rx_packets, p.rx_packets) / 1e6,
            rate(c.rx_bytes, p.rx_bytes) * 8.0 / 1e9,
            rate(c.tx_packets, p.tx_packets) / 1e6,
            rate(c.tx_bytes, p.tx_bytes) * 8.0 / 1e9,
            rate(c.tx_wire_bytes, p.tx_wire_bytes) * 8.0 / 1e9,
            c.queue_bytes,
            c.queue_max_bytes,
            c.ce_marked,
            c.wred_drops,
            c.tail_drops,
            c.ctrl_tail_drops,
            c.int_pushed,
            c.int_e_set,
            c.int_errors,
            c.rx_malformed,
            c.rx_not_ipv4,
            c.rx_ttl_expired,
            c.rx_unroutable,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_line_rates() {
        let prev = PortCounters::default();
        let cur = PortCounters {
            tx_packets: 1_000_000,
            tx_bytes: 125_000_000,
            queue_bytes: 7,
            ..Default::default()
        };
        let s = StatsLine {
            port_id: 3,
            cur: &cur,
            prev: &prev,
            interval_ns: 1_000_000_000,
        }
        .to_string();
        assert!(s.starts_with("port 3: rx 0.00 Mpps"), "{s}");
        assert!(s.contains("tx 1.00 Mpps 1.00 Gb/s"), "{s}");
        assert!(s.contains("q 7 B"), "{s}");
    }
}
