//! Whole RoCEv2 frames: a layered parse ([`parse_frame`]) and a builder
//! ([`FrameBuilder`]) that writes headers into a caller buffer, for a one-shot frame or for
//! a header segment followed by payload segments (zero-copy TX with an incremental ICRC).

use super::bth::{self, BthPacket, BthRepr, Opcode};
use super::ccext::{CcExtPacket, CcExtRepr};
use super::ethernet::{self, EtherType, EthernetAddress, EthernetPacket, EthernetRepr};
use super::icrc::{self, IcrcHasher};
use super::int::{self, IntPacket, IntRepr};
use super::ipv4::{self, Ecn, Ipv4Address, Ipv4Packet, Ipv4Repr};
use super::transport_hdrs::*;
use super::udp::{self, UdpPacket, UdpRepr, ROCEV2_UDP_PORT};
use super::{need, need_out, Result, WireError};

/// Options of [`parse_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseOptions {
    /// DSCP that signals an INT container (None: never look for one).
    pub int_dscp: Option<u8>,
    /// Verify the ICRC (as if any INT container were absent).
    pub verify_icrc: bool,
}

impl Default for ParseOptions {
    fn default() -> Self {
        Self {
            int_dscp: Some(int::DEFAULT_INT_DSCP),
            verify_icrc: true,
        }
    }
}

/// A parsed RoCEv2 frame: every layer, borrowed payload, offsets for zero-copy use.
#[derive(Debug, Clone)]
pub struct RoceFrame<'a> {
    /// Ethernet header.
    pub eth: EthernetRepr,
    /// IPv4 header (DSCP/ECN as received; ECN CE means congestion experienced).
    pub ip: Ipv4Repr,
    /// UDP header.
    pub udp: UdpRepr,
    /// The INT container, if the DSCP announced one.
    pub int: Option<IntPacket<&'a [u8]>>,
    /// Length of the INT container (0 if none).
    pub int_len: usize,
    /// BTH.
    pub bth: BthRepr,
    /// CC extension (present on probe opcodes, and where the caller said the QP uses it).
    pub ccext: Option<CcExtRepr>,
    /// DETH (UD opcodes).
    pub deth: Option<DethRepr>,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// ImmDt.
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND Last/Only with Invalidate).
    pub ieth: Option<IethRepr>,
    /// AtomicETH.
    pub atomic: Option<AtomicEthRepr>,
    /// AtomicAckETH.
    pub atomic_ack: Option<AtomicAckEthRepr>,
    /// Payload without pad and ICRC.
    pub payload: &'a [u8],
    /// ICRC as carried.
    pub icrc: u32,
    /// Offset of the BTH in the frame.
    pub bth_offset: usize,
    /// Offset of the payload in the frame.
    pub payload_offset: usize,
    /// The IPv4 header as received (options included): a UD receive places its first
    /// 20 bytes in the GRH slot (IBA 11.4.1.2; rxe `execute`, `rdma_network_hdr`).
    pub ipv4_header: &'a [u8],
}

