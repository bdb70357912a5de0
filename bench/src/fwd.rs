//! io forwarding between two ports, the way DPDK's l2fwd/testpmd io mode do
//! it: receive a burst on one port, send it out of the other, free what the
//! driver would not take (counted as a drop). One screen, no allocation, no
//! lock, no syscall.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dpdk::{Burst, RxQueue, TxQueue};

/// Counters the forwarding thread publishes for whoever prints rates.
#[derive(Debug, Default)]
pub struct FwdCounters {
    /// Packets received (and forwarded or dropped).
    pub packets: AtomicU64,
    /// Packets the TX queue did not take, freed.
    pub dropped: AtomicU64,
}

/// One direction of forwarding.
pub struct Path {
    /// Where packets come in.
    pub rx: RxQueue,
    /// Where they go out.
    pub tx: TxQueue,
}

/// Forwards on every path, round robin, until `stop` is set.
pub fn forward(paths: &mut [Path], counters: &FwdCounters, stop: &AtomicBool) {
    let mut burst: Burst = Burst::new();
    // Bytes are not counted here: that would touch every mbuf header, which
    // an io forwarder otherwise never does; the ports' own counters
    // (`Port::stats`) have them.
    let (mut packets, mut dropped) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        for p in paths.iter_mut() {
            let n = p.rx.recv(&mut burst);
            if n == 0 {
                continue;
            }
            packets += n as u64;
            p.tx.send(&mut burst);
            dropped += burst.clear() as u64;
        }
        // Single writer: plain stores, no read-modify-write.
        counters.packets.store(packets, Ordering::Relaxed);
        counters.dropped.store(dropped, Ordering::Relaxed);
    }
}
