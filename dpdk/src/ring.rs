//! Lock-free rings of mbufs (`rte_ring`), to hand packets between cores.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::{Burst, Eal};

/// A multi-producer, multi-consumer ring of owned mbufs.
pub struct Ring {
    raw: NonNull<dpdk_sys::rte_ring>,
}

// SAFETY: rte_ring is a concurrent structure; the MP/MC variant is safe to
// use from many threads, and the SP/SC one is only reachable through the
// unique RingProducer / RingConsumer handles.
unsafe impl Send for Ring {}
// SAFETY: as for Send.
unsafe impl Sync for Ring {}

impl Ring {
    /// A multi-producer, multi-consumer ring with room for `count - 1`
    /// mbufs (`count` a power of two).
    pub fn new(eal: &Eal, name: &str, count: u32) -> Result<Ring> {
        Self::create(eal, name, count, 0)
    }

    /// A single-producer, single-consumer ring, as two unique handles.
    pub fn spsc(eal: &Eal, name: &str, count: u32) -> Result<(RingProducer, RingConsumer)> {
        let ring = Arc::new(Self::create(
            eal,
            name,
            count,
            dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
        )?);
        Ok((RingProducer { ring: ring.clone() }, RingConsumer { ring }))
    }

    fn create(_eal: &Eal, name: &str, count: u32, flags: u32) -> Result<Ring> {
        let cname =
            CString::new(name).map_err(|_| Error::InvalidArgument(name.into(), "NUL byte"))?;
        // SAFETY: valid name; the EAL is up.
        let raw = unsafe {
            dpdk_sys::rte_ring_create(cname.as_ptr(), count, dpdk_sys::SOCKET_ID_ANY, flags)
        };
        NonNull::new(raw)
            .map(|raw| Ring { raw })
            .ok_or_else(|| Error::last("rte_ring_create"))
    }

    /// Moves mbufs from the front of `burst` into the ring; returns how many
    /// went in (the rest stay in `burst`).
    #[inline]
    pub fn enqueue<const N: usize>(&self, burst: &mut Burst<N>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots are owned mbufs; the ring takes the
        // first `n`.
        let n = unsafe {
            dpdk_sys::shim_rte_ring_enqueue_burst(
                self.raw.as_ptr(),
                burst.as_raw() as *const *mut std::ffi::c_void,
                len as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        burst.consume_front(n);
        n
    }

    /// Moves mbufs from the ring into the free space of `burst`.
    #[inline]
    pub fn dequeue<const N: usize>(&self, burst: &mut Burst<N>) -> usize {
        let (ptr, room) = burst.spare_raw();
        if room == 0 {
            return 0;
        }
        // SAFETY: `room` free slots; the ring hands over `n` owned mbufs.
        let n = unsafe {
            dpdk_sys::shim_rte_ring_dequeue_burst(
                self.raw.as_ptr(),
                ptr.cast(),
                room as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        // SAFETY: the dequeue set the first `n` spare slots.
        unsafe { burst.assume_init_spare(n) };
        n
    }

    /// Mbufs currently in the ring.
    pub fn len(&self) -> usize {
        // SAFETY: valid ring.
        unsafe { dpdk_sys::shim_rte_ring_count(self.raw.as_ptr()) as usize }
    }

    /// Whether the ring is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let mut burst: Burst = Burst::new();
        while self.dequeue(&mut burst) > 0 {
            burst.clear();
        }
        // SAFETY: nobody else holds the ring any more.
        unsafe { dpdk_sys::rte_ring_free(self.raw.as_ptr()) };
    }
}

/// The only producer of a single-producer ring.
pub struct RingProducer {
    ring: Arc<Ring>,
}

/// The only consumer of a single-consumer ring.
pub struct RingConsumer {
    ring: Arc<Ring>,
}

impl RingProducer {
    /// See [`Ring::enqueue`].
    #[inline]
    pub fn enqueue<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        self.ring.enqueue(burst)
    }
}

impl RingConsumer {
    /// See [`Ring::dequeue`].
    #[inline]
    pub fn dequeue<const N: usize>(&mut self, burst: &mut Burst<N>) -> usize {
        self.ring.dequeue(burst)
    }

    /// Mbufs waiting.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
}