/// Parses a whole Ethernet/IPv4/UDP/(INT)/BTH/... frame. `has_ccext` is asked, once the
/// BTH is known, whether this QP carries the CC extension (it is negotiated per QP, so
/// only the caller's QP table knows); probe opcodes always carry it.
///
/// The IPv4, UDP and BTH parsers it calls are always inlined: a
/// `Result<Repr>` returned through memory was stored field by field and read
/// back in wider loads, a store-forwarding stall per header (18 of 45 ns per
/// frame on a 2-core Xeon VM; docs/benchmarks.md).
pub fn parse_frame<'a>(
    frame: &'a [u8],
    opts: &ParseOptions,
    has_ccext: impl FnOnce(&BthRepr) -> bool,
) -> Result<RoceFrame<'a>> {
    let e = EthernetPacket::new_checked(frame)?;
    let eth = EthernetRepr::parse_ipv4(&e)?;
    let l3 = ethernet::HEADER_LEN;
    let ipp = Ipv4Packet::new_checked(&frame[l3..])?;
    let ip = Ipv4Repr::parse(&ipp)?;
    if ip.protocol != ipv4::PROTO_UDP {
        return Err(WireError::NotUdp(ip.protocol));
    }
    let udp_off = l3 + ipp.header_len();
    let ip_end = l3 + ipp.total_len() as usize;
    let up = UdpPacket::new_checked(&frame[udp_off..ip_end])?;
    if up.len_field() as usize != ip_end - udp_off {
        return Err(WireError::BadUdpLength(up.len_field()));
    }
    let udpr = UdpRepr::parse(&up)?;
    if udpr.dst_port != ROCEV2_UDP_PORT {
        return Err(WireError::NotRoce(udpr.dst_port));
    }
    let mut off = udp_off + udp::HEADER_LEN;
    let (int, int_len) = if opts.int_dscp == Some(ip.dscp) {
        let c = IntPacket::new_checked(&frame[off..ip_end])?;
        let n = c.len();
        off += n;
        (Some(c), n)
    } else {
        (None, 0)
    };
    let bth_offset = off;
    let bp = BthPacket::new_checked(&frame[off..ip_end])?;
    let bthr = BthRepr::parse(&bp)?;
    off += bth::HEADER_LEN;
    let op = bthr.opcode;
    // Parsed into the result at the end: an `Option<CcExtRepr>` is 140 bytes
    // (the echoed hops), and one parsed here was copied into the frame even
    // when `None`, on every packet.
    let ccext_view = if matches!(op, Opcode::Probe | Opcode::ProbeResponse) || has_ccext(&bthr) {
        let p = CcExtPacket::new_checked(&frame[off..ip_end])?;
        off += p.len();
        Some(p)
    } else {
        None
    };
    let rest = &frame[off..ip_end];
    need("transport headers + ICRC", op.ext_len() + 4, rest.len())?;
    let mut o = 0;
    // IBA 9.2 order: DETH first. No opcode has both a DETH and a RETH or AtomicETH
    // (UD carries neither), so those two still parse at offset 0.
    let deth = if op.has_deth() {
        o += DETH_LEN;
        Some(DethRepr::parse(rest)?)
    } else {
        None
    };
    let reth = if op.has_reth() {
        o += RETH_LEN;
        Some(RethRepr::parse(rest)?)
    } else {
        None
    };
    let atomic = if op.has_atomic_eth() {
        o += ATOMIC_ETH_LEN;
        Some(AtomicEthRepr::parse(rest)?)
    } else {
        None
    };
    let aeth = if op.has_aeth() {
        let a = AethRepr::parse(&rest[o..])?;
        o += AETH_LEN;
        Some(a)
    } else {
        None
    };
    let atomic_ack = if op.has_atomic_ack_eth() {
        let a = AtomicAckEthRepr::parse(&rest[o..])?;
        o += ATOMIC_ACK_ETH_LEN;
        Some(a)
    } else {
        None
    };
    let immdt = if op.has_immdt() {
        let i = ImmDtRepr::parse(&rest[o..])?;
        o += IMMDT_LEN;
        Some(i)
    } else {
        None
    };
    let ieth = if op.has_ieth() {
        let i = IethRepr::parse(&rest[o..])?;
        o += IETH_LEN;
        Some(i)
    } else {
        None
    };
    if op == Opcode::Cnp {
        o += CNP_RESERVED_LEN;
    }
    let body = &rest[o..rest.len() - 4];
    let pad = bthr.pad as usize;
    if pad > body.len() {
        return Err(WireError::BadPad(bthr.pad));
    }
    let payload = &body[..body.len() - pad];
    if !op.has_payload() && !payload.is_empty() {
        return Err(WireError::FieldRange("payload on a header-only opcode"));
    }
    let t = &rest[rest.len() - 4..];
    let icrc_v = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
    if opts.verify_icrc {
        icrc::verify_icrc(&frame[..ip_end], l3, int_len)?;
    }
    // A literal per case, so that each builds the frame where it is returned
    // (a closure here was not inlined, and its result was copied whole).
    macro_rules! roce_frame {
        ($ccext:expr) => {
            RoceFrame {
                eth,
                ip,
                udp: udpr,
                int,
                int_len,
                bth: bthr,
                ccext: $ccext,
                deth,
                reth,
                aeth,
                immdt,
                ieth,
                atomic,
                atomic_ack,
                payload,
                icrc: icrc_v,
                bth_offset,
                payload_offset: off + o,
                ipv4_header: &frame[l3..udp_off],
            }
        };
    }
    match ccext_view {
        None => Ok(roce_frame!(None)),
        Some(p) => {
            let e = CcExtRepr::parse(&p)?;
            Ok(roce_frame!(Some(e)))
        }
    }
}

