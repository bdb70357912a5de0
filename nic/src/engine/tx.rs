//! The TX pipeline: the flow scheduler picks what goes next (control
//! packets first, then round robin over the QPs with data, paced by credit),
//! the QP's transport gives the packet (gated by its CC window in LSN
//! bytes), and the frame is built into an mbuf (through the QP's header
//! template) and sent in bursts.

use dpdk::Burst;
use qpcore::FrameSink;
use rdma::transport::qp::Payload as QpPayload;
use rdma::transport::sgl::{self, MAX_SGE};
use rdma::transport::{Sge, TxPacket};
use rdma::wire::frame::FrameBuilder;
use rdma::wire::transport_hdrs::AethSyndrome;
use rdma::wire::{EthernetAddress, HeaderTemplate, Ipv4Address, Opcode};

use super::qp_work::timer_key;
use super::{Engine, PacketIo, CAPTURE_SNAP};
use crate::counters::Counters;
use crate::io::{build_frame, build_frame_tpl, ExtPart, Payload, TxPools};
use crate::port_shaper::PortShaper;
use crate::scheduler::Decision;
use crate::sys::MrMem;
use rdma::transport::Service;

/// Ethernet preamble, inter-frame gap and FCS: what the wire adds to a frame.
const WIRE_OVERHEAD: u64 = 24;
/// Capture interface id of sent frames (`rx.rs` has the received ones).
pub(super) const CAPTURE_TX: u32 = 1;

impl Engine {
    /// Fills a TX burst as the flow scheduler decides: control packets
    /// (ACK/NAK/CNP, probe responses) first, then round robin over QPs with
    /// data, each charged its packet against its pacing credit; the QP's
    /// transport applies the CC window in LSN bytes; the port's shaper
    /// stops the burst at the line rate (crate::port_shaper). Amortised O(1) per
    /// packet whatever the number of QPs (crate::scheduler).
    pub(super) fn transmit(&mut self, now: u64) {
        // What the port did not take last time goes first.
        if !self.txb.is_empty() {
            self.loop_back();
            self.io.send(&mut self.txb);
            if !self.txb.is_empty() {
                return;
            }
        }
        while !self.txb.is_full() && self.shaper.may_send(now) {
            match self.sched.next(now) {
                Decision::Idle { .. } => break,
                Decision::Control(q) => self.send_control(q as usize, now),
                Decision::Qp { qp, .. } => self.send_data(qp as usize, now),
            }
        }
        if let Some(cap) = self.capture.as_mut() {
            let mut head = [0u8; CAPTURE_SNAP];
            for m in self.txb.as_slice() {
                let n = m.pkt_len().min(CAPTURE_SNAP);
                if m.read(0, &mut head[..n]).is_ok() {
                    cap.capture_head(CAPTURE_TX, now, &head[..n], m.pkt_len());
                }
            }
        }
        if !self.txb.is_empty() {
            self.loop_back();
            self.io.send(&mut self.txb);
        }
    }

    /// Moves the frames of the TX burst addressed to the port's own MAC and IP to
    /// the loopback queue, which the receive path takes first (rx.rs): two
    /// QPs of one port talk inside the NIC, with the same ICRC, CC and
    /// counters as over the wire, and nothing reaches the wire (as a
    /// hardware RoCE NIC and Linux rxe loop such traffic back). A shard
    /// behind a dispatcher leaves it to the dispatcher, which knows which
    /// shard owns the destination QP (crate::shard). A full queue drops
    /// (counted), as a NIC's full RX queue does.
    #[inline]
    fn loop_back(&mut self) {
        let (mac, ip) = (self.mac, self.ip);
        let to_self = |m: &dpdk::Mbuf| crate::io::is_for_self(m.data(), &mac, &ip);
        if matches!(self.io, PacketIo::Shard { .. }) || !self.txb.as_slice().iter().any(to_self) {
            return;
        }
        let mut wire = Burst::new();
        for m in self.txb.drain() {
            if !to_self(&m) {
                // `wire` has the room of the burst it came from.
                let _ = wire.push(m);
            } else if self.lo.push(m).is_ok() {
                self.counters.tx_loopback += 1;
            } else {
                self.counters.rx_drop_loopback_full += 1;
            }
        }
        self.txb = wire;
    }

