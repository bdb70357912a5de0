//! The library's configuration, from the environment (the program is
//! unmodified, so there is no other channel; `rsnic-exec` sets these):
//!
//! | variable | meaning |
//! |---|---|
//! | `RSNIC_DEV` | DPDK devargs of the port, e.g. `net_tap0,iface=rs0` (required) |
//! | `RSNIC_IP` | the port's IPv4 address; the GID is `::ffff:<ip>` (required, except on a `net_af_xdp` port: host mode takes the interface's own) |
//! | `RSNIC_MAC` | the port's MAC (default: `02:52:53:<ip[1..4]>` on `net_tap`, else the port's) |
//! | `RSNIC_CORE` | CPU to pin the engine thread to (default: not pinned) |
//! | `RSNIC_CC` | congestion control of every QP: none, dcqcn, hpcc, ... (default none) |
//! | `RSNIC_LOSS_RECOVERY` | loss recovery of every RC QP: `gbn` (go-back-N, the default) or `sr` (selective repeat; the peer must be an rsnic set to `sr` too) |
//! | `RSNIC_EAL` | extra EAL arguments, split at white space |
//! | `RSNIC_BUSY_POLL` | `1`: the engine never yields its core (default: it yields when idle, for hosts that share cores) |
//! | `RSNIC_LOG` | `LEVEL` or `LEVEL:FILE`: what the library and DPDK inside it log, and where (default: `off`) |
//! | `RSNIC_CM_TIMEOUT` | the CM's response timeout, an exponent of 4.096 us, 8 to 31 (default 20, ~4.3 s, as Linux's rdma_cm) |
//! | `RSNIC_CM_RETRIES` | how many times the CM sends a REQ, REP or DREQ again before it gives up, 0 to 15 (default 15, as Linux's rdma_cm) |
//!
//! The library runs inside someone else's program, so it prints nothing
//! the user did not ask for: by default DPDK's log (the EAL's and the
//! PMDs' messages, e.g. net_tap's "Could not add multiq qdisc") goes
//! nowhere and rsnic's own `tracing` events are not recorded; only a
//! failure to open the device is explained on standard error (the call
//! fails with ENODEV). `RSNIC_LOG=LEVEL` (`error`, `warning`, `notice`,
//! `info` or `debug`, DPDK's level names; `off`) writes both, from that
//! level up, to standard error, `RSNIC_LOG=LEVEL:FILE` appends them to
//! FILE instead, e.g. `RSNIC_LOG=debug:/tmp/rsnic.log`.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use cc::CcKind;
use rdma::transport::LossRecovery;

/// What the environment asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// DPDK devargs of the port.
    pub dev: String,
    /// The port's IPv4 address; `None` on a `net_af_xdp` port without
    /// `RSNIC_IP`: host mode, the kernel interface's own address, read when
    /// the device starts ([`Config::host_iface`]).
    pub ip: Option<Ipv4Addr>,
    /// The port's MAC, if given.
    pub mac: Option<[u8; 6]>,
    /// The engine's CPU.
    pub core: Option<usize>,
    /// Congestion control of the QPs.
    pub cc: CcKind,
    /// Loss recovery of every RC QP (`RSNIC_LOSS_RECOVERY`).
    pub loss_recovery: LossRecovery,
    /// Extra EAL arguments.
    pub eal: Vec<String>,
    /// Never yield the engine's core.
    pub busy_poll: bool,
    /// What to log, and where (`RSNIC_LOG`).
    pub log: LogConfig,
    /// The CM's response timeout exponent and retries (`RSNIC_CM_TIMEOUT`,
    /// `RSNIC_CM_RETRIES`; `nic::DeviceConfig::cm_timing`).
    pub cm_timing: (u8, u8),
}

/// `RSNIC_LOG`: the level from which the library and DPDK log (None: they
/// log nothing), and the file they append to (None: standard error).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogConfig {
    /// The lowest severity written.
    pub level: Option<LogLevel>,
    /// Where, if not standard error.
    pub file: Option<PathBuf>,
}

/// A log level, by DPDK's names (`rte_log.h`); each maps to `tracing`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `RTE_LOG_ERR`, `tracing::Level::ERROR`.
    Error,
    /// `RTE_LOG_WARNING`, `WARN`.
    Warning,
    /// `RTE_LOG_NOTICE`, `INFO` (tracing has no notice).
    Notice,
    /// `RTE_LOG_INFO`, `INFO`.
    Info,
    /// `RTE_LOG_DEBUG`, `DEBUG`.
    Debug,
}

