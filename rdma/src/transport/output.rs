//! What a queue pair answers: packets to send (a header description plus a payload
//! reference the NIC attaches zero-copy), work completions, events for the congestion
//! control, and the drop/error counters (docs/design.md §3). The four roles
//! ([`super::requester`], [`super::completer`], [`super::responder`],
//! [`super::cc_ext`]) write into one [`Outputs`], as rxe's tasks share the QP's CQ.

use super::inline_deque::InlineDeque;
use super::mr::MemorySpace;
use super::sgl::{self, SglRef};
use super::wc::Sge;
use super::wc::WorkCompletion;
use crate::wire::ccext::{CcExtRepr, MAX_ECHO_HOPS};
use crate::wire::frame::{FrameBuilder, RoceRepr};
use crate::wire::int::HopRecord;
use crate::wire::ipv4::Ecn;
use crate::wire::transport_hdrs::AethSyndrome;
use crate::wire::WireError;
use std::collections::VecDeque;

/// Where a packet's payload comes from, so the NIC can attach it zero-copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// No payload.
    None,
    /// From local memory of a send WQE (already checked against `lkey` at post time).
    Local {
        /// Local key.
        lkey: u32,
        /// Virtual address.
        va: u64,
        /// Length.
        len: u32,
    },
    /// Bytes `[offset, offset + len)` of a send WQE's gather list (several
    /// SGEs, each checked at post time): the list is the QP's
    /// ([`super::Qp::gather_list`]), walked with [`super::sgl::pieces`].
    Gather {
        /// The WQE's list.
        sgl: SglRef,
        /// Offset in the message.
        offset: u32,
        /// Length.
        len: u32,
    },
    /// From responder memory for a READ response (already checked against `rkey`).
    Remote {
        /// Remote key the requester used.
        rkey: u32,
        /// Virtual address.
        va: u64,
        /// Length.
        len: u32,
    },
}

impl Payload {
    /// Payload length.
    pub fn len(&self) -> u32 {
        match *self {
            Payload::None => 0,
            Payload::Local { len, .. }
            | Payload::Remote { len, .. }
            | Payload::Gather { len, .. } => len,
        }
    }

    /// No payload bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload's bytes out of `mem` into `dst` (its length);
    /// `gather` is the list of a [`Payload::Gather`].
    fn copy_out<M: MemorySpace + ?Sized>(&self, mem: &M, gather: &[Sge], dst: &mut [u8]) {
        match *self {
            Payload::None => {}
            Payload::Local { va, .. } | Payload::Remote { va, .. } => mem.copy_out(va, dst),
            Payload::Gather { offset, len, .. } => {
                let mut at = 0;
                for p in sgl::pieces(gather, offset, len) {
                    let n = p.len as usize;
                    mem.copy_out(p.addr, &mut dst[at..at + n]);
                    at += n;
                }
            }
        }
    }
}

/// A packet to transmit, described abstractly (headers + payload reference).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPacket {
    /// BTH and extension headers.
    pub repr: RoceRepr,
    /// Payload reference.
    pub payload: Payload,
    /// IP ECN to send with: ECT(0) for data; the NIC may switch LDCP fast-start packets
    /// to Not-ECT.
    pub ecn: Ecn,
    /// ACK/NAK/CNP class: goes before data (docs/design.md §5).
    pub priority: bool,
    /// LSN of the packet's first byte (the requester or the READ-response space).
    pub lsn: u32,
    /// LSN charge of this packet (payload bytes, or [`LSN_HEADER_ONLY_CHARGE`](super::config::LSN_HEADER_ONLY_CHARGE)).
    pub lsn_len: u32,
    /// A retransmission (go-back-N, timeout or RNR).
    pub retransmit: bool,
    /// The destination of a UD packet: the address handle its work request named
    /// (the NIC builds the frame's IP and MAC from it; the BTH DestQP and the DETH
    /// are already in `repr`). `None` for every other packet: the QP's connected
    /// peer. Four bytes in what was the struct's tail padding: it adds nothing (the
    /// DETH slot of [`RoceRepr`] does: 16 bytes, a `TxPacket` went from 296 to 312).
    pub ah: Option<super::wc::AhId>,
}

