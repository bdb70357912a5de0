//! The pure half of the ABI: translations between libibverbs' C structs and
//! the engine's types, the `ibv_modify_qp` attribute-mask rules and the
//! errno of every failure. No pointers are followed here (the callers in
//! the `abi` module hand over references), so all of it is unit-tested,
//! but for `bind_op` (a memory window's bind), which reads the program's
//! window and region as rdma-core providers read them.

use libc::{EBUSY, EHOSTUNREACH, EINVAL, EIO, ENODEV, ENOMEM, EOPNOTSUPP, EPERM};
use nic::contract::EngineError;
use nic::verbs::VerbsError;
use rdma::transport::{Access, MwBind, SendOp, WcOpcode, WcStatus, WorkCompletion};

use crate::ffi::*;

/// `ibv_qp_attr.timeout` (IBA 9.7.6.1.3: the local ACK timeout is
/// 4.096 us x 2^timeout; 0 means infinite) in ns. Infinite is a quarter of
/// u64's range, far enough that a deadline `now + timeout` never wraps.
pub fn timeout_ns(timeout: u8) -> u64 {
    match timeout {
        0 => u64::MAX / 4,
        t => 4_096u64 << t.min(31),
    }
}

/// `enum ibv_mtu` (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5) in bytes.
pub fn mtu_bytes(m: ibv_mtu) -> Option<u32> {
    (1..=5).contains(&m).then(|| 128u32 << m)
}

/// Bytes (256 .. 4096) as `enum ibv_mtu`.
pub fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        4096.. => IBV_MTU_4096,
        2048.. => IBV_MTU_2048,
        1024.. => IBV_MTU_1024,
        512.. => IBV_MTU_512,
        _ => IBV_MTU_256,
    }
}

/// The GID of an IPv4 address for RoCE v2: `::ffff:a.b.c.d` (IBA annex
/// A17.4.5.1, the IPv4-mapped IPv6 address).
pub fn gid_of_ipv4(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The IPv4 address of an IPv4-mapped GID (RoCE v2 over IPv4), or None.
pub fn ipv4_of_gid(g: &[u8; 16]) -> Option<[u8; 4]> {
    (g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff)
        .then(|| [g[12], g[13], g[14], g[15]])
}

/// `ibv_access_flags` of `ibv_reg_mr` as the engine's [`Access`]. As
/// `ibv_reg_mr(3)` says: remote write or remote atomic without local
/// write is EINVAL; flags this NIC does not implement (zero-based, on-demand
/// paging) are EOPNOTSUPP; relaxed ordering is a hint and ignored;
/// `IBV_ACCESS_MW_BIND` lets memory windows be bound to the region.
pub fn access_of(flags: u32) -> Result<Access, i32> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_MW_BIND
        | IBV_ACCESS_RELAXED_ORDERING;
    if flags & !known != 0 {
        return Err(EOPNOTSUPP);
    }
    if flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && flags & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(EINVAL);
    }
    let mut a = Access::empty();
    for (ibv, ours) in [
        (IBV_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
        (IBV_ACCESS_MW_BIND, Access::MW_BIND),
    ] {
        if flags & ibv != 0 {
            a |= ours;
        }
    }
    Ok(a)
}

