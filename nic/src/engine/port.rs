//! Where an engine's frames come from and go to ([`PacketIo`]), and how a
//! port is set up for an engine or a device's shards (its receive pool, a
//! queue pair per engine, jumbo frames where the driver allows them).

use std::sync::Arc;

use dpdk::{Burst, Eal, Mempool, Port, RingConsumer, RingProducer, RxQueue, TxQueue};

use super::Engine;
use crate::contract::DeviceConfig;
use crate::counters::Counters;
use crate::error::VerbsError;
use crate::io::MAX_FRAME;
use crate::park::Parker;
use crate::shard::Steer;

/// The IP MTU the engine asks of its port: jumbo, room for a 4 KiB RoCE MTU
/// with INT and extension headers.
const PORT_MTU: u16 = 9000;

/// Where an engine's frames come from and go to: a port's queues, or, for
/// one shard of a sharded device, the rings to and from the device's
/// dispatcher (crate::shard; docs/design.md §5 "QPs sharded").
pub(crate) enum PacketIo {
    /// The port's RX and TX queue (an unsharded device).
    Port {
        /// RX queue.
        rx: RxQueue,
        /// TX queue.
        tx: TxQueue,
    },
    /// One shard's own queue pair of a port with a queue pair per shard,
    /// and its side of the steering between shards (crate::shard::Steer).
    Queue {
        /// The shard's RX queue.
        rx: RxQueue,
        /// The shard's TX queue.
        tx: TxQueue,
        /// Frames to and from the other shards.
        steer: Steer,
    },
    /// A shard: frames for its QPs from the dispatcher, frames to send back.
    Shard {
        /// Frames steered to this shard.
        rx: RingConsumer,
        /// Frames for the dispatcher to send.
        tx: RingProducer,
        /// The dispatcher's parker: a frame handed to a parked dispatcher
        /// wakes it (crate::park), so an idle dispatcher costs no latency
        /// on the way out.
        dispatcher: Arc<Parker>,
    },
}

impl PacketIo {
    /// [`dpdk::Port::ring_pair_key`] of the port whose queue this reads
    /// (`None` for a shard behind a dispatcher: its frames come from a ring).
    pub(super) fn ring_pair_key(&self) -> Option<usize> {
        match self {
            PacketIo::Port { rx, .. } | PacketIo::Queue { rx, .. } => rx.ring_pair_key(),
            PacketIo::Shard { .. } => None,
        }
    }

    /// Fills `b` with received frames (for a shard with its own queue:
    /// those of its QPs, counting what it steers to others in `counters`).
    #[inline]
    pub(super) fn recv(&mut self, b: &mut Burst, counters: &mut Counters) -> usize {
        match self {
            PacketIo::Port { rx, .. } => rx.recv(b),
            PacketIo::Queue { rx, steer, .. } => {
                rx.recv(b);
                steer.exchange(b, counters);
                b.len()
            }
            PacketIo::Shard { rx, .. } => rx.dequeue(b),
        }
    }

    #[inline]
    pub(super) fn send(&mut self, b: &mut Burst) -> usize {
        match self {
            PacketIo::Port { tx, .. } | PacketIo::Queue { tx, .. } => tx.send(b),
            PacketIo::Shard { tx, dispatcher, .. } => {
                let n = tx.enqueue(b);
                if n > 0 {
                    dispatcher.wake();
                }
                n
            }
        }
    }
}

impl Engine {
    /// A unique name for one of this process's DPDK objects (mempools,
    /// rings: their names share one namespace).
    pub(crate) fn unique_name(kind: &str) -> String {
        static POOL_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = POOL_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("nic{}_{id}_{kind}", std::process::id())
    }

    /// The pool a port receives into.
    pub(crate) fn rx_pool(
        eal: &'static Eal,
        cfg: &DeviceConfig,
    ) -> Result<Arc<Mempool>, VerbsError> {
        Ok(Mempool::new(
            eal,
            &Self::unique_name("rx"),
            cfg.pool_size,
            256,
            Mempool::DEFAULT_DATA_ROOM,
        )?)
    }

    /// Configures `port` with one RX and one TX queue receiving into
    /// `rx_pool`; returns the queues and the longest frame the port carries.
    pub(crate) fn open_port(
        port: &mut Port,
        rx_pool: &Arc<Mempool>,
    ) -> Result<(RxQueue, TxQueue, usize), VerbsError> {
        let (mut rxs, mut txs, max_frame) = Self::open_port_queues(port, rx_pool, 1)?;
        let (Some(rx), Some(tx)) = (rxs.pop(), txs.pop()) else {
            return Err(VerbsError::PortWithoutQueue);
        };
        Ok((rx, tx, max_frame))
    }

    /// Configures `port` with `queues` RX and TX queues receiving into
    /// `rx_pool`; returns them and the longest frame the port carries.
    pub(crate) fn open_port_queues(
        port: &mut Port,
        rx_pool: &Arc<Mempool>,
        queues: u16,
    ) -> Result<(Vec<RxQueue>, Vec<TxQueue>, usize), VerbsError> {
        // Jumbo frames where the port allows them, so that a 4 KiB RoCE MTU
        // (plus INT and extension headers) fits (e.g. a TAP, whose kernel side
        // would otherwise drop frames above 1500 bytes of IP).
        let port_cfg = dpdk::PortConfig {
            mtu: Some(PORT_MTU),
            rx_queues: queues,
            tx_queues: queues,
            ..dpdk::PortConfig::default()
        };
        let (rxs, txs) = port.configure(&port_cfg, rx_pool)?;
        if rxs.len() < usize::from(queues) || txs.len() < usize::from(queues) {
            return Err(VerbsError::PortWithoutQueue);
        }
        let max_frame = port
            .max_frame_len()
            .map_or(MAX_FRAME, |n| (n as usize).min(MAX_FRAME));
        Ok((rxs, txs, max_frame))
    }
}
