//! QP churn on real engines (a DPDK ring pair): 100k QPs created and
//! destroyed leave no slot, timer or list entry behind and no memory.
//!
//! This test has a file, and so a process, of its own: it measures the
//! process's resident set, which the other tests' pools and regions would
//! grow if they ran beside it.

mod support;

use std::time::{Duration, Instant};

use nic::verbs::{Device, DeviceConfig, QpOptions};
use rdma::transport::WcStatus;

use support::{qps_live, ALL};

/// Two devices on a ring pair whose engines yield when idle: two spinning
/// engines and the test thread on two cores would make every slow-path
/// round trip wait for a time slice.
fn pair() -> (Device, Device) {
    support::device_pair("churn", 1024, |c| DeviceConfig {
        pool_size: 4095,
        idle_yield: true,
        ..c
    })
}

/// Resident set size of this process, bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// 100k QPs created and destroyed one after the other (more than six
/// times the engine's 16384 slots, so a leaked slot fails the create),
/// one in 100 by `destroy_qp`, the others by dropping the handle, every 1000th one
/// connected and used for a WRITE first (timers, scheduler, lists): the
/// engine's QP count returns to what it was and the RSS stays flat.
#[test]
fn create_and_destroy_100k_qps_with_memory_flat() {
    // LIFECYCLE_QPS lowers the count on a loaded host, where each slow-path
    // round trip waits for a scheduler slice (keep it above 16384).
    let n: u32 = std::env::var("LIFECYCLE_QPS").map_or(100_000, |v| v.parse().unwrap());
    let (a, b) = pair();
    let (mut ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let src = a.reg_mr(4096, ALL).unwrap();
    let dst = b.reg_mr(4096, ALL).unwrap();
    let mut rss_warm = 0;
    let started = Instant::now();
    for k in 0..n {
        if k == n / 20 {
            rss_warm = rss();
        }
        if k % 1000 == 0 {
            let (mut qa, qb) = support::connect_qps(&a, &b, &ca, &cb, QpOptions::default());
            qa.post_send(support::write_wr(u64::from(k), &src, 0, &dst, 0, 64))
                .unwrap();
            let wc = ca.wait(Duration::from_secs(5)).expect("completion");
            assert_eq!((wc.wr_id, wc.status), (u64::from(k), WcStatus::Success));
            a.destroy_qp(qa).unwrap();
            drop(qb);
            continue;
        }
        let qp = a.create_qp(&ca, &ca, QpOptions::default()).unwrap();
        if k % 100 == 1 {
            a.destroy_qp(qp).unwrap();
        } else {
            // No reply to wait for: the next create's round trip comes after.
            drop(qp);
        }
    }
    let took = started.elapsed();
    assert_eq!(qps_live(&a, 0), 0, "every QP of A destroyed");
    assert_eq!(qps_live(&b, 0), 0, "every QP of B destroyed");
    let grown = rss().saturating_sub(rss_warm);
    eprintln!(
        "{n} QPs created and destroyed in {took:?}; RSS {} MiB, grew {} KiB after warm-up",
        rss() >> 20,
        grown >> 10
    );
    assert!(
        grown < 16 << 20,
        "RSS grew by {} KiB over {} QPs",
        grown >> 10,
        n - n / 20
    );
}
