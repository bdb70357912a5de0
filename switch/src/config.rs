//! Switch configuration: a serde/TOML front end ([`Config`]) and its validated form
//! ([`SwitchSettings`]).
//!
//! The raw [`Config`] mirrors the TOML file key for key (docs/design.md §6: "a static
//! forwarding table ... from a TOML file"), so the binary can override fields from
//! command-line flags before calling [`Config::validate`]. Validation turns every bad
//! value into a typed [`ConfigError`]; nothing here panics on input.
//!
//! Every key is documented in `docs/switch.md`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Default INT DSCP (docs/design.md §4; the same default as `rdma::wire::int`).
pub const DEFAULT_INT_DSCP: u8 = rdma::wire::int::DEFAULT_INT_DSCP;
/// Default port buffer (bytes).
pub const DEFAULT_BUF_MAX: u64 = 1 << 20;
/// Default K_min (bytes).
pub const DEFAULT_K_MIN: u64 = 5 * 1024;
/// Default K_max (bytes).
pub const DEFAULT_K_MAX: u64 = 200 * 1024;
/// Default P_max.
pub const DEFAULT_P_MAX: f64 = 0.01;
/// Default buffer of the high-priority (ACK/NAK/CNP) class, bytes.
pub const DEFAULT_CTRL_BUF_MAX: u64 = 64 * 1024;
/// Default shaper burst tolerance, bytes (token-bucket depth).
pub const DEFAULT_BURST: u64 = 16 * 1024;
/// Smallest configurable link speed (bit/s).
pub const MIN_SPEED_BPS: u64 = 1_000;
/// Largest configurable link speed (bit/s): 10 Tbit/s.
pub const MAX_SPEED_BPS: u64 = 10_000_000_000_000;
/// Largest configurable buffer (bytes): 256 MiB; the rings are allocated up front
/// (one slot per 60 bytes).
pub const MAX_BUF: u64 = 256 << 20;
/// Largest frame the core expects (jumbo 9216 B + slack); `buf_max` must hold one.
pub const MAX_FRAME: u64 = 9_216;

/// A number or a string with a unit, as written in TOML (`25000000000`, `"25Gbps"`,
/// `"256KiB"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Quantity {
    /// A plain integer (bit/s for speeds, bytes for sizes).
    Int(u64),
    /// A float (e.g. `2.5e10` bit/s).
    Float(f64),
    /// A string with an optional unit.
    Text(String),
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Quantity::Int(v) => write!(f, "{v}"),
            Quantity::Float(v) => write!(f, "{v}"),
            Quantity::Text(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<u64> for Quantity {
    fn from(v: u64) -> Self {
        Quantity::Int(v)
    }
}

impl From<&str> for Quantity {
    fn from(v: &str) -> Self {
        Quantity::Text(v.to_owned())
    }
}

/// Per-port parameters that `[defaults]` may provide and each `[[port]]` may override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortDefaults {
    /// Link speed B (bit/s or a string such as `"25Gbps"`).
    pub speed: Option<Quantity>,
    /// Data-class buffer in bytes (tail drop above it).
    pub buf_max: Option<Quantity>,
    /// WRED K_min in bytes (LDCP 004 section 2.1).
    pub k_min: Option<Quantity>,
    /// WRED K_max in bytes.
    pub k_max: Option<Quantity>,
    /// WRED P_max in [0, 1].
    pub p_max: Option<f64>,
    /// Not-ECT drop threshold K in bytes (LDCP 004 section 2.3, Eq. 3).
    pub k_drop: Option<Quantity>,
    /// Buffer of the high-priority ACK/NAK/CNP class, bytes.
    pub ctrl_buf_max: Option<Quantity>,
    /// Shaper burst tolerance (token-bucket depth) in bytes.
    pub burst: Option<Quantity>,
}

/// One `[[port]]` table: its id and MAC, and any of the [`PortDefaults`] keys
/// (written flat in the table) to override `[defaults]` for this port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// Port ID: the DPDK port id and the INT `port_ID`.
    pub id: u16,
    /// The port's own MAC, written as the source MAC of frames leaving it.
    pub mac: String,
    /// This port's own values of the per-port keys.
    #[serde(flatten)]
    pub own: PortDefaults,
}

