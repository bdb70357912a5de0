//! The TAP link goes down and comes back during a transfer (issue 14): two
//! NICs on DPDK `net_tap` ports (`rsnic-rel-a`, `rsnic-rel-b`, bridged by
//! the kernel in `rsnic-rel-br`), a 32 MiB WRITE, and `ip link set
//! rsnic-rel-a down` for 300 ms in the middle. The transfer recovers
//! byte-exact, or every WR ends with RetryExcErr / WrFlushErr within the
//! retry budget: never a hang, never wrong bytes. Needs root, as CI has.

use std::process::Command;
use std::time::{Duration, Instant};

use bench::chaos::{message_seed, pattern_fill, pattern_mismatch};
use dpdk::{Eal, Port};
use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::{Access, SendOp, SendWr, WcStatus};

const TAP_A: &str = "rsnic-rel-a";
const TAP_B: &str = "rsnic-rel-b";
const BRIDGE: &str = "rsnic-rel-br";

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?} failed (root needed)");
}

/// The kernel bridge between the two TAPs; removed on drop.
struct Bridge;

impl Bridge {
    fn up() -> Bridge {
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).status();
        ip(&[
            "link",
            "add",
            BRIDGE,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ]);
        for tap in [TAP_A, TAP_B] {
            // No IPv6 link-local traffic from the kernel into the NICs.
            let _ = Command::new("sysctl")
                .args(["-qw", &format!("net.ipv6.conf.{tap}.disable_ipv6=1")])
                .status();
            ip(&["link", "set", tap, "master", BRIDGE]);
            ip(&["link", "set", tap, "up"]);
        }
        ip(&["link", "set", BRIDGE, "up"]);
        Bridge
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", BRIDGE]).status();
    }
}

fn cfg(last: u8) -> DeviceConfig {
    let mut c = DeviceConfig::new([10, 0, 0, last]);
    c.mac = Some([0x02, 0x52, 0x52, 0, 0, last]);
    c.idle_yield = true;
    c
}

#[test]
fn tap_link_down_and_up_mid_transfer_recovers_or_errors_cleanly() {
    Eal::require_root("TAP ports and a kernel bridge");
    let eal = Eal::for_tests();
    let pa = Port::open(eal, &format!("net_tap_rsnicrel_a,iface={TAP_A}")).unwrap();
    let pb = Port::open(eal, &format!("net_tap_rsnicrel_b,iface={TAP_B}")).unwrap();
    let (la, lb) = (pa.link_watch(), pb.link_watch());
    let a = Device::open(eal, pa, cfg(1)).unwrap();
    let b = Device::open(eal, pb, cfg(2)).unwrap();
    let _bridge = Bridge::up();
    assert!(la.wait_up(Duration::from_secs(5)) && lb.wait_up(Duration::from_secs(5)));

    let opts = QpOptions {
        mtu: 1024,
        ..QpOptions::default()
    };
    let budget = Duration::from_nanos(opts.timeout_ns * (u64::from(opts.retry_cnt) + 1));
    let (len, msg) = (32 << 20, 64 << 10);
    let src = a.reg_mr(len, Access::LOCAL_WRITE).unwrap();
    let dst = b
        .reg_mr(len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    let mut cq = a.create_cq(256).unwrap();
    let cq_b = b.create_cq(256).unwrap();
    let mut qa = a.create_qp(&cq, &cq, opts).unwrap();
    let mut qb = b.create_qp(&cq_b, &cq_b, opts).unwrap();
    qa.connect(&qb.remote_info()).unwrap();
    qb.connect(&qa.remote_info()).unwrap();
    let seed = message_seed(0x7A, 0);
    let mut data = vec![0u8; len];
    pattern_fill(seed, &mut data);
    src.write(0, &data);

    let n = len / msg;
    let (mut posted, mut done, mut errors) = (0usize, 0usize, Vec::new());
    let mut flap = None;
    let mut last_wc = Instant::now();
    let end = Instant::now() + Duration::from_secs(120);
    while done < n && Instant::now() < end {
        while errors.is_empty() && posted < n && posted - done < 8 {
            let off = (posted * msg) as u64;
            let op = SendOp::Write {
                remote_va: dst.va() + off,
                rkey: dst.rkey(),
            };
            let wr = SendWr::signaled(posted as u64, op, src.sge(off, msg as u32));
            qa.post_send(wr).unwrap();
            posted += 1;
        }
        if let Some(wc) = cq.poll_one() {
            done += 1;
            last_wc = Instant::now();
            if wc.status != WcStatus::Success {
                errors.push(wc.status);
            }
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
        if flap.is_none() && done >= n / 4 {
            // The link flaps on another thread while this one keeps posting.
            flap = Some(std::thread::spawn(|| {
                ip(&["link", "set", TAP_A, "down"]);
                std::thread::sleep(Duration::from_millis(300));
                ip(&["link", "set", TAP_A, "up"]);
                Instant::now()
            }));
        }
        if !errors.is_empty() && done == posted {
            break;
        }
    }
    let flapped = flap.map(|t| t.join().expect("ip link set"));
    let c = a.counters();
    eprintln!(
        "link flap: {done} of {posted} posted WRs completed, errors {errors:?}; A retransmits {} timeouts {}",
        c.retransmits, c.timeouts
    );
    assert!(flapped.is_some(), "the transfer never got a quarter done");
    assert_eq!(done, posted, "WRs still outstanding: a hang");
    if errors.is_empty() {
        // Recovered: every byte is there.
        assert_eq!(done, n);
        let mut back = vec![0u8; len];
        dst.read(0, &mut back);
        assert_eq!(pattern_mismatch(seed, &back), None, "bytes differ");
        assert!(
            c.timeouts > 0 || c.retransmits > 0,
            "the flap cost nothing?"
        );
    } else {
        // Errored cleanly: the first is RetryExcErr, the rest flushed, and
        // within the retry budget of the link coming back.
        assert_eq!(errors[0], WcStatus::RetryExcErr, "{errors:?}");
        assert!(errors[1..].iter().all(|s| *s == WcStatus::WrFlushErr));
        assert!(last_wc - flapped.unwrap() <= budget + Duration::from_secs(2));
    }
    drop((qa, qb, cq, cq_b, src, dst));
    a.close();
    b.close();
}
