//! End-to-end checks of the pure NIC helpers through their public API:
//! the capture ring + writer thread + pcapng file read back by tshark (an
//! independent decoder, docs/design.md §8), and the connection exchange over real
//! TCP on 127.0.0.1.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::time::Duration;

use nic::exchange::{check_compatible, connect, serve, CcName, ConnInfo};
use nic::pcapng::{capture_ring, spawn_writer, Interface, PcapngWriter};

#[test]
fn capture_ring_to_pcapng_read_by_tshark() {
    let path = std::env::temp_dir().join(format!("nic-pure-capture-{}.pcapng", std::process::id()));
    let file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let ifs = [
        Interface {
            name: "port0".into(),
            snaplen: 96,
        },
        Interface {
            name: "port1".into(),
            snaplen: 96,
        },
    ];
    let writer = PcapngWriter::new(file, &ifs).unwrap();
    let (mut prod, cons) = capture_ring::<96>(1024);
    let th = spawn_writer(cons, writer).unwrap();
    let base = 1_650_000_000_000_000_000u64;
    let mut frame = [0u8; 1500];
    frame[12] = 0x08;
    for i in 0..50u64 {
        let len = 60 + (i as usize * 29) % 1400;
        assert!(prod.capture((i % 2) as u32, base + i * 1_001, &frame[..len]));
    }
    assert_eq!((prod.captured(), prod.drops()), (50, 0));
    drop(prod);
    let w = th.join().unwrap().unwrap();
    assert_eq!(w.packets(), 50);
    w.into_inner().unwrap();

    let out = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["-T", "fields", "-e", "frame.len", "-e", "frame.cap_len"])
        .args(["-e", "frame.time_epoch", "-e", "frame.interface_id"])
        .output()
        .expect("tshark must be installed");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(rows.len(), 50);
    for (i, r) in rows.iter().enumerate() {
        let len = 60 + (i * 29) % 1400;
        assert_eq!(r[0], len.to_string(), "frame.len of {i}");
        assert_eq!(r[1], len.min(96).to_string(), "frame.cap_len of {i}");
        let ts = base + i as u64 * 1_001;
        let want = format!("{}.{:09}", ts / 1_000_000_000, ts % 1_000_000_000);
        assert_eq!(r[2], want, "ns timestamp of {i}");
        assert_eq!(r[3], (i % 2).to_string());
    }
}

fn info(test: &str, qpn: u32) -> ConnInfo {
    ConnInfo {
        qpn,
        psn: 0x123456,
        ip: Ipv4Addr::new(192, 168, 7, 1),
        mac: [2, 0, 0, 0, 0, qpn as u8],
        rkey: 0xdead_beef,
        va: 0x7f12_3456_7000,
        len: 65_536,
        mtu: 1024,
        cc: CcName::Ldcp,
        ext: vec!["cc".into()],
        udp_sport: 50_000,
        test: test.into(),
    }
}

#[test]
fn exchange_and_mismatch_over_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let srv = std::thread::spawn(move || {
        let local = info("write_lat", 1);
        let (remote, _) = serve(&l, &local, Duration::from_secs(5)).unwrap();
        check_compatible(&local, &remote).map(|_| remote)
    });
    let local = info("read_lat", 2);
    let remote = connect(addr, &local, Duration::from_secs(5)).unwrap();
    assert_eq!(remote, info("write_lat", 1));
    let e = check_compatible(&remote, &local).unwrap_err().to_string();
    assert_eq!(e, "server runs write_lat, client asked for read_lat");
    assert_eq!(srv.join().unwrap().unwrap_err().to_string(), e);
}
