//! Topologies: hosts, switches with their ports and routes, and links.
//!
//! * [`Topology::fattree`] of [`Topology::hpcc_shape`]: the HPCC paper's fat-tree (simulation/mix/fat.txt of
//!   the authors' simulator, `sim/data/README.md`): racks of 16 hosts at 100 Gbit/s,
//!   pods of 4 ToRs and 4 aggregation switches at 400 Gbit/s, agg `i` of every pod up to
//!   cores `4i..4i+3`; 320 hosts give the paper's 20 ToRs, 20 aggs and 16 cores.
//! * [`Topology::fattree`] of [`Topology::kary_shape`]: the textbook k-ary fat-tree (k pods of k/2 ToRs and
//!   k/2 aggs, (k/2)^2 cores, k/2 hosts a ToR), one link speed.
//! * [`Topology::star`]: N hosts on one switch (incast).
//!
//! Addresses: host `i` of rack `r` of pod `p` is 10.p.r.(i+1); a ToR routes each of its
//! hosts (/32) down and everything else up over an ECMP group; an aggregation switch
//! routes each rack of its pod (/24) down and the rest up (ECMP); a core routes each
//! pod (/16) down.

use switch::Route;

/// ECN/WRED and buffer settings of a switch port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PortParams {
    /// Link speed, bit/s.
    pub speed_bps: u64,
    /// Byte bound of the data queue.
    pub buf_max: u64,
    /// WRED K_min, bytes.
    pub k_min: u64,
    /// WRED K_max, bytes.
    pub k_max: u64,
    /// WRED P_max.
    pub p_max: f64,
}

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A host's NIC.
    Host(u32),
    /// Switch `0`, port `1`.
    Switch(u32, u16),
}

/// A full-duplex link.
#[derive(Debug, Clone, Copy)]
pub struct LinkSpec {
    /// One end.
    pub a: End,
    /// The other.
    pub b: End,
    /// Speed, bit/s (both directions).
    pub rate_bps: u64,
    /// Propagation delay, ns.
    pub prop_ns: u64,
}

/// A switch: its ports (index = port id) and routes.
#[derive(Debug, Clone)]
pub struct SwitchSpec {
    /// Name for reports ("tor3", "agg0", "core7", "sw").
    pub name: String,
    /// Ports.
    pub ports: Vec<PortParams>,
    /// Routes (the same prefix on several ports is an ECMP group).
    pub routes: Vec<Route>,
    /// Tier: 0 ToR (or the star's switch), 1 aggregation, 2 core. The parallel event
    /// loop splits each tier's switches into contiguous shares ([`Topology::partition`]).
    pub tier: u8,
}

/// A topology.
#[derive(Debug, Clone)]
pub struct Topology {
    /// What it is, for reports.
    pub name: String,
    /// Host IPv4 addresses, by host index.
    pub host_ips: Vec<[u8; 4]>,
    /// Host link speed, bit/s.
    pub host_rate_bps: u64,
    /// Switches.
    pub switches: Vec<SwitchSpec>,
    /// Links.
    pub links: Vec<LinkSpec>,
    /// Switch ports whose queue the report calls "bottleneck" (host-facing ports).
    pub monitored: Vec<(u32, u16)>,
    /// Switch hops on the longest host-to-host path.
    pub max_switch_hops: u32,
    /// Each host's (pod, ToR) (a star: all (0, 0)).
    pub host_loc: Vec<(u32, u32)>,
    /// Speed of the switch port towards each host, bit/s.
    pub to_host_bps: Vec<u64>,
    /// Speed of switch-to-switch links, bit/s.
    pub fabric_bps: u64,
    /// Propagation delay of every link, ns.
    pub prop_ns: u64,
}

/// ECN thresholds of the HPCC paper's runs by link speed (KMIN_MAP/KMAX_MAP/PMAX_MAP:
/// 100/400 KB at 25 Gbit/s, scaled linearly with the speed; P_max 0.2).
pub fn hpcc_ecn(speed_bps: u64, buf_per_100g: u64) -> PortParams {
    let gbps = speed_bps / 1_000_000_000;
    PortParams {
        speed_bps,
        buf_max: buf_per_100g * speed_bps.div_ceil(100_000_000_000).max(1),
        k_min: 4_000 * gbps,
        k_max: 16_000 * gbps,
        p_max: 0.2,
    }
}