/// One `[[route]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Destination prefix, `"a.b.c.d/len"` (a bare address means /32).
    pub prefix: String,
    /// Egress port id.
    pub port: u16,
    /// Next-hop MAC written as the destination MAC.
    pub next_hop_mac: String,
}

/// The switch configuration as written in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// INT `switch_ID` (HPCC++ 000 section 3).
    pub switch_id: u16,
    /// DSCP that announces an INT container (default 0x18).
    #[serde(default = "default_int_dscp")]
    pub int_dscp: u8,
    /// Seed of the WRED random generator (runs are reproducible).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// True if the frames the core sees include the 4-byte FCS (DPDK strips it by
    /// default, so the default is false and the shaper adds 4 bytes).
    #[serde(default)]
    pub fcs_in_frame: bool,
    /// Defaults for every port.
    #[serde(default)]
    pub defaults: PortDefaults,
    /// The ports.
    #[serde(default, rename = "port")]
    pub ports: Vec<PortConfig>,
    /// The forwarding table.
    #[serde(default, rename = "route")]
    pub routes: Vec<RouteConfig>,
}

fn default_int_dscp() -> u8 {
    DEFAULT_INT_DSCP
}

fn default_seed() -> u64 {
    1
}

/// Why a configuration was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// The TOML text does not parse or has unknown keys / wrong types.
    #[error("bad TOML: {0}")]
    Toml(String),
    /// The file could not be read.
    #[error("cannot read {path}: {msg}")]
    Io {
        /// Path.
        path: String,
        /// OS error text.
        msg: String,
    },
    /// No `[[port]]`.
    #[error("no [[port]] configured")]
    NoPorts,
    /// Two ports share an id.
    #[error("duplicate port id {0}")]
    DuplicatePort(u16),
    /// A required key is set neither on the port nor in `[defaults]`.
    #[error("port {port}: missing `{key}` (set it in [[port]] or [defaults])")]
    Missing {
        /// Port id.
        port: u16,
        /// Key name.
        key: &'static str,
    },
    /// The speed does not parse or is out of range.
    #[error("port {port}: bad speed {value}: {why}")]
    BadSpeed {
        /// Port id.
        port: u16,
        /// As written.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A byte size does not parse.
    #[error("port {port}: bad byte size for `{key}`: {value}")]
    BadSize {
        /// Port id.
        port: u16,
        /// Key name.
        key: &'static str,
        /// As written.
        value: String,
    },
    /// K_min above K_max.
    #[error("port {port}: k_min {k_min} > k_max {k_max}")]
    KminAboveKmax {
        /// Port id.
        port: u16,
        /// K_min bytes.
        k_min: u64,
        /// K_max bytes.
        k_max: u64,
    },
    /// P_max not in [0, 1].
    #[error("port {port}: p_max {p_max} outside [0, 1]")]
    PmaxOutOfRange {
        /// Port id.
        port: u16,
        /// The value.
        p_max: f64,
    },
    /// A threshold above the buffer it applies to.
    #[error("port {port}: {key} = {value} above buf_max {buf_max}")]
    AboveBufMax {
        /// Port id.
        port: u16,
        /// Key name.
        key: &'static str,
        /// Its value.
        value: u64,
        /// buf_max.
        buf_max: u64,
    },
    /// A buffer smaller than one maximum frame.
    #[error("port {port}: {key} = {value} cannot hold one {MAX_FRAME}-byte frame")]
    BufferTooSmall {
        /// Port id.
        port: u16,
        /// Key name.
        key: &'static str,
        /// Its value.
        value: u64,
    },
    /// A buffer above [`MAX_BUF`].
    #[error("port {port}: {key} = {value} above the {MAX_BUF}-byte limit")]
    BufferTooLarge {
        /// Port id.
        port: u16,
        /// Key name.
        key: &'static str,
        /// Its value.
        value: u64,
    },
    /// A MAC address does not parse.
    #[error("{what}: bad MAC address {value:?} (want aa:bb:cc:dd:ee:ff)")]
    BadMac {
        /// Where (port or route).
        what: String,
        /// As written.
        value: String,
    },
    /// A route prefix does not parse.
    #[error("route {index}: bad prefix {value:?}: {why}")]
    BadPrefix {
        /// Index in the route list.
        index: usize,
        /// As written.
        value: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A route names a port that is not configured.
    #[error("route {index} ({prefix}): unknown port {port}")]
    UnknownPort {
        /// Index in the route list.
        index: usize,
        /// The prefix.
        prefix: String,
        /// The port id.
        port: u16,
    },
    /// The same prefix twice on one port (on different ports it is ECMP).
    #[error("duplicate route for {0}")]
    DuplicateRoute(String),
    /// `int_dscp` above 63.
    #[error("int_dscp {0} is not a 6-bit DSCP")]
    BadDscp(u8),
}

/// Validated settings of one port.
#[derive(Debug, Clone, PartialEq)]
pub struct PortSettings {
    /// Port id.
    pub id: u16,
    /// Source MAC.
    pub mac: [u8; 6],
    /// Link speed B in bit/s.
    pub speed_bps: u64,
    /// Data-class buffer, bytes.
    pub buf_max: u64,
    /// WRED K_min, bytes.
    pub k_min: u64,
    /// WRED K_max, bytes.
    pub k_max: u64,
    /// WRED P_max.
    pub p_max: f64,
    /// Not-ECT drop threshold K, bytes.
    pub k_drop: u64,
    /// High-priority class buffer, bytes.
    pub ctrl_buf_max: u64,
    /// Shaper burst tolerance, bytes.
    pub burst: u64,
}

/// A validated route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Network address (host bits zero).
    pub net: u32,
    /// Prefix length 0..=32.
    pub len: u8,
    /// Egress port id.
    pub port: u16,
    /// Next-hop MAC.
    pub next_hop_mac: [u8; 6],
}

