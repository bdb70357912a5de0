//! The RX pipeline: a burst from the port, each frame checked (ICRC at raw
//! CRC speed when there is no INT container, otherwise by the parser),
//! parsed in place (a chained frame without copying its payload), counted
//! and handed to its QP's transport and to the receiver side of its CC.

use rdma::wire::transport_hdrs::AethSyndrome;
use rdma::wire::{Ecn, Opcode, ParseOptions, RoceFrame, WireError};

use super::{Engine, RawMemory, MAX_QPS};
use crate::control::is_rocev2;
use crate::io::parse_rx;
use crate::shard::dest_qpn;

/// Capture interface id of received frames (`tx.rs` has the sent ones).
pub(super) const CAPTURE_RX: u32 = 0;
/// How many frames ahead of the one being handled the RX path prefetches
/// the state of the QP a frame is for: a frame takes 100-300 ns to handle,
/// a line from memory about 100 (docs/benchmarks.md, QP scale).
const RX_PREFETCH_AHEAD: usize = 4;
/// What the RX path prefetches of a frame ahead of handling it.
#[derive(Clone, Copy)]
enum RxPrefetch {
    /// The first mbuf's metadata (its two lines).
    Meta,
    /// The headers (first line of the first segment's data).
    Headers,
    /// The headers and the payload segment's metadata.
    HeadersAndPayloadMeta,
    /// The trailer's metadata.
    TrailerMeta,
    /// The trailer's bytes (the ICRC).
    Trailer,
}

/// Where the frames were written on this core (a TAP's or a NIC's driver
/// fills the mbufs as it receives; both ends of a ring pair on one thread):
/// each frame's headers, [`RX_PREFETCH_AHEAD`] frames before the QP's state,
/// so that reading the QPN there ([`Engine::prefetch_dest_qp`]) finds the
/// line in the cache, as DPDK's l3fwd prefetches packet data a stage ahead
/// of its lookup.
const RX_LOCAL: [(usize, RxPrefetch); 1] = [(2 * RX_PREFETCH_AHEAD, RxPrefetch::Headers)];
/// Where another core wrote them (`Engine::rx_cross_core`): a chained frame
/// (headers, attached payload, ICRC trailer) is then a dependent load per
/// segment, each a line that core holds, so the chain comes in in stages,
/// a segment deeper each, every stage reading only lines the one before
/// brought in (frames ahead, what). They are what one QP with an engine
/// per side needs (docs/benchmarks.md, "One QP on machine C"); with both
/// engines on one core and 16k QPs the same stages cost more than they
/// save, hence the two lists.
const RX_CROSS_CORE: [(usize, RxPrefetch); 4] = [
    (16, RxPrefetch::Meta),
    (12, RxPrefetch::HeadersAndPayloadMeta),
    (8, RxPrefetch::TrailerMeta),
    (6, RxPrefetch::Trailer),
];

impl RxPrefetch {
    /// Issues this prefetch for frame `m`.
    #[inline]
    fn run(self, m: &dpdk::Mbuf) {
        match self {
            RxPrefetch::Meta => m.prefetch_segment_meta(0),
            RxPrefetch::Headers => m.prefetch_segment_data(0),
            RxPrefetch::HeadersAndPayloadMeta => {
                m.prefetch_segment_data(0);
                m.prefetch_segment_meta(1);
            }
            RxPrefetch::TrailerMeta => m.prefetch_segment_meta(2),
            RxPrefetch::Trailer => m.prefetch_segment_data(2),
        }
    }
}