    /// One control packet of QP `i` (`QpCore::send_control`): a CNP it
    /// owes, else its transport's next ACK/NAK or probe response. Not charged
    /// to the QP's credit.
    fn send_control(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            self.life.clear_ctrl_orphan(i);
            return;
        };
        let mut out = MbufSink {
            tpl: s.tpl.as_ref(),
            ahs: &self.ahs,
            mr_mem: &self.mr_mem,
            pools: &mut self.pools,
            txb: &mut self.txb,
            shaper: &mut self.shaper,
            counters: &mut self.counters,
        };
        s.core
            .send_control(&mut self.sched, i as u32, now, &mut out);
        super::poll::sync_counters(s, &mut self.qp_sums);
    }

    /// The next packet of QP `i`'s transport (`QpCore::send_data`: data, a
    /// READ request, a probe, or an ACK that was due), with the CC told of
    /// data sent; a QP with nothing sendable leaves the round robin.
    fn send_data(&mut self, i: usize, now: u64) {
        let Some(s) = self.qps[i].as_deref_mut() else {
            let _ = self.sched.mark_idle(i as u32);
            return;
        };
        let mut out = MbufSink {
            tpl: s.tpl.as_ref(),
            ahs: &self.ahs,
            mr_mem: &self.mr_mem,
            pools: &mut self.pools,
            txb: &mut self.txb,
            shaper: &mut self.shaper,
            counters: &mut self.counters,
        };
        s.core.send_data(
            &mut self.sched,
            &mut self.wheel,
            timer_key(i),
            now,
            &mut out,
        );
        super::poll::sync_counters(s, &mut self.qp_sums);
        // UC and UD sends complete when their last packet leaves (no
        // acknowledgement will come to move the completion). An RC QP's
        // completions move on the receive path, and its place in the round
        // robin is send_data's alone.
        if s.opts.service != Service::Rc
            && s.core
                .qp
                .as_ref()
                .is_some_and(|q| q.pending_completions() > 0)
        {
            self.deliver_completions(i);
        }
    }
}

/// Where the engine's frames go: an mbuf (through the QP's header template
/// when the packet uses the QP's own headers) in the TX burst, charged to the
/// port's shaper and counted.
struct MbufSink<'a> {
    tpl: Option<&'a HeaderTemplate>,
    /// The device's address handles: where a UD datagram goes.
    ahs: &'a [Option<super::AhRoute>],
    mr_mem: &'a [Option<MrMem>],
    pools: &'a mut TxPools,
    txb: &'a mut Burst,
    shaper: &'a mut PortShaper,
    counters: &'a mut Counters,
}

impl FrameSink for MbufSink<'_> {
    /// Builds `pkt` into an mbuf, counts it and puts it in the TX burst: its
    /// wire bytes, or `None` if it could not be built (counted). A gathered
    /// payload is attached window by window (zero-copy), as one SGE's is.
    fn emit(&mut self, fb: &FrameBuilder, pkt: &TxPacket, gather: &[Sge]) -> Option<u32> {
        if pkt.repr.bth.opcode == Opcode::Cnp {
            self.counters.tx_cnps += 1;
        }
        // A UD datagram goes where its address handle says (the QP's own
        // headers name no peer).
        let routed;
        let fb = match pkt.ah {
            None => fb,
            Some(ah) => {
                let Some(r) = self.ahs.get(ah.0.get() as usize - 1).copied().flatten() else {
                    self.counters.tx_drop_no_ah += 1;
                    return None;
                };
                let mut f = *fb;
                f.net.dst_mac = EthernetAddress(r.mac);
                f.net.dst_ip = Ipv4Address(r.ip);
                routed = f;
                &routed
            }
        };
        let payload = match pkt.payload {
            QpPayload::None => Payload::None,
            QpPayload::Local { lkey: key, va, len } | QpPayload::Remote { rkey: key, va, len } => {
                match window(self.mr_mem, key, va, len) {
                    Some(part) => Payload::Ext {
                        mem: part.mem,
                        offset: part.offset,
                        len: part.len,
                    },
                    None => {
                        // Deregistered while in flight: not sendable.
                        self.counters.tx_drop_no_mbuf += 1;
                        return None;
                    }
                }
            }
            QpPayload::Gather { offset, len, .. } => {
                let Some((parts, n)) = gather_windows(self.mr_mem, gather, offset, len) else {
                    // A region deregistered while in flight: not sendable.
                    self.counters.tx_drop_no_mbuf += 1;
                    return None;
                };
                let payload = Payload::Gather {
                    parts: &parts[..n],
                    len: len as usize,
                };
                return self.emit_built(fb, pkt, payload);
            }
        };
        self.emit_built(fb, pkt, payload)
    }
}

