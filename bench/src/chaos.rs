//! What the chaos soak (`roce-soak`) and the fault tests share: a seeded
//! byte pattern every receiver can check by offset, two NICs joined through
//! the impairment stage ([`nic::impair`]), and the process's memory census
//! (RSS and every mempool's in-use count).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dpdk::{Eal, Mempool, Port};
use nic::impair::{run as impair, ImpairCounters, ImpairedPath, Impairment};
use nic::verbs::{Device, DeviceConfig, VerbsError};

/// The seed of message `seq` of QP `qp`: every message has its own, so a
/// message that lands in another's slot, or a stale one, fails the check.
pub fn message_seed(qp: u32, seq: u64) -> u64 {
    splitmix(((qp as u64) << 40) ^ seq ^ 0x5EED_0000_0000_0000)
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern's 8 bytes at word `w` (offsets `8w .. 8w+8`).
fn word(seed: u64, w: usize) -> [u8; 8] {
    splitmix(seed ^ (w as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes()
}

/// Fills `out` with the pattern of `seed` (byte `o` depends on seed and `o`).
pub fn pattern_fill(seed: u64, out: &mut [u8]) {
    for (w, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&word(seed, w)[..chunk.len()]);
    }
}

/// The first offset where `data` differs from the pattern of `seed`.
pub fn pattern_mismatch(seed: u64, data: &[u8]) -> Option<usize> {
    for (w, chunk) in data.chunks(8).enumerate() {
        let want = word(seed, w);
        if chunk != &want[..chunk.len()] {
            let i = chunk
                .iter()
                .zip(want)
                .position(|(a, b)| *a != b)
                .unwrap_or(0);
            return Some(w * 8 + i);
        }
    }
    None
}

/// This process's resident set size, bytes (`VmRSS` of /proc/self/status).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Mbufs in use over every mempool of the process.
pub fn mbufs_in_use(eal: &Eal) -> u64 {
    dpdk::census::mempools(eal)
        .iter()
        .map(|p| u64::from(p.in_use))
        .sum()
}

/// Two NICs, A and B, on one poll thread, joined by two ring pairs through
/// the impairment stage on a thread of its own:
/// `A <-ring-> stage <-ring-> B`.
pub struct ImpairedLink {
    /// The first NIC.
    pub a: Device,
    /// The second NIC.
    pub b: Device,
    /// What the stage did.
    pub counters: Arc<ImpairCounters>,
    stop: Arc<AtomicBool>,
    stage: Option<JoinHandle<()>>,
}

impl ImpairedLink {
    /// Opens A and B (configs `ca`, `cb`) and starts the stage with `imp`;
    /// `name` keeps the rings and pool of several links apart.
    pub fn open(
        eal: &'static Eal,
        name: &str,
        imp: Impairment,
        ca: DeviceConfig,
        cb: DeviceConfig,
    ) -> Result<ImpairedLink, VerbsError> {
        let (pa, mut m1) = Port::ring_pair(eal, &format!("{name}a"), 4096)?;
        let (mut m2, pb) = Port::ring_pair(eal, &format!("{name}b"), 4096)?;
        let pool = Mempool::new(
            eal,
            &format!("{name}_stage"),
            16383,
            64,
            Mempool::DEFAULT_DATA_ROOM,
        )?;
        let (r1, t1) = m1.configure_single(&pool)?;
        let (r2, t2) = m2.configure_single(&pool)?;
        let counters = Arc::new(ImpairCounters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (counters.clone(), stop.clone());
        let stage = std::thread::Builder::new()
            .name("impair".into())
            .spawn(move || {
                // The ports live as long as the stage.
                let _ports = (m1, m2);
                let mut paths = [ImpairedPath::new(r1, t2), ImpairedPath::new(r2, t1)];
                impair(&mut paths, &imp, &pool, &c, &s);
            })
            .map_err(|source| VerbsError::Thread {
                what: "impairment stage",
                source,
            })?;
        let mut devs = Device::open_group(eal, vec![(pa, ca), (pb, cb)], None)?;
        let b = devs.pop().expect("two devices");
        let a = devs.pop().expect("two devices");
        Ok(ImpairedLink {
            a,
            b,
            counters,
            stop,
            stage: Some(stage),
        })
    }

    /// Stops the stage (frames in flight are freed) and closes both NICs.
    pub fn close(mut self) {
        self.stop_stage();
    }

    fn stop_stage(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.stage.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ImpairedLink {
    fn drop(&mut self) {
        self.stop_stage();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_seed_and_offset() {
        let mut a = vec![0u8; 1000];
        pattern_fill(message_seed(1, 7), &mut a);
        assert_eq!(pattern_mismatch(message_seed(1, 7), &a), None);
        // Another message's seed, or the same bytes one word off, fail.
        assert_eq!(pattern_mismatch(message_seed(1, 8), &a), Some(0));
        assert_eq!(pattern_mismatch(message_seed(2, 7), &a), Some(0));
        assert!(pattern_mismatch(message_seed(1, 7), &a[8..]).is_some());
        a[999] ^= 1;
        assert_eq!(pattern_mismatch(message_seed(1, 7), &a), Some(999));
    }

    #[test]
    fn rss_is_read() {
        assert!(rss_bytes() > 1 << 20);
    }
}