/// What [`prepare_rx`] did to a received frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxPrepared {
    /// Offset of the (possibly moved) frame in the buffer.
    pub start: usize,
    /// Frame length after stripping.
    pub len: usize,
    /// Bytes of INT container removed (0 if none).
    pub int_len: usize,
    /// Hop records the container carried (newest first, at most
    /// [`crate::wire::ccext::MAX_ECHO_HOPS`]).
    pub hops: [int::HopRecord; crate::wire::ccext::MAX_ECHO_HOPS],
    /// Valid entries in `hops`.
    pub n_hops: u8,
    /// The container's E bit (some hop could not push its record).
    pub int_exceeded: bool,
}

/// The NIC's RX preparation of a frame in a buffer it owns (`buf[..len]`, IPv4 at 14):
/// if the IPv4 DSCP equals `int_dscp`, copies the INT hop records out and strips the
/// container in place (docs/design.md §4); then verifies the ICRC in place at raw CRC
/// speed. Afterwards call [`parse_frame`] on `buf[start..start+len]` with
/// `verify_icrc: false`.
pub fn prepare_rx(buf: &mut [u8], len: usize, int_dscp: Option<u8>) -> Result<RxPrepared> {
    need("frame", len, buf.len())?;
    let l3 = ethernet::HEADER_LEN;
    need("Ethernet + IPv4", l3 + ipv4::HEADER_LEN, len)?;
    let mut out = RxPrepared {
        start: 0,
        len,
        int_len: 0,
        hops: [int::HopRecord::default(); crate::wire::ccext::MAX_ECHO_HOPS],
        n_hops: 0,
        int_exceeded: false,
    };
    let dscp = buf[l3 + 1] >> 2;
    if int_dscp == Some(dscp) {
        let loc = int::locate(&buf[..len], l3, dscp)?;
        let c = IntPacket::new_checked(&buf[loc.int_off..loc.int_off + loc.int_len])?;
        out.n_hops = c.copy_hops(&mut out.hops) as u8;
        out.int_exceeded = c.flags().contains(int::MdFlags::E);
        let s = int::strip_in_place(buf, 0, len, l3, dscp)?;
        out.start = s.start;
        out.len = s.len;
        out.int_len = s.int_len;
    }
    icrc::verify_icrc_in_place(&mut buf[out.start..out.start + out.len], l3, 0)?;
    Ok(out)
}

/// The transport part of a packet: BTH and the headers its opcode needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceRepr {
    /// BTH (its pad count is set by the builder from the payload length).
    pub bth: BthRepr,
    /// CC extension, only on QPs that negotiated it.
    pub ccext: Option<CcExtRepr>,
    /// DETH (UD SEND Only, with or without immediate).
    pub deth: Option<DethRepr>,
    /// RETH (WRITE First/Only, READ Request).
    pub reth: Option<RethRepr>,
    /// AETH (ACK/NAK, READ Response First/Last/Only, ATOMIC ACK).
    pub aeth: Option<AethRepr>,
    /// ImmDt (with-immediate opcodes).
    pub immdt: Option<ImmDtRepr>,
    /// IETH (SEND Last/Only with Invalidate).
    pub ieth: Option<IethRepr>,
    /// AtomicETH (CmpSwap, FetchAdd).
    pub atomic: Option<AtomicEthRepr>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack: Option<AtomicAckEthRepr>,
}