impl TxPacket {
    /// An ACK/NAK-class packet: no payload, ahead of data, no LSN charge.
    pub(super) fn control(repr: RoceRepr) -> Self {
        Self {
            repr,
            payload: Payload::None,
            ecn: Ecn::Ect0,
            priority: true,
            lsn: 0,
            lsn_len: 0,
            retransmit: false,
            ah: None,
        }
    }

    /// Writes the full frame into `buf` (payload copied out of `mem` straight into the
    /// frame); returns its length. For tests and simple paths: the NIC builds headers
    /// and attaches payload zero-copy. A [`Payload::Gather`] needs its list:
    /// [`Self::build_frame_gather`].
    pub fn build_frame<M: MemorySpace + ?Sized>(
        &self,
        fb: &FrameBuilder,
        mem: &M,
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        self.build_frame_gather(fb, mem, &[], buf)
    }

    /// [`Self::build_frame`] with the gather list of a [`Payload::Gather`]
    /// (the sending QP's [`super::Qp::gather_list`]).
    pub fn build_frame_gather<M: MemorySpace + ?Sized>(
        &self,
        fb: &FrameBuilder,
        mem: &M,
        gather: &[Sge],
        buf: &mut [u8],
    ) -> Result<usize, WireError> {
        let len = self.payload.len() as usize;
        let l = fb.emit_headers(&self.repr, len, self.ecn, buf)?;
        if buf.len() < l.frame_len {
            return Err(WireError::BufferTooSmall {
                what: "RoCEv2 frame",
                need: l.frame_len,
                have: buf.len(),
            });
        }
        let mut h = fb.icrc_start(buf, &l)?;
        let payload = &mut buf[l.len..l.len + len];
        self.payload.copy_out(mem, gather, payload);
        h.update(payload);
        FrameBuilder::finish_icrc(h, &l, &mut buf[l.len + len..l.frame_len])?;
        Ok(l.frame_len)
    }
}

/// Events for the congestion control and the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// An ACK (or READ response / ATOMIC ACK) made progress or was received.
    Ack {
        /// PSN acknowledged.
        psn: u32,
        /// Requester LSN now acknowledged (cumulative).
        acked_lsn: u32,
        /// Bytes of LSN newly acknowledged by this ACK.
        newly_acked: u32,
        /// CE marks echoed (CC extension).
        ce_count: u8,
        /// Receiver window (Rx-HPCC), if carried.
        window: Option<u32>,
        /// Hop records it echoed: when not 0, [`super::Qp::poll_event`] gives
        /// them beside the event ([`EchoedHops`]).
        n_hops: u8,
    },
    /// A NAK was received.
    Nak {
        /// PSN in the NAK.
        psn: u32,
        /// Syndrome.
        syndrome: AethSyndrome,
    },
    /// The retransmit timer fired; `retries_left` after this one.
    Timeout {
        /// Oldest unacknowledged PSN.
        psn: u32,
        /// Retries left.
        retries_left: u8,
    },
    /// A request arrived CE-marked: the NIC may send a CNP (DCQCN) and the next ACK
    /// echoes it (CC extension).
    CeMarked {
        /// PSN of the marked packet.
        psn: u32,
    },
    /// A CNP arrived for this QP (DCQCN reaction point).
    CnpReceived,
    /// The requester acknowledged our READ responses (LDCP section 3.1).
    ReadRespAck {
        /// Acknowledged response LSN (cumulative).
        lsn: u32,
        /// CE marks it echoes.
        ce_count: u8,
    },
    /// A probe response arrived (HPCC++ probe mode) with the path's telemetry.
    ProbeResponse {
        /// Hop records it echoed: when not 0, [`super::Qp::poll_event`] gives
        /// them beside the event ([`EchoedHops`]).
        n_hops: u8,
    },
    /// The QP entered the error state.
    Error,
}

impl QpEvent {
    /// How many hop records the event echoed (an ACK's or a probe
    /// response's telemetry); 0 for every other event.
    pub fn n_hops(&self) -> u8 {
        match *self {
            QpEvent::Ack { n_hops, .. } | QpEvent::ProbeResponse { n_hops } => n_hops,
            _ => 0,
        }
    }
}

