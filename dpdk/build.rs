//! Builds rsnic's XDP program (`xdp/rsnic_xdp.c` at the workspace root) with
//! clang's BPF target into `OUT_DIR` (under `target/`), where
//! `src/af_xdp.rs` embeds it: the program that `net_af_xdp` ports load
//! (`xdp_prog=`) to redirect RoCEv2 to the AF_XDP socket and pass the rest
//! to the kernel. Needs clang (already needed for bindgen) and Debian's
//! libbpf headers (`libbpf-dev`, installed by scripts/setup.sh).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    // Found by walking up, so that the crate may move in the workspace.
    let src = manifest
        .ancestors()
        .map(|d| d.join("xdp/rsnic_xdp.c"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("xdp/rsnic_xdp.c not found above {}", manifest.display()));
    println!("cargo:rerun-if-changed={}", src.display());
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it")).join("rsnic_xdp.o");
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    let mut cmd = Command::new(&clang);
    cmd.args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"]);
    // <linux/bpf.h> includes <asm/types.h>, which Debian keeps under the
    // multiarch directory that `-target bpf` does not search.
    if let Some(dir) = multiarch_include() {
        cmd.arg(format!("-I{}", dir.display()));
    }
    cmd.arg("-c").arg(&src).arg("-o").arg(&out);
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run {clang} to build the XDP program: {e} (run scripts/setup.sh)")
    });
    assert!(
        status.success(),
        "{clang} -target bpf failed on {} (needs libbpf-dev's <bpf/bpf_helpers.h> and \
         linux-libc-dev; run scripts/setup.sh)",
        src.display()
    );
}

/// `/usr/include/<multiarch>` of the target, if it exists.
fn multiarch_include() -> Option<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    let os = env::var("CARGO_CFG_TARGET_OS").ok()?;
    let env_ = env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let arch = match arch.as_str() {
        "x86" => "i386",
        a => a,
    };
    let dir = Path::new("/usr/include").join(format!("{arch}-{os}-{env_}"));
    dir.exists().then_some(dir)
}
