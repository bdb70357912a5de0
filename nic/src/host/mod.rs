//! Host mode: a NIC on a port that the kernel shares (a `net_af_xdp` port
//! on the host's own interface, dpdk::af_xdp), as a hardware RoCE NIC's
//! driver shares its port with the host stack.
//!
//! There the kernel answers ARP for the interface's addresses (the XDP
//! program passes ARP and everything else that is not RoCEv2 to it) and
//! keeps the neighbour table, so the NIC does what an RDMA driver does at
//! address resolution (`rdma_resolve_addr`, `ib_addr.c`): it asks the
//! kernel for the route to the peer, then the neighbour entry of the next
//! hop, asks the kernel to resolve it when missing, and waits for it. The
//! NIC itself sends no ARP (no gratuitous one either) on such a port.
//!
//! Everything here is slow path, on the program's thread at `connect` /
//! `modify_qp` time: one rtnetlink socket per resolution (crate::sys),
//! messages built and parsed by the pure [`netlink`] module. The engine's
//! poll loop never calls into it.

pub mod netlink;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netlink::{Message, Neigh, Route};

use crate::sys::NetlinkSocket;

/// How long a resolution through the kernel may take: the kernel's own
/// ARP gives up after 3 probes 1 s apart (`mcast_solicit`,
/// `retrans_time_ms`), so this leaves it time to finish.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the neighbour entry is read while the kernel resolves it.
const POLL: Duration = Duration::from_millis(10);

/// A kernel interface a NIC shares (host mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelIface {
    /// The interface name.
    pub name: String,
    /// Its index.
    pub ifindex: u32,
}

