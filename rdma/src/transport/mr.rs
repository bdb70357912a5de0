//! Memory regions (IBA 10.6): registration with lkey/rkey and access flags, bounds checks
//! without overflow, and the [`MemorySpace`] trait through which the transport touches
//! memory only after a check passed.

bitflags::bitflags! {
    /// Access flags of a memory region (`ibv_access_flags`). Local read is always allowed.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct Access: u32 {
        /// The local HCA may write (READ responses, ATOMIC results, RECV buffers).
        const LOCAL_WRITE = 1;
        /// Remote RDMA WRITE.
        const REMOTE_WRITE = 2;
        /// Remote RDMA READ.
        const REMOTE_READ = 4;
        /// Remote ATOMIC.
        const REMOTE_ATOMIC = 8;
    }
}

/// Why an access was refused. Each maps to a NAK or a local completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// No region with that key.
    #[error("unknown key {0:#x}")]
    BadKey(u32),
    /// The range is outside the region (or overflows u64).
    #[error("range outside the region")]
    OutOfRange,
    /// The region lacks the needed permission.
    #[error("missing permission")]
    Permission,
}

/// A registered memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    /// Local key.
    pub lkey: u32,
    /// Remote key (what peers put in RETH/AtomicETH).
    pub rkey: u32,
    /// First virtual address.
    pub va: u64,
    /// Length in bytes.
    pub len: u64,
    /// Permissions.
    pub access: Access,
    /// The protection domain it belongs to: only QPs of the same PD may use
    /// its keys (IBA 10.2.3; a key of another PD is an invalid key).
    pub pd: u32,
}

impl Mr {
    /// True if `[va, va+len)` lies inside the region (no overflow possible).
    pub fn contains(&self, va: u64, len: u64) -> bool {
        match (va.checked_sub(self.va), va.checked_add(len)) {
            (Some(off), Some(_)) => off <= self.len && len <= self.len - off,
            _ => false,
        }
    }
}

/// The table of registered regions of a device, each in a protection domain. A key is
/// what hardware and rxe make it (`rxe_mr.c`: `index << 8 | rxe_get_next_key()`): the
/// slot index plus one in bits 31..8 and a random key byte in bits 7..0 that differs
/// from the slot's previous one, so a stale key (its region deregistered, the slot
/// reused) is refused and a peer cannot guess a key from another one. The table stays
/// pure: the randomness is a seed from the caller ([`MrTable::with_key_seed`]; the NIC
/// draws it from the OS when the device opens). A key is only valid for QPs of its
/// region's PD.
#[derive(Debug, Clone, Default)]
pub struct MrTable {
    slots: Vec<Slot>,
    /// Indices of the empty slots, the last freed on top: registering takes
    /// one in O(1) (16k QPs register 16k regions) and reuses the slot just
    /// freed, whose new key byte differs from the old one.
    free: Vec<u32>,
    keys: KeyBytes,
}

/// A slot of the table: its region, and the key byte of the last registration in it.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    mr: Option<Mr>,
    key_byte: u8,
}

/// The key bytes: SplitMix64 (Steele, Lea, Flood 2014) over the caller's seed, eight
/// bytes per step. Unpredictable to a peer that does not know the seed; reproducible for
/// a test that fixes it.
#[derive(Debug, Clone, Default)]
struct KeyBytes {
    state: u64,
    word: u64,
    left: u8,
}

impl KeyBytes {
    fn next(&mut self) -> u8 {
        if self.left == 0 {
            self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            self.word = z ^ (z >> 31);
            self.left = 8;
        }
        self.left -= 1;
        let b = self.word as u8;
        self.word >>= 8;
        b
    }
}

