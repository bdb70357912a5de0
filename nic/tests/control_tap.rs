//! The NIC on a Linux TAP (`net_tap` PMD), seen from the kernel's own
//! network stack (docs/design.md §5, §8): the kernel pings the NIC's IP, which
//! needs it to resolve the NIC's MAC by ARP first (no static neighbour
//! entry; `ip neigh` then shows the NIC's MAC as learnt), and the NIC
//! resolves the kernel's MAC by ARP in turn.
//!
//! The ping is an ICMP echo request sent through a raw IPv4 socket, so
//! the kernel routes it, resolves the next hop and builds the frame.
//! Needs root (TAP devices, raw sockets): fails with a clear message otherwise
//! (docs/design.md §8).
//! The TAP is `rsnic-ctl0` (another name with `RSNIC_CTL_TAP`), on
//! 10.213.77.0/24: the kernel side .1, the NIC .2.

use std::process::Command;
use std::time::{Duration, Instant};

use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig};
use rdma::wire::{Icmpv4Packet, Icmpv4Repr, Ipv4Packet, Ipv4Repr};

const KERNEL_IP: [u8; 4] = [10, 213, 77, 1];
const NIC_IP: [u8; 4] = [10, 213, 77, 2];

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A raw ICMP socket of the kernel's stack (closed on drop).
struct IcmpSocket(i32);

impl IcmpSocket {
    fn open() -> IcmpSocket {
        // SAFETY: plain socket calls with valid arguments.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: valid fd and option buffer.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        IcmpSocket(fd)
    }

    /// Sends `msg` (an ICMP message; the kernel adds the IP header) to `to`.
    fn send_to(&self, msg: &[u8], to: [u8; 4]) {
        // SAFETY: zeroed sockaddr_in is valid; fields set below.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as u16;
        sa.sin_addr.s_addr = u32::from_ne_bytes(to);
        // SAFETY: valid fd, buffer and address.
        let rc = unsafe {
            libc::sendto(
                self.0,
                msg.as_ptr() as *const libc::c_void,
                msg.len(),
                0,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        assert!(rc >= 0, "sendto: {}", std::io::Error::last_os_error());
    }

    /// One IPv4 packet (header included), or None after the timeout.
    fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        // SAFETY: valid fd and buffer.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        (n > 0).then(|| {
            buf.truncate(n as usize);
            buf
        })
    }
}

impl Drop for IcmpSocket {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.0) };
    }
}

/// Pings `to` once with (`ident`, `seq`): whether the echo reply came
/// back within a second.
fn ping(sock: &IcmpSocket, to: [u8; 4], ident: u16, seq: u16) -> bool {
    let data = *b"rsnic control plane ping";
    let req = Icmpv4Repr::EchoRequest {
        ident,
        seq_no: seq,
        data: &data,
    };
    let mut msg = [0u8; 64];
    let n = req.emit(&mut msg).unwrap();
    sock.send_to(&msg[..n], to);
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        let Some(pkt) = sock.recv() else { continue };
        // The raw socket sees every ICMP message of the host: keep ours.
        let Ok(ipp) = Ipv4Packet::new_checked(&pkt[..]) else {
            continue;
        };
        let Ok(iph) = Ipv4Repr::parse(&ipp) else {
            continue;
        };
        let Ok(icmp) = Icmpv4Packet::new_checked(ipp.payload()) else {
            continue;
        };
        if iph.src.0 == to
            && Icmpv4Repr::parse(&icmp)
                == Ok(Icmpv4Repr::EchoReply {
                    ident,
                    seq_no: seq,
                    data: &data,
                })
        {
            return true;
        }
    }
    false
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[test]
fn the_kernel_pings_the_nic_and_each_resolves_the_other_by_arp() {
    Eal::require_root("TAP ports and raw sockets");
    let tap = std::env::var("RSNIC_CTL_TAP").unwrap_or_else(|_| "rsnic-ctl0".into());
    let eal = Eal::for_tests();
    let port = Port::open(eal, &format!("net_tap_ctl,iface={tap}")).expect("TAP port");
    let mut cfg = DeviceConfig::new(NIC_IP);
    cfg.idle_yield = true;
    let dev = Device::open(eal, port, cfg).expect("device");
    ip(&["addr", "add", "10.213.77.1/24", "dev", &tap]);
    ip(&["link", "set", &tap, "up"]);
    ip(&["neigh", "flush", "dev", &tap]);
    assert!(
        !ip(&["neigh", "show", "dev", &tap]).contains("10.213.77.2"),
        "no neighbour entry for the NIC before the ping"
    );

    let sock = IcmpSocket::open();
    let ident = std::process::id() as u16;
    let answered = (1..=3)
        .filter(|&seq| ping(&sock, NIC_IP, ident, seq))
        .count();
    assert_eq!(
        answered,
        3,
        "echo replies; NIC counters:\n{}",
        dev.counters()
    );

    // The kernel learnt the NIC's MAC by ARP (not a static entry).
    let neigh = ip(&["neigh", "show", "10.213.77.2", "dev", &tap]);
    assert!(
        neigh.contains(&format!("lladdr {}", mac_text(dev.mac()))),
        "ip neigh: {neigh:?}, NIC MAC {}",
        mac_text(dev.mac())
    );
    assert!(!neigh.contains("PERMANENT"), "ip neigh: {neigh:?}");

    // And the NIC resolves the kernel's MAC by ARP.
    let kernel_mac = std::fs::read_to_string(format!("/sys/class/net/{tap}/address"))
        .expect("the TAP's MAC")
        .trim()
        .to_string();
    let resolved = dev.resolve_mac(KERNEL_IP).expect("the kernel answers ARP");
    assert_eq!(mac_text(resolved), kernel_mac);

    let c = dev.counters();
    assert!(c.rx_arp_requests >= 1 && c.tx_arp_replies >= 1, "{c}");
    assert!(
        c.rx_icmp_echo_requests >= 3 && c.tx_icmp_echo_replies >= 3,
        "{c}"
    );
    assert!(c.rx_drop_control == 0, "{c}");
    dev.close();
}
