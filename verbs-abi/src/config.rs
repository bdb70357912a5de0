//! The library's configuration, from the environment (the program is
//! unmodified, so there is no other channel; `rsnic-exec` sets these):
//!
//! | variable | meaning |
//! |---|---|
//! | `RSNIC_DEV` | DPDK devargs of the port, e.g. `net_tap0,iface=rs0` (required) |
//! | `RSNIC_IP` | the port's IPv4 address; the GID is `::ffff:<ip>` (required) |
//! | `RSNIC_MAC` | the port's MAC (default: `02:52:53:<ip[1..4]>` on `net_tap`, else the port's) |
//! | `RSNIC_CORE` | CPU to pin the engine thread to (default: not pinned) |
//! | `RSNIC_CC` | congestion control of every QP: none, dcqcn, hpcc, ... (default none) |
//! | `RSNIC_EAL` | extra EAL arguments, split at white space |
//! | `RSNIC_BUSY_POLL` | `1`: the engine never yields its core (default: it yields when idle, for hosts that share cores) |

use std::net::Ipv4Addr;

use cc::CcKind;

/// What the environment asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// DPDK devargs of the port.
    pub dev: String,
    /// The port's IPv4 address.
    pub ip: Ipv4Addr,
    /// The port's MAC, if given.
    pub mac: Option<[u8; 6]>,
    /// The engine's CPU.
    pub core: Option<usize>,
    /// Congestion control of the QPs.
    pub cc: CcKind,
    /// Extra EAL arguments.
    pub eal: Vec<String>,
    /// Never yield the engine's core.
    pub busy_poll: bool,
}

/// Why the environment does not describe a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error("{0} is not set (run the program under rsnic-exec, or set RSNIC_DEV and RSNIC_IP)")]
    Missing(&'static str),
    /// A variable's value does not parse.
    #[error("{var}={value:?}: {why}")]
    Bad {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
}

impl Config {
    /// The configuration from the process's environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The configuration from `get` (a variable's value, if set).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let bad = |var: &'static str, value: &str, why: String| ConfigError::Bad {
            var,
            value: value.to_owned(),
            why,
        };
        let dev = get("RSNIC_DEV")
            .filter(|s| !s.is_empty())
            .ok_or(ConfigError::Missing("RSNIC_DEV"))?;
        let ip_s = get("RSNIC_IP").ok_or(ConfigError::Missing("RSNIC_IP"))?;
        let ip: Ipv4Addr = ip_s
            .parse()
            .map_err(|e| bad("RSNIC_IP", &ip_s, format!("{e}")))?;
        let mac = match get("RSNIC_MAC") {
            None => None,
            Some(m) => Some(parse_mac(&m).ok_or_else(|| {
                bad(
                    "RSNIC_MAC",
                    &m,
                    "expected six hex bytes, aa:bb:cc:dd:ee:ff".into(),
                )
            })?),
        };
        let core = match get("RSNIC_CORE") {
            None => None,
            Some(c) => Some(
                c.parse::<usize>()
                    .map_err(|e| bad("RSNIC_CORE", &c, format!("{e}")))?,
            ),
        };
        let cc = match get("RSNIC_CC") {
            None => CcKind::None,
            Some(c) => c
                .parse::<CcKind>()
                .map_err(|e| bad("RSNIC_CC", &c, format!("{e}")))?,
        };
        let eal = get("RSNIC_EAL")
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let busy_poll = get("RSNIC_BUSY_POLL").is_some_and(|v| v == "1");
        Ok(Config {
            dev,
            ip,
            mac,
            core,
            cc,
            eal,
            busy_poll,
        })
    }

    /// The MAC the port uses: the given one; on `net_tap` a locally
    /// administered one derived from the IP (as `roce-perf` does, so that
    /// two namespaces' TAPs never collide); else the port's own (None).
    pub fn port_mac(&self) -> Option<[u8; 6]> {
        let ip = self.ip.octets();
        self.mac.or_else(|| {
            self.dev
                .starts_with("net_tap")
                .then_some([0x02, 0x52, 0x53, ip[1], ip[2], ip[3]])
        })
    }
}

/// `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut n = 0;
    for part in s.split([':', '-']) {
        if n == 6 || part.len() != 2 {
            return None;
        }
        out[n] = u8::from_str_radix(part, 16).ok()?;
        n += 1;
    }
    (n == 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn required_and_defaults() {
        assert_eq!(
            Config::from_lookup(env(&[("RSNIC_IP", "10.0.0.1")])),
            Err(ConfigError::Missing("RSNIC_DEV"))
        );
        let c = Config::from_lookup(env(&[
            ("RSNIC_DEV", "net_tap0,iface=rs0"),
            ("RSNIC_IP", "10.0.0.1"),
        ]))
        .unwrap();
        assert_eq!(c.cc, CcKind::None);
        assert_eq!(c.port_mac(), Some([2, 0x52, 0x53, 0, 0, 1]));
        assert!(c.eal.is_empty() && !c.busy_poll && c.core.is_none());
    }

    #[test]
    fn bad_values_are_named() {
        let e = Config::from_lookup(env(&[
            ("RSNIC_DEV", "net_null0"),
            ("RSNIC_IP", "10.0.0.300"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            ConfigError::Bad {
                var: "RSNIC_IP",
                ..
            }
        ));
        let e = Config::from_lookup(env(&[
            ("RSNIC_DEV", "net_null0"),
            ("RSNIC_IP", "10.0.0.3"),
            ("RSNIC_CC", "fastest"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            ConfigError::Bad {
                var: "RSNIC_CC",
                ..
            }
        ));
        let c = Config::from_lookup(env(&[
            ("RSNIC_DEV", "net_null0"),
            ("RSNIC_IP", "10.0.0.3"),
            ("RSNIC_CC", "hpcc"),
            ("RSNIC_MAC", "02:00:00:00:00:09"),
            ("RSNIC_EAL", " --log-level=debug  -m 512"),
        ]))
        .unwrap();
        assert_eq!(c.cc, CcKind::Hpcc);
        assert_eq!(c.port_mac(), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(c.eal, ["--log-level=debug", "-m", "512"]);
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02-00-00-00-00-0a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }
}