fn route(ip: [u8; 4], len: u8, port: u16) -> Route {
    Route {
        net: u32::from_be_bytes(ip),
        len,
        port,
        next_hop_mac: [0x02, 0, 0, 0, (port >> 8) as u8, port as u8],
    }
}

/// Shape of a three-tier fat-tree.
#[derive(Debug, Clone, Copy)]
pub struct FatTreeShape {
    /// Pods.
    pub pods: u32,
    /// ToRs per pod.
    pub tors_per_pod: u32,
    /// Aggregation switches per pod.
    pub aggs_per_pod: u32,
    /// Cores each aggregation switch reaches (cores = aggs_per_pod x this).
    pub cores_per_agg: u32,
    /// Hosts per ToR.
    pub hosts_per_tor: u32,
    /// Host link speed.
    pub host_bps: u64,
    /// ToR-agg and agg-core link speed.
    pub fabric_bps: u64,
    /// Propagation delay of every link, ns.
    pub prop_ns: u64,
}

impl Topology {
    /// The HPCC paper's fat-tree shape for `hosts` hosts (a multiple of 16): racks of
    /// 16, pods of up to 4 racks; 320 hosts is the paper's network.
    pub fn hpcc_shape(hosts: u32, prop_ns: u64) -> Result<FatTreeShape, String> {
        if hosts == 0 || hosts % 16 != 0 {
            return Err(format!(
                "--hosts {hosts}: the HPCC fat-tree needs a multiple of 16 (racks of 16)"
            ));
        }
        let racks = hosts / 16;
        let tors_per_pod = racks.min(4);
        if racks % tors_per_pod != 0 {
            return Err(format!(
                "--hosts {hosts}: {racks} racks do not fill pods of 4"
            ));
        }
        Ok(FatTreeShape {
            pods: racks / tors_per_pod,
            tors_per_pod,
            aggs_per_pod: 4,
            cores_per_agg: 4,
            hosts_per_tor: 16,
            host_bps: 100_000_000_000,
            fabric_bps: 400_000_000_000,
            prop_ns,
        })
    }

    /// The k-ary fat-tree shape (k even, at least 2) at one link speed.
    pub fn kary_shape(k: u32, bps: u64, prop_ns: u64) -> Result<FatTreeShape, String> {
        if k < 2 || k % 2 != 0 {
            return Err(format!("k = {k}: a k-ary fat-tree needs an even k >= 2"));
        }
        Ok(FatTreeShape {
            pods: k,
            tors_per_pod: k / 2,
            aggs_per_pod: k / 2,
            cores_per_agg: k / 2,
            hosts_per_tor: k / 2,
            host_bps: bps,
            fabric_bps: bps,
            prop_ns,
        })
    }

