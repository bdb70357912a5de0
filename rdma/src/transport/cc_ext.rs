//! The congestion-control side of a QP (no rxe counterpart: this is the project's
//! extension, docs/design.md §4, on QPs whose two ends negotiated it; the IBA part is
//! only the CE mark, IBA vol. 1 annex A17 / RoCEv2 "congestion notification"):
//! - as responder: counts CE-marked requests (reported as [`QpEvent::CeMarked`], which
//!   a DCQCN NIC answers with a CNP) and copies the INT hop records of the newest
//!   request, both echoed in the next ACK's CC extension header with the LSN it
//!   acknowledges and an Rx-HPCC window;
//! - as requester of READs: acknowledges READ responses in their own LSN space (LDCP
//!   section 3.1) so the responder's CC sees them;
//! - HPCC++ probes (opcode 0xC0) and probe responses (0xC1) echoing the path's hops.
//!
//! With `cc_ext` off nothing here reaches the wire: the QP stays plain RoCEv2.

use super::config::{QpConfig, LSN_HEADER_ONLY_CHARGE};
use super::output::{Outputs, QpEvent, TxPacket};
use crate::wire::bth::{BthRepr, Opcode};
use crate::wire::ccext::{CcExtFlags, CcExtRepr, MAX_ECHO_HOPS};
use crate::wire::frame::RoceFrame;
use crate::wire::frame::RoceRepr;
use crate::wire::int::HopRecord;
use crate::wire::ipv4::Ecn;
use crate::wire::transport_hdrs::{AethRepr, AethSyndrome};

/// CC-extension state of a QP.
#[derive(Debug)]
pub(super) struct CcExtState {
    /// LSN just past the newest in-order request (what our ACKs acknowledge).
    pub exp_lsn: u32,
    /// CE-marked requests since the last ACK.
    ce_pending: u8,
    /// INT hops of the newest request.
    echo_hops: [HopRecord; MAX_ECHO_HOPS],
    echo_n: u8,
    /// Rx-HPCC window for the next ACK.
    pub ack_window: Option<u32>,
    /// A probe to send (requester).
    pub probe_pending: bool,
    /// A probe to answer: (PSN, hops, records).
    probe_resp: Option<(u32, u8, [HopRecord; MAX_ECHO_HOPS])>,
    /// READ-response LSN received so far (requester).
    resp_rx_lsn: u32,
    /// The LDCP ACK of READ responses to send: (PSN, LSN, CE count).
    resp_ack_pending: Option<(u32, u32, u8)>,
    /// CE-marked READ responses since that ACK.
    resp_ce: u8,
}

impl CcExtState {
    pub fn new() -> Self {
        Self {
            exp_lsn: 0,
            ce_pending: 0,
            echo_hops: [HopRecord::default(); MAX_ECHO_HOPS],
            echo_n: 0,
            ack_window: None,
            probe_pending: false,
            probe_resp: None,
            resp_rx_lsn: 0,
            resp_ack_pending: None,
            resp_ce: 0,
        }
    }

    /// A request arrived (any PSN): note its CE mark and INT hops.
    pub fn on_request(&mut self, f: &RoceFrame<'_>, out: &mut Outputs) {
        if f.ip.ecn == Ecn::Ce {
            self.ce_pending = self.ce_pending.saturating_add(1);
            out.push_event(QpEvent::CeMarked { psn: f.bth.psn });
        }
        if let Some(c) = &f.int {
            self.echo_n = c.copy_hops(&mut self.echo_hops) as u8;
        }
    }

    /// An in-sequence request passed the sequence and length checks: what our next ACK
    /// acknowledges in LSN.
    pub fn on_in_order_request(&mut self, f: &RoceFrame<'_>) {
        if let Some(e) = &f.ccext {
            self.exp_lsn = e.lsn.wrapping_add(charge(f.payload.len()));
        }
    }

