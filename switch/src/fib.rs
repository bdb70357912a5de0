//! Longest-prefix-match forwarding table over IPv4 destinations.
//!
//! One sorted array per prefix length in use, searched from the longest length down
//! with a binary search: O(L log n) for L distinct lengths, no allocation per lookup.

use crate::config::{prefix_mask, Route};

/// A next hop: egress port index (into the switch's port array) and MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    /// Index of the egress port in the switch's port array.
    pub port_idx: usize,
    /// Destination MAC to write.
    pub mac: [u8; 6],
}

/// The forwarding table.
#[derive(Debug, Clone, Default)]
pub struct Fib {
    /// (prefix length, sorted (network, next hop)), longest length first.
    levels: Vec<(u8, Vec<(u32, NextHop)>)>,
}

impl Fib {
    /// Builds the table; `port_idx` maps a port id to its index (routes were validated,
    /// so unknown ports are skipped rather than trusted).
    pub fn new(routes: &[Route], port_idx: impl Fn(u16) -> Option<usize>) -> Self {
        let mut levels: Vec<(u8, Vec<(u32, NextHop)>)> = Vec::new();
        for r in routes {
            let Some(port_idx) = port_idx(r.port) else {
                continue;
            };
            let nh = NextHop {
                port_idx,
                mac: r.next_hop_mac,
            };
            let net = r.net & prefix_mask(r.len);
            match levels.iter_mut().find(|(l, _)| *l == r.len) {
                Some((_, v)) => v.push((net, nh)),
                None => levels.push((r.len, vec![(net, nh)])),
            }
        }
        levels.sort_by_key(|l| std::cmp::Reverse(l.0));
        for (_, v) in &mut levels {
            v.sort_by_key(|e| e.0);
            v.dedup_by_key(|e| e.0);
        }
        Self { levels }
    }

    /// The longest matching route for `dst`.
    #[inline]
    pub fn lookup(&self, dst: u32) -> Option<NextHop> {
        for (len, v) in &self.levels {
            let key = dst & prefix_mask(*len);
            if let Ok(i) = v.binary_search_by_key(&key, |e| e.0) {
                return Some(v[i].1);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(net: u32, len: u8, port: u16) -> Route {
        Route {
            net,
            len,
            port,
            next_hop_mac: [port as u8; 6],
        }
    }

    #[test]
    fn longest_prefix_wins() {
        let f = Fib::new(
            &[
                r(0x0A00_0000, 8, 0),
                r(0x0A00_0100, 24, 1),
                r(0x0A00_0107, 32, 2),
                r(0, 0, 3),
            ],
            |p| Some(p as usize),
        );
        assert_eq!(f.lookup(0x0A00_0107).map(|n| n.port_idx), Some(2));
        assert_eq!(f.lookup(0x0A00_0108).map(|n| n.port_idx), Some(1));
        assert_eq!(f.lookup(0x0A05_0108).map(|n| n.port_idx), Some(0));
        assert_eq!(f.lookup(0x0B00_0000).map(|n| n.port_idx), Some(3));
        let g = Fib::new(&[r(0x0A00_0100, 24, 1)], |p| Some(p as usize));
        assert_eq!(g.lookup(0x0A00_0200), None);
    }
}