/// The window `[va, va + len)` of the registered memory of `key` (an lkey or
/// rkey: both name the region's slot in `mr_mem`), `None` if the region is
/// gone (deregistered while a packet from it was in flight).
#[inline]
fn window(mr_mem: &[Option<MrMem>], key: u32, va: u64, len: u32) -> Option<ExtPart<'_>> {
    let (r, offset) = MrMem::find(mr_mem, key, va, len as usize)?;
    Some(ExtPart {
        mem: &r.mem,
        offset,
        len: len as usize,
    })
}

/// The windows of bytes `[offset, offset + len)` of a gather list's message
/// (one per SGE they lie in, at most [`MAX_SGE`]) and how many there are;
/// `None` if a region is gone or the list is shorter than the range.
#[inline]
fn gather_windows<'a>(
    mr_mem: &'a [Option<MrMem>],
    gather: &[Sge],
    offset: u32,
    len: u32,
) -> Option<([ExtPart<'a>; MAX_SGE], usize)> {
    let mut pieces = sgl::pieces(gather, offset, len);
    let first = pieces.next()?;
    let first = window(mr_mem, first.lkey, first.addr, first.len)?;
    // The first window fills the slots left unused.
    let (mut parts, mut n, mut total) = ([first; MAX_SGE], 1, first.len);
    for p in pieces {
        *parts.get_mut(n)? = window(mr_mem, p.lkey, p.addr, p.len)?;
        n += 1;
        total += p.len as usize;
    }
    (total == len as usize).then_some((parts, n))
}

impl MbufSink<'_> {
    /// Builds `pkt` with `payload` into an mbuf, counts it and puts it in
    /// the TX burst (see [`FrameSink::emit`]).
    fn emit_built(
        &mut self,
        fb: &FrameBuilder,
        pkt: &TxPacket,
        payload: Payload<'_>,
    ) -> Option<u32> {
        // The QP's template when the packet uses the QP's own headers (a probe
        // adds INT, a CNP or ACK may drop it: those take the general path);
        // same bytes either way.
        let built = match self.tpl {
            Some(t) if t.frame_builder() == fb => {
                build_frame_tpl(t, &pkt.repr, pkt.ecn, payload, self.pools)
            }
            _ => build_frame(fb, &pkt.repr, pkt.ecn, payload, self.pools),
        };
        match built {
            Ok(m) => {
                let bytes = m.pkt_len() as u64;
                self.shaper.charge(bytes + WIRE_OVERHEAD);
                self.counters.tx_packets += 1;
                self.counters.tx_bytes += bytes;
                match pkt.repr.bth.opcode {
                    Opcode::Acknowledge => match pkt.repr.aeth.map(|a| a.syndrome) {
                        Some(AethSyndrome::Ack { .. }) => self.counters.tx_acks += 1,
                        _ => self.counters.tx_naks += 1,
                    },
                    Opcode::Cnp => {}
                    _ => self.counters.tx_data_packets += 1,
                }
                let _ = self.txb.push(m);
                Some((bytes + WIRE_OVERHEAD) as u32)
            }
            Err(_) => {
                self.counters.tx_drop_no_mbuf += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WIRE_OVERHEAD;
    use rdma::wire::ccext::{CcExtFlags, CcExtRepr};
    use rdma::wire::frame::RoceRepr;
    use rdma::wire::transport_hdrs::{ImmDtRepr, RethRepr};
    use rdma::wire::{BthRepr, Ecn, Opcode};
    use sched::scheduler::MAX_FRAME_CHARGE_OVER_PAYLOAD;

    /// The scheduler's quantum holds a 64 KiB message because no data frame
    /// of a QP without CC is charged more than its payload plus
    /// `MAX_FRAME_CHARGE_OVER_PAYLOAD`: checked on the largest, an RDMA WRITE
    /// Only with immediate (RETH and ImmDt) and the CC extension header.
    #[test]
    fn a_data_frame_is_charged_at_most_its_payload_and_the_bound() {
        let fb = crate::io::test_frame_builder(None);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnlyImm, 0x11, 7));
        r.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x100,
            dma_len: 1024,
        });
        r.immdt = Some(ImmDtRepr(9));
        r.ccext = Some(CcExtRepr::data(0, CcExtFlags::empty()));
        let payload = vec![0u8; 1024];
        let mut buf = vec![0u8; 2048];
        let n = fb.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
        let charge = n as u64 + WIRE_OVERHEAD - payload.len() as u64;
        assert!(
            charge <= u64::from(MAX_FRAME_CHARGE_OVER_PAYLOAD),
            "{charge} bytes over the payload"
        );
    }
}