    /// The CC extension header of an ACK or ATOMIC ACK we send (None without `cc_ext`):
    /// consumes the CE count, the hops and the Rx-HPCC window.
    pub fn ack_ext(&mut self, cfg: &QpConfig) -> Option<CcExtRepr> {
        if !cfg.cc_ext {
            return None;
        }
        let mut e = CcExtRepr::data(self.exp_lsn, CcExtFlags::ACK);
        e.ce_count = self.ce_pending;
        self.ce_pending = 0;
        e.window = self.ack_window.take();
        e.n_hops = self.echo_n;
        e.hops = self.echo_hops;
        self.echo_n = 0;
        Some(e)
    }

    /// A READ response was accepted (requester): LDCP 3.1 acknowledges it.
    pub fn on_read_response(&mut self, f: &RoceFrame<'_>, cfg: &QpConfig) {
        self.resp_rx_lsn = f
            .ccext
            .map_or(self.resp_rx_lsn, |e| e.lsn)
            .wrapping_add(charge(f.payload.len()));
        if f.ip.ecn == Ecn::Ce {
            self.resp_ce = self.resp_ce.saturating_add(1);
        }
        if cfg.ack_read_responses && cfg.cc_ext {
            self.resp_ack_pending = Some((f.bth.psn, self.resp_rx_lsn, self.resp_ce));
        }
    }

    /// A probe arrived: answer it with the hops it collected.
    pub fn on_probe(&mut self, f: &RoceFrame<'_>) {
        let mut hops = [HopRecord::default(); MAX_ECHO_HOPS];
        let n = f.int.as_ref().map_or(0, |c| c.copy_hops(&mut hops)) as u8;
        self.probe_resp = Some((f.bth.psn, n, hops));
    }

    /// A control packet of the extension waits (READ-response ACK, probe response).
    pub fn has_control(&self) -> bool {
        self.resp_ack_pending.is_some() || self.probe_resp.is_some()
    }

    /// The next control packet of the extension, if any.
    pub fn poll_control(&mut self, cfg: &QpConfig) -> Option<TxPacket> {
        if let Some((p, lsn, ce)) = self.resp_ack_pending.take() {
            let mut r = RoceRepr::new(BthRepr::new(Opcode::Acknowledge, cfg.dest_qpn, p));
            r.aeth = Some(AethRepr {
                syndrome: AethSyndrome::ACK,
                msn: 0,
            });
            let mut e = CcExtRepr::data(lsn, CcExtFlags::ACK | CcExtFlags::RESP_SPACE);
            e.ce_count = ce;
            self.resp_ce = 0;
            r.ccext = Some(e);
            return Some(TxPacket::control(r));
        }
        let (p, n, hops) = self.probe_resp.take()?;
        let mut r = RoceRepr::new(BthRepr::new(Opcode::ProbeResponse, cfg.dest_qpn, p));
        let mut e = CcExtRepr::data(self.exp_lsn, CcExtFlags::PROBE | CcExtFlags::ACK);
        e.n_hops = n;
        e.hops = hops;
        r.ccext = Some(e);
        Some(TxPacket::control(r))
    }

    /// The pending probe, sent at PSN `next_psn` (not consumed) and LSN `next_lsn`.
    pub fn poll_probe(&mut self, cfg: &QpConfig, next_psn: u32, next_lsn: u32) -> Option<TxPacket> {
        if !std::mem::take(&mut self.probe_pending) {
            return None;
        }
        let mut r = RoceRepr::new(BthRepr::new(Opcode::Probe, cfg.dest_qpn, next_psn));
        r.ccext = Some(CcExtRepr::data(next_lsn, CcExtFlags::PROBE));
        Some(TxPacket {
            priority: false,
            lsn: next_lsn,
            ..TxPacket::control(r)
        })
    }
}

/// LSN charge of a packet with `len` payload bytes.
pub(super) fn charge(len: usize) -> u32 {
    if len == 0 {
        LSN_HEADER_ONLY_CHARGE
    } else {
        len as u32
    }
}
