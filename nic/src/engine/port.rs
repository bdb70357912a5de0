//! Where an engine's frames come from and go to ([`PacketIo`]), and how a
//! port is set up for an engine (its receive pool, one RX and one TX queue,
//! jumbo frames where the driver allows them).

use std::sync::Arc;

use dpdk::{Burst, Eal, Mempool, Port, RingConsumer, RingProducer, RxQueue, TxQueue};

use super::Engine;
use crate::contract::DeviceConfig;
use crate::error::VerbsError;
use crate::io::MAX_FRAME;

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
    /// A shard: frames for its QPs from the dispatcher, frames to send back.
    Shard {
        /// Frames steered to this shard.
        rx: RingConsumer,
        /// Frames for the dispatcher to send.
        tx: RingProducer,
    },
}

impl PacketIo {
    #[inline]
    pub(super) fn recv(&mut self, b: &mut Burst) -> usize {
        match self {
            PacketIo::Port { rx, .. } => rx.recv(b),
            PacketIo::Shard { rx, .. } => rx.dequeue(b),
        }
    }

    #[inline]
    pub(super) fn send(&mut self, b: &mut Burst) -> usize {
        match self {
            PacketIo::Port { tx, .. } => tx.send(b),
            PacketIo::Shard { tx, .. } => tx.enqueue(b),
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
        // Jumbo frames where the port allows them, so that a 4 KiB RoCE MTU
        // (plus INT and extension headers) fits (e.g. a TAP, whose kernel side
        // would otherwise drop frames above 1500 bytes of IP).
        let port_cfg = dpdk::PortConfig {
            mtu: Some(PORT_MTU),
            ..dpdk::PortConfig::default()
        };
        let (mut rxs, mut txs) = port.configure(&port_cfg, rx_pool)?;
        let (Some(rx), Some(tx)) = (rxs.pop(), txs.pop()) else {
            return Err(VerbsError::PortWithoutQueue);
        };
        let max_frame = port
            .max_frame_len()
            .map_or(MAX_FRAME, |n| (n as usize).min(MAX_FRAME));
        Ok((rx, tx, max_frame))
    }
}