impl RoceRepr {
    /// A packet with only a BTH.
    pub fn new(bth: BthRepr) -> Self {
        Self {
            bth,
            ccext: None,
            deth: None,
            reth: None,
            aeth: None,
            immdt: None,
            ieth: None,
            atomic: None,
            atomic_ack: None,
        }
    }

    fn check(&self) -> Result<()> {
        let op = self.bth.opcode;
        if op.has_reth() != self.reth.is_some()
            || op.has_deth() != self.deth.is_some()
            || op.has_aeth() != self.aeth.is_some()
            || op.has_immdt() != self.immdt.is_some()
            || op.has_ieth() != self.ieth.is_some()
            || op.has_atomic_eth() != self.atomic.is_some()
            || op.has_atomic_ack_eth() != self.atomic_ack.is_some()
        {
            return Err(WireError::FieldRange(
                "extension headers do not match the opcode",
            ));
        }
        Ok(())
    }

    /// Bytes from the BTH to the payload.
    #[inline]
    pub fn transport_len(&self) -> usize {
        bth::HEADER_LEN + self.ccext.map_or(0, |c| c.buffer_len()) + self.bth.opcode.ext_len()
    }

    /// Writes BTH, CC extension and the opcode's headers in IBA order (9.2: DETH, RETH,
    /// AtomicETH, AETH, AtomicAckETH, ImmDt or IETH); returns the length.
    pub fn emit_transport(&self, buf: &mut [u8]) -> Result<usize> {
        self.check()?;
        need_out("transport headers", self.transport_len(), buf.len())?;
        let mut o = self.bth.emit(buf)?;
        if let Some(c) = &self.ccext {
            o += c.emit(&mut buf[o..])?;
        }
        if let Some(d) = &self.deth {
            o += d.emit(&mut buf[o..])?;
        }
        if let Some(r) = &self.reth {
            o += r.emit(&mut buf[o..])?;
        }
        if let Some(a) = &self.atomic {
            o += a.emit(&mut buf[o..])?;
        }
        if let Some(a) = &self.aeth {
            o += a.emit(&mut buf[o..])?;
        }
        if let Some(a) = &self.atomic_ack {
            o += a.emit(&mut buf[o..])?;
        }
        if let Some(i) = &self.immdt {
            o += i.emit(&mut buf[o..])?;
        }
        if let Some(i) = &self.ieth {
            o += i.emit(&mut buf[o..])?;
        }
        if self.bth.opcode == Opcode::Cnp {
            buf[o..o + CNP_RESERVED_LEN].fill(0);
            o += CNP_RESERVED_LEN;
        }
        Ok(o)
    }
}

/// The per-QP (per-path) outer headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetHeaders {
    /// Source MAC.
    pub src_mac: EthernetAddress,
    /// Destination (next-hop) MAC.
    pub dst_mac: EthernetAddress,
    /// Source IPv4.
    pub src_ip: Ipv4Address,
    /// Destination IPv4.
    pub dst_ip: Ipv4Address,
    /// UDP source port: per-QP entropy for ECMP (IBA A17.2.1).
    pub udp_src_port: u16,
    /// DSCP of the traffic class (replaced by the INT DSCP when INT is inserted; the
    /// original goes into the shim).
    pub dscp: u8,
    /// TTL.
    pub ttl: u8,
}

impl NetHeaders {
    /// Headers from `src_mac`/`src_ip` to `dst_mac`/`dst_ip` in RoCEv2's
    /// usual class (DSCP 26, the `RoCE` class of common deployments; TTL
    /// 64), with `udp_src_port` as the flow's entropy.
    pub fn new(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src_ip: [u8; 4],
        dst_ip: [u8; 4],
        udp_src_port: u16,
    ) -> NetHeaders {
        NetHeaders {
            src_mac: EthernetAddress(src_mac),
            dst_mac: EthernetAddress(dst_mac),
            src_ip: Ipv4Address(src_ip),
            dst_ip: Ipv4Address(dst_ip),
            udp_src_port,
            dscp: 26,
            ttl: 64,
        }
    }
}

