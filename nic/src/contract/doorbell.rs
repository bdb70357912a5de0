//! The fast path's unit: a [`Doorbell`] (a posted work request, or the
//! pieces of one) in a QP's SPSC ring, fixed-size slots ([`DoorbellSlot`],
//! [`doorbell_slots`]) so that posting allocates nothing.

use super::*;

/// A posted work request on its way to the engine.
#[derive(Debug, Clone, Copy)]
pub enum Doorbell {
    /// `post_send`.
    Send(SendWr),
    /// `post_recv`.
    Recv(RecvWr),
    /// `post_send` on a UD QP (`wr.ud`): SEND or SEND with immediate to
    /// one destination (IBA 9.8), in one slot as the others.
    SendUd(UdWr),
    /// Part of the SGE list of the work request in the first `Send` or
    /// `Recv` slot after it: a request with several SGEs takes
    /// `n.div_ceil(GATHER_PER_SLOT)` of these before its own slot, all
    /// committed to the ring at once (its `sge` is then ignored).
    Sges {
        /// SGEs; the first `n` are used.
        sges: [Sge; GATHER_PER_SLOT],
        /// How many of `sges` are used.
        n: u8,
    },
}

/// A UD send work request ([`Doorbell::SendUd`]): what a [`SendWr`] of a
/// SEND says, and where it goes. UD has no RDMA or atomic operation, so
/// this is smaller than a `SendWr` beside a [`UdDest`] and keeps a doorbell
/// slot at one cache line.
#[derive(Debug, Clone, Copy)]
pub struct UdWr {
    /// Caller's id.
    pub wr_id: u64,
    /// The payload (ignored when the request carries an SGE list).
    pub sge: Sge,
    /// `IBV_WR_SEND_WITH_IMM`'s immediate.
    pub imm: Option<u32>,
    /// Address handle, remote QPN and Q_Key.
    pub dest: UdDest,
    /// Completes with a work completion.
    pub signaled: bool,
    /// Sets the BTH SE bit.
    pub solicited: bool,
}

impl UdWr {
    /// The [`SendWr`] the transport queues.
    pub fn send_wr(&self) -> SendWr {
        SendWr {
            wr_id: self.wr_id,
            op: match self.imm {
                Some(i) => rdma::transport::SendOp::SendImm(i),
                None => rdma::transport::SendOp::Send,
            },
            sge: self.sge,
            signaled: self.signaled,
            solicited: self.solicited,
        }
    }
}

/// SGEs one [`Doorbell::Sges`] slot carries.
pub const GATHER_PER_SLOT: usize = 3;

/// The doorbell slots a work request with `n` SGEs takes.
pub const fn doorbell_slots(n: usize) -> usize {
    if n > 1 {
        1 + n.div_ceil(GATHER_PER_SLOT)
    } else {
        1
    }
}

/// Pushes request `d` into `ring`, preceded by its SGE list when `sgl` has
/// several ([`Doorbell::Sges`]), all its slots committed at once so that the
/// engine never sees a list without its request; `Err` (nothing pushed)
/// when the ring lacks the room.
pub(crate) fn push_request(
    ring: &mut rtrb::Producer<DoorbellSlot>,
    d: Doorbell,
    sgl: &[Sge],
) -> Result<(), ()> {
    let list = if sgl.len() > 1 { sgl } else { &[] };
    let chunk = ring
        .write_chunk_uninit(doorbell_slots(list.len()))
        .map_err(|_| ())?;
    let parts = list.chunks(GATHER_PER_SLOT).map(|c| {
        let mut sges = [Sge::default(); GATHER_PER_SLOT];
        sges[..c.len()].copy_from_slice(c);
        DoorbellSlot(Doorbell::Sges {
            sges,
            n: c.len() as u8,
        })
    });
    chunk.fill_from_iter(parts.chain(std::iter::once(DoorbellSlot(d))));
    Ok(())
}

/// A [`Doorbell`] in its QP's ring: one cache line, aligned to one. The
/// ring is cold whenever thousands of QPs take turns, and a slot that
/// straddled two lines cost the program and the engine two misses each.
/// (The alignment sits on this wrapper, not on the enum: an aligned enum
/// loses the niche that keeps its tag inside the 64 bytes.)
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
pub struct DoorbellSlot(pub Doorbell);
