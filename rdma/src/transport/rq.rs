//! Receive WQEs (IBA 10.7.2.1, 11.4.1.2 `PostReceive`): a posted receive as
//! a queue holds it, and the checks a receive WR passes before a QP's own
//! receive queue (super::responder) or a shared one (super::srq) takes it.

use super::config::QpError;
use super::mr::{Access, MrTable};
use super::sgl::{self, SglRef, SglStore};
use super::wc::{RecvWr, Sge};

/// A posted receive: the request (with several SGEs, `wr.sge` is the first
/// with the list's whole length) and where its scatter list is.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecvWqe {
    pub wr: RecvWr,
    pub sgl: SglRef,
}

/// Checks receive WR `wr` (its scatter list `sgl` when given, `wr.sge`
/// otherwise: at most the store's `max_sge`, the total at most 2^31, and,
/// with `mrs`, every SGE LOCAL_WRITE in protection domain `pd`) and makes
/// its queue entry, a list of several SGEs kept in `store`.
pub(super) fn admit_recv(
    mut wr: RecvWr,
    sgl: Option<&[Sge]>,
    store: &mut SglStore,
    pd: u32,
    mrs: Option<&MrTable>,
) -> Result<RecvWqe, QpError> {
    let list = match sgl {
        Some([one]) => {
            wr.sge = *one;
            &[][..]
        }
        Some([]) => {
            wr.sge = Sge::default();
            &[][..]
        }
        Some(l) => l,
        None => &[][..],
    };
    if list.len() > store.max_sge() {
        return Err(QpError::LocalLength);
    }
    let check = |s: &Sge| match mrs {
        Some(mrs) if s.len > 0 => mrs
            .check_local_in(pd, s.lkey, s.addr, u64::from(s.len), Access::LOCAL_WRITE)
            .map(|_| ())
            .map_err(QpError::LocalProtection),
        _ => Ok(()),
    };
    let mut sgl_ref = SglRef::OWN;
    if list.is_empty() {
        check(&wr.sge)?;
    } else {
        let total = sgl::total_len(list).ok_or(QpError::LocalLength)?;
        list.iter().try_for_each(check)?;
        wr.sge = Sge {
            addr: list[0].addr,
            len: total,
            lkey: list[0].lkey,
        };
        sgl_ref = store.push(list);
    }
    Ok(RecvWqe { wr, sgl: sgl_ref })
}