impl LogLevel {
    /// The name the EAL's `--log-level` takes.
    pub fn dpdk_name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warning => "warning",
            LogLevel::Notice => "notice",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }

    /// The `tracing` level of rsnic's own events.
    pub fn tracing(self) -> tracing::Level {
        match self {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warning => tracing::Level::WARN,
            LogLevel::Notice | LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
        }
    }
}

impl LogConfig {
    /// `off`, `LEVEL` or `LEVEL:FILE`.
    fn parse(s: &str) -> Result<LogConfig, String> {
        let (level, file) = match s.split_once(':') {
            Some((l, f)) if !f.is_empty() => (l, Some(PathBuf::from(f))),
            Some(_) => return Err("a file name after ':'".into()),
            None => (s, None),
        };
        let level = match level.trim().to_ascii_lowercase().as_str() {
            "off" | "" => None,
            "error" | "err" => Some(LogLevel::Error),
            "warning" | "warn" => Some(LogLevel::Warning),
            "notice" => Some(LogLevel::Notice),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            _ => return Err("off, error, warning, notice, info or debug [:FILE]".into()),
        };
        if level.is_none() && file.is_some() {
            return Err("a level before the file (off logs nothing)".into());
        }
        Ok(LogConfig { level, file })
    }
}

/// Why the environment does not describe a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set.
    #[error(
        "{0} is not set (run the program under rsnic-exec, or set RSNIC_DEV and RSNIC_IP; \
         a net_af_xdp port takes its interface's own IP)"
    )]
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
        let ip = match get("RSNIC_IP").filter(|s| !s.is_empty()) {
            Some(ip_s) => Some(
                ip_s.parse::<Ipv4Addr>()
                    .map_err(|e| bad("RSNIC_IP", &ip_s, format!("{e}")))?,
            ),
            // Host mode: the interface's address, taken at start.
            None if dpdk::af_xdp::iface_of(&dev).is_some() => None,
            None => return Err(ConfigError::Missing("RSNIC_IP")),
        };
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
        let loss_recovery = match get("RSNIC_LOSS_RECOVERY") {
            None => LossRecovery::Gbn,
            Some(m) => m
                .parse::<LossRecovery>()
                .map_err(|e| bad("RSNIC_LOSS_RECOVERY", &m, e))?,
        };
        let eal = get("RSNIC_EAL")
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let busy_poll = get("RSNIC_BUSY_POLL").is_some_and(|v| v == "1");
        let log = match get("RSNIC_LOG") {
            None => LogConfig::default(),
            Some(l) => LogConfig::parse(&l).map_err(|why| bad("RSNIC_LOG", &l, why))?,
        };
        let in_range = |var: &'static str, lo: u8, hi: u8, default: u8| match get(var) {
            None => Ok(default),
            Some(v) => v
                .parse::<u8>()
                .ok()
                .filter(|n| (lo..=hi).contains(n))
                .ok_or_else(|| bad(var, &v, format!("expected {lo} to {hi}"))),
        };
        let cm_defaults = rdma::cm::CmConfig::default();
        let cm_timing = (
            in_range("RSNIC_CM_TIMEOUT", 8, 31, cm_defaults.response_timeout)?,
            in_range("RSNIC_CM_RETRIES", 0, 15, cm_defaults.max_retries)?,
        );
        Ok(Config {
            dev,
            ip,
            mac,
            core,
            cc,
            loss_recovery,
            eal,
            busy_poll,
            log,
            cm_timing,
        })
    }

    /// The MAC the port uses: the given one; on `net_tap` a locally
    /// administered one derived from the IP (as `roce-perf` does, so that
    /// two namespaces' TAPs never collide); else the port's own (None; on
    /// a `net_af_xdp` port, the kernel interface's).
    pub fn port_mac(&self) -> Option<[u8; 6]> {
        self.mac.or_else(|| {
            let ip = self.ip?.octets();
            self.dev
                .starts_with("net_tap")
                .then_some([0x02, 0x52, 0x53, ip[1], ip[2], ip[3]])
        })
    }

    /// The kernel interface whose address the device takes (host mode):
    /// the interface of a `net_af_xdp` port when `RSNIC_IP` is not set.
    pub fn host_iface(&self) -> Option<String> {
        self.ip
            .is_none()
            .then(|| dpdk::af_xdp::iface_of(&self.dev))
            .flatten()
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
        assert_eq!(c.host_iface(), None);
        assert_eq!(c.log, LogConfig::default(), "quiet unless asked");
    }

    #[test]
    fn log_levels_and_places() {
        let with = |v: &str| {
            Config::from_lookup(env(&[
                ("RSNIC_DEV", "net_ring0"),
                ("RSNIC_IP", "10.0.0.3"),
                ("RSNIC_LOG", v),
            ]))
        };
        assert_eq!(with("off").unwrap().log, LogConfig::default());
        let c = with("debug").unwrap();
        assert_eq!((c.log.level, c.log.file), (Some(LogLevel::Debug), None));
        let c = with("Warning:/tmp/rsnic.log").unwrap();
        assert_eq!(c.log.level, Some(LogLevel::Warning));
        assert_eq!(c.log.file.as_deref(), Some("/tmp/rsnic.log".as_ref()));
        assert_eq!(LogLevel::Notice.dpdk_name(), "notice");
        for v in ["loud", "debug:", "off:/tmp/x"] {
            assert!(
                matches!(
                    with(v),
                    Err(ConfigError::Bad {
                        var: "RSNIC_LOG",
                        ..
                    })
                ),
                "{v}"
            );
        }
    }

    #[test]
    fn af_xdp_takes_the_interface_address() {
        // Without RSNIC_IP: host mode on the interface (read at start).
        let c = Config::from_lookup(env(&[("RSNIC_DEV", "af_xdp:eth0")])).unwrap();
        assert_eq!(c.ip, None);
        assert_eq!(c.host_iface().as_deref(), Some("eth0"));
        assert_eq!(c.port_mac(), None);
        let c = Config::from_lookup(env(&[("RSNIC_DEV", "net_af_xdp0,iface=v1")])).unwrap();
        assert_eq!(c.host_iface().as_deref(), Some("v1"));
        // An explicit address wins.
        let c = Config::from_lookup(env(&[
            ("RSNIC_DEV", "af_xdp:eth0"),
            ("RSNIC_IP", "10.0.0.7"),
        ]))
        .unwrap();
        assert_eq!((c.ip, c.host_iface()), (Some([10, 0, 0, 7].into()), None));
        // Other ports still need it.
        for dev in ["net_tap0,iface=t0", "net_ring0", "af_xdp:"] {
            assert_eq!(
                Config::from_lookup(env(&[("RSNIC_DEV", dev)])),
                Err(ConfigError::Missing("RSNIC_IP")),
                "{dev}"
            );
        }
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
            ("RSNIC_LOSS_RECOVERY", "sr"),
            ("RSNIC_MAC", "02:00:00:00:00:09"),
            ("RSNIC_EAL", " --log-level=debug  -m 512"),
        ]))
        .unwrap();
        assert_eq!(c.cc, CcKind::Hpcc);
        assert_eq!(c.loss_recovery, LossRecovery::Sr);
        assert_eq!(c.port_mac(), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(c.eal, ["--log-level=debug", "-m", "512"]);
        assert_eq!(c.cm_timing, (20, 15), "Linux rdma_cm's by default");
        let c = Config::from_lookup(env(&[
            ("RSNIC_DEV", "net_null0"),
            ("RSNIC_IP", "10.0.0.3"),
            ("RSNIC_CM_TIMEOUT", "14"),
            ("RSNIC_CM_RETRIES", "2"),
        ]))
        .unwrap();
        assert_eq!(c.cm_timing, (14, 2));
        for (var, v) in [
            ("RSNIC_CM_TIMEOUT", "7"),
            ("RSNIC_CM_TIMEOUT", "32"),
            ("RSNIC_CM_RETRIES", "16"),
            ("RSNIC_CM_RETRIES", "-1"),
        ] {
            let e = Config::from_lookup(env(&[
                ("RSNIC_DEV", "net_null0"),
                ("RSNIC_IP", "10.0.0.3"),
                (var, v),
            ]))
            .unwrap_err();
            assert!(
                matches!(e, ConfigError::Bad { var: w, .. } if w == var),
                "{var}={v}"
            );
        }
    }

    #[test]
    fn macs() {
        assert_eq!(parse_mac("02-00-00-00-00-0a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }
}
