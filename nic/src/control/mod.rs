//! The control plane of a NIC's port, as a host stack gives a hardware NIC
//! (docs/design.md §5): it answers ARP requests for the NIC's IPv4 address and
//! ICMP echo requests to it, resolves peers' MACs by ARP ([`ArpCache`]),
//! and announces the address with a gratuitous ARP at start. Everything
//! else that is not RoCEv2 is left to the engine, which counts and drops it.
//!
//! Pure: the engine feeds it frames and the time, and sends the frames it
//! writes into the engine's buffer; nothing here touches DPDK, allocates
//! after construction, or reads a clock.

mod arp_cache;

pub use arp_cache::{ArpCache, ArpConfig, Due, Lookup};

use rdma::wire::arp::{self, ArpOperation, ArpPacket, ArpRepr};
use rdma::wire::icmp::{self, Icmpv4Packet, Icmpv4Repr};
use rdma::wire::{
    ethernet, Ecn, EtherType, EthernetAddress, EthernetPacket, EthernetRepr, Ipv4Address,
    Ipv4Packet, Ipv4Repr, WireError,
};

/// Shortest Ethernet frame without its FCS: shorter frames are padded.
pub const MIN_FRAME: usize = 60;
/// TTL of the echo replies we send.
const REPLY_TTL: u8 = 64;

/// What the control plane counted (named like `ethtool -S`; the engine
/// publishes them with its own counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// ARP requests received (for any address).
    pub rx_arp_requests: u64,
    /// ARP replies received.
    pub rx_arp_replies: u64,
    /// ARP requests sent (resolutions, retries, the gratuitous one).
    pub tx_arp_requests: u64,
    /// ARP replies sent (to requests for our address).
    pub tx_arp_replies: u64,
    /// Resolutions answered from the cache.
    pub arp_cache_hits: u64,
    /// Resolutions that had to ask the network.
    pub arp_cache_misses: u64,
    /// Resolutions that got no answer (or found no room in the cache).
    pub arp_resolve_failures: u64,
    /// ICMP echo requests to our address received.
    pub rx_icmp_echo_requests: u64,
    /// ICMP echo replies sent.
    pub tx_icmp_echo_replies: u64,
    /// ARP or ICMP frames dropped: malformed, bad checksum, or a kind we do
    /// not speak (another ARP hardware type, an ICMP type other than echo).
    pub rx_drop_control: u64,
}

/// What became of a frame given to [`ControlPlane::on_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// Taken (and counted); send the reply of this many bytes written into
    /// the output buffer.
    Reply(usize),
    /// Taken (and counted); nothing to send.
    Taken,
    /// Not a control-plane frame: the engine counts and drops it.
    NotControl,
}

/// The answer to [`ControlPlane::resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Known: the peer's MAC.
    Known([u8; 6]),
    /// Being resolved; send the request of this many bytes written into
    /// the output buffer if `Some` (a new resolution).
    Pending(Option<usize>),
    /// No room for another resolution (counted as a failure).
    Failed,
}

/// The port's control plane (module docs).
#[derive(Debug, Clone)]
pub struct ControlPlane {
    mac: EthernetAddress,
    ip: Ipv4Address,
    cache: ArpCache,
    counters: ControlCounters,
}

impl ControlPlane {
    /// The control plane of a port with addresses `mac` and `ip`.
    pub fn new(mac: [u8; 6], ip: [u8; 4], cfg: ArpConfig) -> Self {
        ControlPlane {
            mac: EthernetAddress(mac),
            ip: Ipv4Address(ip),
            cache: ArpCache::new(cfg),
            counters: ControlCounters::default(),
        }
    }

    /// What it counted.
    pub fn counters(&self) -> &ControlCounters {
        &self.counters
    }

    /// The ARP cache.
    pub fn cache(&self) -> &ArpCache {
        &self.cache
    }

    /// Takes a received frame that is not RoCEv2: answers an ARP request
    /// for our address and an ICMP echo request to it (the reply written
    /// into `out`, which must hold a frame as long as the request), learns
    /// from ARP packets, and counts; anything else is [`Handled::NotControl`].
    pub fn on_frame(&mut self, frame: &[u8], now: u64, out: &mut [u8]) -> Handled {
        let Ok(eth) = EthernetPacket::new_checked(frame) else {
            return Handled::NotControl;
        };
        match eth.ethertype() {
            EtherType::Other(arp::ETHERTYPE_ARP) => self.on_arp(eth.payload(), now, out),
            EtherType::Ipv4 => self.on_ipv4(&eth, out),
            EtherType::Other(_) => Handled::NotControl,
        }
    }

