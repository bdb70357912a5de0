//! The ARP cache of a NIC's port (RFC 826 "translation table"): IPv4 to
//! MAC, each entry resolved (until it expires) or pending (requests sent,
//! retried on a timer, failed after the last). Bounded: it never holds
//! more than [`ArpConfig::max_entries`] and never allocates after
//! construction. Pure: time is an argument.

/// How the cache behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpConfig {
    /// Most entries, resolved and pending together.
    pub max_entries: usize,
    /// How long a resolved entry is used before it is resolved again, ns.
    pub reachable_ns: u64,
    /// Requests sent for one resolution before it fails.
    pub tries: u32,
    /// Time between two requests (and after the last, before failing), ns.
    pub retry_interval_ns: u64,
}

impl Default for ArpConfig {
    /// Linux's defaults where it has one: 3 requests (`mcast_solicit`) 1 s
    /// apart (`retrans_time_ms`); resolved entries used for 60 s; 256
    /// entries.
    fn default() -> Self {
        ArpConfig {
            max_entries: 256,
            reachable_ns: 60_000_000_000,
            tries: 3,
            retry_interval_ns: 1_000_000_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Resolved { mac: [u8; 6], expires_ns: u64 },
    Pending { tries: u32, next_ns: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    ip: [u8; 4],
    state: State,
}

/// What [`ArpCache::start`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Resolved: the MAC.
    Hit([u8; 6]),
    /// Not resolved yet; `send` says whether a first request must go out
    /// now (a new resolution) or one is already under way.
    Pending {
        /// Send a request now.
        send: bool,
    },
    /// Every entry is a resolution under way: no room for another.
    Full,
}

/// What came due in [`ArpCache::poll`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Send another request for this address.
    Retry([u8; 4]),
    /// Resolving this address failed: the last request got no answer.
    Failed([u8; 4]),
}

/// The cache (module docs).
#[derive(Debug, Clone)]
pub struct ArpCache {
    cfg: ArpConfig,
    entries: Vec<Entry>,
}

impl ArpCache {
    /// An empty cache.
    pub fn new(cfg: ArpConfig) -> Self {
        ArpCache {
            entries: Vec::with_capacity(cfg.max_entries),
            cfg,
        }
    }

    /// Entries held (resolved and pending).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&self, ip: [u8; 4]) -> Option<usize> {
        self.entries.iter().position(|e| e.ip == ip)
    }

    /// The MAC of `ip` if it is resolved and has not expired.
    pub fn lookup(&self, ip: [u8; 4], now: u64) -> Option<[u8; 6]> {
        match self.find(ip).map(|i| self.entries[i].state) {
            Some(State::Resolved { mac, expires_ns }) if now < expires_ns => Some(mac),
            _ => None,
        }
    }

    /// Whether a resolution of `ip` is under way.
    pub fn is_pending(&self, ip: [u8; 4]) -> bool {
        self.find(ip)
            .is_some_and(|i| matches!(self.entries[i].state, State::Pending { .. }))
    }

    /// Looks `ip` up for a sender that needs its MAC, starting a resolution
    /// when it is unknown or expired (the caller then sends the first
    /// request: [`Lookup::Pending`] with `send`).
    pub fn start(&mut self, ip: [u8; 4], now: u64) -> Lookup {
        if let Some(mac) = self.lookup(ip, now) {
            return Lookup::Hit(mac);
        }
        let pending = State::Pending {
            tries: 1,
            next_ns: now.saturating_add(self.cfg.retry_interval_ns),
        };
        match self.find(ip) {
            Some(i) => match self.entries[i].state {
                State::Pending { .. } => Lookup::Pending { send: false },
                State::Resolved { .. } => {
                    self.entries[i].state = pending;
                    Lookup::Pending { send: true }
                }
            },
            None if self.make_room(now) => {
                self.entries.push(Entry { ip, state: pending });
                Lookup::Pending { send: true }
            }
            None => Lookup::Full,
        }
    }

    /// Records that `ip` is at `mac` (an ARP packet's sender): updates an
    /// entry that exists (resolving a pending one), and adds one if
    /// `create` (RFC 826: when the packet was addressed to us). Returns
    /// whether a resolution under way completed.
    pub fn learn(&mut self, ip: [u8; 4], mac: [u8; 6], now: u64, create: bool) -> bool {
        let resolved = State::Resolved {
            mac,
            expires_ns: now.saturating_add(self.cfg.reachable_ns),
        };
        match self.find(ip) {
            Some(i) => {
                let was_pending = matches!(self.entries[i].state, State::Pending { .. });
                self.entries[i].state = resolved;
                was_pending
            }
            None => {
                if create && self.make_room(now) {
                    self.entries.push(Entry {
                        ip,
                        state: resolved,
                    });
                }
                false
            }
        }
    }