/// The attributes `ibv_modify_qp(3)` requires (first) and allows besides
/// (second) for an RC QP moving `from` -> `to` (IBA 10.3.1 table 91 /
/// the man page's table; IBV_QP_STATE is in both). None: the transition
/// does not exist.
pub fn rc_transition_masks(from: ibv_qp_state, to: ibv_qp_state) -> Option<(u32, u32)> {
    let state = IBV_QP_STATE;
    let any = IBV_QP_CUR_STATE
        | IBV_QP_ACCESS_FLAGS
        | IBV_QP_PKEY_INDEX
        | IBV_QP_PORT
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_QP_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER
        | IBV_QP_SQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_DEST_QPN
        | IBV_QP_ALT_PATH
        | IBV_QP_PATH_MIG_STATE
        | IBV_QP_EN_SQD_ASYNC_NOTIFY;
    match (from, to) {
        // Any state to RESET or ERR: only the state is needed.
        (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => Some((state, state | any)),
        (IBV_QPS_RESET, IBV_QPS_INIT) => Some((
            state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )),
        (IBV_QPS_INIT, IBV_QPS_INIT) => Some((
            0,
            state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )),
        (IBV_QPS_INIT, IBV_QPS_RTR) => Some((
            state
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
            state
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_ALT_PATH
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_PKEY_INDEX,
        )),
        (IBV_QPS_RTR, IBV_QPS_RTS) => Some((
            state
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC,
            state
                | IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
                | IBV_QP_CUR_STATE
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_ALT_PATH
                | IBV_QP_PATH_MIG_STATE,
        )),
        (IBV_QPS_RTS, IBV_QPS_RTS) => Some((
            0,
            state
                | IBV_QP_CUR_STATE
                | IBV_QP_ACCESS_FLAGS
                | IBV_QP_MIN_RNR_TIMER
                | IBV_QP_ALT_PATH
                | IBV_QP_PATH_MIG_STATE,
        )),
        _ => None,
    }
}

/// [`rc_transition_masks`] for a QP of `qp_type`: RC, UC (no READ/atomic
/// or retry attributes: IBA 10.3.1 table 91's UC column) or UD (a Q_Key, no
/// path: its datagrams carry their address). None: no such transition or
/// QP type.
pub fn transition_masks(
    qp_type: ibv_qp_type,
    from: ibv_qp_state,
    to: ibv_qp_state,
) -> Option<(u32, u32)> {
    let state = IBV_QP_STATE;
    let common = IBV_QP_CUR_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    match qp_type {
        IBV_QPT_RC => rc_transition_masks(from, to),
        IBV_QPT_UC => match (from, to) {
            (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => Some((
                state,
                state
                    | common
                    | IBV_QP_ACCESS_FLAGS
                    | IBV_QP_AV
                    | IBV_QP_PATH_MTU
                    | IBV_QP_RQ_PSN
                    | IBV_QP_SQ_PSN
                    | IBV_QP_DEST_QPN
                    | IBV_QP_ALT_PATH
                    | IBV_QP_PATH_MIG_STATE,
            )),
            (IBV_QPS_RESET, IBV_QPS_INIT) => {
                let m = state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
                Some((m, m))
            }
            (IBV_QPS_INIT, IBV_QPS_INIT) => Some((
                0,
                state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            )),
            (IBV_QPS_INIT, IBV_QPS_RTR) => {
                let req = state | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
                Some((
                    req,
                    req | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
                ))
            }
            (IBV_QPS_RTR, IBV_QPS_RTS) => Some((
                state | IBV_QP_SQ_PSN,
                state
                    | IBV_QP_SQ_PSN
                    | IBV_QP_CUR_STATE
                    | IBV_QP_ACCESS_FLAGS
                    | IBV_QP_ALT_PATH
                    | IBV_QP_PATH_MIG_STATE,
            )),
            (IBV_QPS_RTS, IBV_QPS_RTS) => Some((
                0,
                state
                    | IBV_QP_CUR_STATE
                    | IBV_QP_ACCESS_FLAGS
                    | IBV_QP_ALT_PATH
                    | IBV_QP_PATH_MIG_STATE,
            )),
            _ => None,
        },
        IBV_QPT_UD => match (from, to) {
            (_, IBV_QPS_RESET) | (_, IBV_QPS_ERR) => {
                Some((state, state | common | IBV_QP_QKEY | IBV_QP_SQ_PSN))
            }
            (IBV_QPS_RESET, IBV_QPS_INIT) => {
                let m = state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
                Some((m, m))
            }
            (IBV_QPS_INIT, IBV_QPS_INIT) => {
                Some((0, state | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
            }
            (IBV_QPS_INIT, IBV_QPS_RTR) => Some((state, state | IBV_QP_PKEY_INDEX | IBV_QP_QKEY)),
            (IBV_QPS_RTR, IBV_QPS_RTS) => Some((
                state | IBV_QP_SQ_PSN,
                state | IBV_QP_SQ_PSN | IBV_QP_CUR_STATE | IBV_QP_QKEY,
            )),
            (IBV_QPS_RTS, IBV_QPS_RTS) => Some((0, state | IBV_QP_CUR_STATE | IBV_QP_QKEY)),
            _ => None,
        },
        _ => None,
    }
}

/// Checks an `ibv_modify_qp` call on an RC QP in state `cur`: the target
/// state (`attr_state` with IBV_QP_STATE in `mask`, else `cur`), or EINVAL
/// when the transition does not exist, a required attribute is missing or
/// one it does not take is given (what `ibv_modify_qp(3)` documents and
/// the kernel's `ib_modify_qp_is_ok` enforces).
pub fn check_modify(
    cur: ibv_qp_state,
    attr_state: ibv_qp_state,
    mask: u32,
) -> Result<ibv_qp_state, i32> {
    check_modify_of(IBV_QPT_RC, cur, attr_state, mask)
}

/// [`check_modify`] for a QP of `qp_type` ([`transition_masks`]).
pub fn check_modify_of(
    qp_type: ibv_qp_type,
    cur: ibv_qp_state,
    attr_state: ibv_qp_state,
    mask: u32,
) -> Result<ibv_qp_state, i32> {
    let to = if mask & IBV_QP_STATE != 0 {
        attr_state
    } else {
        cur
    };
    if mask & IBV_QP_STATE == 0 && mask == 0 {
        return Err(EINVAL);
    }
    let (required, allowed) = transition_masks(qp_type, cur, to).ok_or(EINVAL)?;
    if mask & required != required || mask & !allowed != 0 {
        return Err(EINVAL);
    }
    Ok(to)
}

/// The engine's operation for an `ibv_send_wr` (its opcode and the
/// matching union member; `imm_data` is in network order, as on the wire).
/// SEND_WITH_INV and LOCAL_INV carry `invalidate_rkey`, BIND_MW its
/// `bind_mw` member (memory windows, IBA 10.6.7); TSO and DRIVER1 are
/// EINVAL, as a provider refuses an opcode it does not take.
pub fn send_op(wr: &ibv_send_wr) -> Result<SendOp, i32> {
    // SAFETY (union reads): every member is plain integers, so any bit
    // pattern is a valid value; the opcode says which one the program set.
    let imm = u32::from_be(unsafe { wr.__bindgen_anon_1.imm_data });
    let rdma = unsafe { wr.wr.rdma };
    let atomic = unsafe { wr.wr.atomic };
    Ok(match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendImm(imm),
        IBV_WR_RDMA_WRITE => SendOp::Write {
            remote_va: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteImm {
            remote_va: rdma.remote_addr,
            rkey: rdma.rkey,
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::Read {
            remote_va: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote_va: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_va: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        // SAFETY (union reads): as above.
        IBV_WR_SEND_WITH_INV => SendOp::SendInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        IBV_WR_LOCAL_INV => SendOp::LocalInv(unsafe { wr.__bindgen_anon_1.invalidate_rkey }),
        IBV_WR_BIND_MW => {
            // SAFETY: plain integers and pointers; the opcode says the
            // program set `bind_mw`.
            let b = unsafe { wr.__bindgen_anon_2.bind_mw };
            bind_op(b.mw, b.rkey, &b.bind_info)?
        }
        _ => return Err(EINVAL),
    })
}

/// The rights of a window (`mw_access_flags`): remote read, write and atomic
/// (local write and MW_BIND mean nothing on a window and are ignored, as rxe
/// ignores them); zero-based windows are not offered (EINVAL).
pub(crate) fn mw_access_of(flags: u32) -> Result<Access, i32> {
    if flags & IBV_ACCESS_ZERO_BASED != 0 {
        return Err(EINVAL);
    }
    let mut a = Access::empty();
    for (bit, acc) in [
        (IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if flags & bit != 0 {
            a |= acc;
        }
    }
    Ok(a)
}

/// The engine's bind of window `m` to `info` under the new R_Key `rkey`
/// (`IBV_WR_BIND_MW`'s `bind_mw`, `ibv_wr_bind_mw`): the window and the
/// region are read as rdma-core providers read them (the program keeps them
/// live while it posts). EINVAL for no window or a zero-based one, EPERM for a
/// region of another PD (as verbs.h's `ibv_bind_mw` answers).
pub(crate) fn bind_op(m: *mut ibv_mw, rkey: u32, info: &ibv_mw_bind_info) -> Result<SendOp, i32> {
    if m.is_null() {
        return Err(EINVAL);
    }
    let access = mw_access_of(info.mw_access_flags)?;
    // SAFETY: the program's window, live while it posts (ibv_post_send(3)).
    let mw = unsafe { &*m };
    let mr_lkey = if info.mr.is_null() {
        if info.addr != 0 || info.length != 0 {
            return Err(EINVAL);
        }
        0
    } else {
        // SAFETY: the program's region, live while it posts.
        let mr = unsafe { &*info.mr };
        if mr.pd != mw.pd {
            return Err(EPERM);
        }
        mr.lkey
    };
    let len = if info.mr.is_null() { 0 } else { info.length };
    Ok(SendOp::BindMw(MwBind::new(
        mw.rkey, rkey, mr_lkey, info.addr, len, access,
    )))
}

/// Fills `out` from an engine completion (`ibv_poll_cq(3)`: `imm_data` in
/// network order with IBV_WC_WITH_IMM in `wc_flags`; a SEND with
/// immediate completes as IBV_WC_RECV with the flag, a WRITE with
/// immediate as IBV_WC_RECV_RDMA_WITH_IMM). The enums' values are
/// verbs.h's (the engine numbers them so).
#[inline]
pub fn fill_wc(wc: &WorkCompletion, out: &mut ibv_wc) {
    out.wr_id = wc.wr_id;
    out.status = wc.status as u32;
    out.opcode = wc.opcode as u32;
    out.vendor_err = 0;
    out.byte_len = wc.byte_len;
    out.qp_num = wc.qp_num;
    // A UD receive: the sender's QPN, and a GRH in the first 40 bytes of
    // the buffer (IBV_WC_GRH).
    out.src_qp = wc.src_qp;
    out.pkey_index = 0;
    out.slid = 0;
    out.sl = 0;
    out.dlid_path_bits = 0;
    match wc.imm {
        // A SEND with Invalidate: IBV_WC_RECV, the R_Key it invalidated in
        // host order (`invalidated_rkey`, ibv_poll_cq(3)).
        Some(rkey) if wc.opcode == WcOpcode::RecvInv => {
            out.opcode = IBV_WC_RECV;
            out.__bindgen_anon_1.invalidated_rkey = rkey;
            out.wc_flags = IBV_WC_WITH_INV;
        }
        Some(imm) => {
            out.__bindgen_anon_1.imm_data = imm.to_be();
            out.wc_flags = IBV_WC_WITH_IMM;
        }
        None => {
            out.__bindgen_anon_1.imm_data = 0;
            out.wc_flags = 0;
        }
    }
    if wc.grh || received_roce(wc) {
        out.wc_flags |= IBV_WC_GRH;
    }
}

/// A successful receive of any service: every RoCE packet carries a GRH (its
/// IP header), and rxe and mlx5 say so in `wc_flags` for RC and UC receives
/// too (IBV_WC_GRH); only a UD receive also has it in the buffer.
#[inline]
pub fn received_roce(wc: &WorkCompletion) -> bool {
    wc.status == rdma::transport::WcStatus::Success && (wc.opcode as u32) & IBV_WC_RECV != 0
}

/// `ibv_wc_status_str(3)`'s strings (libibverbs' wording).
pub fn wc_status_str(status: u32) -> &'static std::ffi::CStr {
    match status {
        IBV_WC_SUCCESS => c"success",
        IBV_WC_LOC_LEN_ERR => c"local length error",
        IBV_WC_LOC_QP_OP_ERR => c"local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => c"local EE context operation error",
        IBV_WC_LOC_PROT_ERR => c"local protection error",
        IBV_WC_WR_FLUSH_ERR => c"Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => c"memory management operation error",
        IBV_WC_BAD_RESP_ERR => c"bad response error",
        IBV_WC_LOC_ACCESS_ERR => c"local access error",
        IBV_WC_REM_INV_REQ_ERR => c"remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => c"remote access error",
        IBV_WC_REM_OP_ERR => c"remote operation error",
        IBV_WC_RETRY_EXC_ERR => c"transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => c"RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => c"local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => c"remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => c"aborted error",
        IBV_WC_INV_EECN_ERR => c"invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => c"invalid EE context state",
        IBV_WC_FATAL_ERR => c"fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => c"response timeout error",
        IBV_WC_GENERAL_ERR => c"general error",
        IBV_WC_TM_ERR => c"TM error",
        IBV_WC_TM_RNDV_INCOMPLETE => c"TM software rendezvous",
        _ => c"unknown",
    }
}

/// The errno of a failed engine request, as a provider reports the same
/// condition: no resources ENOMEM, still in use EBUSY, a peer that does
/// not answer ARP EHOSTUNREACH, an engine that stopped ENODEV, everything
/// the program got wrong EINVAL.
pub fn errno_of(e: &VerbsError) -> i32 {
    match e {
        VerbsError::QueueFull => ENOMEM,
        VerbsError::EngineGone => ENODEV,
        VerbsError::Dpdk(_) | VerbsError::Channel(_) | VerbsError::Thread { .. } => EIO,
        VerbsError::Capture { .. } => EIO,
        VerbsError::Engine(e) => match e {
            EngineError::MrTableFull | EngineError::TooManyQps => ENOMEM,
            EngineError::ArpCacheFull(_) => ENOMEM,
            EngineError::CqBusy(_) | EngineError::PdBusy(_) | EngineError::SrqBusy(_) => EBUSY,
            EngineError::ArpFailed(_) | EngineError::NoPeerMac(_) => EHOSTUNREACH,
            _ => EINVAL,
        },
        VerbsError::MrShared(_) => EBUSY,
        VerbsError::NoAddressHandleLeft => ENOMEM,
        _ => EINVAL,
    }
}

/// [`WcStatus`] and [`WcOpcode`] carry verbs.h's numbers: checked here so
/// that [`fill_wc`] may cast.
pub const fn wc_enums_match() -> bool {
    WcStatus::Success as u32 == IBV_WC_SUCCESS
        && WcStatus::LocLenErr as u32 == IBV_WC_LOC_LEN_ERR
        && WcStatus::LocProtErr as u32 == IBV_WC_LOC_PROT_ERR
        && WcStatus::WrFlushErr as u32 == IBV_WC_WR_FLUSH_ERR
        && WcStatus::MwBindErr as u32 == IBV_WC_MW_BIND_ERR
        && WcStatus::RemAccessErr as u32 == IBV_WC_REM_ACCESS_ERR
        && WcStatus::RetryExcErr as u32 == IBV_WC_RETRY_EXC_ERR
        && WcStatus::RnrRetryExcErr as u32 == IBV_WC_RNR_RETRY_EXC_ERR
        && WcStatus::GeneralErr as u32 == IBV_WC_GENERAL_ERR
        && WcOpcode::Send as u32 == IBV_WC_SEND
        && WcOpcode::RdmaWrite as u32 == IBV_WC_RDMA_WRITE
        && WcOpcode::RdmaRead as u32 == IBV_WC_RDMA_READ
        && WcOpcode::CompSwap as u32 == IBV_WC_COMP_SWAP
        && WcOpcode::FetchAdd as u32 == IBV_WC_FETCH_ADD
        && WcOpcode::BindMw as u32 == IBV_WC_BIND_MW
        && WcOpcode::LocalInv as u32 == IBV_WC_LOCAL_INV
        && WcOpcode::Recv as u32 == IBV_WC_RECV
        && WcOpcode::RecvRdmaWithImm as u32 == IBV_WC_RECV_RDMA_WITH_IMM
}
const _: () = assert!(wc_enums_match(), "rdma's WC enums drifted from verbs.h");

#[cfg(test)]
mod tests {
    use super::*;

    const INIT: u32 = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    /// What perftest and ibv_rc_pingpong pass at RTR and RTS.
    const RTR: u32 = IBV_QP_STATE
        | IBV_QP_AV
        | IBV_QP_PATH_MTU
        | IBV_QP_DEST_QPN
        | IBV_QP_RQ_PSN
        | IBV_QP_MAX_DEST_RD_ATOMIC
        | IBV_QP_MIN_RNR_TIMER;
    const RTS: u32 = IBV_QP_STATE
        | IBV_QP_SQ_PSN
        | IBV_QP_TIMEOUT
        | IBV_QP_RETRY_CNT
        | IBV_QP_RNR_RETRY
        | IBV_QP_MAX_QP_RD_ATOMIC;

    #[test]
    fn the_life_cycle_programs_use_is_accepted() {
        assert_eq!(
            check_modify(IBV_QPS_RESET, IBV_QPS_INIT, INIT),
            Ok(IBV_QPS_INIT)
        );
        assert_eq!(
            check_modify(IBV_QPS_INIT, IBV_QPS_RTR, RTR),
            Ok(IBV_QPS_RTR)
        );
        assert_eq!(check_modify(IBV_QPS_RTR, IBV_QPS_RTS, RTS), Ok(IBV_QPS_RTS));
        assert_eq!(
            check_modify(IBV_QPS_RTS, IBV_QPS_ERR, IBV_QP_STATE),
            Ok(IBV_QPS_ERR)
        );
        assert_eq!(
            check_modify(IBV_QPS_ERR, IBV_QPS_RESET, IBV_QP_STATE),
            Ok(IBV_QPS_RESET)
        );
        // Attributes only, no state: the QP stays.
        assert_eq!(
            check_modify(IBV_QPS_RTS, 0, IBV_QP_MIN_RNR_TIMER),
            Ok(IBV_QPS_RTS)
        );
    }

    #[test]
    fn missing_extra_and_skipped_are_einval() {
        // INIT without the port.
        assert_eq!(
            check_modify(IBV_QPS_RESET, IBV_QPS_INIT, INIT & !IBV_QP_PORT),
            Err(EINVAL)
        );
        // RTR without the peer's QPN.
        assert_eq!(
            check_modify(IBV_QPS_INIT, IBV_QPS_RTR, RTR & !IBV_QP_DEST_QPN),
            Err(EINVAL)
        );
        // RTR with an RTS attribute.
        assert_eq!(
            check_modify(IBV_QPS_INIT, IBV_QPS_RTR, RTR | IBV_QP_SQ_PSN),
            Err(EINVAL)
        );
        // RESET straight to RTS, INIT to RTS, RTS back to RTR.
        assert_eq!(check_modify(IBV_QPS_RESET, IBV_QPS_RTS, RTS), Err(EINVAL));
        assert_eq!(check_modify(IBV_QPS_INIT, IBV_QPS_RTS, RTS), Err(EINVAL));
        assert_eq!(check_modify(IBV_QPS_RTS, IBV_QPS_RTR, RTR), Err(EINVAL));
        // An empty mask.
        assert_eq!(check_modify(IBV_QPS_RTS, 0, 0), Err(EINVAL));
        // A state verbs.h does not have.
        assert_eq!(check_modify(IBV_QPS_INIT, 42, IBV_QP_STATE), Err(EINVAL));
    }

    #[test]
    fn mtus_and_gids() {
        assert_eq!(mtu_bytes(IBV_MTU_1024), Some(1024));
        assert_eq!(mtu_bytes(IBV_MTU_4096), Some(4096));
        assert_eq!(timeout_ns(14), 4_096 << 14);
        assert_eq!(timeout_ns(1), 8_192);
        assert!(timeout_ns(0) > timeout_ns(31));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
        assert_eq!(mtu_enum(1024), IBV_MTU_1024);
        assert_eq!(mtu_enum(9000), IBV_MTU_4096);
        let g = gid_of_ipv4([10, 0, 0, 7]);
        assert_eq!(ipv4_of_gid(&g), Some([10, 0, 0, 7]));
        let mut v6 = g;
        v6[0] = 0xfe;
        assert_eq!(ipv4_of_gid(&v6), None);
    }

    #[test]
    fn access_rules() {
        assert_eq!(access_of(0), Ok(Access::empty()));
        assert_eq!(
            access_of(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
            Ok(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ)
        );
        assert_eq!(access_of(IBV_ACCESS_REMOTE_WRITE), Err(EINVAL));
        assert_eq!(access_of(IBV_ACCESS_REMOTE_ATOMIC), Err(EINVAL));
        assert_eq!(
            access_of(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND),
            Err(EOPNOTSUPP)
        );
    }

    #[test]
    fn send_wrs_translate() {
        let mut wr = ibv_send_wr {
            opcode: IBV_WR_RDMA_WRITE_WITH_IMM,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = 0x1234_5678u32.to_be();
        wr.wr.rdma = ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: 0xdead_0000,
            rkey: 0x99,
        };
        assert_eq!(
            send_op(&wr),
            Ok(SendOp::WriteImm {
                remote_va: 0xdead_0000,
                rkey: 0x99,
                imm: 0x1234_5678
            })
        );
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic = ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: 8,
            compare_add: 5,
            swap: 0,
            rkey: 3,
        };
        assert_eq!(
            send_op(&wr),
            Ok(SendOp::FetchAdd {
                remote_va: 8,
                rkey: 3,
                add: 5
            })
        );
        wr.opcode = IBV_WR_LOCAL_INV;
        wr.__bindgen_anon_1.invalidate_rkey = 0x1234;
        assert_eq!(send_op(&wr), Ok(SendOp::LocalInv(0x1234)));
        wr.opcode = IBV_WR_SEND_WITH_INV;
        assert_eq!(send_op(&wr), Ok(SendOp::SendInv(0x1234)));
        // A bind without a window.
        wr.opcode = IBV_WR_BIND_MW;
        assert_eq!(send_op(&wr), Err(EINVAL));
    }

    #[test]
    fn completions_translate() {
        let mut out = ibv_wc::default();
        let wc = WorkCompletion {
            wr_id: 7,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RdmaWrite,
            byte_len: 0,
            imm: None,
            qp_num: 0x11,
            solicited: false,
            src_qp: 0,
            grh: false,
        };
        fill_wc(&wc, &mut out);
        assert_eq!(
            (out.wr_id, out.status, out.opcode, out.qp_num, out.wc_flags),
            (7, IBV_WC_REM_ACCESS_ERR, IBV_WC_RDMA_WRITE, 0x11, 0)
        );
        let wc = WorkCompletion {
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 64,
            imm: Some(0xa0b0c0d0),
            ..wc
        };
        fill_wc(&wc, &mut out);
        // Every successful receive: IBV_WC_GRH (RoCE carries one, rxe and
        // mlx5 say so for RC too).
        assert_eq!(out.wc_flags, IBV_WC_WITH_IMM | IBV_WC_GRH);
        // SAFETY: a plain integer member.
        assert_eq!(
            unsafe { out.__bindgen_anon_1.imm_data }.to_ne_bytes(),
            [0xa0, 0xb0, 0xc0, 0xd0]
        );
        // A send completion: no GRH; one of an operation with immediate
        // says so (imm 0, SendOp::completion_imm).
        let wc = WorkCompletion {
            opcode: WcOpcode::Send,
            imm: Some(0),
            ..wc
        };
        fill_wc(&wc, &mut out);
        assert_eq!(out.wc_flags, IBV_WC_WITH_IMM);
        assert_eq!(
            wc_status_str(IBV_WC_LOC_PROT_ERR).to_str().unwrap(),
            "local protection error"
        );
    }

    #[test]
    fn errnos() {
        assert_eq!(errno_of(&VerbsError::QueueFull), ENOMEM);
        assert_eq!(errno_of(&VerbsError::Engine(EngineError::CqBusy(1))), EBUSY);
        assert_eq!(
            errno_of(&VerbsError::Engine(EngineError::TooManyQps)),
            ENOMEM
        );
        assert_eq!(
            errno_of(&VerbsError::Engine(EngineError::ArpFailed(
                [10, 0, 0, 9].into()
            ))),
            EHOSTUNREACH
        );
        assert_eq!(errno_of(&VerbsError::EmptyRegion), EINVAL);
        assert_eq!(errno_of(&VerbsError::EngineGone), ENODEV);
    }
}
