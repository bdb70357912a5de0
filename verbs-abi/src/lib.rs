//! `librsnic_verbs.so`: the public libibverbs ABI over the rsnic engine, so
//! that unmodified ibverbs programs (perftest's `ib_write_bw` & co.,
//! `ibv_rc_pingpong`, `ibv_devinfo`) run on rsnic when it is preloaded:
//!
//! ```text
//! rsnic-exec --dev net_tap0,iface=rs0 --ip 10.0.0.1 -- ib_write_bw ...
//! # = RSNIC_DEV=net_tap0,iface=rs0 RSNIC_IP=10.0.0.1 LD_PRELOAD=.../librsnic_verbs.so ib_write_bw ...
//! ```
//!
//! Why a preloaded library and not an rdma-core provider: libibverbs loads
//! providers only for devices the kernel lists (uverbs), and the provider
//! ABI (`IBVERBS_PRIVATE_<N>`) changes with every rdma-core release. The
//! public ABI is stable: this library defines its functions under the same
//! symbol versions (`IBVERBS_1.0` .. `IBVERBS_1.11`, build.rs and
//! symbols.txt), so the program's references bind here first; the real
//! `libibverbs.so.1` stays loaded for the providers that link it.
//!
//! Layers:
//! - [`ffi`]: verbs.h's structs through bindgen (never by hand);
//! - [`translate`]: pure translations, the `ibv_modify_qp` mask rules and
//!   errno values (unit-tested);
//! - [`objects`]: our C objects (an ibverbs struct first, the engine's
//!   handle after it) and the registry that rejects foreign pointers;
//! - [`abi`]: the exported functions and the context's `ops` (the hot
//!   path of verbs.h's inline `ibv_post_send` / `ibv_poll_cq`);
//! - [`backend`]: where the engine runs. Today in-process (EAL and engine on
//!   threads of the program's own process); the planned daemon that owns the
//!   port and serves many programs over shared-memory rings is another
//!   backend behind the same handle API, not a rewrite of the ABI layer.

#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod backend;
pub mod config;
pub mod objects;
pub mod rdmacm;
pub mod translate;

/// libibverbs' types and constants from the system's `infiniband/verbs.h`.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    unsafe_op_in_unsafe_fn
)]
pub mod ffi {
    include!(concat!(env!("OUT_DIR"), "/verbs.rs"));
}

// Each `rsnic_<name>` is exported as `<name>@@<version>` (build.rs).
#[cfg(not(test))]
std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));
