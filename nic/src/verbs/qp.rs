//! RC queue pair handles ([`QueuePair`], `ibv_qp`): posting work
//! requests (with scatter/gather lists), `modify_qp`, inline sends.

use std::sync::Arc;

use rdma::transport::sgl::MAX_SGE;
use rdma::transport::{Access, LossRecovery, QpState, RecvWr, SendOp, SendWr, Service, Sge};

use super::staging::Staging;
use super::{
    request, MemoryRegion, MemoryWindow, QpOptions, QpTransition, RemoteQp, SgRef, VerbsError,
};
use crate::contract::{
    push_request, Command, CommandTx, Doorbell, DoorbellSlot, EngineShared, Reply, UdWr,
};

/// An RC queue pair handle: posts work requests to the engine.
///
/// What a post reads (the state, the doorbell ring, the engine's shared
/// state, the QPN) comes first, on one cache line (`repr(C, align(64))`):
/// with thousands of QPs each handle is cold when the program comes back to
/// it.
#[repr(C, align(64))]
pub struct QueuePair {
    /// The state the program last moved it to (the engine may have moved
    /// it to ERR since; work posted then completes with WR_FLUSH_ERR).
    pub(super) state: QpState,
    pub(super) qpn: u32,
    pub(super) ring: rtrb::Producer<DoorbellSlot>,
    pub(super) shared: Arc<EngineShared>,
    pub(super) psn: u32,
    pub(super) opts: QpOptions,
    /// The engine's command channel (None once destroyed).
    pub(super) cmd: Option<CommandTx>,
    /// The engine that runs the port's control plane (ARP).
    pub(super) resolver: CommandTx,
    /// Host mode: resolve peers through this interface's kernel neighbours.
    pub(super) kernel_iface: Option<crate::host::KernelIface>,
    pub(super) mac: [u8; 6],
    pub(super) ip: [u8; 4],
    /// Where inline sends are copied at post time.
    pub(super) staging: Option<Staging>,
    /// The peer's loss recovery as an exchange told it ([`Self::set_peer_loss_recovery`]).
    pub(super) peer_loss_recovery: LossRecovery,
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.take() {
            let _ = cmd.send(Command::DestroyQp {
                qpn: self.qpn,
                reply: None,
            });
        }
    }
}

impl QueuePair {
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// What the peer needs to connect to this QP.
    pub fn remote_info(&self) -> RemoteQp {
        RemoteQp {
            qpn: self.qpn,
            psn: self.psn,
            ip: self.ip,
            mac: Some(self.mac),
            mtu: self.opts.mtu,
            cc: self.opts.cc,
        }
    }

    /// Moves the QP from INIT to RTR and RTS towards `remote` in one call
    /// (IBA 10.3: INIT -> RTR needs the peer's QPN, PSN and path; RTR ->
    /// RTS our send PSN), the shortcut for [`Self::modify_qp`] twice. The
    /// MTU used is the smaller of the two; the CC kinds must match.
    ///
    /// Without `remote.mac`, the peer's MAC is resolved by ARP first (as rxe
    /// does at RTR): this waits for the reply, and fails with
    /// [`crate::contract::EngineError::ArpFailed`] when none comes (`DeviceConfig::arp`: 3
    /// requests 1 s apart by default).
    ///
    /// An RC QP whose options ask for selective repeat runs it only with a peer
    /// known to want it too: one [`Self::set_peer_loss_recovery`] named, or one the
    /// port's CM negotiated it with (`rdma::cm::ext`); otherwise go-back-N.
    pub fn connect(&mut self, remote: &RemoteQp) -> Result<(), VerbsError> {
        self.check_cc(remote)?;
        let remote = self.with_mac(remote)?;
        let qpn = self.qpn;
        let peer_sr = self.peer_loss_recovery == LossRecovery::Sr;
        self.request(|reply| Command::Connect {
            qpn,
            remote,
            peer_sr,
            reply,
        })?;
        self.state = QpState::Rts;
        Ok(())
    }