    /// Retries and failures due at `now`, each handed to `due`; a failed
    /// resolution leaves the cache (the next [`Self::start`] begins anew).
    pub fn poll(&mut self, now: u64, mut due: impl FnMut(Due)) {
        let (tries, interval) = (self.cfg.tries.max(1), self.cfg.retry_interval_ns);
        self.entries.retain_mut(|e| match &mut e.state {
            State::Pending { tries: t, next_ns } if now >= *next_ns => {
                if *t >= tries {
                    due(Due::Failed(e.ip));
                    false
                } else {
                    *t += 1;
                    *next_ns = now.saturating_add(interval);
                    due(Due::Retry(e.ip));
                    true
                }
            }
            _ => true,
        });
    }

    /// Makes room for one more entry: drops the expired ones, then, if
    /// still full, the resolved entry that expires first. `false`: every
    /// entry is a resolution under way.
    fn make_room(&mut self, now: u64) -> bool {
        if self.entries.len() < self.cfg.max_entries {
            return true;
        }
        self.entries.retain(
            |e| !matches!(e.state, State::Resolved { expires_ns, .. } if now >= expires_ns),
        );
        if self.entries.len() < self.cfg.max_entries {
            return true;
        }
        let oldest = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e.state {
                State::Resolved { expires_ns, .. } => Some((expires_ns, i)),
                State::Pending { .. } => None,
            })
            .min();
        match oldest {
            Some((_, i)) => {
                self.entries.swap_remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg() -> ArpConfig {
        ArpConfig {
            max_entries: 3,
            reachable_ns: 1_000 * MS,
            tries: 3,
            retry_interval_ns: 100 * MS,
        }
    }

    #[test]
    fn resolves_on_reply_and_expires() {
        let mut c = ArpCache::new(cfg());
        let ip = [10, 0, 0, 2];
        assert_eq!(c.start(ip, 0), Lookup::Pending { send: true });
        assert_eq!(c.start(ip, 1), Lookup::Pending { send: false });
        assert!(c.is_pending(ip));
        assert!(c.learn(ip, [2, 0, 0, 0, 0, 2], 5, false));
        assert_eq!(c.start(ip, 6), Lookup::Hit([2, 0, 0, 0, 0, 2]));
        assert_eq!(c.lookup(ip, 5 + 1_000 * MS - 1), Some([2, 0, 0, 0, 0, 2]));
        assert_eq!(c.lookup(ip, 5 + 1_000 * MS), None);
        // Expired: a new resolution starts, with a request.
        assert_eq!(c.start(ip, 5 + 1_000 * MS), Lookup::Pending { send: true });
    }

    #[test]
    fn retries_then_fails() {
        let mut c = ArpCache::new(cfg());
        let ip = [10, 0, 0, 9];
        assert_eq!(c.start(ip, 0), Lookup::Pending { send: true });
        let mut seen = Vec::new();
        for t in [50, 100, 150, 200, 250, 300] {
            c.poll(t * MS, |d| seen.push((t, d)));
        }
        assert_eq!(
            seen,
            vec![
                (100, Due::Retry(ip)),
                (200, Due::Retry(ip)),
                (300, Due::Failed(ip))
            ]
        );
        assert!(c.is_empty());
        assert_eq!(c.start(ip, 301 * MS), Lookup::Pending { send: true });
    }

    #[test]
    fn learns_only_what_it_may_and_stays_bounded() {
        let mut c = ArpCache::new(cfg());
        // Not addressed to us and unknown: not added.
        assert!(!c.learn([10, 0, 0, 5], [2; 6], 0, false));
        assert_eq!(c.lookup([10, 0, 0, 5], 0), None);
        // Addressed to us: added.
        c.learn([10, 0, 0, 5], [2; 6], 0, true);
        c.learn([10, 0, 0, 6], [3; 6], 10, true);
        c.learn([10, 0, 0, 7], [4; 6], 20, true);
        assert_eq!(c.len(), 3);
        // Full of resolved entries: the one that expires first makes room.
        c.learn([10, 0, 0, 8], [5; 6], 30, true);
        assert_eq!(c.len(), 3);
        assert_eq!(c.lookup([10, 0, 0, 5], 30), None);
        assert_eq!(c.lookup([10, 0, 0, 8], 30), Some([5; 6]));
        // Full of pending resolutions: refused, never grown.
        let mut p = ArpCache::new(cfg());
        for i in 0..3 {
            assert_eq!(p.start([10, 1, 0, i], 0), Lookup::Pending { send: true });
        }
        assert_eq!(p.start([10, 1, 0, 9], 0), Lookup::Full);
        assert_eq!(p.len(), 3);
    }
}
