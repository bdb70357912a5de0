//! What the chaos soak (`roce-soak`) and the fault tests share: a seeded
//! byte pattern every receiver can check by offset, two NICs joined through
//! the impairment stage ([`impair`](mod@impair)), and the process's memory census
//! (RSS and every mempool's in-use count).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dpdk::{Eal, Mempool, Port, RxQueue, TxQueue};
use impair::{run as impair, ImpairCounters, ImpairedPath, Impairment};
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

/// One side of the stage: a ring pair's far end and its queues.
struct End {
    _port: Port,
    rx: RxQueue,
    tx: TxQueue,
}

/// The stage's thread; it gives the ends back when stopped.
struct Stage {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(End, End)>,
}

impl Stage {
    fn start(
        imp: Impairment,
        burst: u32,
        pool: Arc<Mempool>,
        counters: Arc<ImpairCounters>,
        a: End,
        b: End,
    ) -> Result<Stage, VerbsError> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("impair".into())
            .spawn(move || {
                let mut paths = [ImpairedPath::new(a.rx, b.tx), ImpairedPath::new(b.rx, a.tx)];
                for p in &mut paths {
                    p.drop_burst = burst;
                }
                impair(&mut paths, &imp, &pool, &counters, &s);
                let [ab, ba] = paths;
                (
                    End {
                        _port: a._port,
                        rx: ab.rx,
                        tx: ba.tx,
                    },
                    End {
                        _port: b._port,
                        rx: ba.rx,
                        tx: ab.tx,
                    },
                )
            })
            .map_err(|source| VerbsError::Thread {
                what: "impairment stage",
                source,
            })?;
        Ok(Stage { stop, thread })
    }

    fn stop(self) -> (End, End) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the impairment stage panicked")
    }
}

/// Two NICs, A and B, joined by two ring pairs through the impairment
/// stage on a thread of its own: `A <-ring-> stage <-ring-> B`. B can be
/// killed (its engine stopped, its port closed: frames towards it queue up
/// and are lost) and restarted on a fresh ring with the same addresses.
pub struct ImpairedLink {
    a: Device,
    b: Option<Device>,
    /// What the stage did.
    pub counters: Arc<ImpairCounters>,
    imp: Impairment,
    burst: u32,
    pool: Arc<Mempool>,
    stage: Option<Stage>,
    name: String,
    restarts: u32,
}

impl ImpairedLink {
    /// Opens A and B (configs `ca`, `cb`) on one poll thread and starts the
    /// stage with `imp`; `name` keeps the rings and pools of links apart.
    pub fn open(
        eal: &'static Eal,
        name: &str,
        imp: Impairment,
        ca: DeviceConfig,
        cb: DeviceConfig,
    ) -> Result<ImpairedLink, VerbsError> {
        Self::open_bursty(eal, name, imp, 1, ca, cb)
    }

    /// [`Self::open`] with burst loss: each drop takes `burst` frames in a
    /// row on its direction (`impair::ImpairedPath::drop_burst`).
    pub fn open_bursty(
        eal: &'static Eal,
        name: &str,
        imp: Impairment,
        burst: u32,
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
        let stage = Stage::start(
            imp,
            burst,
            pool.clone(),
            counters.clone(),
            End {
                _port: m1,
                rx: r1,
                tx: t1,
            },
            End {
                _port: m2,
                rx: r2,
                tx: t2,
            },
        )?;
        let mut devs = Device::open_group(eal, vec![(pa, ca), (pb, cb)], None)?;
        let b = devs.pop().expect("two devices");
        let a = devs.pop().expect("two devices");
        Ok(ImpairedLink {
            a,
            b: Some(b),
            counters,
            imp,
            burst,
            pool,
            stage: Some(stage),
            name: name.to_owned(),
            restarts: 0,
        })
    }

    /// NIC A.
    pub fn a(&self) -> &Device {
        &self.a
    }

    /// NIC B (panics while it is killed).
    pub fn b(&self) -> &Device {
        self.b.as_ref().expect("B was killed and not restarted")
    }

    /// Kills B: its engine stops and its port closes, as a crashed host's
    /// NIC would; what A sends towards it is lost.
    pub fn kill_b(&mut self) {
        if let Some(b) = self.b.take() {
            b.close();
        }
    }

    /// Starts a new B with `cb` (the same addresses, or others) on a fresh
    /// ring behind the stage, its engine on a thread of its own. What was
    /// queued towards the old B is lost; what A sends from now on (the old
    /// QPs' retransmissions too) reaches the new one.
    pub fn restart_b(&mut self, eal: &'static Eal, cb: DeviceConfig) -> Result<(), VerbsError> {
        self.kill_b();
        let (a_end, _old_b) = self.stage.take().expect("stage running").stop();
        self.restarts += 1;
        let (mut m2, pb) = Port::ring_pair(eal, &format!("{}b{}", self.name, self.restarts), 4096)?;
        let (r2, t2) = m2.configure_single(&self.pool)?;
        self.stage = Some(Stage::start(
            self.imp,
            self.burst,
            self.pool.clone(),
            self.counters.clone(),
            a_end,
            End {
                _port: m2,
                rx: r2,
                tx: t2,
            },
        )?);
        self.b = Some(Device::open(eal, pb, cb)?);
        Ok(())
    }

    /// Stops the stage (frames in flight are freed) and closes both NICs.
    pub fn close(mut self) {
        self.stop_stage();
    }

    fn stop_stage(&mut self) {
        if let Some(s) = self.stage.take() {
            drop(s.stop());
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
