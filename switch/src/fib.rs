//! Longest-prefix-match forwarding table over IPv4 destinations, with equal-cost
//! multipath (ECMP).
//!
//! One sorted array per prefix length in use, searched from the longest length down
//! with a binary search: O(L log n) for L distinct lengths, no allocation per lookup.
//! Routes with the same prefix and different ports form an ECMP group; a lookup picks
//! one member from a flow hash (the switch hashes the UDP source port, the RoCEv2
//! entropy field, so every packet of a QP takes one path and QPs spread).

use crate::config::{prefix_mask, Route};

/// A next hop: egress port index (into the switch's port array) and MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    /// Index of the egress port in the switch's port array.
    pub port_idx: usize,
    /// Destination MAC to write.
    pub mac: [u8; 6],
}

/// One prefix of a length level: (network, index of its first next hop, members).
type Entry = (u32, u32, u32);

/// The forwarding table.
#[derive(Debug, Clone, Default)]
pub struct Fib {
    /// (prefix length, sorted (network, first member, members)), longest length first.
    levels: Vec<(u8, Vec<Entry>)>,
    /// Next hops; an ECMP group's members are consecutive.
    hops: Vec<NextHop>,
}

impl Fib {
    /// Builds the table; `port_idx` maps a port id to its index (routes were validated,
    /// so unknown ports are skipped rather than trusted).
    pub fn new(routes: &[Route], port_idx: impl Fn(u16) -> Option<usize>) -> Self {
        // (len, net, next hop) in route order, grouped by (len, net) below.
        let mut all: Vec<(u8, u32, NextHop)> = Vec::with_capacity(routes.len());
        for r in routes {
            let Some(port_idx) = port_idx(r.port) else {
                continue;
            };
            let nh = NextHop {
                port_idx,
                mac: r.next_hop_mac,
            };
            let net = r.net & prefix_mask(r.len);
            if !all
                .iter()
                .any(|&(l, n, h)| l == r.len && n == net && h == nh)
            {
                all.push((r.len, net, nh));
            }
        }
        // Stable: members keep their configuration order.
        all.sort_by_key(|&(l, n, _)| (std::cmp::Reverse(l), n));
        let mut levels: Vec<(u8, Vec<Entry>)> = Vec::new();
        let mut hops = Vec::with_capacity(all.len());
        for (len, net, nh) in all {
            if levels.last().map_or(true, |(l, _)| *l != len) {
                levels.push((len, Vec::new()));
            }
            let v = &mut levels.last_mut().expect("pushed above").1;
            match v.last_mut() {
                Some((n, _, count)) if *n == net => *count += 1,
                _ => v.push((net, hops.len() as u32, 1)),
            }
            hops.push(nh);
        }
        Self { levels, hops }
    }

    /// The longest matching route for `dst`; in an ECMP group, member
    /// `flow_hash() % members` (the hash is computed only for a group of several).
    #[inline]
    pub fn lookup(&self, dst: u32, flow_hash: impl FnOnce() -> u32) -> Option<NextHop> {
        for (len, v) in &self.levels {
            let key = dst & prefix_mask(*len);
            if let Ok(i) = v.binary_search_by_key(&key, |e| e.0) {
                let (_, first, n) = v[i];
                let k = if n == 1 { 0 } else { flow_hash() % n };
                return Some(self.hops[(first + k) as usize]);
            }
        }
        None
    }

    /// Members of the ECMP group that `dst` matches (1 for a plain route, 0 for none).
    pub fn paths(&self, dst: u32) -> u32 {
        for (len, v) in &self.levels {
            if let Ok(i) = v.binary_search_by_key(&(dst & prefix_mask(*len)), |e| e.0) {
                return v[i].2;
            }
        }
        0
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
        assert_eq!(f.lookup(0x0A00_0107, || 0).map(|n| n.port_idx), Some(2));
        assert_eq!(f.lookup(0x0A00_0108, || 0).map(|n| n.port_idx), Some(1));
        assert_eq!(f.lookup(0x0A05_0108, || 0).map(|n| n.port_idx), Some(0));
        assert_eq!(f.lookup(0x0B00_0000, || 0).map(|n| n.port_idx), Some(3));
        let g = Fib::new(&[r(0x0A00_0100, 24, 1)], |p| Some(p as usize));
        assert_eq!(g.lookup(0x0A00_0200, || 0), None);
    }

    #[test]
    fn ecmp_group_picks_member_by_hash() {
        let f = Fib::new(
            &[
                r(0, 0, 4),
                r(0, 0, 5),
                r(0, 0, 6),
                r(0, 0, 5),
                r(0x0A00_0100, 24, 1),
            ],
            |p| Some(p as usize),
        );
        assert_eq!(f.paths(0x0B00_0000), 3);
        assert_eq!(f.paths(0x0A00_0101), 1);
        let ports: Vec<usize> = (0..6)
            .map(|h| f.lookup(0x0B00_0000, || h).unwrap().port_idx)
            .collect();
        assert_eq!(ports, vec![4, 5, 6, 4, 5, 6]);
        // The more specific plain route still wins whatever the hash.
        assert_eq!(f.lookup(0x0A00_0101, || 7).unwrap().port_idx, 1);
    }
}