/// INT insertion parameters for a QP that negotiated INT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntInsert {
    /// DSCP announcing the container (configured; default [`int::DEFAULT_INT_DSCP`]).
    pub int_dscp: u8,
    /// RemainingHopCnt of the fresh container.
    pub max_hops: u8,
}

/// Layout of headers written by [`FrameBuilder::emit_headers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderLayout {
    /// Bytes of headers written (Ethernet through the last transport header).
    pub len: usize,
    /// Pad bytes the payload needs before the ICRC.
    pub pad: usize,
    /// INT container length (0 if none).
    pub int_len: usize,
    /// Total frame length once payload, pad and ICRC are added.
    pub frame_len: usize,
}

/// Writes RoCEv2 frames into caller-provided buffers (no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameBuilder {
    /// Outer headers.
    pub net: NetHeaders,
    /// INT insertion (None: plain RoCEv2).
    pub int: Option<IntInsert>,
}

impl FrameBuilder {
    /// Bytes of headers for `pkt`.
    #[inline]
    pub fn headers_len(&self, pkt: &RoceRepr) -> usize {
        ethernet::HEADER_LEN
            + ipv4::HEADER_LEN
            + udp::HEADER_LEN
            + if self.int.is_some() {
                int::HEADER_LEN
            } else {
                0
            }
            + pkt.transport_len()
    }

    /// Writes all headers for a packet whose payload is `payload_len` bytes, with IP/UDP
    /// lengths covering payload, pad and ICRC, and the BTH pad count set. `ecn` is the
    /// IP ECN codepoint (ECT(0) for data, Not-ECT for LDCP fast start).
    pub fn emit_headers(
        &self,
        pkt: &RoceRepr,
        payload_len: usize,
        ecn: Ecn,
        buf: &mut [u8],
    ) -> Result<HeaderLayout> {
        let hl = self.headers_len(pkt);
        need_out("RoCEv2 headers", hl, buf.len())?;
        let pad = (4 - payload_len % 4) % 4;
        let int_len = if self.int.is_some() {
            int::HEADER_LEN
        } else {
            0
        };
        let l4 =
            hl - ethernet::HEADER_LEN - ipv4::HEADER_LEN - udp::HEADER_LEN + payload_len + pad + 4;
        if l4 + udp::HEADER_LEN + ipv4::HEADER_LEN > u16::MAX as usize {
            return Err(WireError::FieldRange("frame length"));
        }
        let mut o = EthernetRepr {
            src: self.net.src_mac,
            dst: self.net.dst_mac,
            ethertype: EtherType::Ipv4,
        }
        .emit(buf)?;
        let dscp = self.int.map_or(self.net.dscp, |i| i.int_dscp);
        o += Ipv4Repr {
            src: self.net.src_ip,
            dst: self.net.dst_ip,
            dscp,
            ecn,
            ttl: self.net.ttl,
            ident: 0,
            protocol: ipv4::PROTO_UDP,
            payload_len: (l4 + udp::HEADER_LEN) as u16,
        }
        .emit(&mut buf[o..])?;
        o += UdpRepr {
            src_port: self.net.udp_src_port,
            dst_port: ROCEV2_UDP_PORT,
            payload_len: l4 as u16,
        }
        .emit(&mut buf[o..])?;
        if let Some(i) = self.int {
            o += IntRepr::new_empty(i.max_hops, self.net.dscp).emit(&mut buf[o..])?;
        }
        let mut t = *pkt;
        t.bth.pad = pad as u8;
        o += t.emit_transport(&mut buf[o..])?;
        debug_assert_eq!(o, hl);
        Ok(HeaderLayout {
            len: hl,
            pad,
            int_len,
            frame_len: hl + payload_len + pad + 4,
        })
    }

    /// Starts the incremental ICRC over headers written by [`FrameBuilder::emit_headers`];
    /// feed the payload segments, then call [`FrameBuilder::finish_icrc`].
    pub fn icrc_start(&self, headers: &[u8], layout: &HeaderLayout) -> Result<IcrcHasher> {
        need("headers", layout.len, headers.len())?;
        let (mut h, o) =
            IcrcHasher::start_frame(&headers[..layout.len], ethernet::HEADER_LEN, layout.int_len)?;
        h.update(&headers[o..layout.len]);
        Ok(h)
    }

