//! The slow path, served every few hundred poll turns: memory
//! registration, completion queues, QP creation and connection, queries
//! ([`Command`]). It may allocate; the per-packet path never waits for it.

use cc::{CcKind, CongestionControl, PathConfig};
use rdma::transport::{LossRecovery, Qp, QpConfig, QpState, Service, SrParams};
use rdma::wire::frame::{FrameBuilder, IntInsert, NetHeaders};
use rdma::wire::{bth, EthernetAddress, HeaderTemplate, Ipv4Address};

use qpcore::QpCore;

use super::{Engine, QpSlot, MAX_HOPS, ROCE_DSCP};
use crate::contract::{Command, DoorbellSlot, EngineError, QpOptions, RemoteQp};
use crate::gbn_backoff::GoBackNBackoff;
use crate::timer_wheel::TimerHandle;

/// The round-trip time a selective-repeat QP's BDP cap and timeouts assume at
/// least (`rdma::transport::SrParams::for_path`): a software NIC's real RTT,
/// with both engines' poll turns and a shared host's scheduling in it, is tens
/// to hundreds of microseconds whatever `DeviceConfig::base_rtt_ns` says.
const SR_MIN_RTT_NS: u64 = 100_000;
/// The shortest selective-repeat timeouts: IRN's RTO_low (while at most 3 packets
/// are in flight) and RTO_high (otherwise). On a shared 2-core host an engine is
/// descheduled for milliseconds at a time; a spurious RTO_high re-requests a READ
/// not yet answered whole (the responder replays all of it), so it stays well
/// above those stalls (docs/reliability.md, "Selective repeat").
const SR_MIN_RTO_NS: u64 = 1_000_000;
const SR_MIN_RTO_HIGH_NS: u64 = 10_000_000;

impl Engine {
    /// Serves every slow-path request waiting, and the control plane's
    /// timers (ARP retries).
    pub(super) fn slow_path(&mut self) {
        let now = self.clock.now_ns();
        self.control_slow_path(now);
        self.gsi_slow_path(now);
        self.lifecycle_turn(now);
        while let Ok(cmd) = self.cmd.try_recv() {
            match cmd {
                Command::RegMr {
                    pd,
                    va,
                    mem,
                    access,
                    reply,
                } => {
                    let _ = reply.send(self.reg_mr(pd, va, mem, access));
                }
                Command::DeregMr { lkey, force, reply } => {
                    let r = self.dereg_mr(lkey, force);
                    if let Some(reply) = reply {
                        let _ = reply.send(r);
                    }
                }
                Command::Cm { op, reply } => {
                    let _ = reply.send(self.cm_command(op, now));
                }
                Command::AllocMw { pd, kind, reply } => {
                    let r = self
                        .mrs
                        .alloc_window(pd, kind)
                        .map(|w| w.rkey)
                        .ok_or(EngineError::MrTableFull);
                    let _ = reply.send(r);
                }
                Command::DeallocMw { pd, rkey, reply } => {
                    let r = self.dealloc_mw(pd, rkey);
                    if let Some(reply) = reply {
                        let _ = reply.send(r);
                    }
                }
                Command::CreateSrq {
                    pd,
                    depth,
                    max_sge,
                    ring,
                    reply,
                } => {
                    let _ = reply.send(self.create_srq(pd, depth, max_sge, ring));
                }
                Command::ArmSrq { srq, limit, reply } => {
                    let _ = reply.send(self.arm_srq(srq, limit));
                }
                Command::QuerySrq { srq, reply } => {
                    let _ = reply.send(self.query_srq(srq));
                }
                Command::DestroySrq { srq, reply } => {
                    let r = self.destroy_srq(srq);
                    if let Some(reply) = reply {
                        let _ = reply.send(r);
                    }
                }
                Command::CreateCq {
                    ring,
                    notify,
                    waiter,
                    reply,
                } => {
                    let id = self.create_cq(super::cq::CqRing::new(ring, notify, waiter));
                    let _ = reply.send(Ok(id));
                }
                Command::CreateQp {
                    pd,
                    send_cq,
                    recv_cq,
                    opts,
                    ring,
                    reply,
                } => {
                    let _ = reply.send(self.create_qp(pd, send_cq, recv_cq, opts, ring));
                }
                Command::Connect {
                    qpn,
                    remote,
                    peer_sr,
                    reply,
                } => {
                    let _ = reply.send(self.connect(qpn, &remote, peer_sr));
                }
                Command::SetSqPsn { qpn, psn, reply } => {
                    let _ = reply.send(self.set_sq_psn(qpn, psn));
                }
                Command::SetRetry {
                    qpn,
                    timeout_ns,
                    retry_cnt,
                    rnr_retry,
                    reply,
                } => {
                    let _ = reply.send(self.set_retry(qpn, timeout_ns, retry_cnt, rnr_retry));
                }
                Command::ResolveMac { ip, reply } => self.resolve_mac(ip, reply, now),
                Command::SetQkey { qpn, qkey, reply } => {
                    let r = self.slot_by_qpn(qpn).and_then(|s| {
                        s.opts.qkey = qkey;
                        match s.core.qp.as_mut() {
                            Some(q) => q
                                .set_qkey(qkey)
                                .map_err(|source| EngineError::Transport { qpn, source }),
                            None => Ok(()),
                        }
                    });
                    let _ = reply.send(r);
                }
                Command::CreateAh { ah, ip, mac, reply } => {
                    let i = ah.0.get() as usize - 1;
                    if self.ahs.len() <= i {
                        self.ahs.resize(i + 1, None);
                    }
                    self.ahs[i] = Some(super::AhRoute { ip, mac });
                    let _ = reply.send(Ok(()));
                }
                Command::DestroyAh { ah } => {
                    if let Some(a) = self.ahs.get_mut(ah.0.get() as usize - 1) {
                        *a = None;
                    }
                }
                Command::QueryQp { qpn, reply } => {
                    let r = match self.slot(qpn) {
                        Some(s) => Ok(s.core.qp.as_ref().map_or(s.idle_state, |q| q.state())),
                        None => Err(EngineError::NoSuchQp(qpn)),
                    };
                    let _ = reply.send(r);
                }
                Command::DescribeQp { qpn, reply } => {
                    let _ = reply.send(self.describe_qp(qpn, now));
                }
                Command::ResizeCq {
                    cq,
                    ring,
                    new,
                    old,
                    reply,
                } => {
                    let r = match self.cqs.get_mut(cq as usize) {
                        Some(c) => c.resize(ring, new, old),
                        None => (old, false),
                    };
                    let _ = reply.send(Ok(r));
                }
                cmd @ (Command::ModifyQp { .. }
                | Command::DestroyQp { .. }
                | Command::DestroyCq { .. }
                | Command::DeallocPd { .. }) => self.lifecycle_command(cmd),
            }
        }
    }

