//! The Environment Abstraction Layer, initialised once per process.

use std::ffi::CString;
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// Proof that `rte_eal_init` succeeded in this process.
///
/// DPDK allows exactly one `rte_eal_init` per process, so this is a
/// process-wide singleton: [`Eal::init`] returns the same `&'static Eal` for
/// the same arguments and an error for different ones.
#[derive(Debug)]
pub struct Eal {
    args: Vec<String>,
}

static EAL: OnceLock<std::result::Result<Eal, String>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// The arguments of the test EAL shared by every test in a process: no
/// hugepages, no PCI scan, no shared config file (so test processes never
/// see each other), no telemetry socket, 512 MiB of ordinary memory.
///
/// docs/design.md §10 suggested `--in-memory`; DPDK 22.11 refuses it next to
/// `--no-huge` ("--legacy-mem is not compatible with --in-memory", because
/// `--no-huge` implies legacy memory), so we use `--no-shconf`, which is
/// what `--in-memory` would have given us here.
pub const TEST_EAL_ARGS: &[&str] = &[
    "rsnic-test",
    "--no-huge",
    "--no-pci",
    "--no-shconf",
    "--no-telemetry",
    "-m",
    "512",
    "--log-level=lib.eal:warning",
];

/// The EAL arguments of a tool or benchmark: `program`, then the user's
/// arguments (what followed `--` on its command line) if there are any,
/// else this project's defaults (docs/design.md §10): no hugepages, 1 GiB of
/// ordinary memory, no PCI scan unless `pci` (a tool given a PCI device
/// needs it), no shared config file and a per-process file prefix (so
/// processes never see each other), no telemetry socket, EAL logs at error
/// level (every component). Every binary builds its EAL line here, so they agree.
pub fn tool_args<S: AsRef<str>>(program: &str, user: &[S], pci: bool) -> Vec<String> {
    let mut args = vec![program.to_owned()];
    if !user.is_empty() {
        args.extend(user.iter().map(|s| s.as_ref().to_owned()));
        return args;
    }
    args.extend(["--no-huge", "-m", "1024"].map(String::from));
    if !pci {
        args.push("--no-pci".into());
    }
    args.extend(["--no-shconf", "--no-telemetry", "--log-level=error"].map(String::from));
    args.push(format!("--file-prefix={program}-{}", std::process::id()));
    args
}

/// Where DPDK's own log messages go ([`set_log_sink`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSink<'a> {
    /// Nowhere: a program that runs DPDK inside its own process (the
    /// ibverbs library) prints nothing it did not ask for.
    Discard,
    /// The process's standard error (DPDK's default also copies every
    /// message to syslog; this does not).
    Stderr,
    /// Appended to this file.
    File(&'a std::path::Path),
}

/// Sends DPDK's log (every component's `rte_log`, the EAL's and the PMDs')
/// to `sink` (`rte_openlog_stream`). Called before [`Eal::init`] it also
/// takes the EAL's own start-up messages: the stream set here wins over the
/// console-and-syslog stream the EAL would install. Which messages are
/// written is the EAL's `--log-level`.
pub fn set_log_sink(sink: LogSink<'_>) -> Result<()> {
    let f: *mut libc::FILE = match sink {
        // SAFETY: both strings are NUL-terminated literals.
        LogSink::Discard => unsafe { libc::fopen(c"/dev/null".as_ptr(), c"w".as_ptr()) },
        LogSink::Stderr => {
            // A descriptor of our own: the program may close or reopen 2.
            // SAFETY: dup takes no pointer.
            let fd = unsafe { libc::dup(libc::STDERR_FILENO) };
            if fd < 0 {
                std::ptr::null_mut()
            } else {
                // SAFETY: `fd` is ours; the literal is NUL-terminated.
                unsafe { libc::fdopen(fd, c"w".as_ptr()) }
            }
        }
        LogSink::File(path) => {
            let c = CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|_| Error::InvalidArgument(path.display().to_string(), "NUL byte"))?;
            // SAFETY: both strings are NUL-terminated.
            unsafe { libc::fopen(c.as_ptr(), c"a".as_ptr()) }
        }
    };
    if f.is_null() {
        let errno = std::io::Error::last_os_error().raw_os_error();
        return Err(Error::from_errno(
            "opening the log stream",
            errno.unwrap_or(libc::EIO),
        ));
    }
    // SAFETY: `f` is an open stream that stays open for the process's life
    // (DPDK keeps it; rte_vlog flushes after each message).
    unsafe { dpdk_sys::rte_openlog_stream(f.cast()) };
    Ok(())
}

