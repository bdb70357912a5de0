//! The system calls of [`crate::shmem`]: memfds, the program's mappings
//! (`/proc/self/maps`), moving pages onto a memfd and the engine's views.
//! All of it runs on the slow path (registration, deregistration, fork).

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::Arc;

/// Why [`crate::shmem::share`] did not share a range.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    /// A page of the range is not mapped (`ibv_reg_mr`: EFAULT, as the
    /// kernel's pinning answers).
    #[error("a page of the range is not mapped")]
    Unmapped,
    /// A page is not readable, or not writable where the access needs
    /// writes (EFAULT, as pinning such a page for writing fails).
    #[error("a page of the range lacks the access the region needs")]
    Access,
    /// The range lies (partly) in a mapping that cannot be moved: shared,
    /// file-backed, hugetlb, the main stack. The caller falls back to the
    /// program's own pages.
    #[error("the range is in a mapping that cannot be moved")]
    Unmovable,
    /// A system call failed (memfd_create, mmap: ENOMEM, EMFILE...).
    #[error("{0}")]
    Os(#[from] std::io::Error),
}

impl ShareError {
    /// The errno `ibv_reg_mr` reports for it.
    pub fn errno(&self) -> i32 {
        match self {
            ShareError::Unmapped | ShareError::Access => libc::EFAULT,
            ShareError::Unmovable => libc::EINVAL,
            ShareError::Os(e) => e.raw_os_error().unwrap_or(libc::ENOMEM),
        }
    }
}

/// The page size the registry works in (x86-64 and aarch64 with 4 KiB
/// pages; a range on larger pages is a hugetlb mapping, which is never
/// moved).
pub(crate) const PAGE: usize = 4096;

/// A memfd that program pages were moved onto, and the engine's mapping of
/// all of it. Dropped (unmapped, closed) with its last holder: the regions'
/// views and the registry's runs; the program's own mapping keeps the
/// pages alive for the program by itself.
pub(crate) struct Backing {
    fd: OwnedFd,
    /// The engine's mapping of the whole memfd (`len` bytes, read-write).
    engine: *mut u8,
    len: usize,
    /// The memfd's identity in `/proc/self/maps`: (major, minor, inode).
    id: (u32, u32, u64),
}

// SAFETY: `engine` is a mapping only this value unmaps (in drop); the
// bytes behind it are shared memory reached through raw copies only.
unsafe impl Send for Backing {}
// SAFETY: as for Send.
unsafe impl Sync for Backing {}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: mapped in `Backing::new` with this length, unmapped once.
        unsafe { libc::munmap(self.engine.cast(), self.len) };
    }
}

impl Backing {
    /// A zeroed memfd of `len` bytes (a multiple of [`PAGE`]) and the
    /// engine's mapping of it, which a forked child does not inherit
    /// (MADV_DONTFORK: the child has no engine).
    pub(crate) fn new(len: usize) -> io::Result<Arc<Backing>> {
        // SAFETY: a NUL-terminated name; flags are plain bits.
        let fd = unsafe { libc::memfd_create(c"rsnic-mr".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and out-parameter.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let id = (libc::major(st.st_dev), libc::minor(st.st_dev), st.st_ino);
        // SAFETY: a new shared mapping of our own memfd, placed by the kernel.
        let engine = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if engine == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: advice on our own mapping; failure is harmless (a child
        // would then merely keep a mapping it does not use).
        unsafe { libc::madvise(engine, len, libc::MADV_DONTFORK) };
        Ok(Arc::new(Backing {
            fd,
            engine: engine.cast(),
            len,
            id,
        }))
    }

    /// The engine's address of the backing's page `page`.
    pub(crate) fn engine_page(&self, page: u64) -> *mut u8 {
        self.engine.wrapping_add(page as usize * PAGE)
    }

    /// Whether a mapping of `vma` shows this memfd.
    fn is(&self, vma: &Vma) -> bool {
        (vma.major, vma.minor, vma.inode) == self.id
    }
}

/// A backing as the registry names it: equal only to itself.
#[derive(Clone)]
pub(crate) struct BackingRef(pub(crate) Arc<Backing>);

impl PartialEq for BackingRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone)]
pub(crate) struct Vma {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) read: bool,
    pub(crate) write: bool,
    pub(crate) shared: bool,
    pub(crate) offset: u64,
    major: u32,
    minor: u32,
    inode: u64,
    pub(crate) path: String,
}