/// A validated configuration: what [`crate::Switch::new`] takes.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchSettings {
    /// INT switch_ID.
    pub switch_id: u16,
    /// INT DSCP.
    pub int_dscp: u8,
    /// RNG seed.
    pub seed: u64,
    /// Frames include the FCS.
    pub fcs_in_frame: bool,
    /// Ports.
    pub ports: Vec<PortSettings>,
    /// Routes.
    pub routes: Vec<Route>,
}

impl Config {
    /// Parses TOML text (does not validate values; see [`Config::validate`]).
    pub fn from_toml_str(s: &str) -> Result<Self, ConfigError> {
        toml::from_str(s).map_err(|e| ConfigError::Toml(e.to_string()))
    }

    /// [`Config::two_hosts`] with both ports at 100 Gbit/s, a 256 KiB buffer and
    /// WRED from 8 to 64 KiB at P_max 0.2: fast enough that the hosts, not the
    /// switch's shaper, set the pace of a functional test.
    pub fn two_hosts_100g(a: u16, b: u16) -> Config {
        Config::two_hosts(
            a,
            b,
            PortDefaults {
                speed: Some("100Gbps".into()),
                buf_max: Some("256KiB".into()),
                k_min: Some("8KiB".into()),
                k_max: Some("64KiB".into()),
                p_max: Some(0.2),
                ..PortDefaults::default()
            },
        )
    }

    /// The two-host topology of the tests and benchmarks that put a switch
    /// between two NICs (`switch/tests/fixtures/two-hosts.toml`): host A's
    /// subnet 10.0.0.0/24 behind port `a`, host B's 10.0.1.0/24 behind port
    /// `b`, with `defaults` for both ports.
    pub fn two_hosts(a: u16, b: u16, defaults: PortDefaults) -> Config {
        let mut cfg = Config::from_toml_str(include_str!("../tests/fixtures/two-hosts.toml"))
            .expect("the fixture parses");
        let id = |fixture_id: u16| if fixture_id == 0 { a } else { b };
        for p in &mut cfg.ports {
            p.id = id(p.id);
        }
        for r in &mut cfg.routes {
            r.port = id(r.port);
        }
        cfg.defaults = defaults;
        cfg
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let s = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Self::from_toml_str(&s)
    }

    /// Parses and validates in one step.
    pub fn load_str(s: &str) -> Result<SwitchSettings, ConfigError> {
        Self::from_toml_str(s)?.validate()
    }