    /// `remote` with its MAC: as given, or resolved by ARP (in host mode,
    /// by the kernel: crate::host).
    fn with_mac(&self, remote: &RemoteQp) -> Result<RemoteQp, VerbsError> {
        let mut remote = *remote;
        if remote.mac.is_none() && remote.ip == self.ip {
            // A QP of this port: its frames loop back inside the NIC
            // (engine `loop_back`); no neighbour to ask, in host mode either.
            remote.mac = Some(self.mac);
        }
        if let (None, Some(k)) = (remote.mac, &self.kernel_iface) {
            remote.mac = Some(k.resolve(remote.ip, crate::host::RESOLVE_TIMEOUT)?);
        }
        if remote.mac.is_none() {
            let ip = remote.ip;
            remote.mac = Some(request(&self.resolver, |reply| Command::ResolveMac {
                ip,
                reply,
            })?);
        }
        Ok(remote)
    }

    fn check_cc(&self, remote: &RemoteQp) -> Result<(), VerbsError> {
        if remote.cc != self.opts.cc {
            return Err(VerbsError::CcMismatch {
                local: self.opts.cc,
                remote: remote.cc,
            });
        }
        Ok(())
    }

    /// Moves the QP to another state (`ibv_modify_qp`), as IBA 10.3.1
    /// allows: RESET -> INIT -> RTR (towards a peer) -> RTS, any state to
    /// ERR (its outstanding work completes with `WR_FLUSH_ERR`, and so does
    /// work posted later) and to RESET (its work is dropped; it can go to
    /// INIT again and be reused). A QP is created in INIT (as
    /// `rdma_create_qp` leaves it).
    pub fn modify_qp(&mut self, to: QpTransition) -> Result<(), VerbsError> {
        let to = match to {
            QpTransition::Rtr(remote) => {
                self.check_cc(&remote)?;
                QpTransition::Rtr(self.with_mac(&remote)?)
            }
            other => other,
        };
        let qpn = self.qpn;
        let peer_sr = self.peer_loss_recovery == LossRecovery::Sr;
        self.request(|reply| Command::ModifyQp {
            qpn,
            to,
            peer_sr,
            reply,
        })?;
        self.state = match to {
            QpTransition::Reset => QpState::Reset,
            QpTransition::Init => QpState::Init,
            QpTransition::Rtr(_) => QpState::Rtr,
            QpTransition::Rts => QpState::Rts,
            QpTransition::Err => QpState::Err,
        };
        Ok(())
    }

    /// The peer QP's loss recovery, as an out-of-band exchange between two rsnic
    /// programs told it (roce-perf's `ext=sr`), before [`Self::connect`] or RTR: with
    /// `Sr` and this QP's options asking for it too, the QP runs selective repeat
    /// (docs/reliability.md). A peer nobody vouched for (an ibverbs program's
    /// `ibv_modify_qp`, a standard peer) gets go-back-N, so that it never receives a
    /// selective ACK it cannot parse; the port's CM negotiates it by itself.
    pub fn set_peer_loss_recovery(&mut self, m: LossRecovery) {
        self.peer_loss_recovery = m;
    }

