//! The traffic of roce-soak: the message mix (WRITE with immediate, SEND with
//! immediate, READ) over each QP pair, the memory layout of its buffers, and the
//! checks of every completion and every byte received.

use std::collections::VecDeque;

use bench::chaos::{message_seed, pattern_fill, pattern_mismatch};
use cc::CcKind;
use nic::verbs::{MemoryRegion, QueuePair};
use rdma::transport::{RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion};

use super::{Mix, SoakError};

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Op {
    WriteImm,
    SendImm,
    Read,
}

impl Op {
    pub(super) fn name(self) -> &'static str {
        match self {
            Op::WriteImm => "WRITE_IMM",
            Op::SendImm => "SEND_IMM",
            Op::Read => "READ",
        }
    }
}

/// One message in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Msg {
    pub(super) seq: u64,
    pub(super) op: Op,
    pub(super) slot: usize,
    pub(super) len: usize,
    pub(super) seed: u64,
    /// Waiting for the sender's completion.
    pub(super) sent: bool,
    /// Waiting for the receiver's check (WRITE_IMM, SEND_IMM).
    pub(super) received: bool,
}

/// Receive buffers per QP (posted, reposted after each receive).
pub(super) const RECV_BUFS: usize = 32;

/// Memory layout: per QP, `window` slots of `max_msg` in each area.
/// A: [send source | READ landing]; B: [WRITE landing | READ source | receive buffers].
pub(super) struct Layout {
    pub(super) max_msg: usize,
    pub(super) window: usize,
    pub(super) qps: usize,
}

impl Layout {
    pub(super) fn a_len(&self) -> usize {
        2 * self.qps * self.window * self.max_msg
    }
    pub(super) fn b_len(&self) -> usize {
        self.qps * (2 * self.window + RECV_BUFS) * self.max_msg
    }
    pub(super) fn a_src(&self, qp: usize, slot: usize) -> usize {
        (qp * self.window + slot) * self.max_msg
    }
    pub(super) fn a_read(&self, qp: usize, slot: usize) -> usize {
        ((self.qps + qp) * self.window + slot) * self.max_msg
    }
    pub(super) fn b_write(&self, qp: usize, slot: usize) -> usize {
        (qp * self.window + slot) * self.max_msg
    }
    pub(super) fn b_read_src(&self, qp: usize, slot: usize) -> usize {
        ((self.qps + qp) * self.window + slot) * self.max_msg
    }
    pub(super) fn b_recv(&self, qp: usize, buf: usize) -> usize {
        (2 * self.qps * self.window + qp * RECV_BUFS + buf) * self.max_msg
    }
}

/// One QP pair under test and its bookkeeping.
pub(super) struct Flow {
    pub(super) cc: CcKind,
    /// Its QPs' loss recovery.
    pub(super) mode: rdma::transport::LossRecovery,
    pub(super) qa: QueuePair,
    pub(super) qb: QueuePair,
    pub(super) next_seq: u64,
    /// Receiver-visible messages posted / checked (the immediates).
    pub(super) next_imm: u32,
    pub(super) want_imm: u32,
    pub(super) inflight: VecDeque<Msg>,
    pub(super) slot_busy: Vec<bool>,
    pub(super) done: [u64; 3],
    pub(super) bytes: u64,
}

pub(super) struct Totals {
    pub(super) msgs: u64,
    pub(super) bytes: u64,
}

pub(super) fn post_recv(
    qb: &mut QueuePair,
    b_mr: &MemoryRegion,
    lay: &Layout,
    qp: usize,
    buf: usize,
) -> Result<(), SoakError> {
    qb.post_recv(RecvWr {
        wr_id: buf as u64,
        sge: Sge {
            addr: b_mr.va() + lay.b_recv(qp, buf) as u64,
            len: lay.max_msg as u32,
            lkey: b_mr.lkey(),
        },
    })?;
    Ok(())
}

/// Posts messages while the QP has a free slot.
pub(super) fn post_more(
    f: &mut Flow,
    i: usize,
    lay: &Layout,
    a_mr: &MemoryRegion,
    b_mr: &MemoryRegion,
    mix: &mut Mix,
    scratch: &mut [u8],
) -> Result<(), SoakError> {
    loop {
        let slot = (f.next_seq % lay.window as u64) as usize;
        if f.slot_busy[slot] || f.qa.free_slots() == 0 {
            return Ok(());
        }
        let r = mix.next();
        let op = match r % 3 {
            0 => Op::WriteImm,
            1 => Op::SendImm,
            _ => Op::Read,
        };
        let len = 1 + ((r >> 8) as usize % lay.max_msg);
        let seq = f.next_seq;
        let seed = message_seed(i as u32, seq);
        pattern_fill(seed, &mut scratch[..len]);
        let (sop, local) = match op {
            Op::WriteImm | Op::SendImm => {
                a_mr.write(lay.a_src(i, slot), &scratch[..len]);
                let imm = f.next_imm;
                let sop = if op == Op::WriteImm {
                    SendOp::WriteImm {
                        remote_va: b_mr.va() + lay.b_write(i, slot) as u64,
                        rkey: b_mr.rkey(),
                        imm,
                    }
                } else {
                    SendOp::SendImm(imm)
                };
                (sop, lay.a_src(i, slot))
            }
            Op::Read => {
                // The responder's memory holds this message's pattern; the
                // landing slot is cleared so that a READ that writes nothing fails.
                b_mr.write(lay.b_read_src(i, slot), &scratch[..len]);
                scratch[..len].fill(0);
                a_mr.write(lay.a_read(i, slot), &scratch[..len]);
                (
                    SendOp::Read {
                        remote_va: b_mr.va() + lay.b_read_src(i, slot) as u64,
                        rkey: b_mr.rkey(),
                    },
                    lay.a_read(i, slot),
                )
            }
        };
        f.qa.post_send(SendWr {
            wr_id: seq,
            op: sop,
            sge: Sge {
                addr: a_mr.va() + local as u64,
                len: len as u32,
                lkey: a_mr.lkey(),
            },
            signaled: true,
            solicited: false,
        })?;
        let visible = op != Op::Read;
        if visible {
            f.next_imm = f.next_imm.wrapping_add(1);
        }
        f.inflight.push_back(Msg {
            seq,
            op,
            slot,
            len,
            seed,
            sent: true,
            received: visible,
        });
        f.slot_busy[slot] = true;
        f.next_seq += 1;
    }
}

