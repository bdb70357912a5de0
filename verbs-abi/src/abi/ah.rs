//! Address handles (`ibv_create_ah`, `ibv_destroy_ah`,
//! `ibv_create_ah_from_wc`, `ibv_init_ah_from_wc`): the destinations of UD
//! datagrams. On RoCE an address is a GID, here `::ffff:a.b.c.d` (RoCE v2
//! over IPv4, IBA annex A17.4.5); the NIC resolves its MAC when the handle
//! is made (`nic::verbs::Device::create_ah`), as rxe does.

use super::*;
use libc::EINVAL;
use rdma::transport::AhId;
use std::ffi::c_int;
use std::num::NonZeroU32;
use std::ptr::null_mut;

/// The id a UD work request names its destination by: the `handle` our
/// `ibv_create_ah` wrote. The program's `ibv_ah` pointer is read as rdma-core
/// providers read it (a destroyed or foreign handle is the program's bug);
/// NULL or a handle without an id is None (EINVAL).
pub(crate) fn ah_id(ah: *mut ibv_ah) -> Option<AhId> {
    if ah.is_null() {
        return None;
    }
    // SAFETY: the program's address handle, live during its post
    // (ibv_post_send(3)).
    NonZeroU32::new(unsafe { (*ah).handle }).map(AhId)
}

/// The IPv4 address an `ibv_ah_attr` names: RoCE needs the GRH (`is_global`)
/// with an IPv4-mapped GID, port 1 (or 0: the QP's) and our only GID index.
fn ipv4_of_ah_attr(a: &ibv_ah_attr) -> Result<[u8; 4], i32> {
    if a.is_global == 0 || a.grh.sgid_index != 0 || a.port_num > 1 {
        return Err(EINVAL);
    }
    // SAFETY: a GID is 16 plain bytes either way it is read.
    let dgid = unsafe { a.grh.dgid.raw };
    ipv4_of_gid(&dgid).ok_or(EINVAL)
}

/// `ibv_create_ah(3)`: an address handle in PD `p`, or NULL with errno
/// (EINVAL for an attribute that names no RoCE v2 IPv4 destination,
/// EHOSTUNREACH when the destination does not answer ARP).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_ah(
    p: *mut ibv_pd,
    attr: *mut ibv_ah_attr,
) -> *mut ibv_ah {
    guard(null_mut(), || {
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        if attr.is_null() {
            return null_with(EINVAL);
        }
        // SAFETY: the caller's attributes (checked non-NULL), read only.
        let ip = match ipv4_of_ah_attr(unsafe { &*attr }) {
            Ok(ip) => ip,
            Err(e) => return null_with(e),
        };
        // SAFETY: a live PD of ours (held); its context outlives it.
        let pd = unsafe { &*p.cast::<Pd>() };
        let backend = unsafe { Context::from_ibv(pd.ibv.context) }.backend;
        let ah = match backend.dev.create_ah(ip) {
            Ok(a) => a,
            Err(e) => return null_with(errno_of(&e)),
        };
        let b = Box::new(Ah {
            ibv: ibv_ah {
                context: pd.ibv.context,
                pd: p,
                handle: ah.id().0.get(),
            },
            ah: Some(ah),
        });
        let a = Box::into_raw(b);
        register(a.cast(), Kind::Ah, &[p.cast()]);
        a.cast()
    })
}

/// `ibv_destroy_ah(3)`: 0 or the errno (EINVAL: not a live handle of ours).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_destroy_ah(a: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        let dying = match begin_destroy(a.cast(), Kind::Ah) {
            Ok(d) => d,
            Err(e) => return e,
        };
        dying.finish();
        // SAFETY: allocated in create_ah, now unregistered; dropping the
        // NIC's handle makes the engines forget it.
        drop(unsafe { Box::from_raw(a.cast::<Ah>()) });
        0
    })
}

/// `ibv_init_ah_from_wc(3)`: the attributes of a handle back to the sender
/// of the UD datagram `wc` whose GRH is `grh` (the first 40 bytes of its
/// receive buffer). On RoCE v2 over IPv4 the GRH holds the IPv4 header in
/// its last 20 bytes (IBA annex A17.4.5.1, rdma-core's
/// `ibv_init_ah_from_wc`): the reply goes to its source address. 0, or -1
/// with errno EINVAL (no GRH, not IPv4).
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    out: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        if ctx(c).is_none() || wc.is_null() || grh.is_null() || out.is_null() || port > 1 {
            return minus_one(EINVAL);
        }
        // SAFETY: the caller's completion and GRH, read only.
        let (w, g) = unsafe { (&*wc, &*grh.cast::<[u8; 40]>()) };
        if w.wc_flags & IBV_WC_GRH == 0 {
            return minus_one(EINVAL);
        }
        let ip4 = &g[20..];
        if ip4[0] >> 4 != 4 {
            return minus_one(EINVAL);
        }
        let mut dgid = [0u8; 16];
        dgid[10] = 0xff;
        dgid[11] = 0xff;
        dgid[12..].copy_from_slice(&ip4[12..16]);
        let mut a = ibv_ah_attr {
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            is_global: 1,
            port_num: port.max(1),
            ..Default::default()
        };
        a.grh.dgid.raw = dgid;
        a.grh.sgid_index = 0;
        // The sender's TTL and DSCP, as rdma-core takes hop limit and
        // traffic class from the GRH.
        a.grh.hop_limit = 0xff;
        a.grh.traffic_class = ip4[1];
        // SAFETY: the caller's attributes to fill.
        unsafe { out.write(a) };
        0
    })
}

/// `ibv_create_ah_from_wc(3)`: [`rsnic_ibv_init_ah_from_wc`], then
/// [`rsnic_ibv_create_ah`] in PD `p`; NULL with errno on a failure.
#[no_mangle]
pub(crate) extern "C" fn rsnic_ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard(null_mut(), || {
        let Some(_pd_held) = hold(p.cast(), Kind::Pd) else {
            return null_with(EINVAL);
        };
        // SAFETY: a live PD of ours (held).
        let c = unsafe { (*p.cast::<Pd>()).ibv.context };
        let mut a = ibv_ah_attr::default();
        if rsnic_ibv_init_ah_from_wc(c, port, wc, grh, &mut a) != 0 {
            return null_mut();
        }
        rsnic_ibv_create_ah(p, &mut a)
    })
}
