//! Where a benchmark's DPDK memory comes from: 2 MiB hugepages when enough are
//! free, ordinary 4 KiB pages (`--no-huge`) otherwise.
//!
//! Baselines must run in their best configuration: `dpdk-testpmd` on 4 KiB pages
//! forwards at well under half its hugepage rate (its mempool's objects then share
//! few cache sets and TLB entries), which would flatter every ratio against it. So
//! each benchmark process, ours and every testpmd it starts, asks for hugepages
//! first and falls back to `--no-huge` only when they are short, and says which it
//! used.
//!
//! Several DPDK processes may want hugepages at once (tests run in parallel, other
//! benchmarks): each asks for a modest, preallocated amount (`-m`), runs
//! `--in-memory` (hugepages come from `memfd`, so nothing is left in a hugetlbfs
//! mount when the process exits, however it exits, and no two processes share a
//! config) with its own `--file-prefix`, and when the reservation fails the process
//! is rerun on `--no-huge` instead of failing.

use std::fmt;
use std::path::Path;

/// Set by [`init_eal`] when it reruns a benchmark on `--no-huge` after its
/// hugepage start failed; setting it by hand forces `--no-huge`.
pub const NO_HUGE_ENV: &str = "RSNIC_BENCH_NO_HUGE";

const FREE_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

/// Which pages a DPDK process's memory is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMode {
    /// `mib` MiB of 2 MiB hugepages reserved at start (`-m`, `--in-memory`).
    Hugepages {
        /// Reserved at start; the EAL may grow it later if pages are free.
        mib: u32,
    },
    /// Ordinary pages (`--no-huge -m mib`).
    NoHuge {
        /// Reserved at start (with `--no-huge` the EAL cannot grow it).
        mib: u32,
    },
}

impl MemoryMode {
    /// Hugepages for `mib` MiB if that many 2 MiB pages plus a margin are free
    /// now and [`NO_HUGE_ENV`] is not set; `--no-huge` with `no_huge_mib` else.
    pub fn choose(mib: u32, no_huge_mib: u32) -> Self {
        let forced_off = std::env::var_os(NO_HUGE_ENV).is_some_and(|v| v != "0");
        if !forced_off && free_hugepages_2m() >= u64::from(mib.div_ceil(2)) + MARGIN_PAGES {
            MemoryMode::Hugepages { mib }
        } else {
            MemoryMode::NoHuge { mib: no_huge_mib }
        }
    }

    /// The EAL arguments for this mode, for `program` (its file prefix carries
    /// the program's name and this process's id, so no two processes share one).
    pub fn eal_args(&self, program: &str) -> Vec<String> {
        let mut v: Vec<String> = match *self {
            MemoryMode::Hugepages { mib } => {
                vec!["--in-memory".into(), "-m".into(), mib.to_string()]
            }
            MemoryMode::NoHuge { mib } => vec![
                "--no-huge".into(),
                "--no-shconf".into(),
                "-m".into(),
                mib.to_string(),
            ],
        };
        v.extend(
            ["--no-pci", "--no-telemetry", "--log-level=error"]
                .iter()
                .map(|s| s.to_string()),
        );
        v.push(format!(
            "--file-prefix={program}-{}-{}",
            std::process::id(),
            PREFIX_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        v
    }

    /// True on hugepages.
    pub fn is_huge(&self) -> bool {
        matches!(self, MemoryMode::Hugepages { .. })
    }
}

impl fmt::Display for MemoryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryMode::Hugepages { mib } => write!(f, "2 MiB hugepages, -m {mib}"),
            MemoryMode::NoHuge { mib } => write!(f, "--no-huge -m {mib}"),
        }
    }
}

/// Pages left free for other processes before we take any.
const MARGIN_PAGES: u64 = 8;

static PREFIX_SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Free 2 MiB hugepages right now (0 when the kernel has none or the file is
/// unreadable).
pub fn free_hugepages_2m() -> u64 {
    read_count(Path::new(FREE_2M))
}

fn read_count(p: &Path) -> u64 {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts this benchmark's EAL for `program` with hugepages for `mib` MiB if they
/// are free, `--no-huge -m no_huge_mib` otherwise, and returns it with the mode
/// it runs in.
///
/// DPDK allows one `rte_eal_init` per process, so when the hugepage start fails
/// (another process took the pages between the check and the reservation) this
/// process is rerun, same arguments, with [`NO_HUGE_ENV`] set, and exits with the
/// rerun's status: a benchmark never fails for want of hugepages.
pub fn init_eal(program: &str, mib: u32, no_huge_mib: u32) -> (&'static dpdk::Eal, MemoryMode) {
    let mode = MemoryMode::choose(mib, no_huge_mib);
    let mut args = vec![program.to_owned()];
    args.extend(mode.eal_args(program));
    match dpdk::Eal::init(&args) {
        Ok(eal) => (eal, mode),
        Err(e) if mode.is_huge() => {
            eprintln!("{program}: EAL on hugepages failed ({e}); rerunning with --no-huge");
            let exe = std::env::current_exe().expect("own executable");
            let status = std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env(NO_HUGE_ENV, "1")
                .status()
                .expect("rerun on --no-huge");
            std::process::exit(status.code().unwrap_or(1));
        }
        Err(e) => panic!("{program}: EAL failed to start: {e} (run scripts/setup.sh)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_name_the_mode_and_a_unique_prefix() {
        let h = MemoryMode::Hugepages { mib: 64 }.eal_args("b");
        assert!(h.contains(&"--in-memory".to_string()) && !h.contains(&"--no-huge".to_string()));
        assert_eq!(h[h.iter().position(|a| a == "-m").unwrap() + 1], "64");
        let n = MemoryMode::NoHuge { mib: 512 }.eal_args("b");
        assert!(n.contains(&"--no-huge".to_string()) && !n.contains(&"--in-memory".to_string()));
        let prefix = |v: &[String]| v.iter().find(|a| a.starts_with("--file-prefix=")).cloned();
        assert_ne!(
            prefix(&h),
            prefix(&n),
            "two processes started here share a prefix"
        );
    }

    #[test]
    fn no_free_pages_means_no_huge() {
        assert_eq!(read_count(Path::new("/nonexistent/free_hugepages")), 0);
        // More than any machine has free: must fall back.
        assert_eq!(
            MemoryMode::choose(u32::MAX / 2, 256),
            MemoryMode::NoHuge { mib: 256 }
        );
    }
}