impl Engine {
    /// Receives a burst and hands every frame, verified, to its QP (frames
    /// that are not RoCEv2 or fail a check are counted and dropped).
    pub(super) fn receive(&mut self, now: u64) {
        // Looped-back frames first (tx.rs `loop_back`); a shard with its own
        // queue steers those of other shards' QPs as it steers the port's.
        let looped = self.lo.move_front_into(&mut self.rxb);
        if self.io.recv(&mut self.rxb, &mut self.counters) == 0 && looped == 0 {
            return;
        }
        // Receives posted before the frames that need them were sent must be
        // seen by those frames (UC and UD drop a message that finds no
        // receive WQE; RC would answer RNR): the doorbells rung since this
        // turn's step 1 are taken now, after the burst arrived.
        self.doorbells();
        let mut burst = std::mem::take(&mut self.rxb);
        let mut scratch = std::mem::take(&mut self.scratch);
        let stages: &[(usize, RxPrefetch)] = if self.rx_cross_core {
            &RX_CROSS_CORE
        } else {
            &RX_LOCAL
        };
        for &(ahead, what) in stages {
            for m in burst.as_slice().iter().take(ahead) {
                what.run(m);
            }
        }
        for m in burst.as_slice().iter().take(RX_PREFETCH_AHEAD) {
            self.prefetch_dest_qp(m.data());
        }
        for k in 0..burst.len() {
            for &(ahead, what) in stages {
                if let Some(a) = burst.as_slice().get(k + ahead) {
                    what.run(a);
                }
            }
            if let Some(a) = burst.as_slice().get(k + RX_PREFETCH_AHEAD) {
                self.prefetch_dest_qp(a.data());
            }
            let m = &mut burst.as_mut_slice()[k];
            self.counters.rx_packets += 1;
            let len = m.pkt_len();
            self.counters.rx_bytes += len as u64;
            if m.nb_segs() > 1
                && self.capture.is_none()
                && self.receive_chained(m, &mut scratch, now)
            {
                continue;
            }
            // The frame, contiguous and writable: the mbuf's own data, or a
            // copy of a chained frame in `scratch`.
            let bytes: &mut [u8] = if m.nb_segs() == 1 {
                m.data_mut()
            } else if len <= scratch.len() && m.read(0, &mut scratch[..len]).is_ok() {
                &mut scratch[..len]
            } else {
                self.counters.rx_drop_too_long += 1;
                continue;
            };
            if !is_rocev2(bytes) {
                self.control_frame(bytes, now);
                continue;
            }
            if let Some(cap) = self.capture.as_mut() {
                cap.capture(CAPTURE_RX, now, bytes);
            }
            match self.check_icrc(bytes) {
                Ok(verified) => self.dispatch(bytes, verified, now),
                Err(e) => self.count_rx_error(&e),
            }
        }
        // Every frame was copied out or dropped: one bulk free for the burst.
        burst.clear();
        self.scratch = scratch;
        self.rxb = burst;
    }

    /// Prefetches the state of the QP frame `f` is for (read as steering
    /// reads it, [`dest_qpn`]), unless that QP's was the last prefetched (a
    /// message's frames come in a row). Only a hint: a frame this cannot
    /// read is checked as usual when its turn comes.
    #[inline]
    fn prefetch_dest_qp(&mut self, f: &[u8]) {
        let Some(qpn) = dest_qpn(f, self.int_dscp) else {
            return;
        };
        if qpn == self.rx_prefetched_qpn {
            return;
        }
        self.rx_prefetched_qpn = qpn;
        if let Some(Some(s)) = qpn
            .checked_sub(self.qpn_base)
            .and_then(|i| self.qps.get(i as usize))
        {
            s.prefetch();
        }
    }

    /// Checks the ICRC of a RoCEv2 frame ([`is_rocev2`]) in place, at raw
    /// CRC speed, when it has no INT container (`Ok(true)`); a frame with a
    /// container is left to the parser (`Ok(false)`), which skips it.
    fn check_icrc(&self, f: &mut [u8]) -> Result<bool, WireError> {
        const L3: usize = rdma::wire::ethernet::HEADER_LEN;
        if Some(f[L3 + 1] >> 2) == self.parse.int_dscp {
            return Ok(false);
        }
        rdma::wire::verify_icrc_in_place(f, L3, 0)?;
        Ok(true)
    }

    fn count_rx_error(&mut self, e: &WireError) {
        match e {
            WireError::BadIcrc { .. } => self.counters.rx_drop_icrc += 1,
            WireError::UnsupportedEtherType(_)
            | WireError::NotUdp(_)
            | WireError::NotRoce(_)
            | WireError::IpFragment => self.counters.rx_drop_not_roce += 1,
            _ => self.counters.rx_drop_malformed += 1,
        }
    }

    fn dispatch(&mut self, bytes: &[u8], icrc_checked: bool, now: u64) {
        // Looked at where the parser put it (a `RoceFrame` is ~360 bytes: a
        // move out of the `Result` was a copy per frame).
        match &self.parse_frame(bytes, !icrc_checked) {
            Ok(f) => self.deliver(f, now),
            Err(e) => self.count_rx_error(e),
        }
    }