impl Vma {
    fn parse(line: &str) -> Option<Vma> {
        let mut f = line.splitn(6, ' ');
        let (start, end) = f.next()?.split_once('-')?;
        let perms = f.next()?.as_bytes();
        let offset = u64::from_str_radix(f.next()?, 16).ok()?;
        let (major, minor) = f.next()?.split_once(':')?;
        let inode = f.next()?.parse().ok()?;
        let path = f.next().unwrap_or("").trim_start().to_string();
        Some(Vma {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            read: perms.first() == Some(&b'r'),
            write: perms.get(1) == Some(&b'w'),
            shared: perms.get(3) == Some(&b's'),
            offset,
            major: u32::from_str_radix(major, 16).ok()?,
            minor: u32::from_str_radix(minor, 16).ok()?,
            inode,
            path,
        })
    }

    /// Protection bits for a new mapping in its place.
    fn prot(&self) -> i32 {
        let mut p = libc::PROT_NONE;
        if self.read {
            p |= libc::PROT_READ;
        }
        if self.write {
            p |= libc::PROT_WRITE;
        }
        p
    }

    /// Whether its pages can be moved onto a memfd without the program
    /// noticing: private anonymous memory (the heap, `malloc`'s and
    /// `mmap(MAP_PRIVATE|MAP_ANONYMOUS)`'s), not the main stack (a
    /// mapping inside it would stop its growth), not huge pages; or pages
    /// an earlier registration moved.
    fn movable(&self) -> bool {
        let anon = !self.shared
            && self.inode == 0
            && (self.path.is_empty() || self.path == "[heap]" || self.path.starts_with("[anon:"));
        // Pages moved for a region since deregistered (the registry forgot
        // them; they are still on that memfd): moved again, onto a new one.
        let ours = self.shared && self.path.starts_with("/memfd:rsnic-mr");
        self.read && (anon || ours)
    }
}

/// The program's mappings that overlap `lo..hi`, in order.
pub(crate) fn vmas(lo: usize, hi: usize) -> io::Result<Vec<Vma>> {
    match query_vmas(lo, hi) {
        Ok(v) => return Ok(v),
        // Kernels before 6.11 have no PROCMAP_QUERY: read the whole file.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {}
        Err(e) => return Err(e),
    }
    let maps = read_maps()?;
    Ok(maps
        .lines()
        .filter_map(Vma::parse)
        .filter(|v| v.start < hi && v.end > lo)
        .collect())
}

/// `struct procmap_query` (Linux 6.11 uapi `linux/fs.h`).
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// `PROCMAP_QUERY`: `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | (104 << 16) | ((b'f' as libc::c_ulong) << 8) | 17;

/// The mappings over `lo..hi` through `PROCMAP_QUERY` ioctls on
/// `/proc/self/maps`, one per mapping in the range (the whole file of a
/// DPDK process, about a thousand mappings, costs milliseconds to
/// generate); stops at the first hole (the caller finds it).
fn query_vmas(lo: usize, hi: usize) -> io::Result<Vec<Vma>> {
    const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);
    let f = std::fs::File::open("/proc/self/maps")?;
    let mut out = Vec::new();
    let mut at = lo;
    while at < hi {
        let mut name = [0u8; 256];
        let mut q = ProcmapQuery {
            size: 104,
            query_addr: at as u64,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: a valid descriptor, a correctly sized query and a name
        // buffer of the size it says.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), PROCMAP_QUERY, &mut q) };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) {
                break; // a hole at `at`
            }
            return Err(e);
        }
        let n = (q.vma_name_size as usize).saturating_sub(1).min(name.len());
        let mut path = String::from_utf8_lossy(&name[..n]).into_owned();
        if q.vma_page_size as usize != PAGE {
            // Huge pages: never moved (Vma::movable).
            path = format!("[hugetlb]{path}");
        }
        out.push(Vma {
            start: q.vma_start as usize,
            end: q.vma_end as usize,
            read: q.vma_flags & 1 != 0,
            write: q.vma_flags & 2 != 0,
            shared: q.vma_flags & 8 != 0,
            offset: q.vma_offset,
            major: q.dev_major,
            minor: q.dev_minor,
            inode: q.inode,
            path,
        });
        at = q.vma_end as usize;
    }
    Ok(out)
}

/// `/proc/self/maps`, read in few large reads: the kernel walks the
/// mappings again at each read, and a DPDK process has about a thousand
/// (one read of 4 KiB each made a registration cost milliseconds).
fn read_maps() -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open("/proc/self/maps")?;
    let mut buf = Vec::with_capacity(256 * 1024);
    loop {
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        let at = buf.len();
        let room = buf.capacity() - at;
        buf.resize(at + room, 0);
        let n = f.read(&mut buf[at..])?;
        buf.truncate(at + n);
        if n == 0 {
            break;
        }
    }
    String::from_utf8(buf).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// The part of `vmas` over `lo..hi`: an error unless they cover every