    /// Builds a three-tier fat-tree; `port` gives each switch port's ECN and buffer
    /// settings from its speed.
    pub fn fattree(name: &str, s: FatTreeShape, port: impl Fn(u64) -> PortParams) -> Self {
        let tors = s.pods * s.tors_per_pod;
        let aggs = s.pods * s.aggs_per_pod;
        let cores = s.aggs_per_pod * s.cores_per_agg;
        let tor_id = |p: u32, t: u32| p * s.tors_per_pod + t;
        let agg_id = |p: u32, a: u32| tors + p * s.aggs_per_pod + a;
        let core_id = |c: u32| tors + aggs + c;
        let mut switches = Vec::new();
        let mut links = Vec::new();
        let mut host_ips = Vec::new();
        let mut monitored = Vec::new();
        let mut host_loc = Vec::new();
        // ToRs: ports 0..hosts_per_tor down, then aggs_per_pod up.
        for p in 0..s.pods {
            for t in 0..s.tors_per_pod {
                let mut ports = Vec::new();
                let mut routes = Vec::new();
                for i in 0..s.hosts_per_tor {
                    let h = host_ips.len() as u32;
                    let ip = [10, p as u8, t as u8, (i + 1) as u8];
                    host_ips.push(ip);
                    host_loc.push((p, t));
                    ports.push(port(s.host_bps));
                    routes.push(route(ip, 32, i as u16));
                    links.push(LinkSpec {
                        a: End::Host(h),
                        b: End::Switch(tor_id(p, t), i as u16),
                        rate_bps: s.host_bps,
                        prop_ns: s.prop_ns,
                    });
                    monitored.push((tor_id(p, t), i as u16));
                }
                for a in 0..s.aggs_per_pod {
                    let pi = (s.hosts_per_tor + a) as u16;
                    ports.push(port(s.fabric_bps));
                    routes.push(route([0, 0, 0, 0], 0, pi));
                    links.push(LinkSpec {
                        a: End::Switch(tor_id(p, t), pi),
                        b: End::Switch(agg_id(p, a), t as u16),
                        rate_bps: s.fabric_bps,
                        prop_ns: s.prop_ns,
                    });
                }
                switches.push(SwitchSpec {
                    name: format!("tor{}", tor_id(p, t)),
                    ports,
                    routes,
                    tier: 0,
                });
            }
        }
        // Aggs: ports 0..tors_per_pod down, then cores_per_agg up.
        for p in 0..s.pods {
            for a in 0..s.aggs_per_pod {
                let mut ports = Vec::new();
                let mut routes = Vec::new();
                for t in 0..s.tors_per_pod {
                    ports.push(port(s.fabric_bps));
                    routes.push(route([10, p as u8, t as u8, 0], 24, t as u16));
                }
                for c in 0..s.cores_per_agg {
                    let pi = (s.tors_per_pod + c) as u16;
                    ports.push(port(s.fabric_bps));
                    routes.push(route([0, 0, 0, 0], 0, pi));
                    let core = a * s.cores_per_agg + c;
                    links.push(LinkSpec {
                        a: End::Switch(agg_id(p, a), pi),
                        b: End::Switch(core_id(core), p as u16),
                        rate_bps: s.fabric_bps,
                        prop_ns: s.prop_ns,
                    });
                }
                switches.push(SwitchSpec {
                    name: format!("agg{}", agg_id(p, a) - tors),
                    ports,
                    routes,
                    tier: 1,
                });
            }
        }
        // Cores: port p down to pod p.
        for c in 0..cores {
            let ports = (0..s.pods).map(|_| port(s.fabric_bps)).collect();
            let routes = (0..s.pods)
                .map(|p| route([10, p as u8, 0, 0], 16, p as u16))
                .collect();
            switches.push(SwitchSpec {
                name: format!("core{c}"),
                ports,
                routes,
                tier: 2,
            });
        }
        let max_switch_hops = if s.pods > 1 {
            5
        } else if s.tors_per_pod > 1 {
            3
        } else {
            1
        };
        Topology {
            name: name.to_string(),
            host_ips,
            host_rate_bps: s.host_bps,
            switches,
            links,
            monitored,
            max_switch_hops,
            to_host_bps: vec![s.host_bps; host_loc.len()],
            host_loc,
            fabric_bps: s.fabric_bps,
            prop_ns: s.prop_ns,
        }
    }

    /// `n` hosts on one switch; host links at `host_bps`, except that the port towards
    /// host 0 (the incast receiver) may be shaped to `bottleneck_bps`.
    pub fn star(
        n: u32,
        host_bps: u64,
        bottleneck_bps: u64,
        prop_ns: u64,
        port: PortParams,
    ) -> Self {
        let mut ports = Vec::new();
        let mut routes = Vec::new();
        let mut links = Vec::new();
        let mut host_ips = Vec::new();
        for h in 0..n {
            let ip = [10, 0, 0, (h + 1) as u8];
            host_ips.push(ip);
            let speed = if h == 0 { bottleneck_bps } else { host_bps };
            ports.push(PortParams {
                speed_bps: speed,
                ..port
            });
            routes.push(route(ip, 32, h as u16));
            links.push(LinkSpec {
                a: End::Host(h),
                b: End::Switch(0, h as u16),
                rate_bps: host_bps,
                prop_ns,
            });
        }
        Topology {
            name: format!("star of {n} hosts"),
            host_ips,
            host_rate_bps: host_bps,
            switches: vec![SwitchSpec {
                name: "sw".into(),
                ports,
                routes,
                tier: 0,
            }],
            links,
            monitored: vec![(0, 0)],
            max_switch_hops: 1,
            host_loc: vec![(0, 0); n as usize],
            to_host_bps: (0..n)
                .map(|h| if h == 0 { bottleneck_bps } else { host_bps })
                .collect(),
            fabric_bps: host_bps,
            prop_ns,
        }
    }