/// The hop records an ACK or a probe response echoed (HPCC++ 000 §6.2: the
/// sender's CC reads the path's telemetry from them), given beside its
/// [`QpEvent`]. Kept out of the event so that an event without telemetry, on
/// every ACK of a QP without INT, writes 24 bytes instead of 150: with
/// thousands of QPs each write is to a cold cache line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EchoedHops {
    n: u8,
    hops: [HopRecord; MAX_ECHO_HOPS],
}

impl EchoedHops {
    /// The first `n` of `hops` (newest first).
    pub(crate) fn new(n: u8, hops: &[HopRecord; MAX_ECHO_HOPS]) -> Self {
        Self {
            n: n.min(MAX_ECHO_HOPS as u8),
            hops: *hops,
        }
    }

    /// The hop records, newest first.
    pub fn records(&self) -> &[HopRecord] {
        &self.hops[..usize::from(self.n)]
    }
}

/// Drop and error counters (each drop reason is counted, docs/design.md §3).
///
/// Laid out in order, aligned to 32 bytes: `tx_packets` (which every visit of
/// a QP moves, on both ends) and `error_events` share a cache line, so a reader
/// that sums the error counters over thousands of QPs reads that one line of a
/// QP whose errors did not move.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[repr(C, align(32))]
pub struct QpCounters {
    /// Packets transmitted.
    pub tx_packets: u64,
    /// How many times any of the nine error and recovery counters moved:
    /// `tx_retransmits`, `rx_duplicates`, `rx_out_of_sequence`,
    /// `rx_dropped_state`, `rx_wrong_source`, `nak_seq_sent`, `rnr_nak_sent`,
    /// `nak_error_sent` and `timeouts` (their sum), or, on a UC or UD QP, one of
    /// its [`UnreliableCounters`]: unchanged, none of them did.
    pub error_events: u64,
    /// Retransmitted packets.
    pub tx_retransmits: u64,
    /// Packets received and accepted.
    pub rx_packets: u64,
    /// Duplicate requests (re-ACKed or replayed).
    pub rx_duplicates: u64,
    /// Out-of-sequence requests dropped.
    pub rx_out_of_sequence: u64,
    /// Packets for another QP or in a state that ignores them.
    pub rx_dropped_state: u64,
    /// Packets from a source IPv4 address other than the connected peer's.
    pub rx_wrong_source: u64,
    /// Malformed or unexpected responses dropped.
    pub rx_bad_response: u64,
    /// NAKs sent: PSN sequence error.
    pub nak_seq_sent: u64,
    /// RNR NAKs sent.
    pub rnr_nak_sent: u64,
    /// Remote access / invalid request NAKs sent.
    pub nak_error_sent: u64,
    /// Retransmit timeouts.
    pub timeouts: u64,
    /// Go-back-N rewinds (NAK, implied NAK, out-of-order READ response).
    pub rewinds: u64,
    /// Events dropped because the event queue was full.
    pub events_dropped: u64,
    /// Responses dropped because the response queue was full.
    pub resp_queue_full: u64,
}

/// The drop counters only UC and UD QPs move ([`super::Qp::unreliable_counters`]).
/// Kept apart from [`QpCounters`], whose two cache lines every QP's visit reads; each
/// of them also moves [`QpCounters::error_events`] (not in
/// [`QpCounters::error_sum`], which stays the sum of the nine RC counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnreliableCounters {
    /// UD packets whose DETH Q_Key is not the QP's (IBA 10.2.4.4, rxe
    /// `check_keys`).
    pub rx_qkey_mismatch: u64,
    /// UC/UD SENDs (and UC WRITEs with immediate) dropped because no receive WQE
    /// was posted (no RNR NAK on unreliable services, rxe `RESPST_ERR_RNR` class D).
    pub rx_no_recv_wqe: u64,
    /// UC packets dropped with the message they belong to (ahead of the expected
    /// PSN, opcode sequence, length, R_Key; IBA 9.8.3, rxe `drop_msg`) and UD
    /// packets longer than the path MTU.
    pub rx_msg_dropped: u64,
}