/// byte (EFAULT: a hole), have read access, and write access if `write`.
pub(crate) fn check_mapped(
    vmas: &[Vma],
    lo: usize,
    hi: usize,
    write: bool,
) -> Result<(), ShareError> {
    let mut at = lo;
    for v in vmas {
        if v.start > at {
            return Err(ShareError::Unmapped);
        }
        if !v.read || (write && !v.write) {
            return Err(ShareError::Access);
        }
        at = at.max(v.end);
        if at >= hi {
            return Ok(());
        }
    }
    Err(ShareError::Unmapped)
}

/// Whether every byte of `lo..hi` lies in a movable mapping ([`Vma::movable`]).
pub(crate) fn all_movable(vmas: &[Vma], lo: usize, hi: usize) -> bool {
    vmas.iter()
        .filter(|v| v.start < hi && v.end > lo)
        .all(Vma::movable)
}

/// Whether the program's mapping of `lo..hi` is still pages `offset..` of
/// `backing` (false once the program unmapped it or mapped something
/// else there).
pub(crate) fn still_on(vmas: &[Vma], lo: usize, hi: usize, backing: &Backing, offset: u64) -> bool {
    let mut at = lo;
    for v in vmas.iter().filter(|v| v.start < hi && v.end > lo) {
        let expect = offset * PAGE as u64 + (v.start.max(lo) - lo) as u64;
        if v.start > at || !backing.is(v) || v.offset + (v.start.max(lo) - v.start) as u64 != expect
        {
            return false;
        }
        at = v.end;
    }
    at >= hi
}

