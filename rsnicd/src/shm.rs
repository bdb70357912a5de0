//! Shared memory between the daemon and a program (issue 42's data path):
//! a memfd mapped by both ([`Region`]), passed over the control socket with
//! `SCM_RIGHTS` ([`crate::sock::send_fd`]), and single-producer
//! single-consumer rings of fixed-size slots in it ([`Ring`]): a program's
//! doorbells one way, its completions the other, with no system call and no
//! lock on either side.
//!
//! The other side of a ring is not trusted: a program may write anything
//! into memory it shares. Every index read from the shared header is checked
//! before use (a producer index more than a ring ahead of the consumer's, or
//! behind it, is [`RingError::Corrupt`]), a slot's length is checked against
//! the slot size, and a message is copied out of its slot before it is
//! looked at, so a peer rewriting it meanwhile cannot change what was
//! checked. The worst a peer can do is corrupt its own rings.
//!
//! ```text
//! header (256 B): 0 magic "RSRG" | 4 slot size | 8 slots (a power of 2)
//!                 64 producer index (u64, its own cache line)
//!                 128 consumer index (u64, its own cache line)
//! slots: slot i at 256 + i * slot size: u32 length, then the message
//! ```

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A shared mapping of a memfd.
pub struct Region {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access through the
// ring goes through atomics or copies, and a Region has one owner.
unsafe impl Send for Region {}

impl Region {
    /// A new memfd of `len` bytes (zeroed), mapped shared.
    pub fn create(name: &str, len: usize) -> io::Result<Region> {
        let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid C string; MFD_CLOEXEC: no leak into children.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made, owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: our memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Region::map(fd)
    }

    /// Maps a memfd received from the other side, its whole length.
    pub fn map(fd: OwnedFd) -> io::Result<Region> {
        // SAFETY: stat is plain data, filled by fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor we own and an out struct.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let len = st.st_size as usize;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty region",
            ));
        }
        // SAFETY: a fresh shared mapping of the whole file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            fd,
            ptr: ptr.cast(),
            len,
        })
    }

    /// Its memfd (to pass to the other side).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: [`Region::map`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// "RSRG", little-endian.
const RING_MAGIC: u32 = 0x4752_5352;
/// The header's length: three cache lines and room.
pub const RING_HEADER: usize = 256;
const PRODUCER_AT: usize = 64;
const CONSUMER_AT: usize = 128;

/// Why a ring cannot be used, or a message not passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The region is too small, or the layout asked for is not valid (slots
    /// not a power of 2, a slot too small or not a multiple of 8).
    #[error("bad ring layout")]
    Layout,
    /// The header's magic or layout is not the one expected.
    #[error("not a ring, or another layout")]
    NotARing,
    /// The other side wrote an index or a length that cannot be: the ring
    /// is unusable (its owner's connection is closed).
    #[error("the other side corrupted the ring")]
    Corrupt,
    /// A message longer than a slot holds.
    #[error("message of {0} bytes, a slot holds {1}")]
    TooLong(usize, usize),
}

/// One side's view of a ring at `offset` in a [`Region`].
pub struct Ring<'r> {
    base: *mut u8,
    slot_size: usize,
    slots: u64,
    /// This side's own copy of its index (the shared one is only written).
    mine: u64,
    _region: std::marker::PhantomData<&'r Region>,
}

impl<'r> Ring<'r> {
    /// The bytes a ring of `slots` slots of `slot_size` bytes takes.
    pub fn bytes(slots: usize, slot_size: usize) -> usize {
        RING_HEADER + slots * slot_size
    }

    fn check(
        region: &Region,
        offset: usize,
        slots: usize,
        slot_size: usize,
    ) -> Result<(), RingError> {
        let ok = slots.is_power_of_two()
            && slot_size >= 16
            && slot_size % 8 == 0
            && offset % 64 == 0
            && offset
                .checked_add(Self::bytes(slots, slot_size))
                .is_some_and(|end| end <= region.len);
        ok.then_some(()).ok_or(RingError::Layout)
    }

