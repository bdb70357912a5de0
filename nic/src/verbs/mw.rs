//! Memory windows ([`MemoryWindow`], `ibv_mw`; IBA 10.6.7, as Linux rxe has them):
//! an R_Key onto a range of a [`super::MemoryRegion`] with its own remote rights,
//! bound and unbound by work requests on a queue pair
//! ([`super::QueuePair::bind_mw`], `IBV_WR_BIND_MW`), a type 2 window freed by
//! `IBV_WR_LOCAL_INV` or a peer's SEND with Invalidate.

use rdma::transport::{Access, MwBind, MwType};

use crate::contract::{Command, CommandTx};

/// A memory window. Its R_Key ([`Self::rkey`]) is what a peer puts in its
/// RETH; each bind gives it a new key byte (`ibv_inc_rkey`), so a peer that
/// held the key before a rebind is refused after it. Dropping the handle frees
/// the window, bound or not.
pub struct MemoryWindow {
    pub(super) rkey: u32,
    pub(super) pd: u32,
    pub(super) kind: MwType,
    pub(super) cmd: Option<CommandTx>,
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("pd", &self.pd)
            .field("kind", &self.kind)
            .finish()
    }
}

impl MemoryWindow {
    /// Its R_Key: the one the last bind posted gave it (if that bind fails, its
    /// completion says so and the window keeps its earlier key, as with
    /// rdma-core's `ibv_bind_mw`: [`Self::set_rkey`] undoes it).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Sets the R_Key the handle reports (after a failed bind, its key before).
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// Type 1 or 2B.
    pub fn kind(&self) -> MwType {
        self.kind
    }

    /// Its protection domain.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// The bind of `len` bytes at `va` of the region of `mr_lkey` with `access`
    /// (`len` 0: unbind a type 1 window), to the next R_Key, which the handle
    /// takes now.
    pub(super) fn next_bind(&mut self, mr_lkey: u32, va: u64, len: u64, access: Access) -> MwBind {
        let b = MwBind::new(self.rkey, inc_rkey(self.rkey), mr_lkey, va, len, access);
        self.rkey = b.new_rkey;
        b
    }
}

/// `ibv_inc_rkey`: the same window, the next key byte.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xFF) | (rkey.wrapping_add(1) & 0xFF)
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DeallocMw {
                pd: self.pd,
                rkey: self.rkey,
                reply: None,
            });
        }
    }
}