/// Moves the program's pages `lo..hi` (page-aligned, every byte in a
/// movable mapping of `vmas`) onto `backing` from its page 0: copies their
/// bytes into the backing, then maps the backing over them with each
/// mapping's own protection (`MAP_FIXED` replaces a mapping in one step,
/// under the kernel's mmap lock, so another thread never sees the range
/// unmapped).
///
/// The race: a write another thread makes to these pages between the copy
/// and the new mapping is lost (it lands in the old pages). The window is
/// the copy's (microseconds per MiB); the pages are ones the program is
/// registering, but the first and last may share their page with other
/// data.
pub(crate) fn move_pages(vmas: &[Vma], lo: usize, hi: usize, backing: &Backing) -> io::Result<()> {
    // SAFETY: lo..hi is mapped readable (check_mapped) and the backing's
    // mapping has room for it (the caller sized it); the program's bytes
    // are copied raw, as the engine copies registered memory.
    unsafe { std::ptr::copy_nonoverlapping(lo as *const u8, backing.engine, hi - lo) };
    for v in vmas.iter().filter(|v| v.start < hi && v.end > lo) {
        let (a, b) = (v.start.max(lo), v.end.min(hi));
        // SAFETY: replaces the program's own private anonymous mapping of
        // a..b (movable, checked) with the same bytes on the memfd.
        let p = unsafe {
            libc::mmap(
                a as *mut c_void,
                b - a,
                v.prot(),
                libc::MAP_SHARED | libc::MAP_FIXED,
                backing.fd.as_raw_fd(),
                (a - lo) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A mapping the engine owns (a region's view over several backings),
/// unmapped when dropped.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as Backing's: only its drop unmaps it.
unsafe impl Send for Mapping {}
// SAFETY: as for Send.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `compose` with this length, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Mapping {
    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// One contiguous mapping of `parts` (backing, first page, pages), in
/// order: the engine's view of a region whose pages lie on several
/// backings.
pub(crate) fn compose(parts: &[(Arc<Backing>, u64, u64)]) -> io::Result<Mapping> {
    let len = parts.iter().map(|p| p.2 as usize * PAGE).sum::<usize>();
    // SAFETY: a fresh reservation placed by the kernel.
    let base = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let m = Mapping {
        ptr: base.cast(),
        len,
    };
    let mut at = 0;
    for (b, page, pages) in parts {
        let n = *pages as usize * PAGE;
        // SAFETY: replaces part of our own reservation with the backing's pages.
        let p = unsafe {
            libc::mmap(
                m.ptr.add(at).cast(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                b.fd.as_raw_fd(),
                (*page as usize * PAGE) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        at += n;
    }
    // SAFETY: advice on our own mapping (see Backing::new).
    unsafe { libc::madvise(m.ptr.cast(), len, libc::MADV_DONTFORK) };
    Ok(m)
}

/// Replaces the program's mapping of `lo..hi` (on a backing, `prot`) with
/// a private anonymous copy of its bytes (read from `src`, the engine's
/// mapping of the same pages): what a forked child does with the pages the
/// parent shares with its engine (below). Async-signal-safe: system calls
/// and a copy, nothing allocated.
fn privatize(lo: usize, hi: usize, prot: i32, src: *const u8) {
    let len = hi - lo;
    // SAFETY: a fresh private mapping placed by the kernel.
    let tmp = unsafe {
        libc::mmap(
            null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return;
    }
    // SAFETY: `src` maps len bytes (a backing's engine mapping, or the
    // program's own mapping); `tmp` is ours.
    unsafe { std::ptr::copy_nonoverlapping(src, tmp.cast(), len) };
    // SAFETY: moves our copy over the program's range in one step.
    unsafe {
        libc::mprotect(tmp, len, prot);
        libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            lo as *mut c_void,
        );
    }
}

/// What a forked child re-privatizes: (first byte, end, protection,
/// source), taken under the registry's lock before `fork()`.
pub(crate) type ForkPlan = Vec<(usize, usize, i32, usize)>;

/// The program's mappings of rsnic's memfds (its registered pages, and
/// pages it registered once), from `/proc/self/maps`, as a [`ForkPlan`]
/// whose source is the range itself (the child still has it).
pub(crate) fn fork_plan() -> ForkPlan {
    let Ok(maps) = read_maps() else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(Vma::parse)
        .filter(|v| v.shared && v.path.starts_with("/memfd:rsnic-mr"))
        .map(|v| (v.start, v.end, v.prot(), v.start))
        .collect()
}

/// Runs [`ForkPlan`] in a forked child: each range becomes private
/// memory with the bytes it had, as a page the kernel pinned for a NIC
/// is copied into a child (`IBV_FORK_UNNEEDED`), instead of staying
/// shared with the parent.
pub(crate) fn run_fork_plan(plan: &ForkPlan) {
    for &(lo, hi, prot, src) in plan {
        // The engine's own mappings of the memfds are in the plan too but
        // not in the child (MADV_DONTFORK): msync fails with ENOMEM on a
        // range that is not mapped.
        // SAFETY: msync only looks at the range's mappings (MS_ASYNC on a
        // shared mapping writes nothing back).
        let mapped = unsafe { libc::msync(lo as *mut c_void, hi - lo, libc::MS_ASYNC) } == 0;
        if mapped && prot & libc::PROT_READ != 0 {
            privatize(lo, hi, prot, src as *const u8);
        }
    }
}

/// What the prepare handler takes before `fork()`: a lock to hold across
/// it (the registry's, type-erased: this module knows no registry) and the
/// child's plan.
pub(crate) type ForkTake = fn() -> (Box<dyn std::any::Any>, ForkPlan);

/// The [`ForkTake`] that [`install_fork_hooks`] was given.
static FORK_TAKE: std::sync::OnceLock<ForkTake> = std::sync::OnceLock::new();

thread_local! {
    /// What the prepare handler took for the child and parent handlers of
    /// the same `fork()` (they run on the forking thread).
    static FORK_STASH: std::cell::RefCell<Option<(Box<dyn std::any::Any>, ForkPlan)>> =
        const { std::cell::RefCell::new(None) };
}

extern "C" fn fork_prepare() {
    if let Some(take) = FORK_TAKE.get() {
        let taken = take();
        FORK_STASH.with(|s| *s.borrow_mut() = Some(taken));
    }
}

extern "C" fn fork_parent() {
    FORK_STASH.with(|s| drop(s.borrow_mut().take()));
}

extern "C" fn fork_child() {
    FORK_STASH.with(|s| {
        if let Some((guard, plan)) = s.borrow_mut().take() {
            run_fork_plan(&plan);
            drop(guard);
            // The plan's vector is freed by the child's allocator, which
            // glibc's fork left consistent.
            drop(plan);
        }
    });
}

/// Registers [`fork_prepare`], [`fork_parent`] and [`fork_child`] with
/// `pthread_atfork`, the first time only, with what the prepare handler
/// takes: a forked child gets private copies of the pages the parent
/// shares with its engine.
pub(crate) fn install_fork_hooks(take: ForkTake) {
    if FORK_TAKE.set(take).is_ok() {
        // SAFETY: plain extern "C" functions that live as long as the process.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    }
}