impl MrTable {
    /// An empty table with the fixed key seed 0: predictable keys, for tests and the
    /// fuzzer. A device uses [`MrTable::with_key_seed`] with a random seed.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty table whose key bytes come from `seed` (draw it from the OS:
    /// `getrandom`, `/dev/urandom`).
    pub fn with_key_seed(seed: u64) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            keys: KeyBytes {
                state: seed,
                ..KeyBytes::default()
            },
        }
    }

    /// Registers `[va, va+len)` in the default protection domain (0); returns the
    /// region (keys inside). `None` if the range overflows or the table is full (2^24
    /// slots).
    pub fn register(&mut self, va: u64, len: u64, access: Access) -> Option<Mr> {
        self.register_in(0, va, len, access)
    }

    /// Registers `[va, va+len)` in protection domain `pd`; as [`Self::register`].
    pub fn register_in(&mut self, pd: u32, va: u64, len: u64, access: Access) -> Option<Mr> {
        va.checked_add(len)?;
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                if self.slots.len() >= 0xFF_FFFF {
                    return None;
                }
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[idx];
        let mut key_byte = self.keys.next();
        while key_byte == slot.key_byte {
            key_byte = self.keys.next();
        }
        let key = ((idx as u32 + 1) << 8) | u32::from(key_byte);
        let mr = Mr {
            lkey: key,
            rkey: key,
            va,
            len,
            access,
            pd,
        };
        *slot = Slot {
            mr: Some(mr),
            key_byte,
        };
        Some(mr)
    }

    /// Removes a region by its key; returns it.
    pub fn deregister(&mut self, key: u32) -> Option<Mr> {
        let i = (key >> 8).checked_sub(1)? as usize;
        let s = self.slots.get_mut(i)?;
        if s.mr.map(|m| m.lkey) == Some(key) {
            self.free.push(i as u32);
            s.mr.take()
        } else {
            None
        }
    }

    /// Looks a key up.
    pub fn get(&self, key: u32) -> Option<&Mr> {
        let i = (key >> 8).checked_sub(1)? as usize;
        self.slots.get(i)?.mr.as_ref().filter(|m| m.lkey == key)
    }

    fn check(
        &self,
        pd: u32,
        key: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<&Mr, AccessError> {
        let mr = self
            .get(key)
            .filter(|m| m.pd == pd)
            .ok_or(AccessError::BadKey(key))?;
        if !mr.access.contains(need) {
            return Err(AccessError::Permission);
        }
        if !mr.contains(va, len) {
            return Err(AccessError::OutOfRange);
        }
        Ok(mr)
    }

    /// Checks a remote access for a QP of protection domain `pd` (0: the default
    /// one): an rkey of another PD is a bad key (the responder NAKs it as a remote
    /// access error).
    pub fn check_remote_in(
        &self,
        pd: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<&Mr, AccessError> {
        self.check(pd, rkey, va, len, need)
    }

    /// Checks a local access for a QP of protection domain `pd`: an lkey of another
    /// PD is refused (a local protection error).
    pub fn check_local_in(
        &self,
        pd: u32,
        lkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<&Mr, AccessError> {
        self.check(pd, lkey, va, len, need)
    }

    /// Whether any region of protection domain `pd` is registered (a PD
    /// with regions cannot be deallocated, `ibv_dealloc_pd` EBUSY).
    pub fn any_in_pd(&self, pd: u32) -> bool {
        self.slots
            .iter()
            .filter_map(|s| s.mr.as_ref())
            .any(|m| m.pd == pd)
    }
}

/// The memory the transport reads and writes, implemented by the caller: the NIC backs it
/// with registered buffers the program shares, tests with a `Vec<u8>`.
///
/// The contract, both ways:
/// - the transport calls it only for ranges an [`MrTable`] check accepted just before
///   (at post time for local buffers, at arrival for remote ones), so an implementation
///   may treat any other range as a bug;
/// - the methods copy in and out and hand out no reference into the memory, so an
///   implementation over memory another thread may write at the same time (the
///   program's buffers, as a NIC's DMA sees them, docs/design.md §5) copies through
///   raw pointers and never forms a `&[u8]` over it. What the other thread sees of a
///   range while a copy runs is the same as with DMA: the program must not touch bytes
///   an operation in flight uses.
pub trait MemorySpace {
    /// Copies the bytes at `[va, va + dst.len())` into `dst`.
    fn copy_out(&self, va: u64, dst: &mut [u8]);
    /// Copies `src` to `[va, va + src.len())`.
    fn copy_in(&mut self, va: u64, src: &[u8]);

    /// Reads a little-endian u64 (atomics operate on host-order 64-bit words; the hosts
    /// this targets are little-endian).
    fn read_u64(&self, va: u64) -> u64 {
        let mut a = [0u8; 8];
        self.copy_out(va, &mut a);
        u64::from_le_bytes(a)
    }

    /// Writes a little-endian u64.
    fn write_u64(&mut self, va: u64, v: u64) {
        self.copy_in(va, &v.to_le_bytes());
    }

    /// [`Self::copy_out`] from the region of `key` (the lkey or rkey whose
    /// check accepted the range). The transport reaches memory through
    /// these keyed calls: an implementation whose regions' bytes are not at
    /// their virtual addresses (the NIC's, where a region of the program's
    /// memory is reached through the engine's own mapping of it,
    /// docs/design.md §5.4) translates by the key; the default ignores it.
    fn copy_out_key(&self, key: u32, va: u64, dst: &mut [u8]) {
        let _ = key;
        self.copy_out(va, dst)
    }

    /// [`Self::copy_in`] into the region of `key` (see [`Self::copy_out_key`]).
    fn copy_in_key(&mut self, key: u32, va: u64, src: &[u8]) {
        let _ = key;
        self.copy_in(va, src)
    }

    /// [`Self::read_u64`] in the region of `key`.
    fn read_u64_key(&self, key: u32, va: u64) -> u64 {
        let mut a = [0u8; 8];
        self.copy_out_key(key, va, &mut a);
        u64::from_le_bytes(a)
    }

    /// [`Self::write_u64`] in the region of `key`.
    fn write_u64_key(&mut self, key: u32, va: u64, v: u64) {
        self.copy_in_key(key, va, &v.to_le_bytes());
    }
}

/// A flat memory space backed by a `Vec<u8>` starting at virtual address `base`
/// (for tests and simple paths). Accesses outside it panic: the transport never makes
/// them after an MR check on regions inside it.
#[derive(Debug, Clone)]
pub struct VecMemory {
    /// Virtual address of byte 0.
    pub base: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl VecMemory {
    /// `len` zero bytes at `base`.
    pub fn new(base: u64, len: usize) -> Self {
        Self {
            base,
            bytes: vec![0; len],
        }
    }

    fn off(&self, va: u64) -> usize {
        (va - self.base) as usize
    }

    /// The bytes `[va, va+len)` (this memory is owned, so a view is sound).
    pub fn read(&self, va: u64, len: usize) -> &[u8] {
        let o = self.off(va);
        &self.bytes[o..o + len]
    }

    /// Writes `data` at `va`.
    pub fn write(&mut self, va: u64, data: &[u8]) {
        let o = self.off(va);
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }
}

impl MemorySpace for VecMemory {
    fn copy_out(&self, va: u64, dst: &mut [u8]) {
        dst.copy_from_slice(self.read(va, dst.len()));
    }

    fn copy_in(&mut self, va: u64, src: &[u8]) {
        self.write(va, src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_valid_only_in_their_protection_domain() {
        let mut t = MrTable::new();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let a = t.register_in(1, 0x1000, 0x100, all).unwrap();
        let b = t.register(0x2000, 0x100, all).unwrap();
        assert_eq!((a.pd, b.pd), (1, 0));
        assert!(t
            .check_remote_in(1, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_local_in(1, a.lkey, 0x1000, 8, Access::empty())
            .is_ok());
        // Another PD's QP may not use it, remotely or locally.
        assert_eq!(
            t.check_remote_in(2, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey))
        );
        assert_eq!(
            t.check_remote_in(0, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey))
        );
        assert_eq!(
            t.check_local_in(0, a.lkey, 0x1000, 8, Access::empty())
                .err(),
            Some(AccessError::BadKey(a.lkey))
        );
        assert!(t
            .check_remote_in(0, b.rkey, 0x2000, 8, Access::REMOTE_READ)
            .is_ok());
        assert!(t
            .check_remote_in(1, b.rkey, 0x2000, 8, Access::REMOTE_READ)
            .is_err());
    }

    #[test]
    fn bounds_and_permissions() {
        let mut t = MrTable::new();
        let a = t.register(0x1000, 0x100, Access::REMOTE_WRITE).unwrap();
        assert!(t
            .check_remote_in(0, a.rkey, 0x1000, 0x100, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote_in(0, a.rkey, 0x10FF, 1, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote_in(0, a.rkey, 0x1100, 0, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote_in(0, a.rkey, 0x10FF, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, a.rkey, 0xFFF, 1, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, a.rkey, u64::MAX, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, a.rkey, 0x1000, 1, Access::REMOTE_READ)
                .err(),
            Some(AccessError::Permission)
        );
        assert_eq!(
            t.check_remote_in(0, a.rkey ^ 1, 0x1000, 1, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey ^ 1))
        );
        assert!(t.register(u64::MAX, 2, Access::empty()).is_none());
        // A stale key after re-registration in the same slot is refused.
        assert!(t.deregister(a.lkey).is_some());
        let b = t.register(0x1000, 0x100, Access::REMOTE_WRITE).unwrap();
        assert_ne!(a.rkey, b.rkey);
        assert!(t.get(a.rkey).is_none());
        assert_eq!(
            t.check_remote_in(0, 0, 0, 0, Access::empty()).err(),
            Some(AccessError::BadKey(0))
        );
    }

    #[test]
    fn keys_are_unique_random_bytes_that_change_on_every_registration() {
        let mut t = MrTable::with_key_seed(0x5EED);
        let mut bytes = std::collections::HashSet::new();
        // Every other registration reuses the slot just freed (its stale key must fail);
        // the others stay registered.
        let mut last = None;
        for i in 0..2000u64 {
            let mr = t.register(0x1000, 0x100, Access::REMOTE_READ).unwrap();
            if let Some(prev) = last {
                assert_ne!(prev, mr.rkey, "a re-registration changes the key");
                assert!(t.get(prev).is_none(), "the stale key is refused");
                assert_eq!(
                    t.check_remote_in(0, prev, 0x1000, 1, Access::REMOTE_READ)
                        .err(),
                    Some(AccessError::BadKey(prev))
                );
            }
            bytes.insert(mr.rkey & 0xFF);
            last = Some(mr.rkey);
            if i % 2 == 0 {
                t.deregister(mr.lkey).unwrap();
            } else {
                last = None;
            }
        }
        // Regions alive at once never share a key (their slots differ).
        let live: Vec<u32> = t
            .slots
            .iter()
            .filter_map(|s| s.mr.map(|m| m.rkey))
            .collect();
        let distinct: std::collections::HashSet<_> = live.iter().collect();
        assert_eq!(distinct.len(), live.len());
        // The key byte is spread over all values, not a counter.
        assert!(bytes.len() > 200, "{} distinct key bytes", bytes.len());
    }

    #[test]
    fn differently_seeded_tables_give_different_keys() {
        let keys = |seed| {
            let mut t = MrTable::with_key_seed(seed);
            (0..16)
                .map(|i| {
                    t.register(i * 0x1000, 0x1000, Access::REMOTE_WRITE)
                        .unwrap()
                        .rkey
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(7), keys(7), "the seed alone decides");
        assert_ne!(keys(7), keys(8));
        let same = keys(7)
            .iter()
            .zip(keys(8))
            .filter(|(a, b)| **a == *b)
            .count();
        assert!(same < 4, "{same} of 16 keys equal across seeds");
        // Same slots, so only the key byte differs: a key of one table is a bad key of
        // the other.
        let mut t8 = MrTable::with_key_seed(8);
        t8.register(0, 0x1000, Access::REMOTE_WRITE).unwrap();
        let k7 = keys(7)[0];
        if k7 != keys(8)[0] {
            assert!(t8
                .check_remote_in(0, k7, 0, 8, Access::REMOTE_WRITE)
                .is_err());
        }
    }
}