    /// Registers `mem` in protection domain `pd`: (lkey, rkey).
    fn reg_mr(
        &mut self,
        pd: u32,
        va: u64,
        mem: std::sync::Arc<dpdk::ExtBuf>,
        access: rdma::transport::Access,
    ) -> Result<(u32, u32), EngineError> {
        let mr = self
            .mrs
            .register_in(pd, va, mem.len() as u64, access)
            .ok_or(EngineError::MrTableFull)?;
        let i = ((mr.lkey >> 8) - 1) as usize;
        if self.mr_mem.len() <= i {
            self.mr_mem.resize(i + 1, None);
        }
        self.mr_mem[i] = Some(crate::sys::MrMem {
            key: mr.lkey,
            va,
            mem,
        });
        Ok((mr.lkey, mr.rkey))
    }

    /// Deregisters the region of `lkey`; one that memory windows are bound to only
    /// if `force` (they are unbound first: type 1 windows unbound, type 2 free).
    fn dereg_mr(&mut self, lkey: u32, force: bool) -> Result<(), EngineError> {
        let windows = self.mrs.windows_bound(lkey);
        if windows > 0 {
            if !force {
                return Err(EngineError::MrHasWindows { key: lkey, windows });
            }
            self.mrs.unbind_windows_of(lkey);
        }
        self.mrs
            .deregister(lkey)
            .ok_or(EngineError::NoSuchMr(lkey))?;
        self.mr_mem[((lkey >> 8) - 1) as usize] = None;
        Ok(())
    }

    /// Frees the memory window of PD `pd` in the slot of `rkey`.
    fn dealloc_mw(&mut self, pd: u32, rkey: u32) -> Result<(), EngineError> {
        let current = self
            .mrs
            .window_in_slot(rkey)
            .filter(|w| w.pd == pd)
            .ok_or(EngineError::NoSuchMw(rkey))?
            .rkey;
        self.mrs.dealloc_window(current);
        Ok(())
    }

