//! The program's side of registered memory (see [`super`]): copies into, out of and
//! between [`MemoryRegion`]s, and registering the caller's own memory.

use dpdk::ExtBuf;
use rdma::transport::Access;

use crate::device::Device;
use crate::error::VerbsError;
use crate::verbs::MemoryRegion;

/// Whether `offset..offset + len` lies inside a region of `size` bytes.
fn inside(offset: usize, len: usize, size: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

impl MemoryRegion {
    /// Copies `data` into the region at `offset`. Panics if out of range.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            inside(offset, data.len(), self.len()),
            "write outside the region"
        );
        // SAFETY: in range of memory the handle keeps alive; a raw copy, so
        // no reference is formed over bytes the engine may be placing.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base_ptr().add(offset), data.len())
        }
    }

    /// Copies bytes at `offset` out of the region. Panics if out of range.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            inside(offset, out.len(), self.len()),
            "read outside the region"
        );
        // SAFETY: as in `write`; `out` is the caller's and not region memory
        // it could alias (it is a `&mut`).
        unsafe {
            std::ptr::copy_nonoverlapping(self.base_ptr().add(offset), out.as_mut_ptr(), out.len())
        }
    }
}

impl Device {
    /// Registers the caller's memory, `len` bytes at `addr`, with `access`
    /// in the default PD (`ibv_reg_mr` over a buffer the program owns): the
    /// engine sends from it without copying and places received data into
    /// it, so its virtual address is `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must be valid for reads and writes from now until
    /// the region is deregistered: [`Device::dereg_mr`] or the drop of its
    /// last handle, which return only once the engine no longer uses the
    /// memory and no frame in flight refers to it (they wait for such
    /// frames to be freed). While registered, the engine (another thread)
    /// reads and writes these bytes, as a NIC's DMA does: the program must
    /// not hold Rust references over bytes an operation in flight uses.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        // SAFETY: the caller's contract above is `reg_user_mr_in`'s.
        unsafe { self.reg_user_mr_in(0, addr, len, access) }
    }

    /// [`Device::reg_user_mr`] in protection domain `pd`.
    ///
    /// # Safety
    /// As [`Device::reg_user_mr`].
    unsafe fn reg_user_mr_in(
        &self,
        pd: u32,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        if addr.is_null() || len == 0 {
            return Err(VerbsError::EmptyRegion);
        }
        // SAFETY: the caller's contract is `from_raw`'s: valid until
        // deregistration, which waits until no mbuf refers to it.
        let mem = unsafe { ExtBuf::from_raw(addr, len) };
        self.reg_mr_in((pd, addr as u64, mem), len, access, true, None)
    }

    /// Registers a program's range shared with the engine
    /// ([`crate::shmem::share`] of `len` bytes at `addr`) in protection
    /// domain `pd`, at virtual address `addr`: the engine reads and writes
    /// the range through its own view, which lives until the region is
    /// deregistered and no frame refers to it, whatever the program does
    /// with its own mapping meanwhile. `ibv_reg_mr` over memory moved onto
    /// a memfd.
    pub fn reg_shared_mr_in(
        &self,
        pd: u32,
        addr: u64,
        shared: crate::shmem::Shared,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        let crate::shmem::Shared { view, hold } = shared;
        let (ptr, len) = (view.ptr(), view.len());
        // SAFETY: the view's memory is valid while the view lives, and the
        // ExtBuf owns the view (dropped with its last reference).
        let mem = unsafe { ExtBuf::with_owner(ptr, len, Box::new(view)) };
        self.reg_mr_in((pd, addr, mem), len, access, false, Some(hold))
    }
}

impl crate::verbs::ProtectionDomain<'_> {
    /// Registers the caller's memory in this PD ([`Device::reg_user_mr`],
    /// whose contract this has).
    ///
    /// # Safety
    /// As [`Device::reg_user_mr`]: `addr..addr + len` valid for reads and
    /// writes until the region is deregistered.
    pub unsafe fn reg_user_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        // SAFETY: the caller's contract is `Device::reg_user_mr`'s.
        unsafe { self.device().reg_user_mr_in(self.id(), addr, len, access) }
    }

    /// Registers a program's range shared with the engine in this PD
    /// ([`Device::reg_shared_mr_in`]).
    pub fn reg_shared_mr(
        &self,
        addr: u64,
        shared: crate::shmem::Shared,
        access: Access,
    ) -> Result<MemoryRegion, VerbsError> {
        self.device()
            .reg_shared_mr_in(self.id(), addr, shared, access)
    }
}
