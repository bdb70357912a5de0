//! The switch between two Linux TAP interfaces (`net_tap` PMD): a RoCEv2 RDMA WRITE
//! with an INT-MD container (docs/wire.md; docs/design.md §4) written into one TAP by
//! an AF_PACKET socket on the Linux side comes out of the other TAP with exactly one
//! more hop record (this switch's switch_ID and the egress port_ID), the MACs and TTL
//! rewritten, and an ICRC that still verifies (it is computed as if the container were
//! absent, rdma::wire::icrc). When scapy is installed the stripped frame is also
//! checked by scapy's RoCE ICRC (an implementation no one here wrote, docs/design.md
//! §8).
//!
//! Needs root (TAP devices): fails with a clear message otherwise (docs/design.md §8).

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{lcore, Eal, Mbuf, Mempool, Port, TscClock};
use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
use rdma::wire::int::IntRepr;
use rdma::wire::{parse_frame, BthRepr, Ecn, FrameBuilder, Opcode, ParseOptions, RethRepr};
use switch::dataplane::{Dataplane, PortIo, StatsSink};
use switch::{Config, PortCounters, Switch};

const IF0: &str = "rswtap0";
const IF1: &str = "rswtap1";

/// A raw AF_PACKET socket bound to one interface (all EtherTypes), 100 ms receive
/// timeout: the Linux side of a TAP.
struct RawSock {
    fd: i32,
    ifindex: i32,
}

impl RawSock {
    fn open(ifname: &str) -> std::io::Result<RawSock> {
        let name = std::ffi::CString::new(ifname).expect("name");
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket calls with valid, initialised arguments.
        unsafe {
            let ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            if ifindex == 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto));
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex;
            let rc = libc::bind(
                fd,
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                libc::close(fd);
                return Err(e);
            }
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: 100_000,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
            Ok(RawSock { fd, ifindex })
        }
    }

    fn send(&self, frame: &[u8]) -> std::io::Result<()> {
        // SAFETY: valid fd and buffer.
        let rc = unsafe {
            libc::send(
                self.fd,
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let _ = self.ifindex;
        Ok(())
    }

    /// One frame, or None after the receive timeout.
    fn recv(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 9216];
        // SAFETY: valid fd and buffer.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        buf.truncate(n as usize);
        Some(buf)
    }
}

impl Drop for RawSock {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.fd) };
    }
}

struct Quiet;
impl StatsSink for Quiet {
    fn report(&mut self, _: &Switch<Mbuf>, _: &[u16], _: &[PortCounters], _: u64) {}
}

/// RDMA WRITE Only (RETH, 64-byte payload) 10.0.0.1 -> 10.0.1.2 with an INT container
/// that already holds one hop record from an upstream switch (switch_ID 0x77), room for
/// 8 hops, DSCP 0x18 (docs/wire.md).
fn frame_with_one_hop() -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            dscp: 3,
            ..NetHeaders::new(
                [0x02, 0, 0, 0, 0, 0x01],
                [0x02, 0, 0, 0, 1, 0x00],
                [10, 0, 0, 1],
                [10, 0, 1, 2],
                0xC123,
            )
        },
        int: Some(IntInsert {
            int_dscp: 0x18,
            max_hops: 8,
        }),
    };
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x33, 77));
    p.reth = Some(RethRepr {
        va: 0x2000,
        rkey: 0x99,
        dma_len: 64,
    });
    let data: Vec<u8> = (0..64u8).collect();
    let mut buf = vec![0u8; 512];
    let n = fb.emit_frame(&p, &data, Ecn::Ect0, &mut buf).expect("emit");
    buf.truncate(n);
    // An upstream hop: push one record the same way a switch would (headers move into
    // front room; the ICRC does not cover the container).
    let mut room = vec![0u8; 16];
    room.extend_from_slice(&buf);
    let len = buf.len();
    let hop = rdma::wire::HopRecord::from_units(0x77, 3, 1000, 2000, 0, 25_000_000_000);
    rdma::wire::int::push_hop_front(&mut room, 16, len, 14, 0x18, &hop).expect("push");
    room
}

fn sh(cmd: &str, args: &[&str]) {
    let _ = Command::new(cmd).args(args).stderr(Stdio::null()).status();
}

