//! Longest-prefix-match forwarding table over IPv4 destinations, with equal-cost
//! multipath (ECMP).
//!
//! One sorted array per prefix length in use, searched from the longest length down
//! with a binary search: O(L log n) for L distinct lengths, no allocation per lookup.
//! Routes with the same prefix and different ports form an ECMP group; a lookup picks
//! one member from a flow hash (the switch hashes the UDP source port, the RoCEv2
//! entropy field, so every packet of a QP takes one path and QPs spread).

use crate::config::{prefix_mask, Route};
use crate::rewrite::L2Rewrite;

/// A next hop: egress port index (into the switch's port array) and MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    /// Index of the egress port in the switch's port array.
    pub port_idx: usize,
    /// Destination MAC to write.
    pub mac: [u8; 6],
    /// The Ethernet addresses a frame leaves with (`mac`, then the egress port's
    /// address once [`Fib::set_source_macs`] has run).
    pub l2: L2Rewrite,
}

/// The ECMP flow hash of a UDP source port under a switch's seed (a splitmix64 finaliser:
/// every input bit reaches every output bit, so `hash % members` spreads evenly).
#[inline]
pub fn ecmp_hash(sport: u16, seed: u64) -> u32 {
    let mut z = u64::from(sport) ^ seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// The route a destination matched: its ECMP group's first next hop and member count
/// (a plain route is a group of one). A burst of frames to one destination looks the
/// table up once and reuses this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    first: u32,
    members: u32,
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
                l2: L2Rewrite::new(&r.next_hop_mac, &[0; 6]),
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

    /// Completes every next hop's rewrite template with the address of its egress
    /// port, `src(port_idx)`.
    pub fn set_source_macs(&mut self, src: impl Fn(usize) -> [u8; 6]) {
        for h in self.hops.iter_mut() {
            h.l2 = L2Rewrite::new(&h.mac, &src(h.port_idx));
        }
    }

    /// The longest matching route for `dst`; in an ECMP group, member
    /// `flow_hash() % members` (the hash is computed only for a group of several).
    #[inline]
    pub fn lookup(&self, dst: u32, flow_hash: impl FnOnce() -> u32) -> Option<NextHop> {
        self.group(dst).map(|g| *self.member(g, flow_hash))
    }

    /// The longest matching route's group for `dst`.
    #[inline]
    pub fn group(&self, dst: u32) -> Option<Group> {
        for (len, v) in &self.levels {
            let key = dst & prefix_mask(*len);
            if let Ok(i) = v.binary_search_by_key(&key, |e| e.0) {
                let (_, first, members) = v[i];
                return Some(Group { first, members });
            }
        }
        None
    }

    /// Member `flow_hash() % members` of `g` (the hash is computed only for a group of
    /// several). `g` came from [`Fib::group`] of this table.
    #[inline]
    pub fn member(&self, g: Group, flow_hash: impl FnOnce() -> u32) -> &NextHop {
        let k = if g.members == 1 {
            0
        } else {
            flow_hash() % g.members
        };
        &self.hops[(g.first + k) as usize]
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
