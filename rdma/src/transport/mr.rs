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

/// The table of registered regions of a device, each in a protection domain. Keys
/// encode the slot index (bits 31..8, plus one) and a generation byte (bits 7..0) so a
/// stale key is refused; a key is only valid for QPs of its region's PD.
#[derive(Debug, Clone, Default)]
pub struct MrTable {
    slots: Vec<Option<Mr>>,
    generation: u8,
}

impl MrTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
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
        self.generation = self.generation.wrapping_add(1);
        let idx = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                if self.slots.len() >= 0xFF_FFFF {
                    return None;
                }
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        let key = ((idx as u32 + 1) << 8) | u32::from(self.generation);
        let mr = Mr {
            lkey: key,
            rkey: key,
            va,
            len,
            access,
            pd,
        };
        self.slots[idx] = Some(mr);
        Some(mr)
    }

    /// Removes a region by its key; returns it.
    pub fn deregister(&mut self, key: u32) -> Option<Mr> {
        let i = (key >> 8).checked_sub(1)? as usize;
        let s = self.slots.get_mut(i)?;
        if s.map(|m| m.lkey) == Some(key) {
            s.take()
        } else {
            None
        }
    }

    /// Looks a key up.
    pub fn get(&self, key: u32) -> Option<&Mr> {
        let i = (key >> 8).checked_sub(1)? as usize;
        self.slots.get(i)?.as_ref().filter(|m| m.lkey == key)
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

    /// Checks a remote access (rkey from the wire) needing `need`, for a QP of the
    /// default protection domain (0).
    pub fn check_remote(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<&Mr, AccessError> {
        self.check(0, rkey, va, len, need)
    }

    /// Checks a remote access for a QP of protection domain `pd`: an rkey of another
    /// PD is a bad key (the responder NAKs it as a remote access error).
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

    /// Checks a local access (lkey from a work request) needing `need` (empty = read),
    /// for a QP of the default protection domain (0).
    pub fn check_local(
        &self,
        lkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<&Mr, AccessError> {
        self.check(0, lkey, va, len, need)
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
        self.slots.iter().flatten().any(|m| m.pd == pd)
    }
}

/// The memory the transport reads and writes, implemented by the caller: the NIC backs it
/// with raw registered buffers, tests with a `Vec<u8>`. The transport calls it only for
/// ranges an [`MrTable`] check accepted, so implementations may treat an out-of-bounds
/// call as a bug.
pub trait MemorySpace {
    /// The bytes `[va, va+len)`.
    fn read(&self, va: u64, len: usize) -> &[u8];
    /// Writes `data` at `va`.
    fn write(&mut self, va: u64, data: &[u8]);

    /// Reads a little-endian u64 (atomics operate on host-order 64-bit words; the hosts
    /// this targets are little-endian).
    fn read_u64(&self, va: u64) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.read(va, 8)[..8]);
        u64::from_le_bytes(a)
    }

    /// Writes a little-endian u64.
    fn write_u64(&mut self, va: u64, v: u64) {
        self.write(va, &v.to_le_bytes());
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
}

impl MemorySpace for VecMemory {
    fn read(&self, va: u64, len: usize) -> &[u8] {
        let o = self.off(va);
        &self.bytes[o..o + len]
    }

    fn write(&mut self, va: u64, data: &[u8]) {
        let o = self.off(va);
        self.bytes[o..o + data.len()].copy_from_slice(data);
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
            t.check_remote(a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey))
        );
        assert_eq!(
            t.check_local_in(0, a.lkey, 0x1000, 8, Access::empty())
                .err(),
            Some(AccessError::BadKey(a.lkey))
        );
        assert!(t
            .check_remote(b.rkey, 0x2000, 8, Access::REMOTE_READ)
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
            .check_remote(a.rkey, 0x1000, 0x100, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote(a.rkey, 0x10FF, 1, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote(a.rkey, 0x1100, 0, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote(a.rkey, 0x10FF, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(a.rkey, 0xFFF, 1, Access::REMOTE_WRITE).err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(a.rkey, u64::MAX, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote(a.rkey, 0x1000, 1, Access::REMOTE_READ).err(),
            Some(AccessError::Permission)
        );
        assert_eq!(
            t.check_remote(a.rkey ^ 1, 0x1000, 1, Access::REMOTE_WRITE)
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
            t.check_remote(0, 0, 0, Access::empty()).err(),
            Some(AccessError::BadKey(0))
        );
    }
}
