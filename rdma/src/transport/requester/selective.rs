//! The requester's side of selective repeat (crate::transport::sack; IRN §3.1-3.2):
//! a hole resent alone, without moving the cursor that sends new packets, a READ's
//! missing run of responses re-requested alone, and the cap on PSNs in flight.

use super::{build_request, Requester, SendWqe};
use crate::transport::config::QpConfig;
use crate::transport::output::TxPacket;
use crate::transport::sack::WINDOW;
use crate::wire::ccext::{CcExtFlags, CcExtRepr};
use crate::wire::ipv4::Ecn;
use crate::wire::psn;

impl Requester {
    /// The started WQE that holds PSN `p`.
    pub(in crate::transport) fn holder(&self, p: u32) -> Option<SendWqe> {
        self.sq
            .iter()
            .take_while(|w| w.started)
            .find(|w| w.holds(p))
            .copied()
    }

    /// PSN `p` of started WQE `w` sent again, asking for an ACK. For a READ, `p` is
    /// the first of `run` response PSNs asked for again: the READ request for them
    /// alone (its RETH at their offset, their length; the whole READ when `p` is its
    /// first PSN and `run` all of it).
    pub(in crate::transport) fn resend(
        &self,
        w: &SendWqe,
        p: u32,
        run: u32,
        cfg: &QpConfig,
    ) -> TxPacket {
        let idx = psn::sub(p, w.first_psn);
        let (mut repr, payload, lsn, lsn_len, _) = build_request(w, idx, p, cfg);
        if w.wr.op.needs_response() {
            if let Some(r) = repr.reth.as_mut() {
                let off = idx * cfg.pmtu;
                let rest = w.wr.sge.len - off.min(w.wr.sge.len);
                r.dma_len = rest.min(run.saturating_mul(cfg.pmtu));
            }
        }
        repr.bth.ack_req = true;
        if cfg.cc_ext {
            repr.ccext = Some(CcExtRepr::data(lsn, CcExtFlags::empty()));
        }
        TxPacket {
            repr,
            payload,
            ecn: Ecn::Ect0,
            priority: false,
            lsn,
            lsn_len,
            retransmit: true,
            ah: None,
        }
    }

    /// Whether the cursor's next packet keeps the PSNs in flight within `cap` (IRN's
    /// BDP-FC, §3.2) and the PSNs from `una` to past it (a READ's whole response
    /// range) within the bitmaps' window; one may always go when nothing is in
    /// flight. In flight are the PSNs from `una` on that are not `done` (`done_ahead`
    /// of them are: reported placed, a READ response received), as RFC 6675's "pipe"
    /// counts what a SACK reports out of the network: IRN counts from the
    /// cumulative ACK, so with the cap at the BDP a hole at `una` stops new packets
    /// for the round trip its resend takes, loss after loss. A READ (or ATOMIC)
    /// request counts as one packet when it goes: its responses enter the network
    /// only after everything before it left the responder, a round trip later, so
    /// counting them now would keep a READ near the cap's size from starting until
    /// the one before it has all but ended (a gap of a round trip per READ); the
    /// PSNs in flight stay within the cap plus one READ (docs/reliability.md).
    pub(in crate::transport) fn within_cap(&self, una: u32, done_ahead: u32, cap: u32) -> bool {
        if una == self.sent_hi {
            return true;
        }
        let Some(w) = self.sq.get(self.tx_idx) else {
            return true;
        };
        let (end, counted) = if w.started {
            let end = psn::add(psn::add(w.first_psn, self.tx_pkt), 1);
            (end, end)
        } else if w.wr.op.needs_response() {
            (psn::add(self.next_psn, w.npkts), psn::add(self.next_psn, 1))
        } else {
            let end = psn::add(self.next_psn, 1);
            (end, end)
        };
        psn::sub(end, una) <= WINDOW && psn::sub(counted, una).saturating_sub(done_ahead) <= cap
    }
}