    fn at(
        region: &'r Region,
        offset: usize,
        slots: usize,
        slot_size: usize,
        mine: u64,
    ) -> Ring<'r> {
        Ring {
            // SAFETY: within the region (checked by the caller).
            base: unsafe { region.ptr.add(offset) },
            slot_size,
            slots: slots as u64,
            mine,
            _region: std::marker::PhantomData,
        }
    }

    fn word32(&self, at: usize) -> &AtomicU32 {
        // SAFETY: an aligned u32 in the header, which lives as long as 'r.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    fn word64(&self, at: usize) -> &AtomicU64 {
        // SAFETY: an aligned u64 in the header, which lives as long as 'r.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    /// Lays out a new ring (the side that made the region): its header, both
    /// indexes 0. The view returned produces.
    pub fn create(
        region: &'r Region,
        offset: usize,
        slots: usize,
        slot_size: usize,
    ) -> Result<Ring<'r>, RingError> {
        Self::check(region, offset, slots, slot_size)?;
        let r = Self::at(region, offset, slots, slot_size, 0);
        r.word32(4).store(slot_size as u32, Ordering::Relaxed);
        r.word32(8).store(slots as u32, Ordering::Relaxed);
        r.word64(PRODUCER_AT).store(0, Ordering::Relaxed);
        r.word64(CONSUMER_AT).store(0, Ordering::Relaxed);
        r.word32(0).store(RING_MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Opens the ring another side laid out with this layout, as producer
    /// (`producer`) or consumer. Its own index is read once, then kept here.
    pub fn open(
        region: &'r Region,
        offset: usize,
        slots: usize,
        slot_size: usize,
        producer: bool,
    ) -> Result<Ring<'r>, RingError> {
        Self::check(region, offset, slots, slot_size)?;
        let r = Self::at(region, offset, slots, slot_size, 0);
        if r.word32(0).load(Ordering::Acquire) != RING_MAGIC
            || r.word32(4).load(Ordering::Relaxed) as usize != slot_size
            || r.word32(8).load(Ordering::Relaxed) as usize != slots
        {
            return Err(RingError::NotARing);
        }
        let mine = r
            .word64(if producer { PRODUCER_AT } else { CONSUMER_AT })
            .load(Ordering::Acquire);
        Ok(Ring { mine, ..r })
    }

    fn slot(&self, index: u64) -> *mut u8 {
        let i = (index & (self.slots - 1)) as usize;
        // SAFETY: slot i of the ring, inside the region.
        unsafe { self.base.add(RING_HEADER + i * self.slot_size) }
    }

    /// The most a message may hold.
    pub fn max_message(&self) -> usize {
        self.slot_size - 4
    }

    /// Producer: appends `msg`; false when the ring is full.
    pub fn push(&mut self, msg: &[u8]) -> Result<bool, RingError> {
        if msg.len() > self.max_message() {
            return Err(RingError::TooLong(msg.len(), self.max_message()));
        }
        let consumer = self.word64(CONSUMER_AT).load(Ordering::Acquire);
        let used = self.mine.wrapping_sub(consumer);
        if used > self.slots {
            return Err(RingError::Corrupt);
        }
        if used == self.slots {
            return Ok(false);
        }
        let s = self.slot(self.mine);
        // SAFETY: a slot the consumer is done with (behind `consumer`), of
        // slot_size bytes; the message fits (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping((msg.len() as u32).to_le_bytes().as_ptr(), s, 4);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), s.add(4), msg.len());
        }
        self.mine = self.mine.wrapping_add(1);
        self.word64(PRODUCER_AT).store(self.mine, Ordering::Release);
        Ok(true)
    }

    /// Consumer: copies the next message into `out` (at least
    /// [`Ring::max_message`] bytes) and returns its length; None when empty.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<Option<usize>, RingError> {
        let producer = self.word64(PRODUCER_AT).load(Ordering::Acquire);
        let ready = producer.wrapping_sub(self.mine);
        if ready > self.slots {
            return Err(RingError::Corrupt);
        }
        if ready == 0 {
            return Ok(None);
        }
        let s = self.slot(self.mine);
        let mut len = [0u8; 4];
        // SAFETY: a slot the producer published (Acquire above), slot_size bytes.
        unsafe { std::ptr::copy_nonoverlapping(s, len.as_mut_ptr(), 4) };
        let len = u32::from_le_bytes(len) as usize;
        if len > self.max_message() || len > out.len() {
            return Err(RingError::Corrupt);
        }
        // SAFETY: as above; `len` checked against the slot and `out`.
        unsafe { std::ptr::copy_nonoverlapping(s.add(4), out.as_mut_ptr(), len) };
        self.mine = self.mine.wrapping_add(1);
        self.word64(CONSUMER_AT).store(self.mine, Ordering::Release);
        Ok(Some(len))
    }

    /// Writes `v` as this side's index, as a hostile peer would (tests).
    #[cfg(test)]
    fn forge(&self, producer: bool, v: u64) {
        self.word64(if producer { PRODUCER_AT } else { CONSUMER_AT })
            .store(v, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn messages_come_out_in_order_and_a_full_ring_says_so() {
        let reg = Region::create("rsnic-ring-test", Ring::bytes(8, 64)).unwrap();
        let mut p = Ring::create(&reg, 0, 8, 64).unwrap();
        let mut c = Ring::open(&reg, 0, 8, 64, false).unwrap();
        let mut buf = [0u8; 60];
        assert_eq!(c.pop(&mut buf), Ok(None));
        for i in 0..8u8 {
            assert_eq!(p.push(&[i; 10]), Ok(true));
        }
        assert_eq!(p.push(b"x"), Ok(false), "full");
        for i in 0..8u8 {
            assert_eq!(c.pop(&mut buf), Ok(Some(10)));
            assert_eq!(&buf[..10], &[i; 10]);
        }
        assert_eq!(c.pop(&mut buf), Ok(None));
        assert_eq!(p.push(&[0; 61]), Err(RingError::TooLong(61, 60)));
        assert_eq!(p.push(&[7; 60]), Ok(true));
        assert_eq!(c.pop(&mut buf), Ok(Some(60)));
    }

    #[test]
    fn bad_layouts_and_foreign_memory_are_refused() {
        let reg = Region::create("rsnic-ring-test", 4096).unwrap();
        assert_eq!(Ring::create(&reg, 0, 6, 64).err(), Some(RingError::Layout));
        assert_eq!(Ring::create(&reg, 0, 8, 12).err(), Some(RingError::Layout));
        assert_eq!(
            Ring::create(&reg, 0, 64, 64).err(),
            Some(RingError::Layout),
            "too big"
        );
        assert_eq!(
            Ring::create(&reg, 8, 8, 64).err(),
            Some(RingError::Layout),
            "unaligned"
        );
        assert_eq!(
            Ring::open(&reg, 0, 8, 64, false).err(),
            Some(RingError::NotARing)
        );
        Ring::create(&reg, 0, 8, 64).unwrap();
        assert_eq!(
            Ring::open(&reg, 0, 16, 64, false).err(),
            Some(RingError::NotARing)
        );
    }

    #[test]
    fn a_peer_that_forges_indexes_or_lengths_is_caught() {
        let reg = Region::create("rsnic-ring-test", Ring::bytes(8, 64)).unwrap();
        let mut p = Ring::create(&reg, 0, 8, 64).unwrap();
        let mut c = Ring::open(&reg, 0, 8, 64, false).unwrap();
        let mut buf = [0u8; 60];
        p.forge(true, 9);
        assert_eq!(
            c.pop(&mut buf),
            Err(RingError::Corrupt),
            "producer a ring ahead"
        );
        p.forge(true, u64::MAX);
        assert_eq!(c.pop(&mut buf), Err(RingError::Corrupt), "producer behind");
        p.forge(true, 0);
        c.forge(false, 100);
        assert_eq!(
            p.push(b"x"),
            Err(RingError::Corrupt),
            "consumer ahead of producer"
        );
        c.forge(false, 0);
        assert_eq!(p.push(b"hello"), Ok(true));
        // The length of the slot rewritten past the slot.
        // SAFETY: slot 0's length word, in the region.
        unsafe { std::ptr::write_unaligned(reg.ptr.add(RING_HEADER) as *mut u32, 61) };
        assert_eq!(c.pop(&mut buf), Err(RingError::Corrupt));
    }

    #[test]
    fn two_processes_pass_messages_through_a_passed_memfd() {
        let reg = Region::create("rsnic-ring-test", Ring::bytes(64, 64)).unwrap();
        Ring::create(&reg, 0, 64, 64).unwrap();
        const N: u64 = 100_000;
        // SAFETY: the child only maps, pushes and exits (no allocation
        // beyond what Region::map does, no lock another thread could hold:
        // the test harness's threads are not touched).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // The child: its own mapping of the same memfd, as the daemon
            // maps one a program sends.
            let dup = reg.fd().try_clone().unwrap();
            let mine = Region::map(dup).unwrap();
            let mut p = Ring::open(&mine, 0, 64, 64, true).unwrap();
            let mut i = 0u64;
            while i < N {
                if p.push(&i.to_le_bytes()).unwrap() {
                    i += 1;
                }
            }
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut c = Ring::open(&reg, 0, 64, 64, false).unwrap();
        let mut buf = [0u8; 60];
        let mut next = 0u64;
        let t0 = std::time::Instant::now();
        while next < N {
            match c.pop(&mut buf).unwrap() {
                Some(8) => {
                    assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), next);
                    next += 1;
                }
                Some(n) => panic!("a message of {n} bytes"),
                None => {
                    assert!(t0.elapsed().as_secs() < 60, "stalled at {next}");
                    std::thread::yield_now();
                }
            }
        }
        let mut st = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0);
    }

    proptest! {
        /// Any sequence of pushes and pops behaves as a bounded queue.
        #[test]
        fn a_ring_is_a_bounded_fifo(ops in proptest::collection::vec(any::<Option<u8>>(), 1..400)) {
            let reg = Region::create("rsnic-ring-test", Ring::bytes(4, 16)).unwrap();
            let mut p = Ring::create(&reg, 0, 4, 16).unwrap();
            let mut c = Ring::open(&reg, 0, 4, 16, false).unwrap();
            let mut model = VecDeque::new();
            let mut buf = [0u8; 12];
            for op in ops {
                match op {
                    Some(v) => {
                        let n = usize::from(v % 13);
                        let pushed = p.push(&vec![v; n]).unwrap();
                        prop_assert_eq!(pushed, model.len() < 4);
                        if pushed {
                            model.push_back(vec![v; n]);
                        }
                    }
                    None => {
                        let got = c.pop(&mut buf).unwrap().map(|n| buf[..n].to_vec());
                        prop_assert_eq!(got, model.pop_front());
                    }
                }
            }
        }
    }
}
