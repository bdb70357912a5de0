//! Generates the raw bindings to the system DPDK (Debian 12 ships 22.11) and
//! builds the C shim for DPDK's static inline functions. See docs/design.md §10.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dpdk = pkg_config::Config::new()
        .atleast_version("22.11")
        .probe("libdpdk")
        .unwrap_or_else(|e| {
            panic!(
                "DPDK not found through pkg-config ({e}). \
                 Run scripts/setup.sh (installs Debian's dpdk-dev and libdpdk-dev)."
            )
        });
    // `rte_eth_from_rings` and `rte_vdev_init` live in libraries that
    // `pkg-config --libs libdpdk` does not name on Debian (they are PMD/bus
    // libraries normally loaded as plugins).
    println!("cargo:rustc-link-lib=dylib=rte_net_ring");
    println!("cargo:rustc-link-lib=dylib=rte_bus_vdev");

    // The cflags that matter: include dirs, `-include rte_config.h`, -march.
    let mut clang_args: Vec<String> = dpdk
        .include_paths
        .iter()
        .map(|p| format!("-I{}", p.display()))
        .collect();
    clang_args.push("-include".into());
    clang_args.push("rte_config.h".into());
    clang_args.push("-march=corei7".into());

    let mut build = cc::Build::new();
    build.file("csrc/shim.c").include("csrc").opt_level(3);
    for p in &dpdk.include_paths {
        build.include(p);
    }
    build
        .flag("-include")
        .flag("rte_config.h")
        .flag("-march=corei7");
    build.flag_if_supported("-Wno-unused-parameter");
    build.compile("rsnic_dpdk_shim");

    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_args(&clang_args)
        .clang_arg("-Icsrc")
        .allowlist_function("rte_.*")
        .allowlist_function("shim_.*")
        .allowlist_type("rte_.*")
        .allowlist_var("RTE_.*")
        .allowlist_var("rte_.*")
        .allowlist_var("per_lcore__rte_errno")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_var("RING_F_.*")
        .allowlist_var("LCORE_ID_ANY")
        // These packed-and-aligned structs do not lay out in Rust; nothing
        // here needs their fields (docs/design.md §10).
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .opaque_type("rte_gtp_psc_generic_hdr")
        .opaque_type("rte_arp_hdr")
        .opaque_type("rte_arp_ipv4")
        .derive_debug(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen failed on csrc/wrapper.h");

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("cannot write bindings.rs");
}