impl Eal {
    /// The EAL's runtime directory (`rte_eal_get_runtime_dir`, e.g.
    /// `/var/run/dpdk/<file-prefix>`): created by `rte_eal_init` even with
    /// `--no-shconf`, which then puts nothing in it, and never removed by
    /// DPDK; a process that leaves no files behind removes it (empty).
    pub fn runtime_dir(&self) -> std::path::PathBuf {
        // SAFETY: returns a pointer to the EAL's static, NUL-terminated path.
        let p = unsafe { std::ffi::CStr::from_ptr(dpdk_sys::rte_eal_get_runtime_dir()) };
        std::path::PathBuf::from(p.to_string_lossy().into_owned())
    }

    /// Initialises the EAL with `args` (`args[0]` is the program name, as in
    /// `argv`). Idempotent for identical arguments.
    ///
    /// `rte_eal_init` pins the calling thread to the main lcore's CPU; we
    /// restore the thread's previous CPU set afterwards so that a program's
    /// (or a test harness's) main thread is not silently confined to one
    /// core. Datapath threads are pinned explicitly with
    /// [`crate::lcore::spawn_pinned`].
    pub fn init<S: AsRef<str>>(args: &[S]) -> Result<&'static Eal> {
        let args: Vec<String> = args.iter().map(|s| s.as_ref().to_owned()).collect();
        let _guard = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(done) = EAL.get() {
            return match done {
                Ok(eal) if eal.args == args => Ok(eal),
                Ok(eal) => Err(Error::EalAlreadyInitialised(eal.args.clone())),
                Err(msg) => Err(Error::EalFailed(msg.clone())),
            };
        }
        let result = Self::init_raw(&args);
        let stored = EAL.get_or_init(|| match result {
            Ok(()) => Ok(Eal { args: args.clone() }),
            Err(ref e) => Err(e.to_string()),
        });
        match stored {
            Ok(eal) => Ok(eal),
            Err(msg) => Err(Error::EalFailed(msg.clone())),
        }
    }

    /// The one policy for tests that need root (TAP ports, raw sockets, network
    /// namespaces; docs/design.md "Tests"): they run, and fail with this message
    /// when the process is not root, never pass silently. CI runs as root.
    pub fn require_root(what: &str) {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "this test needs root ({what}): run it as root, or leave it out with `--skip`"
        );
    }

    /// The shared EAL for tests and benchmarks (`TEST_EAL_ARGS`).
    ///
    /// Panics if it cannot start: a test cannot do anything useful without it.
    pub fn for_tests() -> &'static Eal {
        match Self::init(TEST_EAL_ARGS) {
            Ok(eal) => eal,
            Err(e) => panic!("test EAL failed to start: {e} (run scripts/setup.sh)"),
        }
    }

    /// The arguments this EAL was started with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    fn init_raw(args: &[String]) -> Result<()> {
        let cargs: Vec<CString> = args
            .iter()
            .map(|a| {
                CString::new(a.as_str())
                    .map_err(|_| Error::InvalidArgument(a.clone(), "contains a NUL byte"))
            })
            .collect::<Result<_>>()?;
        // rte_eal_init may keep pointers into argv and permutes it: leak both
        // (once per process, a few hundred bytes).
        let cargs: &'static [CString] = Vec::leak(cargs);
        let argv: &'static mut [*mut libc::c_char] = Vec::leak(
            cargs
                .iter()
                .map(|c| c.as_ptr() as *mut libc::c_char)
                .collect(),
        );
        let saved = current_affinity();
        // SAFETY: argv points to NUL-terminated strings that live forever.
        let rc = unsafe { dpdk_sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if let Some(set) = saved {
            restore_affinity(&set);
        }
        if rc < 0 {
            return Err(Error::last("rte_eal_init"));
        }
        Ok(())
    }
}

fn current_affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: plain libc calls on a zeroed cpu_set_t for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            Some(set)
        } else {
            None
        }
    }
}

fn restore_affinity(set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid cpu_set_t obtained from sched_getaffinity.
    unsafe {
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
    }
}
