//! Go-back-N against selective repeat on a lossy link (issue 43): one QP pair
//! between two NICs joined through the impairment stage ([`crate::chaos::ImpairedLink`]),
//! `window` WRITEs or READs of one size kept in flight, and what it cost. What
//! `roce-lossy` prints and `tests/lossy_modes.rs` checks.

use std::time::{Duration, Instant};

use crate::chaos::{pattern_fill, pattern_mismatch, ImpairedLink};
use dpdk::Eal;
use impair::Impairment;
use nic::verbs::{DeviceConfig, QpOptions};
use rdma::transport::{Access, LossRecovery, SendOp, SendWr, Sge, WcStatus};

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE from A to B.
    Write,
    /// RDMA READ by A of B's memory.
    Read,
}

/// One measurement's settings.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The operation.
    pub op: Op,
    /// Message size, bytes.
    pub size: usize,
    /// Drop probability per frame, each direction.
    pub loss: f64,
    /// Frames each drop takes in a row.
    pub burst: u32,
    /// Loss recovery of both QPs.
    pub mode: LossRecovery,
    /// Messages in flight.
    pub window: usize,
    /// Path MTU.
    pub mtu: u32,
    /// The QPs' IBA retransmit timeout, ns.
    pub timeout_ns: u64,
    /// Seed of the stage.
    pub seed: u64,
    /// How long to keep posting.
    pub secs: f64,
    /// Stop posting after this many messages too.
    pub max_msgs: u64,
}

/// What one measurement saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    /// Messages completed.
    pub msgs: u64,
    /// Bytes they carried.
    pub bytes: u64,
    /// Seconds from the first post to the last completion.
    pub secs: f64,
    /// Frames the stage dropped (data, requests, ACKs; both directions).
    pub lost: u64,
    /// Payload packets sent beyond the minimum: a WRITE packet or a READ
    /// response sent again (from the NICs' `tx_data_packets`).
    pub resent: u64,
    /// READ requests beyond one per READ (a request again, a re-request of a
    /// missing run).
    pub rereq: u64,
    /// IBA retransmit timeouts, both NICs.
    pub timeouts: u64,
}

impl Measured {
    /// Goodput in MiB/s.
    pub fn mib_s(&self) -> f64 {
        self.bytes as f64 / self.secs.max(1e-9) / (1 << 20) as f64
    }
}

/// Runs `c` on a fresh link named `name` (each link needs its own) and checks every
/// slot's last message byte for byte.
pub fn measure(
    eal: &'static Eal,
    name: &str,
    c: &Case,
) -> Result<Measured, Box<dyn std::error::Error>> {
    let Case {
        op,
        size,
        loss,
        mode,
        ..
    } = *c;
    let imp = Impairment {
        drop: loss,
        duplicate: 0.0,
        reorder: 0.0,
        corrupt: 0.0,
        seed: c.seed,
    };
    let mut ca = DeviceConfig::new([10, 0, 0, 1]);
    let mut cb = DeviceConfig::new([10, 0, 0, 2]);
    ca.idle_yield = true;
    cb.idle_yield = true;
    let link = ImpairedLink::open_bursty(eal, name, imp, c.burst, ca, cb)?;
    let w = c.window;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let a_mr = link.a().reg_mr(w * size, access)?;
    let b_mr = link.b().reg_mr(w * size, access)?;
    // The source of every message is one pattern per slot.
    let mut buf = vec![0u8; size];
    for k in 0..w {
        pattern_fill(k as u64 + 1, &mut buf);
        match op {
            Op::Write => a_mr.write(k * size, &buf),
            Op::Read => b_mr.write(k * size, &buf),
        }
    }
    let mut cq = link.a().create_cq(4 * w + 64)?;
    let bcq = link.b().create_cq(64)?;
    let opts = QpOptions {
        mtu: c.mtu,
        sq_depth: (2 * w).max(16) as u16,
        rq_depth: 16,
        timeout_ns: c.timeout_ns,
        loss_recovery: mode,
        ..QpOptions::default()
    };
    let mut qa = link.a().create_qp(&cq, &cq, opts)?;
    let mut qb = link.b().create_qp(&bcq, &bcq, opts)?;
    // Both rsnic QPs of this process, configured alike.
    qa.set_peer_loss_recovery(mode);
    qb.set_peer_loss_recovery(mode);
    qa.connect(&qb.remote_info())?;
    qb.connect(&qa.remote_info())?;
    let post = |qa: &mut nic::verbs::QueuePair, k: usize| {
        let sop = match op {
            Op::Write => SendOp::Write {
                remote_va: b_mr.va() + (k * size) as u64,
                rkey: b_mr.rkey(),
            },
            Op::Read => SendOp::Read {
                remote_va: b_mr.va() + (k * size) as u64,
                rkey: b_mr.rkey(),
            },
        };
        qa.post_send(SendWr {
            wr_id: k as u64,
            op: sop,
            sge: Sge {
                addr: a_mr.va() + (k * size) as u64,
                len: size as u32,
                lkey: a_mr.lkey(),
            },
            signaled: true,
            solicited: false,
        })
    };
    let (a0, b0) = (link.a().counters(), link.b().counters());
    let d0 = link
        .counters
        .dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(c.secs);
    let max_msgs = c.max_msgs;
    for k in 0..w {
        post(&mut qa, k)?;
    }
    let (mut msgs, mut inflight) = (0u64, w);
    while inflight > 0 {
        let Some(c) = cq.wait(Duration::from_secs(30)) else {
            return Err(format!("{mode} {op:?} {size} B at {loss}: no completion in 30 s").into());
        };
        if c.status != WcStatus::Success {
            return Err(format!("{mode} {op:?}: completion {:?}", c.status).into());
        }
        msgs += 1;
        inflight -= 1;
        if Instant::now() < until && msgs + (inflight as u64) < max_msgs {
            post(&mut qa, c.wr_id as usize)?;
            inflight += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // The engines publish their counters every millisecond.
    std::thread::sleep(Duration::from_millis(20));
    let (a1, b1) = (link.a().counters(), link.b().counters());
    let lost = link
        .counters
        .dropped
        .load(std::sync::atomic::Ordering::Relaxed)
        - d0;
    let pkts = size.div_ceil(c.mtu as usize) as u64;
    let (a_sent, b_sent) = (
        a1.tx_data_packets - a0.tx_data_packets,
        b1.tx_data_packets - b0.tx_data_packets,
    );
    // Payload packets beyond the minimum (a WRITE packet, a READ response sent
    // again), and READ requests beyond one per READ (re-requests).
    let (resent, rereq) = match op {
        Op::Write => (a_sent.saturating_sub(msgs * pkts), 0),
        Op::Read => (
            b_sent.saturating_sub(msgs * pkts),
            a_sent.saturating_sub(msgs),
        ),
    };
    // Every slot's last message landed whole.
    for k in 0..w {
        match op {
            Op::Write => b_mr.read(k * size, &mut buf),
            Op::Read => a_mr.read(k * size, &mut buf),
        }
        if let Some(at) = pattern_mismatch(k as u64 + 1, &buf) {
            return Err(format!("{mode} {op:?}: slot {k} differs at byte {at}").into());
        }
    }
    let timeouts = (a1.timeouts - a0.timeouts) + (b1.timeouts - b0.timeouts);
    drop((qa, qb, cq, bcq, a_mr, b_mr));
    link.close();
    Ok(Measured {
        msgs,
        bytes: msgs * size as u64,
        secs,
        lost,
        resent,
        rereq,
        timeouts,
    })
}