    /// Checks every value and resolves defaults and units.
    pub fn validate(&self) -> Result<SwitchSettings, ConfigError> {
        if self.int_dscp > 0x3F {
            return Err(ConfigError::BadDscp(self.int_dscp));
        }
        if self.ports.is_empty() {
            return Err(ConfigError::NoPorts);
        }
        let mut ports: Vec<PortSettings> = Vec::with_capacity(self.ports.len());
        for p in &self.ports {
            if ports.iter().any(|q| q.id == p.id) {
                return Err(ConfigError::DuplicatePort(p.id));
            }
            ports.push(self.validate_port(p)?);
        }
        let mut routes: Vec<Route> = Vec::with_capacity(self.routes.len());
        for (index, r) in self.routes.iter().enumerate() {
            let (net, len) = parse_prefix(&r.prefix).map_err(|why| ConfigError::BadPrefix {
                index,
                value: r.prefix.clone(),
                why,
            })?;
            if !ports.iter().any(|p| p.id == r.port) {
                return Err(ConfigError::UnknownPort {
                    index,
                    prefix: r.prefix.clone(),
                    port: r.port,
                });
            }
            let next_hop_mac = parse_mac(&r.next_hop_mac).ok_or_else(|| ConfigError::BadMac {
                what: format!("route {index} ({})", r.prefix),
                value: r.next_hop_mac.clone(),
            })?;
            // The same prefix on another port is an ECMP member (crate::fib).
            if routes
                .iter()
                .any(|q| q.net == net && q.len == len && q.port == r.port)
            {
                return Err(ConfigError::DuplicateRoute(r.prefix.clone()));
            }
            routes.push(Route {
                net,
                len,
                port: r.port,
                next_hop_mac,
            });
        }
        Ok(SwitchSettings {
            switch_id: self.switch_id,
            int_dscp: self.int_dscp,
            seed: self.seed,
            fcs_in_frame: self.fcs_in_frame,
            ports,
            routes,
        })
    }

    fn validate_port(&self, p: &PortConfig) -> Result<PortSettings, ConfigError> {
        let d = &self.defaults;
        let port = p.id;
        let mac = parse_mac(&p.mac).ok_or_else(|| ConfigError::BadMac {
            what: format!("port {port}"),
            value: p.mac.clone(),
        })?;
        let speed = p
            .own
            .speed
            .as_ref()
            .or(d.speed.as_ref())
            .ok_or(ConfigError::Missing { port, key: "speed" })?;
        let speed_bps = parse_speed(speed).map_err(|why| ConfigError::BadSpeed {
            port,
            value: speed.to_string(),
            why,
        })?;
        let size = |key: &'static str,
                    own: &Option<Quantity>,
                    def: &Option<Quantity>,
                    fallback: u64|
         -> Result<u64, ConfigError> {
            match own.as_ref().or(def.as_ref()) {
                None => Ok(fallback),
                Some(q) => parse_size(q).ok_or_else(|| ConfigError::BadSize {
                    port,
                    key,
                    value: q.to_string(),
                }),
            }
        };
        let buf_max = size("buf_max", &p.own.buf_max, &d.buf_max, DEFAULT_BUF_MAX)?;
        let k_min = size("k_min", &p.own.k_min, &d.k_min, DEFAULT_K_MIN)?;
        let k_max = size("k_max", &p.own.k_max, &d.k_max, DEFAULT_K_MAX)?;
        let k_drop = size("k_drop", &p.own.k_drop, &d.k_drop, k_max)?;
        let ctrl_buf_max = size(
            "ctrl_buf_max",
            &p.own.ctrl_buf_max,
            &d.ctrl_buf_max,
            DEFAULT_CTRL_BUF_MAX,
        )?;
        let burst = size("burst", &p.own.burst, &d.burst, DEFAULT_BURST)?;
        let p_max = p.own.p_max.or(d.p_max).unwrap_or(DEFAULT_P_MAX);
        if !(0.0..=1.0).contains(&p_max) {
            return Err(ConfigError::PmaxOutOfRange { port, p_max });
        }
        if k_min > k_max {
            return Err(ConfigError::KminAboveKmax { port, k_min, k_max });
        }
        for (key, value) in [("buf_max", buf_max), ("ctrl_buf_max", ctrl_buf_max)] {
            if value < MAX_FRAME {
                return Err(ConfigError::BufferTooSmall { port, key, value });
            }
            if value > MAX_BUF {
                return Err(ConfigError::BufferTooLarge { port, key, value });
            }
        }
        for (key, value) in [("k_max", k_max), ("k_drop", k_drop)] {
            if value > buf_max {
                return Err(ConfigError::AboveBufMax {
                    port,
                    key,
                    value,
                    buf_max,
                });
            }
        }
        Ok(PortSettings {
            id: port,
            mac,
            speed_bps,
            buf_max,
            k_min,
            k_max,
            p_max,
            k_drop,
            ctrl_buf_max,
            burst,
        })
    }
}