    /// Parses a contiguous frame (the CC extension where the QP negotiated
    /// it), verifying its ICRC if `verify_icrc`.
    fn parse_frame<'b>(
        &self,
        bytes: &'b [u8],
        verify_icrc: bool,
    ) -> Result<RoceFrame<'b>, WireError> {
        let qps = &self.qps;
        let opts = ParseOptions {
            verify_icrc,
            ..self.parse
        };
        parse_rx(bytes, &opts, |bth| {
            bth.dest_qp
                .checked_sub(self.qpn_base)
                .and_then(|i| qps.get(i as usize))
                .and_then(Option::as_ref)
                .is_some_and(|s| s.core.cc_ext)
        })
    }

    /// A frame chained as the sender built it (or as a NIC scatters it):
    /// every header in the first segment, then the payload, then the pad
    /// and ICRC, in at most two more segments. Parsed without copying the
    /// payload: the headers and the last bytes go to `scratch` where the
    /// parser reads them, the ICRC is computed over the segments, and the
    /// QP copies the payload straight from its segment into the region.
    /// `false`: not of that shape (the caller linearises it).
    fn receive_chained(&mut self, m: &dpdk::Mbuf, scratch: &mut [u8], now: u64) -> bool {
        let mut segs = m.segments();
        let (Some(head), Some(body)) = (segs.next(), segs.next()) else {
            return false;
        };
        if !is_rocev2(head) {
            return false;
        }
        let tail = segs.next().unwrap_or(&[]);
        let (h, b) = (head.len(), body.len());
        let total = h + b + tail.len();
        if segs.next().is_some() || total > scratch.len() || b < 8 || tail.len() > 7 {
            return false;
        }
        scratch[..h].copy_from_slice(head);
        scratch[h + b - 8..h + b].copy_from_slice(&body[b - 8..]);
        scratch[h + b..total].copy_from_slice(tail);
        let mut parsed = self.parse_frame(&scratch[..total], false);
        let f = match parsed.as_mut() {
            Ok(f) => f,
            Err(e) => {
                self.count_rx_error(e);
                return true;
            }
        };
        let n = f.payload.len();
        if f.payload_offset != h || n > b {
            return false;
        }
        // ICRC: masked headers (INT container skipped), then every byte up
        // to the ICRC (payload, pad), from the segments.
        let Ok(mut icrc) = rdma::wire::icrc::IcrcHasher::start_headers(
            head,
            rdma::wire::ethernet::HEADER_LEN,
            f.int_len,
        ) else {
            self.counters.rx_drop_malformed += 1;
            return true;
        };
        let upto = total - 4 - h;
        icrc.update(&body[..upto.min(b)]);
        if upto > b {
            icrc.update(&tail[..upto - b]);
        }
        let computed = icrc.finalize();
        if computed != f.icrc {
            self.count_rx_error(&WireError::BadIcrc {
                found: f.icrc,
                computed,
            });
            return true;
        }
        f.payload = &body[..n];
        self.deliver(f, now);
        true
    }

    /// Hands a parsed, verified frame to its QP (and the receiver side of
    /// its CC), counting it.
    fn deliver(&mut self, f: &RoceFrame<'_>, now: u64) {
        if f.bth.dest_qp == rdma::wire::mad::GSI_QPN {
            self.gsi_frame(f, now);
            return;
        }
        let Some(i) = f
            .bth
            .dest_qp
            .checked_sub(self.qpn_base)
            .map(|i| i as usize)
            .filter(|&i| i < MAX_QPS)
        else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        let Some(s) = self.qps[i].as_mut() else {
            self.counters.rx_drop_unknown_qp += 1;
            return;
        };
        if s.core.qp.is_none() {
            self.counters.rx_drop_qp_state += 1;
            return;
        }
        let op = f.bth.opcode;
        let ce = f.ip.ecn == Ecn::Ce;
        match op {
            Opcode::Acknowledge => match f.aeth.map(|a| a.syndrome) {
                Some(AethSyndrome::Ack { .. }) => self.counters.rx_acks += 1,
                _ => self.counters.rx_naks += 1,
            },
            Opcode::Cnp => self.counters.rx_cnps += 1,
            _ => {
                self.counters.rx_data_packets += 1;
                if ce {
                    self.counters.rx_ce_marked += 1;
                }
            }
        }
        // Receiver side of the CC (DCQCN notification point, Rx-HPCC
        // NewINT), then the transport.
        match s.opts.srq {
            None => s.core.receive(
                f,
                now,
                &mut self.mrs,
                &mut RawMemory {
                    regions: &self.mr_mem,
                },
            ),
            Some(k) => {
                let srq = self.srqs.get_mut(k as usize).and_then(Option::as_mut);
                let srq = srq.map(|q| &mut q.srq);
                let limit = s.core.receive_srq(
                    f,
                    now,
                    &mut self.mrs,
                    &mut RawMemory {
                        regions: &self.mr_mem,
                    },
                    srq,
                );
                if limit {
                    self.life.queue(
                        crate::contract::AsyncEvent::SrqLimitReached { srq: k },
                        &mut self.counters,
                    );
                }
            }
        }
        self.after_qp_work(i, now);
    }
}