    /// Link rates of the path from `src` to `dst` (the ECMP choice does not matter:
    /// every path of a fat-tree between two racks has the same rates).
    pub fn path_rates(&self, src: u32, dst: u32) -> Vec<u64> {
        let (a, b) = (self.host_loc[src as usize], self.host_loc[dst as usize]);
        let fabric = if a == b {
            0
        } else if a.0 == b.0 {
            2
        } else {
            4
        };
        let mut r = vec![self.host_rate_bps];
        r.extend(std::iter::repeat(self.fabric_bps).take(fabric));
        r.push(self.to_host_bps[dst as usize]);
        r
    }

    /// The CCs' base RTT T for this topology: propagation both ways over the longest
    /// path plus one MTU frame's serialisation per link (and an ACK's back).
    pub fn base_rtt_ns(&self, mtu: u32) -> u64 {
        let links = u64::from(self.max_switch_hops) + 1;
        let slow = self.host_rate_bps.min(self.fabric_bps).max(1);
        let frame = u64::from(mtu) + 82 + 84;
        2 * links * self.prop_ns + links * frame * 8_000_000_000 / slow
    }

    /// Hosts.
    pub fn hosts(&self) -> u32 {
        self.host_ips.len() as u32
    }

    /// Logical partitions the parallel event loop uses unless told otherwise: 2 for a
    /// fat-tree of at least 64 hosts with at least two switches in every tier, else 1
    /// (a star or a small fat-tree is not worth a barrier every lookahead). Fixed by
    /// the topology alone, never by the machine: the results depend on it.
    pub fn auto_partitions(&self) -> u32 {
        let fits = (0..=2u8).all(|t| self.switches.iter().filter(|s| s.tier == t).count() >= 2);
        if fits && self.hosts() >= 64 {
            2
        } else {
            1
        }
    }

    /// Splits the fabric into `parts` logical partitions: the `i`-th of a tier's `n`
    /// switches goes to partition `i * parts / n` (ToRs and aggregation switches in
    /// pod order, so a partition holds whole pods where the counts allow, and cores
    /// by index), a host to its switch's. Returns `(host -> partition, switch ->
    /// partition)`. Every tier needs at least `parts` switches.
    pub fn partition(&self, parts: u32) -> Result<(Vec<u16>, Vec<u16>), String> {
        if parts == 0 || parts > u32::from(u16::MAX) {
            return Err(format!("--partitions {parts}: at least 1"));
        }
        let mut sw_part = vec![0u16; self.switches.len()];
        for tier in 0..=2u8 {
            let members: Vec<usize> = (0..self.switches.len())
                .filter(|&i| self.switches[i].tier == tier)
                .collect();
            let n = members.len() as u32;
            if n > 0 && n < parts {
                return Err(format!(
                    "--partitions {parts}: {n} switches in tier {tier}, fewer than partitions"
                ));
            }
            for (i, &s) in members.iter().enumerate() {
                sw_part[s] = (i as u32 * parts / n) as u16;
            }
        }
        let mut host_part = vec![0u16; self.host_ips.len()];
        for l in &self.links {
            if let (End::Host(h), End::Switch(s, _)) | (End::Switch(s, _), End::Host(h)) =
                (l.a, l.b)
            {
                host_part[h as usize] = sw_part[s as usize];
            }
        }
        Ok((host_part, sw_part))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpcc_fattree_has_the_papers_counts() {
        let s = Topology::hpcc_shape(320, 1000).unwrap();
        let t = Topology::fattree("hpcc", s, |b| hpcc_ecn(b, 1 << 20));
        assert_eq!(t.hosts(), 320);
        let count = |p: &str| t.switches.iter().filter(|s| s.name.starts_with(p)).count();
        assert_eq!((count("tor"), count("agg"), count("core")), (20, 20, 16));
        // 320 host links + 20 x 4 ToR-agg + 20 x 4 agg-core (fat.txt: 480 links).
        assert_eq!(t.links.len(), 480);
        // 100G ports: K_min 400 KB, K_max 1600 KB (the paper's 100G setting).
        let p = t.switches[0].ports[0];
        assert_eq!((p.k_min, p.k_max, p.p_max), (400_000, 1_600_000, 0.2));
        assert!(Topology::hpcc_shape(100, 1000).is_err());
    }

    #[test]
    fn kary_fattree_counts() {
        let t = Topology::fattree(
            "k4",
            Topology::kary_shape(4, 10_000_000_000, 1000).unwrap(),
            |b| hpcc_ecn(b, 1 << 20),
        );
        assert_eq!(t.hosts(), 16);
        assert_eq!(t.switches.len(), 8 + 8 + 4);
        assert_eq!(t.links.len(), 16 + 16 + 16);
    }
}