    /// One line of a QP's state for [`Command::DescribeQp`].
    fn describe_qp(&self, qpn: u32, now: u64) -> Result<String, EngineError> {
        let s = self.slot(qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let i = qpn - self.qpn_base;
        let timer = |t: Option<(TimerHandle, u64)>| match t {
            Some((h, at)) => format!(
                "{}@{:+}ns(wheel {:?})",
                if self.wheel.is_pending(h) {
                    "armed"
                } else {
                    "LOST"
                },
                at as i64 - now as i64,
                self.wheel.expiry_ns(h).map(|e| e as i64 - now as i64)
            ),
            None => "none".into(),
        };
        let mut out = format!(
            "qp {qpn:#x}: sched {:?} credit {}B rate {} next_bytes {} ctrl_queued {} \
             cnp_pending {} doorbell_blocked {} transport_timer {} cc_timers [",
            self.sched.state(i),
            self.sched.credit_bytes(i).unwrap_or(0),
            match s.core.sched_rate {
                Some(sched::scheduler::RATE_UNPACED) => "unpaced".to_string(),
                Some(r) => r.to_string(),
                None => "unset".to_string(),
            },
            s.core.next_bytes,
            s.core.ctrl_queued,
            s.core.cnp_pending,
            s.doorbell_blocked,
            timer(s.core.transport_timer),
        );
        for (k, t) in s.core.cc_armed.iter().enumerate() {
            out += &format!(" {}:{}", s.core.cc_timers[k], timer(*t));
        }
        out += " ]";
        if let Some(qp) = s.core.qp.as_ref() {
            out += &format!(
                " | {:?} loss_recovery {} next_timer {:?} has_control {} next_lsn {} acked_lsn {} \
                 next_psn {} una_psn {} expected_psn {} sq_outstanding {} in_flight {} \
                 cc_window {:?} {:?}",
                qp.state(),
                qp.loss_recovery(),
                qp.next_timer().map(|t| t as i64 - now as i64),
                qp.has_control(),
                qp.next_lsn(),
                qp.acked_lsn(),
                qp.next_psn(),
                qp.una_psn(),
                qp.expected_psn(),
                qp.sq_outstanding(),
                qp.in_flight(),
                s.core.cc.window_bytes(),
                qp.counters(),
            );
        }
        out += &format!(
            " | wheel len {} now {:+}ns | sched active {} control {}",
            self.wheel.len(),
            self.wheel.now_ns() as i64 - now as i64,
            self.sched.active_len(),
            self.sched.control_len()
        );
        Ok(out)
    }

    /// The first PSN QP `qpn` sends ([`Command::SetSqPsn`]): kept for
    /// the connection when it has none yet, else set on its transport
    /// (which refuses once it is past RTR).
    fn set_sq_psn(&mut self, qpn: u32, psn: u32) -> Result<(), EngineError> {
        let s = self.slot_by_qpn(qpn)?;
        match s.core.qp.as_mut() {
            None => {
                s.psn = psn & 0xFF_FFFF;
                Ok(())
            }
            Some(qp) => qp
                .set_sq_psn(psn & 0xFF_FFFF)
                .map_err(|source| EngineError::Transport { qpn, source }),
        }
    }

    /// QP `qpn`'s retry attributes ([`Command::SetRetry`]): kept in its
    /// options for the connection when it has none yet, else set on its
    /// transport (which refuses once it is past RTR).
    fn set_retry(
        &mut self,
        qpn: u32,
        timeout_ns: u64,
        retry_cnt: u8,
        rnr_retry: u8,
    ) -> Result<(), EngineError> {
        let s = self.slot_by_qpn(qpn)?;
        let transport = |source| EngineError::Transport { qpn, source };
        match s.core.qp.as_mut() {
            None if retry_cnt > 7 || rnr_retry > 7 || timeout_ns == 0 => Err(transport(
                rdma::transport::QpError::Config("retry counts <= 7, timeout > 0"),
            )),
            None => {
                s.opts.timeout_ns = timeout_ns;
                s.opts.retry_cnt = retry_cnt;
                s.opts.rnr_retry = rnr_retry;
                Ok(())
            }
            Some(qp) => qp
                .set_retry(timeout_ns, retry_cnt, rnr_retry)
                .map_err(transport),
        }
    }

    /// QP `qpn`'s slot, or [`EngineError::NoSuchQp`].
    fn slot_by_qpn(&mut self, qpn: u32) -> Result<&mut QpSlot, EngineError> {
        let i = qpn
            .checked_sub(self.qpn_base)
            .ok_or(EngineError::NoSuchQp(qpn))? as usize;
        self.qps
            .get_mut(i)
            .and_then(Option::as_mut)
            .map(|b| &mut **b)
            .ok_or(EngineError::NoSuchQp(qpn))
    }

    fn slot(&self, qpn: u32) -> Option<&QpSlot> {
        let i = qpn.checked_sub(self.qpn_base)? as usize;
        self.qps.get(i)?.as_deref()
    }

    fn next_psn(&mut self) -> u32 {
        // xorshift64: initial PSNs are not predictable, as IBA recommends.
        let mut x = self.psn_seed;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.psn_seed = x;
        (x as u32) & 0xFF_FFFF
    }

    fn create_qp(
        &mut self,
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        opts: QpOptions,
        ring: rtrb::Consumer<DoorbellSlot>,
    ) -> Result<(u32, u32), EngineError> {
        for cq in [send_cq, recv_cq] {
            if !self
                .cqs
                .get(cq as usize)
                .is_some_and(|c| c.in_use() && !c.orphaned)
            {
                return Err(EngineError::NoSuchCq(cq));
            }
        }
        if !matches!(opts.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return Err(EngineError::BadMtu(opts.mtu));
        }
        if let Some(k) = opts.srq {
            // An SRQ of this engine and of the QP's PD (IBA 10.2.9).
            if self.srq_slot(k)?.srq.pd() != pd {
                return Err(EngineError::NoSuchSrq(k));
            }
        }
        // Round robin from the slot after the last one taken, as rxe's pool
        // allocates: a destroyed QP's number comes back last, so a peer's CM
        // that still remembers the old connection (timewait) does not take a
        // new REQ from it for a stale one (REJ 10).
        let n = self.qps.len();
        let i = (0..n)
            .map(|k| (self.next_qp_slot + k) % n)
            .find(|&i| self.qps[i].is_none())
            .ok_or(EngineError::TooManyQps)?;
        self.next_qp_slot = (i + 1) % n;
        let psn = self.next_psn();
        let path = PathConfig {
            line_rate_bps: self.line_rate_bps,
            base_rtt_ns: self.base_rtt_ns,
            mtu_bytes: opts.mtu,
        };
        let cc = opts.cc.build(path);
        let fb = FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress(self.mac),
                dst_mac: EthernetAddress([0; 6]),
                src_ip: Ipv4Address(self.ip),
                dst_ip: Ipv4Address([0; 4]),
                udp_src_port: 0xC000 | ((self.qpn_base + i as u32) & 0x3FFF) as u16,
                dscp: ROCE_DSCP,
                ttl: 64,
            },
            int: None,
        };
        let probe_int = IntInsert {
            int_dscp: self.int_dscp,
            max_hops: MAX_HOPS as u8,
        };
        let mut core = QpCore::new(cc, fb, probe_int, opts.cc.uses_extensions(), opts.mtu);
        // The port's shaper holds every QP to the line rate (crate::port_shaper).
        core.port_holds_line_rate = true;
        self.qps[i] = Some(Box::new(QpSlot {
            opts,
            pd,
            send_cq,
            recv_cq,
            doorbell: ring,
            psn,
            core,
            tpl: None,
            doorbell_blocked: false,
            cq_waiting: false,
            idle_state: QpState::Init,
            stop_at_rtr: false,
            err_by_program: false,
            fatal_pending: false,
            synced: super::poll::QpSums::default(),
            synced_mark: super::poll::SyncMark::default(),
        }));
        if let Some(k) = opts.srq {
            self.srq_slot(k)?.users += 1;
        }
        if self.life.take_ctrl_orphan(i) {
            // The control-ring entry a destroyed QP left in this slot is ours.
            self.qps[i]
                .as_deref_mut()
                .expect("set above")
                .core
                .ctrl_queued = true;
        }
        self.counters.qps_live += 1;
        let now = self.clock.now_ns();
        let _ = self.sched.reset_qp(i as u32, now);
        Ok((self.qpn_base + i as u32, psn))
    }

    /// Connects QP `qpn` to `remote`; `peer_sr`: an exchange told us the peer
    /// runs selective repeat too (else only the port's CM may have agreed it).
    pub(super) fn connect(
        &mut self,
        qpn: u32,
        remote: &RemoteQp,
        peer_sr: bool,
    ) -> Result<(), EngineError> {
        let int_dscp = self.int_dscp;
        // Selective repeat only with a peer known to run it (issue 43): a standard
        // peer takes a selective ACK as a fatal error.
        let peer_sr = peer_sr || self.cm.sr_agreed(remote.ip, remote.qpn);
        let i = qpn
            .checked_sub(self.qpn_base)
            .ok_or(EngineError::NoSuchQp(qpn))? as usize;
        let s = self
            .qps
            .get_mut(i)
            .and_then(Option::as_mut)
            .ok_or(EngineError::NoSuchQp(qpn))?;
        if s.core.qp.is_some() {
            return Err(EngineError::AlreadyConnected(qpn));
        }
        let cfg = QpConfig {
            qpn,
            dest_qpn: remote.qpn,
            pmtu: s.opts.mtu.min(remote.mtu),
            sq_depth: s.opts.sq_depth,
            rq_depth: s.opts.rq_depth,
            max_rd_atomic: s.opts.max_rd_atomic,
            timeout_ns: s.opts.timeout_ns,
            retry_cnt: s.opts.retry_cnt,
            rnr_retry: s.opts.rnr_retry,
            min_rnr_timer: 1,
            sq_psn: s.psn,
            rq_psn: remote.psn,
            cc_ext: s.core.cc_ext,
            ack_read_responses: s.opts.cc == CcKind::Ldcp,
            ack_events_without_progress: s.opts.cc.counts_acks(),
            pd: s.pd,
            max_send_sge: s.opts.max_send_sge,
            max_recv_sge: s.opts.max_recv_sge,
            srq: s.opts.srq.is_some(),
            service: s.opts.service,
            qkey: s.opts.qkey,
            loss_recovery: match (s.opts.service, s.opts.loss_recovery, peer_sr) {
                (Service::Rc, LossRecovery::Sr, true) => LossRecovery::Sr,
                _ => LossRecovery::Gbn,
            },
        };
        let transport = |source| EngineError::Transport { qpn, source };
        let mut qp = Qp::new(cfg).map_err(transport)?;
        let sr = cfg.loss_recovery == LossRecovery::Sr;
        if sr {
            // IRN's BDP cap and timeouts for this port's path, with the
            // floors a software NIC on a shared host needs (SR_MIN_RTT_NS).
            let rtt = self.base_rtt_ns.max(SR_MIN_RTT_NS);
            let mut p = SrParams::for_path(self.line_rate_bps, rtt, cfg.pmtu, SR_MIN_RTO_NS);
            p.rto_high_ns = p.rto_high_ns.max(SR_MIN_RTO_HIGH_NS);
            qp.set_sr_params(p).map_err(transport)?;
        }
        // A UD QP takes datagrams from anyone (its `remote` is itself: its
        // packets go where their address handles say).
        if s.opts.service != Service::Ud {
            qp.set_peer_ip(remote.ip);
        }
        let last = if s.stop_at_rtr { 2 } else { 3 };
        for st in &[QpState::Init, QpState::Rtr, QpState::Rts][..last] {
            qp.modify(*st).map_err(transport)?;
        }
        let Some(mac) = remote.mac else {
            return Err(EngineError::NoPeerMac(qpn));
        };
        s.core.fb.net.dst_mac = EthernetAddress(mac);
        s.core.fb.net.dst_ip = Ipv4Address(remote.ip);
        if s.core.cc.int_on_data() {
            s.core.fb.int = Some(IntInsert {
                int_dscp,
                max_hops: MAX_HOPS as u8,
            });
        }
        // A template that cannot be built (never expected: the QPN was checked by
        // the QP above) leaves the QP on the general build_frame path.
        // RC only: the template bakes in one destination QP and the RC
        // header shapes; UC and UD frames take the general path.
        s.tpl = if s.opts.service == Service::Rc {
            HeaderTemplate::new(s.core.fb, remote.qpn, bth::DEFAULT_PKEY).ok()
        } else {
            None
        };
        if s.opts.cc == CcKind::None && !sr {
            // Selective repeat resends no window: its BDP cap is the bound.
            s.core.backoff = Some(GoBackNBackoff::new(cfg.pmtu));
        }
        s.core.qp = Some(qp);
        s.core.update_window();
        // Only what its new transport counts from now on is added.
        super::poll::take_baseline(s);
        self.connected.push(i);
        // Work posted before the connection is taken now.
        self.shared.ring_doorbell(qpn);
        Ok(())
    }
}