    fn on_arp(&mut self, payload: &[u8], now: u64, out: &mut [u8]) -> Handled {
        let Ok(r) = ArpPacket::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) else {
            self.counters.rx_drop_control += 1;
            return Handled::Taken;
        };
        let for_us = r.target_ip == self.ip;
        match r.operation {
            ArpOperation::Request => self.counters.rx_arp_requests += 1,
            ArpOperation::Reply => self.counters.rx_arp_replies += 1,
            ArpOperation::Other(_) => {
                self.counters.rx_drop_control += 1;
                return Handled::Taken;
            }
        }
        // RFC 826: update the sender's entry if we have one, add it if the
        // packet is for us (a gratuitous ARP refreshes what we know).
        if r.sender_ip != self.ip && r.sender_ip.0 != [0; 4] {
            self.cache.learn(r.sender_ip.0, r.sender_hw.0, now, for_us);
        }
        if r.operation != ArpOperation::Request || !for_us {
            return Handled::Taken;
        }
        let reply = ArpRepr {
            operation: ArpOperation::Reply,
            sender_hw: self.mac,
            sender_ip: self.ip,
            target_hw: r.sender_hw,
            target_ip: r.sender_ip,
        };
        match self.write_arp(&reply, r.sender_hw, out) {
            Some(n) => {
                self.counters.tx_arp_replies += 1;
                Handled::Reply(n)
            }
            None => Handled::Taken,
        }
    }

    fn on_ipv4(&mut self, eth: &EthernetPacket<&[u8]>, out: &mut [u8]) -> Handled {
        let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else {
            return Handled::NotControl;
        };
        let Ok(ip_repr) = Ipv4Repr::parse(&ip) else {
            return Handled::NotControl;
        };
        if ip_repr.protocol != icmp::PROTO_ICMP || ip_repr.dst != self.ip {
            return Handled::NotControl;
        }
        let request = Icmpv4Packet::new_checked(ip.payload());
        let Ok(Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        }) = request.as_ref().map_err(|e| *e).and_then(Icmpv4Repr::parse)
        else {
            self.counters.rx_drop_control += 1;
            return Handled::Taken;
        };
        self.counters.rx_icmp_echo_requests += 1;
        let reply = Icmpv4Repr::EchoReply {
            ident,
            seq_no,
            data,
        };
        match self.write_echo_reply(&reply, eth.src(), ip_repr.src, out) {
            Ok(n) => {
                self.counters.tx_icmp_echo_replies += 1;
                Handled::Reply(n)
            }
            Err(_) => {
                self.counters.rx_drop_control += 1;
                Handled::Taken
            }
        }
    }

    /// The MAC of `ip`, from the cache or, when unknown, by ARP: the first
    /// request of a new resolution is written into `out`. Counts hits,
    /// misses and a full cache as a failure. The port's own address is its
    /// own MAC, asked of nobody: frames to it loop back inside the NIC.
    pub fn resolve(&mut self, ip: [u8; 4], now: u64, out: &mut [u8]) -> Resolution {
        if ip == self.ip.0 {
            return Resolution::Known(self.mac.0);
        }
        match self.cache.start(ip, now) {
            Lookup::Hit(mac) => {
                self.counters.arp_cache_hits += 1;
                Resolution::Known(mac)
            }
            Lookup::Pending { send } => {
                if send {
                    self.counters.arp_cache_misses += 1;
                }
                Resolution::Pending(send.then(|| self.request(ip, out)).flatten())
            }
            Lookup::Full => {
                self.counters.arp_resolve_failures += 1;
                Resolution::Failed
            }
        }
    }

    /// The MAC of `ip` if it is resolved (no request, not counted).
    pub fn lookup(&self, ip: [u8; 4], now: u64) -> Option<[u8; 6]> {
        self.cache.lookup(ip, now)
    }

    /// Retries and failures of resolutions due at `now`: a retry's request
    /// is written into `out` and handed to `send`; a failure is counted and
    /// handed to `failed`.
    pub fn poll(
        &mut self,
        now: u64,
        out: &mut [u8],
        mut send: impl FnMut(&[u8]),
        mut failed: impl FnMut([u8; 4]),
    ) {
        let mut due = [None; 16];
        let mut n = 0;
        // At most 16 handled per call (the rest come due next call): the
        // cache is borrowed while it hands them out.
        self.cache.poll(now, |d| {
            if let Some(slot) = due.get_mut(n) {
                *slot = Some(d);
                n += 1;
            }
        });
        for d in due.iter().flatten() {
            match *d {
                Due::Retry(ip) => {
                    if let Some(len) = self.request(ip, out) {
                        send(&out[..len]);
                    }
                }
                Due::Failed(ip) => {
                    self.counters.arp_resolve_failures += 1;
                    failed(ip);
                }
            }
        }
    }

    /// A gratuitous ARP (a request for our own address, RFC 5227 §3) that
    /// announces the port, written into `out`: its length.
    pub fn gratuitous(&mut self, out: &mut [u8]) -> Option<usize> {
        self.request(self.ip.0, out)
    }

    /// A broadcast ARP request for `ip` written into `out` (counted).
    fn request(&mut self, ip: [u8; 4], out: &mut [u8]) -> Option<usize> {
        let r = ArpRepr::request(self.mac, self.ip, Ipv4Address(ip));
        let n = self.write_arp(&r, EthernetAddress([0xFF; 6]), out)?;
        self.counters.tx_arp_requests += 1;
        Some(n)
    }

    /// An ARP frame to `dst`, padded to the shortest Ethernet frame.
    fn write_arp(&self, r: &ArpRepr, dst: EthernetAddress, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..MIN_FRAME)?;
        let eth = EthernetRepr {
            src: self.mac,
            dst,
            ethertype: EtherType::Other(arp::ETHERTYPE_ARP),
        };
        let h = eth.emit(out).ok()?;
        let n = r.emit(&mut out[h..]).ok()?;
        out[h + n..].fill(0);
        Some(MIN_FRAME)
    }

    /// An echo reply to `dst_mac`/`dst_ip` written into `out`: its length.
    fn write_echo_reply(
        &self,
        reply: &Icmpv4Repr<'_>,
        dst_mac: EthernetAddress,
        dst_ip: Ipv4Address,
        out: &mut [u8],
    ) -> Result<usize, WireError> {
        let icmp_len = reply.buffer_len();
        let ip = Ipv4Repr {
            src: self.ip,
            dst: dst_ip,
            dscp: 0,
            ecn: Ecn::NotEct,
            ttl: REPLY_TTL,
            ident: 0,
            protocol: icmp::PROTO_ICMP,
            payload_len: u16::try_from(icmp_len)
                .map_err(|_| WireError::FieldRange("ICMP length"))?,
        };
        let eth = EthernetRepr {
            src: self.mac,
            dst: dst_mac,
            ethertype: EtherType::Ipv4,
        };
        let mut n = eth.emit(out)?;
        n += ip.emit(out.get_mut(n..).unwrap_or_default())?;
        n += reply.emit(out.get_mut(n..).unwrap_or_default())?;
        if n < MIN_FRAME && out.len() >= MIN_FRAME {
            out[n..MIN_FRAME].fill(0);
            n = MIN_FRAME;
        }
        Ok(n)
    }
}

