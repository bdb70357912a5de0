//! Memory regions (IBA 10.6): registration with lkey/rkey and access flags, bounds checks
//! without overflow, memory windows (IBA 10.6.7: type 1 and type 2B, as Linux rxe has
//! them) in the same key space, and the [`MemorySpace`] trait through which the
//! transport touches memory only after a check passed.

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
        /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`, IBA
        /// 10.6.7.2 C10-73).
        const MW_BIND = 16;
    }
}

/// The type of a memory window (`enum ibv_mw_type`, IBA 10.6.7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Type 1: bound and unbound by `ibv_bind_mw` (a bind WR of the consumer's
    /// choosing QP), usable by any QP of its PD; never invalidated.
    One = 1,
    /// Type 2B: bound by a bind WR to one QP, which alone may use it, and freed by
    /// invalidation (LOCAL_INV, or a peer's SEND with Invalidate).
    Two = 2,
}

/// What a bound memory window gives access to (IBA 10.6.7.2): a range of one memory
/// region, with the window's own access rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBinding {
    /// The key of the region it is bound to.
    pub mr_key: u32,
    /// First virtual address (inside the region).
    pub va: u64,
    /// Length in bytes (never 0: a zero-length bind unbinds a type 1 window).
    pub len: u64,
    /// Remote rights: `REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`.
    pub access: Access,
    /// Type 2B: the QP it is bound to, the only one a peer may reach it through.
    pub qpn: Option<u32>,
}

/// A memory window (`ibv_mw`): an R_Key that names a window onto a region, bound and
/// rebound while the region stays registered (IBA 10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mw {
    /// Its current R_Key: the slot in bits 31..8 like a region's, and a key byte that
    /// each bind changes (type 1: the next value, as `ibv_inc_rkey`; type 2: the
    /// consumer's choice in the bind WR), so that a key a peer held before a rebind
    /// is refused after it.
    pub rkey: u32,
    /// The protection domain it was allocated in.
    pub pd: u32,
    /// Type 1 or 2B.
    pub kind: MwType,
    /// Where it points; `None` while unbound (type 1) or free (type 2, IBA's "Free
    /// state").
    pub binding: Option<MwBinding>,
}

/// A bind of a memory window, as a bind work request carries it (`IBV_WR_BIND_MW`:
/// `bind_mw.mw`, `bind_mw.rkey` and `bind_mw.bind_info`; IBA 10.6.7.2.1). The window
/// is named by its R_Key before the bind ([`Self::mw_rkey`]): the slot of `new_rkey`
/// and the key byte `prev_key`. Packed (29 bytes, no padding of its own) so that a
/// send work request carrying it still fits one 64-byte doorbell slot. As rxe, only the
/// key byte of the program's new R_Key counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, packed)]
pub struct MwBind {
    /// The window's R_Key after the bind: its slot and the new key byte.
    pub new_rkey: u32,
    /// The key byte of the window's R_Key before the bind.
    pub prev_key: u8,
    /// The region's L_Key (ignored for a zero-length bind, which unbinds).
    pub mr_lkey: u32,
    /// First address of the window.
    pub va: u64,
    /// Its length (0: unbind a type 1 window).
    pub len: u64,
    /// The window's remote rights.
    pub access: Access,
}

impl MwBind {
    /// A bind of the window whose R_Key is `mw_rkey` to the key byte of `new_rkey`.
    pub fn new(
        mw_rkey: u32,
        new_rkey: u32,
        mr_lkey: u32,
        va: u64,
        len: u64,
        access: Access,
    ) -> Self {
        Self {
            new_rkey: (mw_rkey & !0xFF) | (new_rkey & 0xFF),
            prev_key: mw_rkey as u8,
            mr_lkey,
            va,
            len,
            access,
        }
    }

    /// The window's R_Key before the bind.
    pub fn mw_rkey(&self) -> u32 {
        (self.new_rkey & !0xFF) | u32::from(self.prev_key)
    }
}

/// Why a memory window operation failed. A bind fails with `IBV_WC_MW_BIND_ERR`, an
/// invalidation with `IBV_WC_LOC_QP_OP_ERR` (local) or a remote invalid request (a
/// peer's SEND with Invalidate), as rxe (`rxe_mw.c`) completes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MwError {
    /// No window (or, for an invalidation, no window or region) under that key.
    #[error("no memory window with key {0:#x}")]
    BadKey(u32),
    /// The window's state forbids it: a type 2 window bound already (o10-37.2.30), a
    /// type 1 window invalidated (o10-37.2.26), a type 1 window zero-based.
    #[error("memory window in the wrong state")]
    State,
    /// The bind's QP or region is of another protection domain (C10-72).
    #[error("protection domain mismatch")]
    Pd,
    /// The region lacks `MW_BIND` (C10-73), or the window asks for remote write or
    /// atomic on a region without local write (C10-74).
    #[error("region access forbids the bind")]
    Access,
    /// The window is not inside the region (C10-75), or a type 2 bind of length 0
    /// (o10-37.2.40).
    #[error("window range outside the region")]
    Range,
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

/// A slot of the table: its region or its memory window (never both), and the key
/// byte of the last key given out in it.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    mr: Option<Mr>,
    mw: Option<Mw>,
    /// Windows bound to the region: it cannot be deregistered until they are
    /// unbound or invalidated (IBA 10.6.7.2.6; rxe `rxe_dereg_mr` EINVAL).
    windows: u32,
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
        let (idx, key) = self.take_slot()?;
        let mr = Mr {
            lkey: key,
            rkey: key,
            va,
            len,
            access,
            pd,
        };
        self.slots[idx].mr = Some(mr);
        Some(mr)
    }

    /// An empty slot (the one freed last, or a new one) and its new key: the slot
    /// plus one in bits 31..8, a fresh key byte unlike the slot's last one.
    fn take_slot(&mut self) -> Option<(usize, u32)> {
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
        *slot = Slot {
            key_byte,
            ..Slot::default()
        };
        Some((idx, ((idx as u32 + 1) << 8) | u32::from(key_byte)))
    }

    /// The slot a key names, if any.
    fn slot_of(&self, key: u32) -> Option<&Slot> {
        self.slots.get((key >> 8).checked_sub(1)? as usize)
    }

    /// Removes a region by its key; returns it. `None` for an unknown key, and for a
    /// region that windows are bound to (IBA 10.6.7.2.6: unbind or invalidate them
    /// first; [`Self::windows_bound`] tells the two apart).
    pub fn deregister(&mut self, key: u32) -> Option<Mr> {
        let i = (key >> 8).checked_sub(1)? as usize;
        let s = self.slots.get_mut(i)?;
        if s.mr.map(|m| m.lkey) == Some(key) && s.windows == 0 {
            self.free.push(i as u32);
            s.mr.take()
        } else {
            None
        }
    }

    /// How many memory windows are bound to the region of `key` (0 for no region).
    pub fn windows_bound(&self, key: u32) -> u32 {
        self.slot_of(key)
            .filter(|s| s.mr.is_some_and(|m| m.lkey == key))
            .map_or(0, |s| s.windows)
    }

    /// Looks a region's key up.
    pub fn get(&self, key: u32) -> Option<&Mr> {
        self.slot_of(key)?.mr.as_ref().filter(|m| m.lkey == key)
    }

    /// Looks a memory window's current R_Key up.
    pub fn window(&self, rkey: u32) -> Option<&Mw> {
        self.slot_of(rkey)?.mw.as_ref().filter(|w| w.rkey == rkey)
    }

    /// The memory window in the slot of `rkey`, whatever its current key byte.
    pub fn window_in_slot(&self, rkey: u32) -> Option<&Mw> {
        self.slot_of(rkey)?.mw.as_ref()
    }

    /// Unbinds every window bound to the region of `mr_key` (type 1 unbound, type 2
    /// free): the region is going away regardless (its handle dropped).
    pub fn unbind_windows_of(&mut self, mr_key: u32) {
        for s in &mut self.slots {
            if let Some(w) = s.mw.as_mut() {
                if w.binding.is_some_and(|b| b.mr_key == mr_key) {
                    w.binding = None;
                }
            }
        }
        if let Some(s) = (mr_key >> 8)
            .checked_sub(1)
            .and_then(|i| self.slots.get_mut(i as usize))
        {
            s.windows = 0;
        }
    }

    /// Allocates an unbound memory window of `kind` in protection domain `pd`
    /// (`ibv_alloc_mw`; rxe `rxe_alloc_mw`): its first R_Key. `None` when the table
    /// is full.
    pub fn alloc_window(&mut self, pd: u32, kind: MwType) -> Option<Mw> {
        let (idx, rkey) = self.take_slot()?;
        let mw = Mw {
            rkey,
            pd,
            kind,
            binding: None,
        };
        self.slots[idx].mw = Some(mw);
        Some(mw)
    }

    /// Frees the window named by its current R_Key (`ibv_dealloc_mw`), unbinding
    /// it; returns it.
    pub fn dealloc_window(&mut self, rkey: u32) -> Option<Mw> {
        let i = (rkey >> 8).checked_sub(1)? as usize;
        let mw = self.slots.get(i)?.mw.filter(|w| w.rkey == rkey)?;
        self.release_binding(&mw);
        self.slots[i].mw = None;
        self.free.push(i as u32);
        Some(mw)
    }

    /// Drops the region's count of a window's binding.
    fn release_binding(&mut self, mw: &Mw) {
        if let Some(b) = mw.binding {
            if let Some(s) = (b.mr_key >> 8)
                .checked_sub(1)
                .and_then(|i| self.slots.get_mut(i as usize))
            {
                s.windows = s.windows.saturating_sub(1);
            }
        }
    }

    /// Binds a window for QP `qpn` of protection domain `pd` (a bind WR, IBA
    /// 10.6.7.2.1), with rxe's checks (`rxe_check_bind_mw`): a type 1 window is
    /// rebound (or unbound with length 0), a type 2 window must be free, is bound
    /// to `qpn`, and needs a region and a length; the region must be of the
    /// window's PD, have `MW_BIND`, local write for a writable window, and hold the
    /// range. On success the window answers to `bind.new_rkey` only.
    pub fn bind_window(&mut self, pd: u32, qpn: u32, bind: &MwBind) -> Result<Mw, MwError> {
        let mw = *self
            .window(bind.mw_rkey())
            .ok_or(MwError::BadKey(bind.mw_rkey()))?;
        match mw.kind {
            MwType::One => {}
            MwType::Two => {
                if mw.binding.is_some() {
                    return Err(MwError::State);
                }
                if pd != mw.pd {
                    return Err(MwError::Pd);
                }
                if bind.len == 0 {
                    return Err(MwError::Range);
                }
            }
        }
        let binding = if bind.len == 0 {
            None
        } else {
            let mr = self
                .get(bind.mr_lkey)
                .ok_or(MwError::BadKey(bind.mr_lkey))?;
            if mr.pd != mw.pd {
                return Err(MwError::Pd);
            }
            if !mr.access.contains(Access::MW_BIND) {
                return Err(MwError::Access);
            }
            let writable = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
            let access = bind.access;
            if access.intersects(writable) && !mr.access.contains(Access::LOCAL_WRITE) {
                return Err(MwError::Access);
            }
            if !mr.contains(bind.va, bind.len) {
                return Err(MwError::Range);
            }
            Some(MwBinding {
                mr_key: mr.lkey,
                va: bind.va,
                len: bind.len,
                access: access
                    & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC),
                qpn: (mw.kind == MwType::Two).then_some(qpn),
            })
        };
        self.release_binding(&mw);
        if let Some(b) = binding {
            if let Some(s) = self.slots.get_mut(((b.mr_key >> 8) - 1) as usize) {
                s.windows += 1;
            }
        }
        let i = ((mw.rkey >> 8) - 1) as usize;
        let new = Mw {
            rkey: bind.new_rkey,
            binding,
            ..mw
        };
        self.slots[i].mw = Some(new);
        self.slots[i].key_byte = bind.new_rkey as u8;
        Ok(new)
    }

    /// Invalidates the type 2 window of `rkey` (LOCAL_INV, or a peer's SEND with
    /// Invalidate; IBA 10.6.7.2.4, rxe `rxe_invalidate_mw`): it returns to the free
    /// state, unbound. A type 1 window cannot be invalidated (o10-37.2.26), a free
    /// one has nothing to invalidate, and a region is not invalidated by a key
    /// (rsnic has no fast-registered regions; rxe refuses a user region too).
    pub fn invalidate(&mut self, rkey: u32) -> Result<(), MwError> {
        let mw = *self.window(rkey).ok_or(MwError::BadKey(rkey))?;
        if mw.kind != MwType::Two || mw.binding.is_none() {
            return Err(MwError::State);
        }
        self.release_binding(&mw);
        let i = ((rkey >> 8) - 1) as usize;
        self.slots[i].mw = Some(Mw {
            binding: None,
            ..mw
        });
        Ok(())
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

    /// Checks a remote access through `rkey` for QP `qpn` of protection domain `pd`
    /// (0: the default one) and returns the key of the region the bytes are in: `rkey`
    /// itself for a region, the bound region's for a memory window (IBA 10.6.7.3; rxe
    /// `rxe_lookup_mw`: the window's PD, its QP for type 2, its rights and range, then
    /// the region's range). An rkey of another PD, a free or unbound window, or a
    /// type 2 window bound to another QP is a bad key (the responder NAKs it as a
    /// remote access error).
    pub fn check_remote_in(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<u32, AccessError> {
        let Some(slot) = self.slot_of(rkey) else {
            return Err(AccessError::BadKey(rkey));
        };
        let Some(mw) = slot.mw else {
            return self.check(pd, rkey, va, len, need).map(|m| m.lkey);
        };
        let b = match mw.binding {
            Some(b) if mw.rkey == rkey && mw.pd == pd && !matches!(b.qpn, Some(q) if q != qpn) => b,
            _ => return Err(AccessError::BadKey(rkey)),
        };
        if !b.access.contains(need) {
            return Err(AccessError::Permission);
        }
        let inside = va
            .checked_sub(b.va)
            .is_some_and(|off| off <= b.len && len <= b.len - off);
        if !inside {
            return Err(AccessError::OutOfRange);
        }
        self.check(pd, b.mr_key, va, len, Access::empty())
            .map(|m| m.lkey)
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

    /// Whether any region or memory window of protection domain `pd` exists (a PD
    /// with either cannot be deallocated, `ibv_dealloc_pd` EBUSY).
    pub fn any_in_pd(&self, pd: u32) -> bool {
        self.slots
            .iter()
            .any(|s| s.mr.is_some_and(|m| m.pd == pd) || s.mw.is_some_and(|w| w.pd == pd))
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
            .check_remote_in(1, 0, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_local_in(1, a.lkey, 0x1000, 8, Access::empty())
            .is_ok());
        // Another PD's QP may not use it, remotely or locally.
        assert_eq!(
            t.check_remote_in(2, 0, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey))
        );
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey, 0x1000, 8, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::BadKey(a.rkey))
        );
        assert_eq!(
            t.check_local_in(0, a.lkey, 0x1000, 8, Access::empty())
                .err(),
            Some(AccessError::BadKey(a.lkey))
        );
        assert!(t
            .check_remote_in(0, 0, b.rkey, 0x2000, 8, Access::REMOTE_READ)
            .is_ok());
        assert!(t
            .check_remote_in(1, 0, b.rkey, 0x2000, 8, Access::REMOTE_READ)
            .is_err());
    }

    #[test]
    fn bounds_and_permissions() {
        let mut t = MrTable::new();
        let a = t.register(0x1000, 0x100, Access::REMOTE_WRITE).unwrap();
        assert!(t
            .check_remote_in(0, 0, a.rkey, 0x1000, 0x100, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote_in(0, 0, a.rkey, 0x10FF, 1, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .check_remote_in(0, 0, a.rkey, 0x1100, 0, Access::REMOTE_WRITE)
            .is_ok());
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey, 0x10FF, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey, 0xFFF, 1, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey, u64::MAX, 2, Access::REMOTE_WRITE)
                .err(),
            Some(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey, 0x1000, 1, Access::REMOTE_READ)
                .err(),
            Some(AccessError::Permission)
        );
        assert_eq!(
            t.check_remote_in(0, 0, a.rkey ^ 1, 0x1000, 1, Access::REMOTE_WRITE)
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
            t.check_remote_in(0, 0, 0, 0, 0, Access::empty()).err(),
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
                    t.check_remote_in(0, 0, prev, 0x1000, 1, Access::REMOTE_READ)
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
                .check_remote_in(0, 0, k7, 0, 8, Access::REMOTE_WRITE)
                .is_err());
        }
    }

    const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

    fn bind(mw: &Mw, mr: &Mr, va: u64, len: u64, access: Access) -> MwBind {
        MwBind::new(mw.rkey, mw.rkey.wrapping_add(1), mr.lkey, va, len, access)
    }

    /// A type 1 window (IBA 10.6.7.2, rxe `rxe_mw.c`): unbound it reaches nothing;
    /// bound, its R_Key reaches exactly its range with exactly its rights for any QP
    /// of its PD, the bytes land through the region's key, and a rebind retires the
    /// old R_Key; the region cannot be deregistered while it is bound.
    #[test]
    fn type_1_window_binds_a_range_with_its_own_rights() {
        let mut t = MrTable::with_key_seed(3);
        let mr = t
            .register_in(
                1,
                0x1000,
                0x1000,
                RW | Access::REMOTE_READ | Access::MW_BIND,
            )
            .unwrap();
        let mw = t.alloc_window(1, MwType::One).unwrap();
        assert_ne!(mw.rkey >> 8, mr.rkey >> 8, "its own slot");
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            t.check_remote_in(1, 5, mw.rkey, 0x1000, 8, w),
            Err(AccessError::BadKey(mw.rkey)),
            "unbound"
        );
        let b = bind(&mw, &mr, 0x1100, 0x100, Access::REMOTE_READ);
        let mw2 = t.bind_window(1, 5, &b).unwrap();
        assert_eq!((mw2.rkey, mw2.binding.unwrap().qpn), (b.new_rkey, None));
        assert_eq!(t.windows_bound(mr.lkey), 1);
        for qpn in [5, 6] {
            assert_eq!(
                t.check_remote_in(1, qpn, mw2.rkey, 0x1100, 0x100, Access::REMOTE_READ),
                Ok(mr.lkey),
                "any QP of the PD, placed through the region's key"
            );
        }
        let r = Access::REMOTE_READ;
        assert_eq!(
            t.check_remote_in(1, 5, mw2.rkey, 0x1100, 8, w),
            Err(AccessError::Permission),
            "the window's rights, not the region's"
        );
        assert_eq!(
            t.check_remote_in(1, 5, mw2.rkey, 0x10FF, 2, r),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(1, 5, mw2.rkey, 0x11FF, 2, r),
            Err(AccessError::OutOfRange)
        );
        assert_eq!(
            t.check_remote_in(2, 5, mw2.rkey, 0x1100, 8, r),
            Err(AccessError::BadKey(mw2.rkey)),
            "another PD"
        );
        assert_eq!(
            t.check_remote_in(1, 5, mw.rkey, 0x1100, 8, r),
            Err(AccessError::BadKey(mw.rkey)),
            "the R_Key before the bind"
        );
        assert!(t.deregister(mr.lkey).is_none(), "a window is bound to it");
        assert!(t.get(mr.lkey).is_some());
        // A zero-length bind unbinds; the region may go then.
        let unbind = MwBind {
            len: 0,
            ..bind(&mw2, &mr, 0, 0, Access::empty())
        };
        let mw3 = t.bind_window(1, 5, &unbind).unwrap();
        assert_eq!(mw3.binding, None);
        assert_eq!(t.windows_bound(mr.lkey), 0);
        assert_eq!(t.invalidate(mw3.rkey), Err(MwError::State), "type 1");
        assert!(t.any_in_pd(1));
        assert!(t.deregister(mr.lkey).is_some());
        assert!(t.any_in_pd(1), "the window still holds the PD");
        assert!(t.dealloc_window(mw3.rkey).is_some());
        assert!(!t.any_in_pd(1));
        assert!(t.window(mw3.rkey).is_none());
    }

    /// A type 2B window: bound to one QP, which alone reaches it; bound again only
    /// after an invalidation frees it; invalidation retires the access.
    #[test]
    fn type_2_window_belongs_to_its_qp_until_invalidated() {
        let mut t = MrTable::new();
        let mr = t
            .register_in(1, 0x1000, 0x1000, RW | Access::MW_BIND)
            .unwrap();
        let mw = t.alloc_window(1, MwType::Two).unwrap();
        let b = bind(&mw, &mr, 0x1000, 0x1000, Access::REMOTE_WRITE);
        assert_eq!(
            t.bind_window(2, 7, &b),
            Err(MwError::Pd),
            "QP of another PD"
        );
        let zero = MwBind { len: 0, ..b };
        assert_eq!(t.bind_window(1, 7, &zero), Err(MwError::Range));
        let bound = t.bind_window(1, 7, &b).unwrap();
        assert_eq!(bound.binding.unwrap().qpn, Some(7));
        let w = Access::REMOTE_WRITE;
        assert_eq!(
            t.check_remote_in(1, 7, bound.rkey, 0x1800, 64, w),
            Ok(mr.lkey)
        );
        assert_eq!(
            t.check_remote_in(1, 8, bound.rkey, 0x1800, 64, w),
            Err(AccessError::BadKey(bound.rkey)),
            "another QP"
        );
        let again = bind(&bound, &mr, 0x1000, 8, w);
        assert_eq!(t.bind_window(1, 7, &again), Err(MwError::State));
        assert_eq!(t.invalidate(mw.rkey), Err(MwError::BadKey(mw.rkey)));
        assert_eq!(t.invalidate(bound.rkey), Ok(()));
        assert_eq!(
            t.invalidate(bound.rkey),
            Err(MwError::State),
            "free already"
        );
        assert_eq!(
            t.check_remote_in(1, 7, bound.rkey, 0x1800, 64, w),
            Err(AccessError::BadKey(bound.rkey))
        );
        assert_eq!(t.windows_bound(mr.lkey), 0);
        assert!(t.bind_window(1, 7, &again).is_ok(), "free again");
        assert_eq!(t.invalidate(mr.lkey), Err(MwError::BadKey(mr.lkey)));
    }

    /// rxe's bind checks: the region must allow binds (C10-73), a writable window
    /// needs local write on the region (C10-74), the window must lie inside the region
    /// (C10-75), the keys must name a window and a region.
    #[test]
    fn bind_checks_refuse_what_iba_forbids() {
        let mut t = MrTable::new();
        let plain = t.register_in(1, 0x1000, 0x1000, RW).unwrap();
        let ro = t
            .register_in(1, 0x4000, 0x1000, Access::REMOTE_READ | Access::MW_BIND)
            .unwrap();
        let ok = t
            .register_in(1, 0x8000, 0x1000, RW | Access::MW_BIND)
            .unwrap();
        let other_pd = t
            .register_in(2, 0xA000, 0x1000, RW | Access::MW_BIND)
            .unwrap();
        let mw = t.alloc_window(1, MwType::One).unwrap();
        let w = Access::REMOTE_WRITE;
        let cases = [
            (
                bind(&mw, &plain, 0x1000, 8, Access::REMOTE_READ),
                MwError::Access,
            ),
            (bind(&mw, &ro, 0x4000, 8, w), MwError::Access),
            (
                bind(&mw, &ro, 0x4000, 8, Access::REMOTE_ATOMIC),
                MwError::Access,
            ),
            (bind(&mw, &ok, 0x8800, 0x801, w), MwError::Range),
            (bind(&mw, &ok, 0x7FFF, 2, w), MwError::Range),
            (bind(&mw, &ok, u64::MAX, 2, w), MwError::Range),
            (bind(&mw, &other_pd, 0xA000, 8, w), MwError::Pd),
            (
                MwBind {
                    new_rkey: mw.rkey + 0x100,
                    ..bind(&mw, &ok, 0x8000, 8, w)
                },
                MwError::BadKey((mw.rkey + 0x100) & !0xFF | (mw.rkey & 0xFF)),
            ),
            (
                MwBind {
                    mr_lkey: ok.lkey ^ 1,
                    ..bind(&mw, &ok, 0x8000, 8, w)
                },
                MwError::BadKey(ok.lkey ^ 1),
            ),
            (
                MwBind {
                    prev_key: mw.rkey as u8 ^ 1,
                    ..bind(&mw, &ok, 0x8000, 8, w)
                },
                MwError::BadKey(mw.rkey ^ 1),
            ),
        ];
        for (b, e) in cases {
            assert_eq!(t.bind_window(1, 3, &b), Err(e), "{b:?}");
            assert_eq!(t.window(mw.rkey).unwrap().binding, None, "unchanged");
        }
        assert!(t
            .bind_window(1, 3, &bind(&mw, &ok, 0x8000, 0x1000, w))
            .is_ok());
        assert!(t.bind_window(1, 3, &bind(&mw, &ro, 0x4000, 8, w)).is_err());
        // A failed rebind leaves the window as it was: still bound, same key.
        assert_eq!(t.windows_bound(ok.lkey), 1);
        // An MW key is no lkey.
        let rk = t.window(mw.rkey).map(|m| m.rkey);
        assert!(rk.is_none(), "the pre-bind key is retired");
    }
}
