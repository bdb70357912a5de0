//! Memory the program and the engine share as a NIC's pinned pages (issue
//! 44): [`share`] moves the program's pages of a range onto a memfd mapped
//! at the same addresses, and gives the engine a mapping of its own (a
//! [`View`]). The program's pages and the view are the same memory while
//! both exist; when the program frees or unmaps the range it loses its
//! view only, and the engine's stays valid until the region is
//! deregistered and the last frame that refers to it is freed. The memfd
//! is also what a daemon serving several programs (issue 42) would map on
//! the other side of a socket, so the one mechanism serves both.
//!
//! Pages are moved once: a registration over pages another one moved
//! shares their backing (the page registry, [`registry`], counts the
//! registrations of each page). The registry's lock is taken on the slow
//! path only (registration, deregistration, `fork()`).

pub mod registry;

use std::sync::{Arc, Mutex, MutexGuard, Once};

pub use crate::sys::shmem::ShareError;
use crate::sys::shmem::{self as sys, Backing, BackingRef, Mapping, PAGE};
use registry::{PageRegistry, Piece};

/// The engine's view of a shared range: `len` bytes at `ptr`, the same
/// memory as the program's range. Holds the backings (and its own mapping
/// when the range spans several), so the memory lives as long as the view,
/// whatever the program does with its own mapping.
pub struct View {
    /// The address, as a number: the view is Send and Sync by its parts.
    ptr: usize,
    len: usize,
    _mapping: Option<Mapping>,
    _backings: Vec<Arc<Backing>>,
}

impl View {
    /// The engine's address of the range's first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty (never: [`share`] refuses empty ranges).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The registrations a range counts in the registry; dropping it releases
/// them (the deregistration: the pages stay the program's, on the memfd).
pub struct Hold {
    held: Vec<(u64, u64, BackingRef)>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut reg = registry_lock();
        for (first, pages, b) in self.held.drain(..) {
            reg.release(first, pages, &b);
        }
    }
}

/// A shared range: the engine's [`View`] and the registry [`Hold`].
pub struct Shared {
    /// The engine's view.
    pub view: View,
    /// The registry's count for the program's pages.
    pub hold: Hold,
}

type Registry = PageRegistry<BackingRef>;

static REGISTRY: Mutex<Registry> = Mutex::new(PageRegistry::new());

fn registry_lock() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shares `len` bytes at `addr` of the program's memory with the engine
/// (`ibv_reg_mr`): checks every page is mapped and readable, and writable
/// if `write` (else [`ShareError::Unmapped`] / [`ShareError::Access`]);
/// moves the pages no registration moved yet onto a new memfd (their bytes
/// kept), shares the backing of the others; returns the engine's view.
/// [`ShareError::Unmovable`] for a range (partly) in a mapping that
/// cannot be moved ([`crate::sys`]'s `Vma::movable`): the caller then uses
/// the program's pages directly, as before.
pub fn share(addr: usize, len: usize, write: bool) -> Result<Shared, ShareError> {
    let end = addr
        .checked_add(len)
        .filter(|_| len > 0)
        .ok_or(ShareError::Unmapped)?;
    let lo = addr & !(PAGE - 1);
    let hi = end
        .checked_next_multiple_of(PAGE)
        .ok_or(ShareError::Unmapped)?;
    let (first, pages) = ((lo / PAGE) as u64, ((hi - lo) / PAGE) as u64);
    install_fork_hooks();
    let mut reg = registry_lock();
    let vmas = sys::vmas(lo, hi)?;
    sys::check_mapped(&vmas, lo, hi, write)?;
    // Runs whose pages the program unmapped or replaced since: forget them
    // (their regions keep their backing).
    for p in reg.pieces(first, pages) {
        if let Piece::Held {
            first: f,
            pages: n,
            backing,
            offset,
        } = p
        {
            let (a, b) = (f as usize * PAGE, (f + n) as usize * PAGE);
            if !sys::still_on(&vmas, a, b, &backing.0, offset) {
                reg.evict(f, n);
            }
        }
    }
    // Every gap must be movable before anything moves.
    let gaps: Vec<(u64, u64)> = reg
        .pieces(first, pages)
        .into_iter()
        .filter_map(|p| match p {
            Piece::Gap { first, pages } => Some((first, pages)),
            Piece::Held { .. } => None,
        })
        .collect();
    for &(f, n) in &gaps {
        if !sys::all_movable(&vmas, f as usize * PAGE, (f + n) as usize * PAGE) {
            return Err(ShareError::Unmovable);
        }
    }
    for (i, &(f, n)) in gaps.iter().enumerate() {
        let (a, b) = (f as usize * PAGE, (f + n) as usize * PAGE);
        let moved = Backing::new(b - a).and_then(|backing| {
            sys::move_pages(&vmas, a, b, &backing)?;
            Ok(backing)
        });
        match moved {
            Ok(backing) => {
                reg.insert(f, n, BackingRef(backing), 0);
            }
            Err(e) => {
                // The gaps moved so far stay moved (the program sees the
                // same bytes) but leave the registry: nobody holds them.
                for &(f, n) in &gaps[..i] {
                    reg.evict(f, n);
                }
                return Err(e.into());
            }
        }
    }
    if !reg.hold(first, pages) {
        return Err(ShareError::Unmapped);
    }
    // The view: the backings' pieces, merged where one continues another.
    let mut parts: Vec<(Arc<Backing>, u64, u64)> = Vec::new();
    let mut held = Vec::new();
    for p in reg.pieces(first, pages) {
        let Piece::Held {
            first: f,
            pages: n,
            backing,
            offset,
        } = p
        else {
            continue;
        };
        held.push((f, n, backing.clone()));
        match parts.last_mut() {
            Some((b, o, m)) if Arc::ptr_eq(b, &backing.0) && *o + *m == offset => *m += n,
            _ => parts.push((backing.0, offset, n)),
        }
    }
    let hold = Hold { held };
    drop(reg);
    let (base, mapping) = match &parts[..] {
        [(b, page, _)] => (b.engine_page(*page), None),
        _ => {
            let m = sys::compose(&parts)?;
            (m.ptr(), Some(m))
        }
    };
    Ok(Shared {
        view: View {
            ptr: base as usize + (addr - lo),
            len,
            _mapping: mapping,
            _backings: parts.into_iter().map(|p| p.0).collect(),
        },
        hold,
    })
}

/// Pages the registry holds (for tests): the sum of its runs' lengths.
pub fn registered_pages() -> u64 {
    registry_lock().iter().map(|r| r.1).sum()
}

/// Registers the `fork()` handlers once ([`sys::install_fork_hooks`]).
fn install_fork_hooks() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| sys::install_fork_hooks(take_for_fork));
}

/// The registry's lock and the child's plan, held across `fork()`
/// (prepare takes them, parent and child let go).
fn take_for_fork() -> (Box<dyn std::any::Any>, sys::ForkPlan) {
    let g: MutexGuard<'static, Registry> = registry_lock();
    let plan = sys::fork_plan();
    (Box::new(g), plan)
}
