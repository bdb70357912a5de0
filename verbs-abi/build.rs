//! Build script of `librsnic_verbs.so`:
//! 1. the libibverbs struct layouts, from the system's own
//!    `infiniband/verbs.h` through bindgen (never written by hand);
//! 2. the symbol versions: a linker version script defining rdma-core's
//!    version nodes and `.symver` directives giving each exported
//!    `rsnic_<name>` its public name `<name>@@<node>` (symbols.txt).
//!
//! Why `.symver` and not the version script alone: rustc passes its own
//! (anonymous) version script for a cdylib; rust-lld (rustc's default linker
//! on x86_64 Linux) merges ours beside it but versions only names that the
//! objects define with a version, which `.symver` does. GNU ld refuses the
//! mix ("anonymous version tag cannot be combined"), so the library needs
//! rustc's default lld.

use std::env;
use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=symbols.txt");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));

    let bindings = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .allowlist_type("ibv_.*")
        .allowlist_type("verbs_context")
        .allowlist_type("_compat_ibv_port_attr")
        .allowlist_var("IBV_.*")
        .allowlist_var("__VERBS_ABI_IS_EXTENDED")
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*")
        .allowlist_var("RAI_.*")
        .derive_debug(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen on infiniband/verbs.h and rdma/rdma_cma.h failed ({e}): install \
                 libibverbs-dev and librdmacm-dev (scripts/setup.sh)"
            )
        });
    bindings
        .write_to_file(out.join("verbs.rs"))
        .expect("write verbs.rs");

    let list = std::fs::read_to_string("symbols.txt").expect("symbols.txt");
    let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
    let mut asm = String::new();
    for line in list.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(name), Some(node)) = (it.next(), it.next()) else {
            panic!("symbols.txt: bad line {line:?}");
        };
        // A two-instruction trampoline in the same assembly as its
        // `.symver` (LLVM wants the versioned symbol defined there; the Rust
        // function may sit in another codegen unit).
        writeln!(
            asm,
            ".globl __rsnic_v_{name}\n.type __rsnic_v_{name},@function\n\
             __rsnic_v_{name}:\n    jmp rsnic_{name}@PLT\n\
             .size __rsnic_v_{name}, .-__rsnic_v_{name}\n\
             .symver __rsnic_v_{name}, {name}@@{node}"
        )
        .unwrap();
        match nodes.iter_mut().find(|(n, _)| n == node) {
            Some((_, names)) => names.push(name.to_owned()),
            None => nodes.push((node.to_owned(), vec![name.to_owned()])),
        }
    }
    // Each library's nodes chain to its previous one (IBVERBS_1.1 follows
    // IBVERBS_1.0, RDMACM_1.1 follows RDMACM_1.0); private nodes stand alone.
    let mut map = String::new();
    let mut prev: Vec<(String, String)> = Vec::new();
    for (node, names) in &nodes {
        writeln!(map, "{node} {{\n  global:").unwrap();
        for n in names {
            writeln!(map, "    {n};").unwrap();
        }
        let family = node.rsplit_once('_').map_or(node.as_str(), |(f, _)| f);
        let private = node.contains("PRIVATE");
        match prev.iter().find(|(f, _)| f == family) {
            Some((_, p)) if !private => writeln!(map, "}} {p};").unwrap(),
            _ => writeln!(map, "}};").unwrap(),
        }
        if !private {
            prev.retain(|(f, _)| f != family);
            prev.push((family.to_owned(), node.clone()));
        }
    }
    let asm = format!(".text\n.p2align 4\n{asm}");
    std::fs::write(out.join("symver.s"), asm).expect("write symver.s");
    let map_path = out.join("libibverbs.map");
    std::fs::write(&map_path, map).expect("write map");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map_path.display()
    );
}