/// Splits `"12.5Gbps"` into `("12.5", "Gbps")`.
fn split_unit(s: &str) -> (&str, &str) {
    let s = s.trim();
    let i = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    (s[..i].trim(), s[i..].trim())
}

/// Parses a decimal number times an integer multiplier exactly (`"2.5"` x 10^9 =
/// 2_500_000_000, `"1.5"` x 2^20 = 1_572_864), with no float rounding; a result that is
/// not a whole number is rejected.
fn scaled(num: &str, mult: u64) -> Option<u64> {
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num.as_str(), ""),
    };
    if (int.is_empty() && frac.is_empty()) || frac.len() > 18 {
        return None;
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let i: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let f: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let den = 10u128.pow(frac.len() as u32);
    let m = u128::from(mult);
    if (f * m) % den != 0 {
        return None;
    }
    let v = i.checked_mul(m)?.checked_add(f * m / den)?;
    u64::try_from(v).ok()
}

/// Parses a link speed in bit/s: an integer, a float, or a string such as `"25Gbps"`,
/// `"100G"`, `"1 Mbit/s"`, `"400gbps"`. Decimal (SI) multipliers, as link speeds are.
pub fn parse_speed(q: &Quantity) -> Result<u64, &'static str> {
    let v = match q {
        Quantity::Int(v) => *v,
        Quantity::Float(f) => {
            if !f.is_finite() || *f < 0.0 || *f > MAX_SPEED_BPS as f64 {
                return Err("not a finite speed within range");
            }
            f.round() as u64
        }
        Quantity::Text(s) => {
            let (num, unit) = split_unit(s);
            let u = unit.to_ascii_lowercase();
            let u = u
                .trim_end_matches("bit/s")
                .trim_end_matches("bps")
                .trim_end_matches("b/s")
                .trim();
            let mult = match u {
                "" => 1,
                "k" => 1_000,
                "m" => 1_000_000,
                "g" => 1_000_000_000,
                "t" => 1_000_000_000_000,
                _ => return Err("unknown unit (use bps, Kbps, Mbps, Gbps, Tbps)"),
            };
            scaled(num, mult).ok_or("not a number")?
        }
    };
    if v < MIN_SPEED_BPS {
        return Err("below 1 kbit/s");
    }
    if v > MAX_SPEED_BPS {
        return Err("above 10 Tbit/s");
    }
    Ok(v)
}

/// Parses a byte size: an integer, or a string with `B`, `KB`/`MB`/`GB` (10^3) or
/// `KiB`/`MiB`/`GiB` (2^10).
pub fn parse_size(q: &Quantity) -> Option<u64> {
    match q {
        Quantity::Int(v) => Some(*v),
        Quantity::Float(f) => {
            if f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f < 1e18 {
                Some(*f as u64)
            } else {
                None
            }
        }
        Quantity::Text(s) => {
            let (num, unit) = split_unit(s);
            let mult = match unit.to_ascii_lowercase().as_str() {
                "" | "b" => 1,
                "k" | "kb" => 1_000,
                "m" | "mb" => 1_000_000,
                "g" | "gb" => 1_000_000_000,
                "ki" | "kib" => 1 << 10,
                "mi" | "mib" => 1 << 20,
                "gi" | "gib" => 1 << 30,
                _ => return None,
            };
            scaled(num, mult)
        }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut n = 0;
    for part in s.trim().split([':', '-']) {
        if n == 6 || part.is_empty() || part.len() > 2 {
            return None;
        }
        out[n] = u8::from_str_radix(part, 16).ok()?;
        n += 1;
    }
    (n == 6).then_some(out)
}

/// Parses `a.b.c.d/len` into (network as u32, len); host bits must be zero.
pub fn parse_prefix(s: &str) -> Result<(u32, u8), &'static str> {
    let (addr, len) = match s.trim().split_once('/') {
        Some((a, l)) => (a, l.trim().parse::<u8>().map_err(|_| "bad length")?),
        None => (s.trim(), 32),
    };
    if len > 32 {
        return Err("length above 32");
    }
    let ip: std::net::Ipv4Addr = addr.trim().parse().map_err(|_| "bad IPv4 address")?;
    let net = u32::from(ip);
    let mask = prefix_mask(len);
    if net & !mask != 0 {
        return Err("host bits set");
    }
    Ok((net, len))
}

