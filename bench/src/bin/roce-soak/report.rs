//! What roce-soak prints: a progress line while it runs, then per CC what was done,
//! what the stage and the NICs counted and the memory census; and the check that
//! every impairment asked for really happened (else the run proved nothing).

use rdma::transport::LossRecovery;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cc::CcKind;

use super::{Census, Opts, Rig, SoakError, Totals};

fn ld(x: &AtomicU64) -> u64 {
    x.load(Ordering::Relaxed)
}

/// One progress line at `t` into the run.
pub(super) fn progress(t: Duration, totals: &Totals, rss: u64, mbufs: u64, rig: &Rig) {
    let c = &rig.link.counters;
    println!(
        "{:>5.0} s  msgs {:>9}  MiB {:>8.1}  RSS {:>6.1} MiB  mbufs {:>6}  QPs {}  stage: dropped {} dup {} reordered {} corrupted {}",
        t.as_secs_f64(),
        totals.msgs,
        totals.bytes as f64 / 1048576.0,
        rss as f64 / 1048576.0,
        mbufs,
        rig.qp_count(),
        ld(&c.dropped),
        ld(&c.duplicated),
        ld(&c.reordered),
        ld(&c.corrupted),
    );
}

/// The summary of a passed run of `secs` seconds.
pub(super) fn print(ccs: &[CcKind], rig: &Rig, census: &Census, totals: &Totals, secs: f64) {
    let (ca, cb) = (rig.link.a().counters(), rig.link.b().counters());
    let c = &rig.link.counters;
    println!("\ncc        msgs    WRITE_IMM   SEND_IMM       READ        MiB");
    for &cc in ccs {
        let (mut m, mut d, mut b) = (0, [0u64; 3], 0);
        for f in rig.flows.iter().filter(|f| f.cc == cc) {
            m += f.done.iter().sum::<u64>();
            for (dk, fk) in d.iter_mut().zip(f.done) {
                *dk += fk;
            }
            b += f.bytes;
        }
        println!(
            "{:<8} {:>6} {:>12} {:>10} {:>10} {:>10.1}",
            cc.to_string(),
            m,
            d[0],
            d[1],
            d[2],
            b as f64 / 1048576.0
        );
    }
    for mode in [LossRecovery::Gbn, LossRecovery::Sr] {
        let fl = || rig.flows.iter().filter(|f| f.mode == mode);
        if fl().next().is_some() {
            let m: u64 = fl().map(|f| f.done.iter().sum::<u64>()).sum();
            let b: u64 = fl().map(|f| f.bytes).sum();
            println!(
                "{:<8} {:>6} {:>45.1}  (loss recovery, {} QP pairs)",
                mode.to_string(),
                m,
                b as f64 / 1048576.0,
                fl().count()
            );
        }
    }
    println!(
        "stage: forwarded {} dropped {} duplicated {} reordered {} corrupted {}",
        ld(&c.forwarded),
        ld(&c.dropped),
        ld(&c.duplicated),
        ld(&c.reordered),
        ld(&c.corrupted)
    );
    for (name, k) in [("A", &ca), ("B", &cb)] {
        println!(
            "NIC {name}: retransmits {} timeouts {} duplicates {} out-of-sequence {} ICRC drops {} malformed {} not-RoCE {} unknown-QP {} seq NAKs {}",
            k.retransmits,
            k.timeouts,
            k.rx_duplicates,
            k.rx_out_of_sequence,
            k.rx_drop_icrc,
            k.rx_drop_malformed,
            k.rx_drop_not_roce,
            k.rx_drop_unknown_qp,
            k.tx_seq_naks
        );
    }
    println!(
        "memory: RSS warm-up max {:.1} MiB, after {:.1} MiB; mbufs in use warm-up max {}, after {}; QPs {} throughout",
        census.warm_rss as f64 / 1048576.0,
        census.peak_rss as f64 / 1048576.0,
        census.warm_mbufs,
        census.peak_mbufs,
        rig.qp_count()
    );
    println!(
        "roce-soak: PASS: {} messages, {:.1} MiB in {:.0} s, every byte checked, none lost or delivered twice",
        totals.msgs,
        totals.bytes as f64 / 1048576.0,
        secs
    );
}

/// Every impairment asked for happened at least once, and a corrupted frame was
/// caught by the ICRC.
pub(super) fn check_impairments(o: &Opts, rig: &Rig) -> Result<(), SoakError> {
    let c = &rig.link.counters;
    let impaired = [
        (o.loss, ld(&c.dropped), "dropped a frame"),
        (o.dup, ld(&c.duplicated), "duplicated a frame"),
        (o.reorder, ld(&c.reordered), "reordered a frame"),
        (o.corrupt, ld(&c.corrupted), "corrupted a frame"),
    ];
    for (p, n, what) in impaired {
        if p > 0.0 && n == 0 {
            return Err(SoakError::Untested(what));
        }
    }
    let (ca, cb) = (rig.link.a().counters(), rig.link.b().counters());
    if o.corrupt > 0.0 && ca.rx_drop_icrc + cb.rx_drop_icrc == 0 {
        return Err(SoakError::Untested(
            "had a corrupted frame caught by the ICRC",
        ));
    }
    Ok(())
}