    /// Hashes the pad and writes `pad` zero bytes followed by the ICRC into `trailer`
    /// (which must hold `layout.pad + 4` bytes); returns the bytes written.
    pub fn finish_icrc(
        mut h: IcrcHasher,
        layout: &HeaderLayout,
        trailer: &mut [u8],
    ) -> Result<usize> {
        let n = layout.pad + 4;
        need_out("pad + ICRC", n, trailer.len())?;
        trailer[..layout.pad].fill(0);
        if layout.pad > 0 {
            h.update(&trailer[..layout.pad]);
        }
        trailer[layout.pad..n].copy_from_slice(&h.finalize().to_le_bytes());
        Ok(n)
    }

    /// Writes a complete frame (headers, payload copy, pad, ICRC); returns its length.
    pub fn emit_frame(
        &self,
        pkt: &RoceRepr,
        payload: &[u8],
        ecn: Ecn,
        buf: &mut [u8],
    ) -> Result<usize> {
        let l = self.emit_headers(pkt, payload.len(), ecn, buf)?;
        need_out("RoCEv2 frame", l.frame_len, buf.len())?;
        let h = self.icrc_start(buf, &l)?;
        let p = l.len;
        buf[p..p + payload.len()].copy_from_slice(payload);
        let mut h = h;
        h.update(payload);
        Self::finish_icrc(h, &l, &mut buf[p + payload.len()..l.frame_len])?;
        Ok(l.frame_len)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::ccext::CcExtFlags;
    use super::super::int::HopRecord;
    use super::*;

    pub(crate) fn builder(int: Option<IntInsert>) -> FrameBuilder {
        FrameBuilder {
            net: NetHeaders {
                src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
                dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
                src_ip: Ipv4Address([10, 0, 0, 1]),
                dst_ip: Ipv4Address([10, 0, 0, 2]),
                udp_src_port: 0xC123,
                dscp: 26,
                ttl: 64,
            },
            int,
        }
    }

    fn write_pkt(len: u32) -> RoceRepr {
        let mut r = RoceRepr::new(BthRepr::new(Opcode::WriteOnlyImm, 0x42, 0xFF_FFFF));
        r.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0x77,
            dma_len: len,
        });
        r.immdt = Some(ImmDtRepr(0x0102_0304));
        r
    }

    #[test]
    fn build_then_parse_roundtrip() {
        let b = builder(None);
        let payload: Vec<u8> = (0..13u8).collect();
        let mut buf = [0u8; 256];
        let n = b
            .emit_frame(&write_pkt(13), &payload, Ecn::Ect0, &mut buf)
            .unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 16 + 4 + 13 + 3 + 4);
        let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| false).unwrap();
        assert_eq!(f.payload, &payload[..]);
        assert_eq!(f.bth.pad, 3);
        assert_eq!(f.reth.unwrap().dma_len, 13);
        assert_eq!(f.immdt, Some(ImmDtRepr(0x0102_0304)));
        assert_eq!(f.ip.ecn, Ecn::Ect0);
        assert_eq!(f.ip.dscp, 26);
        assert!(f.int.is_none());
        // Any single-bit flip in the invariant part is caught (ICRC) or rejected.
        for i in [42usize, 50, 60, 70, n - 5] {
            let mut c = buf;
            c[i] ^= 0x10;
            assert!(
                parse_frame(&c[..n], &ParseOptions::default(), |_| false).is_err(),
                "byte {i}"
            );
        }
        // Truncations never panic and always fail.
        for k in 0..n {
            assert!(parse_frame(&buf[..k], &ParseOptions::default(), |_| false).is_err());
        }
    }

    #[test]
    fn int_frame_icrc_ignores_container_and_pushes() {
        let b = builder(Some(IntInsert {
            int_dscp: 0x18,
            max_hops: 4,
        }));
        let payload = [0xABu8; 100];
        let mut r = write_pkt(100);
        r.ccext = Some(CcExtRepr::data(12345, CcExtFlags::FAST_START));
        let mut buf = [0u8; 512];
        let n = b.emit_frame(&r, &payload, Ecn::NotEct, &mut buf).unwrap();
        let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| true).unwrap();
        assert_eq!(f.int_len, 16);
        assert_eq!(f.int.as_ref().unwrap().orig_dscp(), 26);
        assert_eq!(f.ccext.unwrap().lsn, 12345);
        assert_eq!(f.payload, &payload[..]);
        // A switch pushes a hop: ICRC (computed without the container) still verifies.
        let h = HopRecord::from_units(9, 3, 77, 88, 640, 100_000_000_000);
        let int::PushOutcome::Pushed { len, .. } =
            int::push_hop(&mut buf, n, 14, 0x18, &h).unwrap()
        else {
            panic!()
        };
        let f = parse_frame(&buf[..len], &ParseOptions::default(), |_| true).unwrap();
        assert_eq!(f.int_len, 32);
        assert_eq!(f.int.as_ref().unwrap().hop(0), Some(h));
        assert_eq!(f.payload, &payload[..]);
        // Stripping gives a frame equal to one built without INT (DSCP restored).
        let s = int::strip_in_place(&mut buf, 0, len, 14, 0x18).unwrap();
        let mut plain = [0u8; 512];
        let m = builder(None)
            .emit_frame(&r, &payload, Ecn::NotEct, &mut plain)
            .unwrap();
        assert_eq!(&buf[s.start..s.start + s.len], &plain[..m]);
    }

    #[test]
    fn segmented_icrc_matches_one_shot() {
        let b = builder(None);
        let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let r = write_pkt(4096);
        let mut one = vec![0u8; 5000];
        let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut one).unwrap();
        let mut hdr = [0u8; 128];
        let l = b
            .emit_headers(&r, payload.len(), Ecn::Ect0, &mut hdr)
            .unwrap();
        let mut h = b.icrc_start(&hdr, &l).unwrap();
        for c in payload.chunks(1000) {
            h.update(c);
        }
        let mut t = [0u8; 7];
        let k = FrameBuilder::finish_icrc(h, &l, &mut t).unwrap();
        assert_eq!(&one[n - 4..n], &t[k - 4..k]);
        assert_eq!(&one[..l.len], &hdr[..l.len]);
    }

    #[test]
    fn prepare_rx_strips_int_keeps_hops_and_checks_icrc() {
        let b = builder(Some(IntInsert {
            int_dscp: 0x18,
            max_hops: 4,
        }));
        let payload = [7u8; 33];
        let r = write_pkt(33);
        let mut buf = [0u8; 512];
        let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
        let h = HopRecord::from_units(3, 4, 5, 6, 7, 8);
        let int::PushOutcome::Pushed { len, .. } =
            int::push_hop(&mut buf, n, 14, 0x18, &h).unwrap()
        else {
            panic!()
        };
        let mut bad = buf;
        let p = prepare_rx(&mut buf, len, Some(0x18)).unwrap();
        assert_eq!(
            (p.n_hops, p.hops[0], p.int_len, p.int_exceeded),
            (1, h, 32, false)
        );
        let f = parse_frame(
            &buf[p.start..p.start + p.len],
            &ParseOptions {
                int_dscp: Some(0x18),
                verify_icrc: true,
            },
            |_| false,
        )
        .unwrap();
        assert_eq!(f.payload, &payload[..]);
        assert_eq!(f.ip.dscp, 26);
        // A corrupted payload byte fails the ICRC after stripping.
        bad[len - 6] ^= 1;
        assert!(matches!(
            prepare_rx(&mut bad, len, Some(0x18)),
            Err(WireError::BadIcrc { .. })
        ));
        // Plain frame: nothing stripped.
        let mut plain = [0u8; 512];
        let m = builder(None)
            .emit_frame(&r, &payload, Ecn::Ect0, &mut plain)
            .unwrap();
        let p = prepare_rx(&mut plain, m, Some(0x18)).unwrap();
        assert_eq!((p.start, p.len, p.n_hops), (0, m, 0));
    }

    /// A SEND Only with Invalidate: the IETH (the R_Key to invalidate) right after the
    /// BTH (IBA 9.3.8), parsed back, covered by the ICRC; a frame whose IETH is cut
    /// short is refused, and a repr whose headers do not match the opcode is refused.
    #[test]
    fn send_with_invalidate_carries_the_ieth() {
        let b = builder(None);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::SendOnlyInv, 0x42, 9));
        r.ieth = Some(IethRepr(0x0001_2345));
        let payload = [7u8; 6];
        let mut buf = [0u8; 256];
        let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 4 + 6 + 2 + 4);
        assert_eq!(buf[42], 0x17);
        assert_eq!(&buf[54..58], &[0, 1, 0x23, 0x45]);
        let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| false).unwrap();
        assert_eq!((f.ieth, f.immdt), (r.ieth, None));
        assert_eq!(f.payload, &payload[..]);
        // The ICRC covers the IETH.
        let mut bad = buf;
        bad[55] ^= 1;
        assert!(matches!(
            parse_frame(&bad[..n], &ParseOptions::default(), |_| false),
            Err(WireError::BadIcrc { .. })
        ));
        let mut no_ieth = r;
        no_ieth.ieth = None;
        assert!(b
            .emit_frame(&no_ieth, &payload, Ecn::Ect0, &mut buf)
            .is_err());
    }

    /// A UD SEND Only with Immediate: the DETH sits right after the BTH and before the
    /// ImmDt (IBA 9.2), both parse back, the ICRC covers them, and the frame's IPv4
    /// header is the one the builder wrote.
    #[test]
    fn ud_frame_roundtrip_with_deth_before_immdt() {
        let b = builder(None);
        let mut r = RoceRepr::new(BthRepr::new(Opcode::UdSendOnlyImm, 0x42, 7));
        r.deth = Some(DethRepr {
            qkey: 0x1111_2222,
            src_qp: 0x33_4455,
        });
        r.immdt = Some(ImmDtRepr(0xA1B2_C3D4));
        let payload = [9u8; 5];
        let mut buf = [0u8; 256];
        let n = b.emit_frame(&r, &payload, Ecn::Ect0, &mut buf).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 8 + 4 + 5 + 3 + 4);
        assert_eq!(buf[42], 0x65);
        assert_eq!(&buf[54..62], &[0x11, 0x11, 0x22, 0x22, 0, 0x33, 0x44, 0x55]);
        assert_eq!(&buf[62..66], &[0xA1, 0xB2, 0xC3, 0xD4]);
        let f = parse_frame(&buf[..n], &ParseOptions::default(), |_| false).unwrap();
        assert_eq!(f.deth, r.deth);
        assert_eq!(f.immdt, r.immdt);
        assert_eq!(f.payload, &payload[..]);
        assert_eq!(f.ipv4_header, &buf[14..34]);
        // The DETH is under the ICRC.
        let mut c = buf;
        c[57] ^= 1;
        assert!(matches!(
            parse_frame(&c[..n], &ParseOptions::default(), |_| false),
            Err(WireError::BadIcrc { .. })
        ));
        // A UD opcode without its DETH (or an RC one with one) is not emitted.
        let mut bad = r;
        bad.deth = None;
        assert!(b.emit_frame(&bad, &payload, Ecn::Ect0, &mut buf).is_err());
        let mut bad = RoceRepr::new(BthRepr::new(Opcode::SendOnly, 0x42, 7));
        bad.deth = r.deth;
        assert!(b.emit_frame(&bad, &payload, Ecn::Ect0, &mut buf).is_err());
        // Truncated in the DETH: an error, not a panic.
        for k in 0..n {
            assert!(parse_frame(&buf[..k], &ParseOptions::default(), |_| false).is_err());
        }
    }

    #[test]
    fn mismatched_headers_are_rejected() {
        let mut r = write_pkt(1);
        r.reth = None;
        let mut buf = [0u8; 128];
        assert!(builder(None)
            .emit_frame(&r, &[1], Ecn::Ect0, &mut buf)
            .is_err());
    }
}