/// Asks scapy (if installed) to check the ICRC of `stripped` (a RoCEv2 frame without
/// INT container, DSCP restored). Returns None when scapy is missing.
fn scapy_icrc_ok(stripped: &[u8]) -> Option<bool> {
    let script = r#"
import sys
from scapy.all import Ether
from scapy.contrib.roce import BTH
p = Ether(bytes.fromhex(sys.stdin.read().strip()))
want = p[BTH].icrc
p2 = Ether(bytes(p))
p2[BTH].icrc = None
got = Ether(bytes(p2))[BTH].icrc
print("ok" if got == want else "bad %08x %08x" % (got, want))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let hex: String = stripped.iter().map(|b| format!("{b:02x}")).collect();
    child.stdin.take()?.write_all(hex.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    if !out.status.success() {
        eprintln!(
            "scapy unavailable: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim() == "ok")
}

#[test]
fn dpdk_tap_int_hop_pushed_between_linux_taps() {
    Eal::require_root("TAP ports");
    let eal = Eal::for_tests();
    let pool = Mempool::new(eal, "tap_sw", 4095, 64, Mempool::DEFAULT_DATA_ROOM).expect("pool");
    let mut p0 = Port::open(eal, &format!("net_tap_rsw0,iface={IF0}")).expect("tap 0");
    let mut p1 = Port::open(eal, &format!("net_tap_rsw1,iface={IF1}")).expect("tap 1");
    let (rx0, tx0) = p0.configure_single(&pool).expect("cfg 0");
    let (rx1, tx1) = p1.configure_single(&pool).expect("cfg 1");
    for i in [IF0, IF1] {
        sh("ip", &["link", "set", i, "up"]);
        sh(
            "sysctl",
            &["-qw", &format!("net.ipv6.conf.{i}.disable_ipv6=1")],
        );
    }
    let (id0, id1) = (p0.id(), p1.id());
    let cfg = Config::from_toml_str(&format!(
        r#"
switch_id = 0x5A
[defaults]
speed = "10Gbps"
[[port]]
id = {id0}
mac = "02:00:00:00:01:00"
[[port]]
id = {id1}
mac = "02:00:00:00:01:01"
[[route]]
prefix = "10.0.1.0/24"
port = {id1}
next_hop_mac = "02:00:00:00:00:02"
"#
    ))
    .expect("toml");
    let sw: Switch<Mbuf> = Switch::from_config(&cfg).expect("config");
    let mut dp = Dataplane::new(
        sw,
        vec![PortIo::new(id0, rx0, tx0), PortIo::new(id1, rx1, tx1)],
        TscClock::new(eal),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let worker = lcore::spawn_pinned(eal, "tap-sw", None, move || {
        dp.run(&s2, 0, &mut Quiet);
        dp
    })
    .expect("spawn");

    let tx_sock = RawSock::open(IF0).expect("AF_PACKET on tap 0");
    let rx_sock = RawSock::open(IF1).expect("AF_PACKET on tap 1");
    let sent = frame_with_one_hop();
    let opts = ParseOptions::default();
    {
        let p = parse_frame(&sent, &opts, |_| false).expect("sent frame valid");
        assert_eq!(p.int.as_ref().map(|i| i.hop_count()), Some(1));
    }
    // Resend once per 200 ms until it shows up (the TAP may take a moment to come up).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = None;
    'outer: while Instant::now() < deadline {
        tx_sock.send(&sent).expect("send into tap 0");
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(200) {
            if let Some(f) = rx_sock.recv() {
                // Only our flow: IPv4/UDP 4791 to 10.0.1.2.
                if f.len() > 42 && f[12..14] == [0x08, 0x00] && f[36..38] == [0x12, 0xB7] {
                    got = Some(f);
                    break 'outer;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let dp = worker.join().expect("switch lcore");
    let got = got.unwrap_or_else(|| {
        panic!(
            "nothing came out of {IF1}: {:?} / {:?}",
            dp.switch.counters(id0),
            dp.switch.counters(id1)
        )
    });

    assert_eq!(got.len(), sent.len() + 16, "one 16-byte hop record more");
    let p = parse_frame(&got, &opts, |_| false).expect("forwarded frame parses, ICRC valid");
    assert_eq!(p.eth.dst.0, [0x02, 0, 0, 0, 0, 0x02]);
    assert_eq!(p.eth.src.0, [0x02, 0, 0, 0, 1, 0x01]);
    assert_eq!(p.ip.ttl, 63);
    assert_eq!(p.ip.dscp, 0x18);
    assert_eq!(p.bth.psn, 77);
    assert_eq!(p.payload, &(0..64u8).collect::<Vec<_>>()[..]);
    let int = p.int.as_ref().expect("container");
    assert_eq!(int.hop_count(), 2);
    let ours = int.hop(0).expect("newest hop first");
    assert_eq!(ours.switch_id, 0x5A);
    assert_eq!(ours.port_id, id1);
    assert_eq!(ours.link_100m, 100, "10 Gbit/s");
    let upstream = int.hop(1).expect("upstream hop");
    assert_eq!(upstream.switch_id, 0x77);
    assert_eq!(upstream.port_id, 3);
    assert_eq!(int.remaining_hop_cnt(), 6);
    let repr = IntRepr::parse(int).expect("container parses");
    let _ = repr;

    // Strip the container and let scapy recompute the ICRC over the plain frame.
    let mut buf = got.clone();
    let len = buf.len();
    let st = rdma::wire::int::strip_in_place(&mut buf, 0, len, 14, 0x18).expect("strip");
    let stripped = &buf[st.start..st.start + st.len];
    rdma::wire::verify_icrc(stripped, 14, 0).expect("ICRC of the stripped frame");
    if let Some(ok) = scapy_icrc_ok(stripped) {
        assert!(ok, "scapy disagrees with the ICRC");
        eprintln!("scapy recomputed the same ICRC");
    }
    let c = dp.switch.counters(id1).expect("port 1");
    assert!(c.int_pushed >= 1 && c.int_errors == 0, "{c:?}");
    drop(dp);
    drop((p0, p1));
}