impl QpCounters {
    /// Counts one error or recovery in `field`, one of the nine that
    /// [`Self::error_events`] sums, and in `error_events`.
    #[inline]
    pub(crate) fn count_error(&mut self, field: fn(&mut QpCounters) -> &mut u64) {
        *field(self) += 1;
        self.error_events += 1;
    }

    /// The sum of the nine counters [`Self::error_events`] counts.
    pub fn error_sum(&self) -> u64 {
        self.tx_retransmits
            + self.rx_duplicates
            + self.rx_out_of_sequence
            + self.rx_dropped_state
            + self.rx_wrong_source
            + self.nak_seq_sent
            + self.rnr_nak_sent
            + self.nak_error_sent
            + self.timeouts
    }
}

/// The QP's output queues and counters, shared by its roles. Every queue is allocated
/// at creation and bounded: each WQE completes once, and the event queue drops its
/// oldest entry (counted) when the CC module does not keep up.
///
/// Laid out in order on its own cache lines, for thousands of QPs whose state is
/// cold at each visit: the counters' first 32 bytes (`tx_packets`, `rx_packets`,
/// `error_events`) on the first line, the rest of the counters on the second;
/// the event queue's first two entries, inline ([`InlineDeque`]), on the
/// third; the completion queue's first entry on the fourth; the echo queue,
/// read rarely, after them. A visit that queues an event and a completion
/// and drains them touches three lines, all of them at offsets a prefetch can
/// name ([`Outputs::HOT_LINES`]).
#[derive(Debug)]
#[repr(C, align(64))]
pub(super) struct Outputs {
    pub counters: QpCounters,
    pub events: EventQueue,
    pub cq: CompletionQueue,
    /// The hop records of the events in `events` that echoed some
    /// ([`QpEvent::n_hops`] not 0), in the same order. Only a QP with the CC
    /// extension receives any (they come in its header): without it this
    /// queue has no room, and the event queue is 24 bytes per entry instead
    /// of 152 (with thousands of QPs, gigabytes of address space).
    pub echoes: VecDeque<EchoedHops>,
    /// Drops of the unreliable services (cold: only UC and UD QPs move them).
    pub unreliable: UnreliableCounters,
}

/// A QP's event queue: its first two events inline (an ACK's, and one more).
pub(super) type EventQueue = InlineDeque<QpEvent, 2>;

/// A QP's completion queue, on its way to the CQ: its first completion inline.
pub(super) type CompletionQueue = InlineDeque<WorkCompletion, 1>;

impl Outputs {
    /// The byte offsets of the three lines a visit reads (the struct's docs):
    /// the counters' first, the event queue's inline entries and the
    /// completion queue's.
    pub(super) const HOT_LINES: [usize; 3] = [
        0,
        core::mem::offset_of!(Outputs, events) / 64 * 64,
        core::mem::offset_of!(Outputs, cq) / 64 * 64,
    ];

    /// Queues for a QP of these depths; room for echoed hop records if it
    /// negotiated the CC extension (`cc_ext`). The event queue holds at most
    /// its capacity (at least `4 * (sq_depth + rq_depth) + 64`).
    pub fn new(sq_depth: usize, rq_depth: usize, cc_ext: bool) -> Self {
        let events =
            EventQueue::with_capacity(4 * (sq_depth + rq_depth) + 64, QpEvent::CnpReceived);
        let echoes = VecDeque::with_capacity(if cc_ext { events.capacity() } else { 0 });
        Self {
            counters: QpCounters::default(),
            events,
            cq: CompletionQueue::with_capacity(sq_depth + rq_depth + 8, WorkCompletion::BLANK),
            echoes,
            unreliable: UnreliableCounters::default(),
        }
    }

    /// Counts a UC/UD drop in `field` of [`UnreliableCounters`], and in
    /// [`QpCounters::error_events`].
    #[cold]
    pub fn count_unreliable(&mut self, field: fn(&mut UnreliableCounters) -> &mut u64) {
        *field(&mut self.unreliable) += 1;
        self.counters.error_events += 1;
    }

    pub fn push_wc(&mut self, wc: WorkCompletion) {
        self.cq.push_back(wc);
    }

    /// Queues an event without telemetry (see [`Self::push_echo`]).
    pub fn push_event(&mut self, e: QpEvent) {
        debug_assert_eq!(e.n_hops(), 0, "hop records go through push_echo");
        self.make_room();
        self.events.push_back(e);
    }