pub(super) fn retire(f: &mut Flow, totals: &mut Totals) {
    while let Some(m) = f.inflight.front() {
        if m.sent || m.received {
            break;
        }
        let m = f.inflight.pop_front().expect("front");
        f.slot_busy[m.slot] = false;
        f.done[m.op as usize] += 1;
        f.bytes += m.len as u64;
        totals.msgs += 1;
        totals.bytes += m.len as u64;
    }
}

pub(super) fn on_send_completion(
    f: &mut Flow,
    i: usize,
    wc: &WorkCompletion,
    lay: &Layout,
    a_mr: &MemoryRegion,
    scratch: &mut [u8],
    totals: &mut Totals,
) -> Result<(), SoakError> {
    let cc = f.cc;
    let Some(m) = f.inflight.iter_mut().find(|m| m.seq == wc.wr_id && m.sent) else {
        return Err(SoakError::Unexpected {
            qp: i,
            cc,
            opcode: wc.opcode,
            wr_id: wc.wr_id,
        });
    };
    if wc.status != WcStatus::Success {
        return Err(SoakError::Status {
            qp: i,
            cc,
            what: m.op.name(),
            status: wc.status,
        });
    }
    m.sent = false;
    if m.op == Op::Read {
        let data = &mut scratch[..m.len];
        a_mr.read(lay.a_read(i, m.slot), data);
        if let Some(at) = pattern_mismatch(m.seed, data) {
            return Err(SoakError::Bytes {
                qp: i,
                cc,
                seq: m.seq,
                op: m.op.name(),
                at,
                len: m.len,
            });
        }
    }
    retire(f, totals);
    Ok(())
}

pub(super) fn on_receive(
    f: &mut Flow,
    i: usize,
    wc: &WorkCompletion,
    lay: &Layout,
    b_mr: &MemoryRegion,
    scratch: &mut [u8],
    totals: &mut Totals,
) -> Result<(), SoakError> {
    let cc = f.cc;
    if wc.status != WcStatus::Success {
        return Err(SoakError::Status {
            qp: i,
            cc,
            what: "receive",
            status: wc.status,
        });
    }
    let got = wc.imm.ok_or(SoakError::Unexpected {
        qp: i,
        cc,
        opcode: wc.opcode,
        wr_id: wc.wr_id,
    })?;
    if got != f.want_imm {
        return Err(SoakError::Order {
            qp: i,
            cc,
            got,
            want: f.want_imm,
        });
    }
    f.want_imm = f.want_imm.wrapping_add(1);
    // The oldest message still waiting for its receiver is this one.
    let m = f
        .inflight
        .iter_mut()
        .find(|m| m.received)
        .ok_or(SoakError::Order {
            qp: i,
            cc,
            got,
            want: u32::MAX,
        })?;
    m.received = false;
    let (at, expect_op) = match m.op {
        Op::WriteImm => (lay.b_write(i, m.slot), WcOpcode::RecvRdmaWithImm),
        Op::SendImm => (lay.b_recv(i, wc.wr_id as usize), WcOpcode::Recv),
        Op::Read => unreachable!("READs are not receiver-visible"),
    };
    if wc.opcode != expect_op {
        return Err(SoakError::Unexpected {
            qp: i,
            cc,
            opcode: wc.opcode,
            wr_id: wc.wr_id,
        });
    }
    if m.op == Op::SendImm && wc.byte_len as usize != m.len {
        return Err(SoakError::Length {
            qp: i,
            cc,
            seq: m.seq,
            got: wc.byte_len,
            want: m.len,
        });
    }
    let data = &mut scratch[..m.len];
    b_mr.read(at, data);
    if let Some(off) = pattern_mismatch(m.seed, data) {
        return Err(SoakError::Bytes {
            qp: i,
            cc,
            seq: m.seq,
            op: m.op.name(),
            at: off,
            len: m.len,
        });
    }
    // Every receive consumed a buffer: post it again.
    post_recv(&mut f.qb, b_mr, lay, i, wc.wr_id as usize)?;
    retire(f, totals);
    Ok(())
}