/// The netmask of a prefix length.
pub(crate) fn prefix_mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds() {
        let t = |s: &str| parse_speed(&Quantity::from(s));
        assert_eq!(t("25Gbps"), Ok(25_000_000_000));
        assert_eq!(t("2.5Gbps"), Ok(2_500_000_000));
        assert_eq!(t("100G"), Ok(100_000_000_000));
        assert_eq!(t("1 Mbit/s"), Ok(1_000_000));
        assert_eq!(t("400gbps"), Ok(400_000_000_000));
        assert_eq!(t("1_000_000"), Ok(1_000_000));
        assert!(t("fast").is_err());
        assert!(t("10 furlongs").is_err());
        assert!(t("0bps").is_err());
        assert!(t("20Tbps").is_err());
        assert!(t("1.0000000005Gbps").is_err());
        assert_eq!(parse_speed(&Quantity::Int(10_000_000)), Ok(10_000_000));
        assert_eq!(parse_speed(&Quantity::Float(2.5e10)), Ok(25_000_000_000));
        assert!(parse_speed(&Quantity::Float(f64::NAN)).is_err());
    }

    #[test]
    fn sizes_macs_prefixes() {
        let t = |s: &str| parse_size(&Quantity::from(s));
        assert_eq!(t("256KiB"), Some(256 * 1024));
        assert_eq!(t("1MB"), Some(1_000_000));
        assert_eq!(t("1.5MiB"), Some(1_572_864));
        assert_eq!(t("1.1B"), None);
        assert_eq!(t("100"), Some(100));
        assert_eq!(t("12 parsecs"), None);
        assert_eq!(parse_mac("02:00:00:00:00:0a"), Some([2, 0, 0, 0, 0, 0x0a]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
        assert_eq!(parse_prefix("10.0.1.0/24"), Ok((0x0A00_0100, 24)));
        assert_eq!(parse_prefix("10.0.1.7"), Ok((0x0A00_0107, 32)));
        assert_eq!(parse_prefix("0.0.0.0/0"), Ok((0, 0)));
        assert!(parse_prefix("10.0.1.7/24").is_err());
        assert!(parse_prefix("10.0.1.0/33").is_err());
        assert!(parse_prefix("10.0.1/24").is_err());
    }

    #[test]
    fn a_port_overrides_defaults_and_unknown_port_keys_are_refused() {
        let text = |extra: &str| {
            format!(
                "switch_id = 1\n[defaults]\nspeed = \"25Gbps\"\nk_min = \"5KiB\"\n\
                 [[port]]\nid = 3\nmac = \"02:00:00:00:01:03\"\nk_min = \"7KiB\"\n{extra}"
            )
        };
        let s = Config::from_toml_str(&text(""))
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.ports[0].k_min, 7 * 1024);
        assert_eq!(s.ports[0].speed_bps, 25_000_000_000);
        let e = Config::from_toml_str(&text("k_minn = 1\n")).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Toml(m) if m.contains("k_minn")),
            "{e}"
        );
    }

    #[test]
    fn the_two_host_fixture_renumbers_its_ports() {
        let defaults = PortDefaults {
            speed: Some("10Gbps".into()),
            ..PortDefaults::default()
        };
        let s = Config::two_hosts(4, 9, defaults).validate().unwrap();
        let mut ids: Vec<u16> = s.ports.iter().map(|p| p.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, [4, 9]);
        let mut ports: Vec<u16> = s.routes.iter().map(|r| r.port).collect();
        ports.sort_unstable();
        assert_eq!(ports, [4, 9]);
    }
}