    /// Queues an ACK or probe response event with the hop records its CC
    /// extension header (`ext`, if it had one) echoed: `e`'s `n_hops` becomes
    /// theirs. A QP without room for them (no CC extension negotiated, yet its
    /// peer sent one) queues the event without.
    pub fn push_echo(&mut self, mut e: QpEvent, ext: Option<&CcExtRepr>) {
        self.make_room();
        let echoed = match ext {
            Some(x) if x.n_hops > 0 => self.push_hops(x),
            _ => 0,
        };
        match &mut e {
            QpEvent::Ack { n_hops, .. } | QpEvent::ProbeResponse { n_hops } => {
                *n_hops = echoed;
            }
            _ => debug_assert!(false, "only ACKs and probe responses echo hops"),
        }
        self.events.push_back(e);
    }

    /// Queues the hop records `ext` echoed, if the echo queue has room; how
    /// many it queued. Out of line: an event without hop records (every
    /// event of a QP without the CC extension) must not read the echo
    /// queue's line, which the compiler would otherwise load ahead of the
    /// test (cold at every visit with thousands of QPs).
    #[cold]
    #[inline(never)]
    fn push_hops(&mut self, ext: &CcExtRepr) -> u8 {
        if self.echoes.len() >= self.echoes.capacity() {
            return 0;
        }
        let h = EchoedHops::new(ext.n_hops, &ext.hops);
        super::inline_deque::push_compact(&mut self.echoes, h);
        h.n
    }

    /// The next event and the hop records it echoed.
    pub fn pop_event(&mut self) -> Option<(QpEvent, Option<EchoedHops>)> {
        let e = self.events.pop_front()?;
        let hops = if e.n_hops() > 0 {
            self.echoes.pop_front()
        } else {
            None
        };
        Some((e, hops))
    }