    /// Sets the first PSN this QP sends (`ibv_modify_qp` with
    /// `IBV_QP_SQ_PSN` at RTR -> RTS): in INIT or RTR, before it sent
    /// anything. [`Self::remote_info`] reports it from then on.
    pub fn set_sq_psn(&mut self, psn: u32) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::SetSqPsn { qpn, psn, reply })?;
        self.psn = psn & 0xFF_FFFF;
        Ok(())
    }

    /// Sets the retry attributes (`ibv_modify_qp` with `IBV_QP_TIMEOUT`,
    /// `IBV_QP_RETRY_CNT`, `IBV_QP_RNR_RETRY` at RTR -> RTS): the transport
    /// timeout in ns and the two retry counts (0..=7; an RNR count of 7
    /// retries forever), in INIT or RTR, before the QP sent anything.
    pub fn set_retry(
        &mut self,
        timeout_ns: u64,
        retry_cnt: u8,
        rnr_retry: u8,
    ) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::SetRetry {
            qpn,
            timeout_ns,
            retry_cnt,
            rnr_retry,
            reply,
        })
    }

    fn request<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, VerbsError> {
        request(self.cmd.as_ref().ok_or(VerbsError::EngineGone)?, make)
    }

    /// The QP's state as the engine sees it.
    pub fn state(&self) -> Result<QpState, VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::QueryQp { qpn, reply })
    }

    /// One line describing the QP's transport, scheduler and timer state
    /// (like `rdma resource show qp -d`): for diagnosing a QP that does not
    /// progress.
    pub fn describe(&self) -> Result<String, VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::DescribeQp { qpn, reply })
    }

    fn ring(&mut self, d: Doorbell) -> Result<(), VerbsError> {
        self.ring
            .push(DoorbellSlot(d))
            .map_err(|_| VerbsError::QueueFull)?;
        self.shared.ring_doorbell(self.qpn);
        Ok(())
    }

    /// Posts a send work request (SEND, WRITE, READ, ATOMIC; see
    /// [`rdma::transport::SendOp`]). Errors found by the engine (a bad lkey,
    /// a full send queue) come back as error completions.
    /// In ERR, it completes with `WR_FLUSH_ERR`.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), VerbsError> {
        self.post_send_list(&[wr]).map_err(|(_, e)| e)
    }

    /// Posts send work requests in order with one doorbell for all of them
    /// (`ibv_post_send` with a list, perftest's `--post_list`): the engine
    /// is told once, so a poster that sends many small messages does not
    /// pay a doorbell per message. On an error, the requests before the
    /// failed one are posted and the error comes with their number.
    pub fn post_send_list(&mut self, wrs: &[SendWr]) -> Result<(), (usize, VerbsError)> {
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err((0, self.not_ready()));
        }
        let mut posted = 0;
        let mut result = Ok(());
        for wr in wrs {
            if self.ring.push(DoorbellSlot(Doorbell::Send(*wr))).is_err() {
                result = Err((posted, VerbsError::QueueFull));
                break;
            }
            posted += 1;
        }
        if posted > 0 {
            self.shared.ring_doorbell(self.qpn);
        }
        result
    }

    /// Binds memory window `mw` to the `range` (address, length) of region `mr`
    /// with the remote rights `access` (`ibv_bind_mw`: an `IBV_WR_BIND_MW` work
    /// request; IBA 10.6.7.2.1). A length of 0 (and no region) unbinds a type 1
    /// window. The window takes its next R_Key now, returned here; the engine
    /// executes the bind in the order of this QP's work requests and completes it
    /// (`WcOpcode::BindMw`, signaled) after the requests posted before it. A bind
    /// the window, the region or the rights forbid completes with `MW_BIND_ERR`
    /// and moves the QP to ERR (then [`MemoryWindow::set_rkey`] undoes the key).
    /// RC QPs only.
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut MemoryWindow,
        mr: Option<&MemoryRegion>,
        range: (u64, u64),
        access: Access,
    ) -> Result<u32, VerbsError> {
        if self.opts.service != Service::Rc {
            return Err(VerbsError::WrongService(
                "memory windows are bound on RC QPs",
            ));
        }
        let before = mw.rkey();
        let b = mw.next_bind(mr.map_or(0, MemoryRegion::lkey), range.0, range.1, access);
        let wr = SendWr::signaled(wr_id, SendOp::BindMw(b), Sge::default());
        self.post_send(wr).inspect_err(|_| mw.set_rkey(before))?;
        Ok(mw.rkey())
    }

    /// Posts a UD datagram (`ibv_post_send` on a UD QP, `wr.ud`): a SEND,
    /// with or without immediate, of at most the path MTU (IBA 9.8), to
    /// `wr.dest` (an [`super::AddressHandle`]'s id, the remote QPN and
    /// Q_Key). `sgl` as [`Self::post_send_sges`]; empty: `wr.sge`. It
    /// completes once its packet is handed to the port.
    pub fn post_send_ud(&mut self, wr: UdWr, sgl: &[Sge]) -> Result<(), VerbsError> {
        if self.opts.service != Service::Ud {
            return Err(VerbsError::WrongService(
                "a UD destination on a connected QP",
            ));
        }
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(self.not_ready());
        }
        let max = usize::from(self.opts.max_send_sge.max(1));
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        let len: u64 = match sgl {
            [] => u64::from(wr.sge.len),
            l => l.iter().map(|s| u64::from(s.len)).sum(),
        };
        if len > u64::from(self.opts.mtu) {
            return Err(VerbsError::DatagramTooLong {
                len,
                mtu: self.opts.mtu,
            });
        }
        match sgl {
            [] => self.ring(Doorbell::SendUd(wr)),
            [one] => self.ring(Doorbell::SendUd(UdWr { sge: *one, ..wr })),
            _ => self.ring_with_sges(Doorbell::SendUd(wr), sgl),
        }
    }

    /// [`Self::post_send_ud`] of `data` copied now (`IBV_SEND_INLINE`, at
    /// most `QpOptions::max_inline_data` bytes; `wr.sge` ignored).
    pub fn post_send_ud_inline(&mut self, wr: UdWr, data: &[u8]) -> Result<(), VerbsError> {
        let max = self.opts.max_inline_data as usize;
        if data.len() > max {
            return Err(VerbsError::TooLong {
                len: data.len(),
                max,
            });
        }
        if self.opts.service != Service::Ud {
            return Err(VerbsError::WrongService(
                "a UD destination on a connected QP",
            ));
        }
        let sge = self.stage(SendOp::Send, data)?;
        self.post_send_ud(UdWr { sge, ..wr }, &[])
    }

    /// Sets a UD QP's Q_Key (`ibv_modify_qp` with `IBV_QP_QKEY`): the one
    /// datagrams must carry to be received, and the one sent when a work
    /// request's has its high bit set (IBA 10.2.4.4).
    pub fn set_qkey(&mut self, qkey: u32) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.request(|reply| Command::SetQkey { qpn, qkey, reply })?;
        self.opts.qkey = qkey;
        Ok(())
    }

    /// The transport service it was created with.
    pub fn service(&self) -> Service {
        self.opts.service
    }

    /// What a UD QP's move to RTR ([`Self::modify_qp`],
    /// [`QpTransition::Rtr`]) or [`Self::connect`] takes: itself. A UD QP
    /// has no peer; its datagrams go where their address handles say.
    pub fn ud_self(&self) -> RemoteQp {
        RemoteQp {
            mac: Some(self.mac),
            ..self.remote_info()
        }
    }

    /// Posts a receive buffer for an incoming SEND (from INIT on, as in
    /// verbs, so before `connect` too; in ERR it completes with
    /// `WR_FLUSH_ERR`).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.state == QpState::Reset {
            return Err(self.not_ready());
        }
        if self.opts.srq.is_some() {
            return Err(VerbsError::ReceivesFromSrq);
        }
        self.ring(Doorbell::Recv(wr))
    }

    /// Posts a send work request whose local buffer is the list `sgl`, in
    /// order (`ibv_send_wr` with `num_sge` up to `QpOptions::max_send_sge`):
    /// SEND and WRITE gather their payload from it, a READ scatters the
    /// response into it, an ATOMIC takes exactly one 8-byte SGE (IBA 9.4.5).
    /// `wr.sge` is ignored. Nothing is copied: the buffers must stay as they
    /// are until the request completes, as with one SGE. The engine checks
    /// each SGE against its region and completes a bad one with
    /// `LOC_PROT_ERR`.
    pub fn post_send_sges(&mut self, wr: SendWr, sgl: &[Sge]) -> Result<(), VerbsError> {
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(self.not_ready());
        }
        let max = usize::from(self.opts.max_send_sge.max(1));
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        match sgl {
            [] => self.post_send(SendWr {
                sge: Sge::default(),
                ..wr
            }),
            [one] => self.post_send(SendWr { sge: *one, ..wr }),
            _ if wr.op.is_atomic() => Err(VerbsError::NotGatherable),
            _ => self.ring_with_sges(Doorbell::Send(wr), sgl),
        }
    }

    /// Posts a receive work request whose buffer is the list `sgl`, in
    /// order (`ibv_recv_wr` with `num_sge` up to `QpOptions::max_recv_sge`;
    /// `wr.sge` ignored): an incoming SEND is scattered over it.
    pub fn post_recv_sges(&mut self, wr: RecvWr, sgl: &[Sge]) -> Result<(), VerbsError> {
        if self.state == QpState::Reset {
            return Err(self.not_ready());
        }
        if self.opts.srq.is_some() {
            return Err(VerbsError::ReceivesFromSrq);
        }
        let max = usize::from(self.opts.max_recv_sge.max(1));
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        match sgl {
            [] => self.post_recv(RecvWr {
                sge: Sge::default(),
                ..wr
            }),
            [one] => self.post_recv(RecvWr { sge: *one, ..wr }),
            _ => self.ring_with_sges(Doorbell::Recv(wr), sgl),
        }
    }

    /// Rings `d` preceded by its SGE list (contract::push_request).
    fn ring_with_sges(&mut self, d: Doorbell, sgl: &[Sge]) -> Result<(), VerbsError> {
        push_request(&mut self.ring, d, sgl).map_err(|()| VerbsError::QueueFull)?;
        self.shared.ring_doorbell(self.qpn);
        Ok(())
    }

    /// Posts a SEND, WRITE or READ over regions given as [`SgRef`]s
    /// (each checked against its region here): [`Self::post_send_sges`].
    pub fn post_send_sgl(
        &mut self,
        wr_id: u64,
        op: SendOp,
        sgl: &[SgRef<'_>],
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let max = usize::from(self.opts.max_send_sge.max(1));
        if sgl.len() > max {
            return Err(VerbsError::TooManySges {
                given: sgl.len(),
                max,
            });
        }
        let mut sges = [Sge::default(); MAX_SGE];
        for (dst, r) in sges.iter_mut().zip(sgl) {
            *dst = r.sge()?;
        }
        let wr = SendWr {
            wr_id,
            op,
            sge: Sge::default(),
            signaled,
            solicited: false,
        };
        self.post_send_sges(wr, &sges[..sgl.len()])
    }

    /// Posts a SEND or WRITE of `data`, copied now (`IBV_SEND_INLINE`: no
    /// registered memory, no lkey; at most `QpOptions::max_inline_data`
    /// bytes).
    pub fn post_send_inline(
        &mut self,
        wr_id: u64,
        op: SendOp,
        data: &[u8],
        signaled: bool,
    ) -> Result<(), VerbsError> {
        let max = self.opts.max_inline_data as usize;
        if data.len() > max {
            return Err(VerbsError::TooLong {
                len: data.len(),
                max,
            });
        }
        let sge = self.stage(op, data)?;
        self.post_send(SendWr {
            wr_id,
            op,
            sge,
            signaled,
            solicited: false,
        })
    }

    fn stage(&mut self, op: SendOp, data: &[u8]) -> Result<Sge, VerbsError> {
        if op.needs_response() {
            return Err(VerbsError::NotGatherable);
        }
        if !matches!(self.state, QpState::Rts | QpState::Err) {
            return Err(self.not_ready());
        }
        let max = Staging::slot_bytes(&self.opts);
        let staging = self
            .staging
            .as_mut()
            .ok_or(VerbsError::TooLong { len: 1, max })?;
        staging.stage(data)
    }

    fn not_ready(&self) -> VerbsError {
        VerbsError::NotReady {
            qpn: self.qpn,
            state: self.state,
        }
    }

    /// Free slots in the doorbell ring.
    pub fn free_slots(&self) -> usize {
        self.ring.slots()
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use core::mem::{align_of, offset_of, size_of};

    /// What a post reads sits on the handle's first line (the struct's docs).
    #[test]
    fn a_post_reads_one_line() {
        assert_eq!(align_of::<QueuePair>(), 64);
        assert!(offset_of!(QueuePair, shared) + size_of::<Arc<EngineShared>>() <= 64);
        assert!(offset_of!(QueuePair, ring) + size_of::<rtrb::Producer<DoorbellSlot>>() <= 64);
        assert!(offset_of!(QueuePair, qpn) < 64);
        assert_eq!(size_of::<DoorbellSlot>(), 64);
        assert_eq!(align_of::<DoorbellSlot>(), 64);
    }
}