/// Whether `frame` is IPv4 to UDP port 4791 (RoCEv2): what the engine's RX
/// path takes; everything else goes to the control plane.
pub fn is_rocev2(f: &[u8]) -> bool {
    const L3: usize = ethernet::HEADER_LEN;
    f.len() >= L3 + 20 + 8 && f[12..14] == [0x08, 0x00] && f[L3] >> 4 == 4 && f[L3 + 9] == 17 && {
        let ihl = usize::from(f[L3] & 0xF) * 4;
        f.len() >= L3 + ihl + 8
            && f[L3 + ihl + 2..L3 + ihl + 4] == rdma::wire::ROCEV2_UDP_PORT.to_be_bytes()
    }
}

/// Whether `frame` is IPv4 but shorter than its own header or its IPv4
/// total length says: a truncated frame, counted as malformed rather than
/// as "not RoCE", since it cannot be told apart from a cut RoCEv2 frame.
pub fn is_truncated_ipv4(f: &[u8]) -> bool {
    const L3: usize = ethernet::HEADER_LEN;
    if f.len() < L3 || f[12..14] != [0x08, 0x00] {
        return false;
    }
    if f.len() < L3 + 20 {
        return true;
    }
    let ihl = usize::from(f[L3] & 0xF) * 4;
    let total = usize::from(u16::from_be_bytes([f[L3 + 2], f[L3 + 3]]));
    f.len() < L3 + ihl.max(20) || f.len() < L3 + total
}

#[cfg(test)]
mod tests;