    /// A full event queue drops its oldest event (counted), with its hops.
    fn make_room(&mut self) {
        if self.events.len() >= self.events.capacity() {
            let _ = self.pop_event();
            self.counters.events_dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::mr::VecMemory;
    use crate::wire::bth::{BthRepr, Opcode};

    fn ack(psn: u32) -> QpEvent {
        QpEvent::Ack {
            psn,
            acked_lsn: psn,
            newly_acked: 1,
            ce_count: 0,
            window: None,
            n_hops: 0,
        }
    }

    /// A CC extension header echoing `n` hop records, switch IDs from `first`.
    fn hops(first: u16, n: u8) -> CcExtRepr {
        let mut e = CcExtRepr::data(0, crate::wire::ccext::CcExtFlags::ACK);
        for (k, r) in e.hops.iter_mut().enumerate() {
            r.switch_id = first + k as u16;
        }
        e.n_hops = n;
        e
    }

    /// Each event comes back with the hop records it was queued with, also
    /// when the full queue drops its oldest events, some with hops, some
    /// without: the dropped event's records go with it.
    #[test]
    fn events_keep_their_echoed_hops_through_drops() {
        let mut out = Outputs::new(1, 1, true);
        let cap = out.events.capacity();
        let total = cap as u32 + 5;
        for p in 0..total {
            match p % 3 {
                0 => out.push_event(ack(p)),
                1 => out.push_echo(ack(p), Some(&hops(p as u16, 1 + (p % 8) as u8))),
                _ => out.push_echo(
                    QpEvent::ProbeResponse { n_hops: 0 },
                    Some(&hops(p as u16, 3)),
                ),
            }
        }
        assert_eq!(out.counters.events_dropped, 5);
        let mut p = 5;
        while let Some((e, h)) = out.pop_event() {
            match p % 3 {
                0 => assert_eq!((e, h), (ack(p), None)),
                1 => {
                    let n = 1 + (p % 8) as u8;
                    assert_eq!(e.n_hops(), n);
                    let h = h.expect("hops");
                    assert_eq!(h.records().len(), usize::from(n));
                    assert_eq!(h.records()[0].switch_id, p as u16);
                }
                _ => {
                    assert_eq!(e, QpEvent::ProbeResponse { n_hops: 3 });
                    assert_eq!(h.expect("hops").records()[2].switch_id, p as u16 + 2);
                }
            }
            p += 1;
        }
        assert_eq!(p, total);
        assert!(out.echoes.is_empty());
    }

    /// An echo of no hops queues no records, and neither does one that
    /// reaches a QP without the CC extension: it has no room for them, and
    /// its event queue never grows (no allocation after creation).
    #[test]
    fn an_echo_without_hops_or_room_is_a_plain_event() {
        for cc_ext in [true, false] {
            let mut out = Outputs::new(4, 4, cc_ext);
            let cap = (out.events.capacity(), out.echoes.capacity());
            out.push_echo(ack(1), Some(&hops(0, 0)));
            assert!(out.echoes.is_empty());
            assert_eq!(out.pop_event(), Some((ack(1), None)));
            out.push_echo(ack(2), Some(&hops(0, 3)));
            let (e, h) = out.pop_event().unwrap();
            assert_eq!(e.n_hops() > 0, cc_ext);
            assert_eq!(h.is_some(), cc_ext);
            assert_eq!((out.events.capacity(), out.echoes.capacity()), cap);
        }
    }

    /// What a visit reads lies on the lines `HOT_LINES` names: the hot
    /// counters on the first, each queue's inline entries on one line of
    /// their own.
    #[test]
    fn the_inline_entries_lie_on_the_hot_lines() {
        use core::mem::offset_of;
        let line = |at: usize| at / 64;
        assert!(offset_of!(QpCounters, error_events) < 64);
        assert_eq!(Outputs::HOT_LINES[0], 0);
        for (at, hot) in [
            (offset_of!(Outputs, events), EventQueue::HOT_BYTES),
            (offset_of!(Outputs, cq), CompletionQueue::HOT_BYTES),
        ] {
            assert!(Outputs::HOT_LINES.contains(&(line(at) * 64)));
            assert_eq!(
                line(at),
                line(at + hot - 1),
                "a queue's hot bytes on one line"
            );
        }
        assert_ne!(line(Outputs::HOT_LINES[1]), line(Outputs::HOT_LINES[2]));
    }

    /// An event and a completion per visit, drained each time, stay in the
    /// inline slots: the heap buffers are never written.
    #[test]
    fn one_event_and_one_completion_stay_inline() {
        let mut out = Outputs::new(4, 4, false);
        for p in 0..100 {
            out.push_echo(ack(p), None);
            out.push_wc(WorkCompletion {
                wr_id: u64::from(p),
                ..WorkCompletion::BLANK
            });
            assert!(!out.events.spilled() && !out.cq.spilled());
            assert_eq!(out.pop_event(), Some((ack(p), None)));
            assert_eq!(out.cq.pop_front().map(|w| w.wr_id), Some(u64::from(p)));
            assert!(out.events.is_empty() && out.cq.is_empty());
        }
    }

    #[test]
    fn build_frame_copies_the_payload_out_into_the_frame() {
        let fb = crate::wire::frame::tests::builder(None);
        let mut mem = VecMemory::new(0x1000, 64);
        let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
        mem.write(0x1000, &bytes);
        for len in 0..10u32 {
            let p = TxPacket {
                repr: RoceRepr::new(BthRepr::new(Opcode::SendOnly, 5, 9)),
                payload: if len == 0 {
                    Payload::None
                } else {
                    Payload::Local {
                        lkey: 1,
                        va: 0x1003,
                        len,
                    }
                },
                ecn: Ecn::Ect0,
                priority: false,
                lsn: 0,
                lsn_len: len,
                retransmit: false,
                ah: None,
            };
            let (mut got, mut want) = ([0xEEu8; 128], [0u8; 128]);
            let n = p.build_frame(&fb, &mem, &mut got).unwrap();
            let m = fb
                .emit_frame(&p.repr, &bytes[3..3 + len as usize], p.ecn, &mut want)
                .unwrap();
            assert_eq!(&got[..n], &want[..m], "payload of {len} bytes");
            let short = p.build_frame(&fb, &mem, &mut got[..n - 1]);
            assert!(matches!(short, Err(WireError::BufferTooSmall { .. })));
        }
    }
}