/// What can go wrong in host mode.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No such interface in this network namespace.
    #[error("no network interface {0:?} in this network namespace")]
    NoInterface(String),
    /// The interface has no IPv4 address to take.
    #[error("interface {0:?} has no IPv4 address (add one with `ip addr add`, or give --ip)")]
    NoIpv4(String),
    /// The rtnetlink socket failed.
    #[error("rtnetlink: {0}")]
    Netlink(#[from] std::io::Error),
    /// The kernel sent what we could not parse.
    #[error("rtnetlink: {0}")]
    Parse(#[from] netlink::ParseError),
    /// The kernel refused a request.
    #[error("rtnetlink {what}: {err}")]
    Kernel {
        /// The request.
        what: &'static str,
        /// The kernel's error.
        err: std::io::Error,
    },
    /// The kernel has no route to the peer.
    #[error("no route to {0}")]
    NoRoute(std::net::Ipv4Addr),
    /// The peer is this host.
    #[error("{0} is an address of this host")]
    Local(std::net::Ipv4Addr),
    /// The route to the peer leaves through another interface.
    #[error("{peer} is routed through interface index {oif}, not {iface:?} (the NIC's)")]
    OtherInterface {
        /// The peer.
        peer: std::net::Ipv4Addr,
        /// The route's interface index.
        oif: u32,
        /// The NIC's interface.
        iface: String,
    },
    /// The kernel could not resolve the next hop.
    #[error("the kernel could not resolve {hop} on {iface:?} (neighbour state {state}) within {waited_ms} ms")]
    Unresolved {
        /// The next hop (the peer, or the gateway towards it).
        hop: std::net::Ipv4Addr,
        /// The interface.
        iface: String,
        /// The last neighbour state seen (`NUD_*` name).
        state: &'static str,
        /// How long we waited.
        waited_ms: u128,
    },
}

impl KernelIface {
    /// The interface `name` of this network namespace.
    pub fn new(name: &str) -> Result<KernelIface, HostError> {
        match dpdk::af_xdp::ifindex(name) {
            0 => Err(HostError::NoInterface(name.into())),
            ifindex => Ok(KernelIface {
                name: name.into(),
                ifindex,
            }),
        }
    }

    /// The interface's first IPv4 address (its primary), from the kernel
    /// (`RTM_GETADDR`).
    pub fn ipv4(&self) -> Result<[u8; 4], HostError> {
        let nl = Netlink::open()?;
        let seq = nl.next_seq();
        nl.sock.send(&netlink::addr_dump(seq))?;
        let mut found = None;
        nl.read_until(seq, |m| match m {
            Message::Addr { addr, .. } => {
                if addr.family == netlink::AF_INET && addr.ifindex == self.ifindex {
                    found = found.or(addr.local.or(addr.address));
                }
                Ok(false)
            }
            Message::Done { .. } => Ok(true),
            Message::Error { errno, .. } if errno != 0 => Err(kernel("RTM_GETADDR", errno)),
            _ => Ok(false),
        })?;
        found.ok_or_else(|| HostError::NoIpv4(self.name.clone()))
    }

    /// The MAC of the next hop towards `peer` from the kernel's neighbour
    /// table, asking the kernel to resolve it when it is missing or failed,
    /// and waiting up to `timeout` (see the module docs).
    pub fn resolve(&self, peer: [u8; 4], timeout: Duration) -> Result<[u8; 6], HostError> {
        let nl = Netlink::open()?;
        let peer_ip = std::net::Ipv4Addr::from(peer);
        let route = nl.route(peer)?;
        const RTN_LOCAL: u8 = 2;
        if route.kind == RTN_LOCAL {
            return Err(HostError::Local(peer_ip));
        }
        match route.oif {
            Some(oif) if oif == self.ifindex => {}
            Some(oif) => {
                return Err(HostError::OtherInterface {
                    peer: peer_ip,
                    oif,
                    iface: self.name.clone(),
                })
            }
            None => return Err(HostError::NoRoute(peer_ip)),
        }
        let hop = route.gateway.unwrap_or(peer);
        let start = Instant::now();
        let mut asked = false;
        let mut seen_incomplete = false;
        loop {
            let entry = nl.neigh(self.ifindex, hop)?;
            let state = entry.map_or(0, |n| n.state);
            if let Some(mac) = entry
                .filter(|n| n.state & netlink::nud::VALID != 0)
                .and_then(|n| n.lladdr)
            {
                // A stale entry is used as the kernel would, and the kernel
                // is asked to confirm it (STALE -> DELAY -> PROBE).
                if state & netlink::nud::STALE != 0 {
                    let _ = nl.use_neigh(self.ifindex, hop);
                }
                tracing::debug!(peer = %peer_ip, hop = %std::net::Ipv4Addr::from(hop), "resolved through the kernel");
                return Ok(mac);
            }
            seen_incomplete |= state & netlink::nud::INCOMPLETE != 0;
            let failed = state & netlink::nud::FAILED != 0;
            if (failed && seen_incomplete) || start.elapsed() >= timeout {
                return Err(HostError::Unresolved {
                    hop: hop.into(),
                    iface: self.name.clone(),
                    state: state_name(state, entry.is_some()),
                    waited_ms: start.elapsed().as_millis(),
                });
            }
            if !asked || (failed && !seen_incomplete) {
                asked = true;
                if nl.use_neigh(self.ifindex, hop).is_err() {
                    // Without the right to change the table: a datagram
                    // to the discard port makes the kernel resolve too.
                    poke_udp(hop);
                }
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The `NUD_*` name of a state.
fn state_name(state: u16, exists: bool) -> &'static str {
    use netlink::nud::*;
    match state {
        _ if !exists => "none (no entry)",
        INCOMPLETE => "INCOMPLETE",
        FAILED => "FAILED",
        REACHABLE => "REACHABLE",
        STALE => "STALE",
        DELAY => "DELAY",
        PROBE => "PROBE",
        NOARP => "NOARP",
        PERMANENT => "PERMANENT",
        0 => "NONE",
        _ => "other",
    }
}

/// Sends an empty UDP datagram to `ip`'s discard port (9), which makes the
/// kernel resolve the next hop as for any packet (best effort).
fn poke_udp(ip: [u8; 4]) {
    if let Ok(s) = std::net::UdpSocket::bind(("0.0.0.0", 0)) {
        let _ = s.send_to(&[], (std::net::Ipv4Addr::from(ip), 9));
    }
}

fn kernel(what: &'static str, errno: i32) -> HostError {
    HostError::Kernel {
        what,
        err: std::io::Error::from_raw_os_error(-errno),
    }
}

/// One rtnetlink socket and the requests of a resolution.
struct Netlink {
    sock: NetlinkSocket,
}

impl Netlink {
    fn open() -> Result<Netlink, HostError> {
        Ok(Netlink {
            sock: NetlinkSocket::open(Duration::from_secs(1))?,
        })
    }

    fn next_seq(&self) -> u32 {
        static SEQ: AtomicU32 = AtomicU32::new(1);
        SEQ.fetch_add(1, Ordering::Relaxed)
    }

    /// Reads datagrams, handing each message of sequence `seq` to `f`,
    /// until `f` says done.
    fn read_until(
        &self,
        seq: u32,
        mut f: impl FnMut(Message) -> Result<bool, HostError>,
    ) -> Result<(), HostError> {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = self.sock.recv(&mut buf)?;
            for m in netlink::parse(&buf[..n])? {
                if seq_of(&m) == seq && f(m)? {
                    return Ok(());
                }
            }
        }
    }

    /// The kernel's route to `ip` (`RTM_GETROUTE`).
    fn route(&self, ip: [u8; 4]) -> Result<Route, HostError> {
        let seq = self.next_seq();
        self.sock.send(&netlink::route_get(seq, ip))?;
        let mut route = None;
        self.read_until(seq, |m| match m {
            Message::Route { route: r, .. } => {
                route = Some(r);
                Ok(true)
            }
            Message::Error { errno, .. } if errno != 0 => Err(HostError::NoRoute(ip.into())),
            _ => Ok(false),
        })?;
        route.ok_or_else(|| HostError::NoRoute(ip.into()))
    }

    /// The neighbour entry of `ip` on `ifindex`, if any (`RTM_GETNEIGH`).
    fn neigh(&self, ifindex: u32, ip: [u8; 4]) -> Result<Option<Neigh>, HostError> {
        let seq = self.next_seq();
        self.sock.send(&netlink::neigh_get(seq, ifindex, ip))?;
        let mut found = None;
        self.read_until(seq, |m| match m {
            Message::Neigh { neigh, .. } => {
                found = Some(neigh);
                Ok(true)
            }
            Message::Error { errno, .. } if errno == -libc::ENOENT => Ok(true),
            Message::Error { errno, .. } if errno != 0 => Err(kernel("RTM_GETNEIGH", errno)),
            _ => Ok(false),
        })?;
        Ok(found)
    }

    /// Asks the kernel to resolve `ip` on `ifindex` (`RTM_NEWNEIGH`,
    /// `NTF_USE`); needs CAP_NET_ADMIN.
    fn use_neigh(&self, ifindex: u32, ip: [u8; 4]) -> Result<(), HostError> {
        let seq = self.next_seq();
        self.sock.send(&netlink::neigh_use(seq, ifindex, ip))?;
        self.read_until(seq, |m| match m {
            Message::Error { errno: 0, .. } => Ok(true),
            Message::Error { errno, .. } => Err(kernel("RTM_NEWNEIGH", errno)),
            _ => Ok(false),
        })
    }
}

fn seq_of(m: &Message) -> u32 {
    match *m {
        Message::Error { seq, .. }
        | Message::Done { seq }
        | Message::Neigh { seq, .. }
        | Message::Addr { seq, .. }
        | Message::Route { seq, .. }
        | Message::Other { seq, .. } => seq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_interface_is_named() {
        let e = KernelIface::new("xd-none-here").unwrap_err().to_string();
        assert!(e.contains("xd-none-here"), "{e}");
    }

    #[test]
    fn loopback_is_found_and_has_127_0_0_1() {
        // Every network namespace has `lo` with 127.0.0.1.
        let lo = KernelIface::new("lo").unwrap();
        assert_eq!(lo.ipv4().unwrap(), [127, 0, 0, 1]);
        // A peer on lo is this host: refused, not resolved.
        assert!(matches!(
            lo.resolve([127, 0, 0, 1], Duration::from_millis(100)),
            Err(HostError::Local(_))
        ));
    }

    #[test]
    fn state_names() {
        assert_eq!(state_name(netlink::nud::FAILED, true), "FAILED");
        assert_eq!(state_name(0, false), "none (no entry)");
    }
}
