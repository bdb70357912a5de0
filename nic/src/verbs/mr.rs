//! Memory regions ([`MemoryRegion`], `ibv_mr`) and gather elements
//! ([`SgRef`]).

use std::sync::Arc;

use dpdk::ExtBuf;
use rdma::transport::Sge;

use super::{request, VerbsError};
use crate::contract::{Command, CommandTx, EngineError};

/// A registered memory region. Its bytes are shared with the engine, like a
/// real NIC's DMA memory: do not change bytes an operation in flight uses.
/// Clones share the registration; the last one's drop deregisters it
/// (or [`super::Device::dereg_mr`]).
#[derive(Clone)]
pub struct MemoryRegion {
    pub(super) inner: Arc<MrInner>,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("lkey", &format_args!("{:#x}", self.inner.lkey))
            .field("va", &format_args!("{:#x}", self.inner.va))
            .field("len", &self.inner.len)
            .finish()
    }
}

/// The registration behind the clones of a [`MemoryRegion`].
pub(super) struct MrInner {
    /// Where its bytes are (for a program's range shared with the engine,
    /// the engine's own mapping of it).
    pub(super) mem: Arc<ExtBuf>,
    /// Its virtual address (what work requests and peers name).
    pub(super) va: u64,
    /// The page registry's count of a shared range (released once the
    /// engines let go: the field drops after `Drop::drop` deregistered).
    pub(super) hold: Option<crate::shmem::Hold>,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) len: usize,
    /// The access it was registered with.
    pub(super) access: rdma::transport::Access,
    /// The engines it is registered with (emptied once deregistered).
    pub(super) cmds: Vec<CommandTx>,
    /// The caller's memory ([`super::Device::reg_user_mr`]): deregistering waits
    /// until nothing uses it any more.
    pub(super) caller_memory: bool,
}

impl MrInner {
    /// Deregisters from every engine and, for the caller's memory, waits
    /// until no frame in flight refers to it. Unless `force`, a region that
    /// memory windows are bound to is refused (`EngineError::MrHasWindows`)
    /// and stays registered; with `force` (the handle's drop) the windows are
    /// unbound first.
    pub(super) fn deregister(&mut self, force: bool) -> Result<(), VerbsError> {
        let mut result = Ok(());
        let cmds = std::mem::take(&mut self.cmds);
        for (k, cmd) in cmds.iter().enumerate() {
            let lkey = self.lkey;
            let r = request(cmd, |reply| Command::DeregMr {
                lkey,
                force,
                reply: Some(reply),
            });
            if k == 0 && matches!(r, Err(VerbsError::Engine(EngineError::MrHasWindows { .. }))) {
                // Windows live on unsharded devices only: nothing else to undo.
                self.cmds = cmds;
                return r;
            }
            result = result.and(r);
        }
        if self.caller_memory {
            // The engines dropped their references; frames sent zero-copy
            // hold one each until the driver frees them (and a shard's view
            // of the memory holds the region until its frames are freed).
            while Arc::strong_count(&self.mem) > 1 || self.mem.refs() != 1 {
                std::thread::yield_now();
            }
        }
        result
    }
}

/// Why [`super::Device::dereg_mr`] did not deregister a region.
#[derive(Debug, thiserror::Error)]
pub enum DeregError {
    /// Memory windows are bound to it (IBA 10.6.7.2.6): it stays registered
    /// and usable, and comes back here.
    #[error("memory region {:#x} has memory windows bound to it: unbind or invalidate them first", .0.lkey())]
    WindowsBound(MemoryRegion),
    /// Any other refusal; the handle is gone (as after a drop).
    #[error(transparent)]
    Failed(#[from] VerbsError),
}

impl From<DeregError> for VerbsError {
    /// The error alone: a region handed back is dropped (its drop forces
    /// the deregistration).
    fn from(e: DeregError) -> VerbsError {
        match e {
            DeregError::WindowsBound(mr) => VerbsError::WindowsBound(mr.lkey()),
            DeregError::Failed(e) => e,
        }
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if self.caller_memory {
            let _ = self.deregister(true);
        } else {
            // The engine keeps the memory alive while frames use it.
            for cmd in self.cmds.drain(..) {
                let _ = cmd.send(Command::DeregMr {
                    lkey: self.lkey,
                    force: true,
                    reply: None,
                });
            }
        }
    }
}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.inner.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.rkey
    }
    /// Virtual address of byte 0 (what goes into a RETH).
    pub fn va(&self) -> u64 {
        self.inner.va
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }
    /// The access flags it was registered with (`ibv_rereg_mr` keeps them
    /// unless it changes them).
    pub fn access(&self) -> rdma::transport::Access {
        self.inner.access
    }
    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The gather/scatter element of `len` bytes at `offset` (not checked
    /// here: the engine checks every SGE against the region when it takes
    /// the work request).
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.va() + offset,
            len,
            lkey: self.lkey(),
        }
    }

    /// Whether it is a program's range shared with the engine
    /// ([`crate::shmem`]): its bytes stay reachable by the engine whatever
    /// the program does with its own mapping.
    pub fn is_shared(&self) -> bool {
        self.inner.hold.is_some()
    }

    /// Address of byte 0 (in the engine's view), for the raw copies in `crate::sys`.
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.inner.mem.base_ptr()
    }
}

/// One element of a gather list ([`super::QueuePair::post_send_sgl`]): `len`
/// bytes at `offset` of a registered region (an `ibv_sge` with its region
/// instead of the region's lkey).
#[derive(Clone, Copy)]
pub struct SgRef<'a> {
    /// The region.
    pub mr: &'a MemoryRegion,
    /// Offset of the first byte in the region.
    pub offset: usize,
    /// Bytes.
    pub len: usize,
}

impl SgRef<'_> {
    /// The element as a work request's SGE, checked against its region.
    pub(super) fn sge(&self) -> Result<Sge, VerbsError> {
        let inside = matches!(self.offset.checked_add(self.len), Some(e) if e <= self.mr.len());
        if !inside || self.len > u32::MAX as usize {
            return Err(VerbsError::OutsideRegion);
        }
        Ok(Sge {
            addr: self.mr.va() + self.offset as u64,
            len: self.len as u32,
            lkey: self.mr.lkey(),
        })
    }
}
