//! roce-perf's command line: perftest's subcommands and flags.

use std::net::Ipv4Addr;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "perftest-style RDMA benchmarks over the rsnic DPDK NIC"
)]
pub struct Cli {
    #[command(subcommand)]
    pub test: Test,
}

#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
#[allow(non_camel_case_types)]
#[command(rename_all = "snake_case")]
pub enum Test {
    /// RDMA WRITE bandwidth (ib_write_bw).
    write_bw(Opts),
    /// RDMA READ bandwidth (ib_read_bw).
    read_bw(Opts),
    /// SEND bandwidth (ib_send_bw).
    send_bw(Opts),
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    write_lat(Opts),
    /// RDMA READ latency (ib_read_lat).
    read_lat(Opts),
    /// SEND ping-pong latency (ib_send_lat).
    send_lat(Opts),
}

/// `--cc`: the one CC enum (a `clap::ValueEnum` through cc's `clap` feature).
pub use cc::CcKind as CcArg;

/// The out-of-band exchange a client speaks (a server detects it).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeArg {
    /// This project's one-line exchange (docs/connection.md).
    Rsnic,
    /// perftest's (ib_write_bw and friends, perftest 4.5).
    Perftest,
}

#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency),
    /// at most 2^31 (IBA's largest message, the device's `max_msg_sz`).
    #[arg(short = 's', long = "size", value_parser = clap::value_parser!(u32).range(0..=1 << 31))]
    pub size: Option<u32>,
    /// Iterations (default 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub qps: u16,
    /// Run sizes 2 .. 2^23, as perftest's -a.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Every QP works on one buffer of the `-q 1` size (one send and one
    /// receive unit, shared) instead of a unit each (perftest's layout):
    /// with many QPs, what remains of the cost is the QPs' own state, not
    /// the memory their messages touch.
    #[arg(long = "shared-buffer")]
    pub shared_buffer: bool,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<u64>,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (default: the largest the
    /// port carries, as perftest takes the port's active MTU; 1024 on a TAP).
    /// With a perftest peer both take the smaller of the two.
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u16>,
    /// Send queue depth, and the work requests in flight over all QPs
    /// (perftest bounds each QP's: with `-q 16`, `-t 128` here is
    /// perftest's `-t 8`).
    #[arg(short = 't', long = "tx-depth", default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    pub tx_depth: u16,
    /// Completion moderation, as perftest's -Q: one signaled work request
    /// in every N per QP (bandwidth tests; at most a quarter of each QP's
    /// share of `-t`, so that the pipeline stays full while a completion
    /// is awaited).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..))]
    pub cq_mod: u16,
    /// Post lists of N work requests, one doorbell each, as perftest's -l
    /// (`QueuePair::post_send_list`; bandwidth tests): a QP gets N messages
    /// in a row. 1: one post per message.
    #[arg(short = 'l', long = "post_list", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub post_list: u16,
    /// Scatter/gather: each bandwidth request's local buffer is cut into N
    /// SGEs of (nearly) equal length, gathered by SEND and WRITE, scattered
    /// into by READ (`QueuePair::post_send_sges`, one doorbell each; 1..=32,
    /// rxe's limit). The same bytes move; what changes is the engine's
    /// gather and scatter work.
    #[arg(long = "sge", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub sge: u8,
    /// QP timeout, as perftest's -u: 4.096 us x 2^N before a retransmit
    /// (0..31; default 14, 67 ms). A peer that may stall for longer (a
    /// loaded emulated guest) needs more before 7 retries run out.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub port: u16,
    /// Report bandwidth in Gbit/s instead of MB/s.
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Write the results and the NIC's final counters as JSON to this file.
    #[arg(long = "out_json")]
    pub out_json: Option<std::ffi::OsString>,
    /// DPDK devargs or PCI address of the port.
    #[arg(long = "dev", default_value = "net_tap0,iface=rsnic0")]
    pub dev: String,
    /// IPv4 address of this NIC. Required, except on a `net_af_xdp` port
    /// (`--dev af_xdp:IF`), which takes the interface's own (host mode).
    #[arg(long = "ip", default_value_t = Ipv4Addr::UNSPECIFIED, hide_default_value = true)]
    pub ip: Ipv4Addr,
    /// MAC address of this NIC (default: the port's; for `net_tap` ports a
    /// locally administered `02:52:53:<ip>`, because the kernel side of a TAP
    /// carries the PMD's own MAC, and a Linux bridge keeps frames for that
    /// address to itself instead of forwarding them into the TAP).
    #[arg(long = "mac", value_parser = parse_mac)]
    pub mac: Option<[u8; 6]>,
    /// The peer's MAC address, when the exchange carries none (perftest's):
    /// an override of ARP resolution.
    #[arg(long = "peer_mac", value_parser = parse_mac)]
    pub peer_mac: Option<[u8; 6]>,
    /// As client: the exchange to speak (a server detects it).
    #[arg(long = "exchange", value_enum, default_value = "rsnic")]
    pub exchange: ExchangeArg,
    /// Seconds a server waits for a client (default: forever, as perftest)
    /// and a client keeps retrying the connection (default 10); also bounds
    /// each wait for the peer's end of a test (default: no bound); at least
    /// this long for each step of the exchange.
    #[arg(long = "timeout")]
    pub timeout: Option<u64>,
    /// Congestion control.
    #[arg(long = "cc", value_enum, default_value = "none")]
    pub cc: CcArg,
    /// Loss recovery of the RC QPs: `gbn` (go-back-N, IBA) or `sr` (selective
    /// repeat, rdma::transport::sack), which the peer must run too (our
    /// exchange refuses a mismatch; with a perftest peer the QPs fall back to
    /// gbn).
    #[arg(long = "loss-recovery", default_value = "gbn")]
    pub loss_recovery: rdma::transport::LossRecovery,
    /// The port's line rate in Gbit/s (`DeviceConfig::line_rate_bps`): what
    /// the NIC's port shaper lets onto the wire (all shards together) and
    /// what the CC assumes. A ring pair or TAP has no rate of its own; a
    /// loopback past 100 Gbit/s (many shards) needs a higher one.
    #[arg(long = "line_rate_gbps", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=3200))]
    pub line_rate_gbps: u32,
    /// Capture every frame into this pcapng file (with --loopback: the
    /// client's NIC).
    #[arg(long = "pcap")]
    pub pcap: Option<std::ffi::OsString>,
    /// CPU for the NIC engine.
    #[arg(long = "core")]
    pub core: Option<usize>,
    /// Never give the cores away, even when idle: the engine and the waits
    /// for completions spin (by default an engine idle for 50 us parks its
    /// thread until a post, a command or a timer wakes it, and a wait for a
    /// completion spins 50 us, then parks until the engine wakes it; so
    /// that processes sharing cores, e.g. both ends on one host, or anything
    /// else busy on the machine, make progress).
    #[arg(long = "busy_poll")]
    pub busy_poll: bool,
    /// Shard this NIC's QPs over N engine threads
    /// (`nic::verbs::Device::open_sharded`): each on its own queue pair
    /// where the port has one per shard (with `--loopback`: a ring pair
    /// with N queue pairs), else behind a dispatcher thread on `--core`
    /// that owns the port's one queue pair. QPs (`-q`) go to the shards in
    /// turn. Absent or 1: one engine; with `--loopback`, absent puts both
    /// ends' engines on one thread, 1 gives each end's engine a thread.
    #[arg(long = "shards", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub shards: Option<u16>,
    /// Copy payloads up to N bytes into the frame (one mbuf, headers,
    /// payload and ICRC written in one pass) instead of attaching them
    /// zero-copy from the registered region (a header mbuf, the attached
    /// payload and a trailer for the ICRC); the default copies up to 256.
    /// `--copy_threshold 4096`: every 4 KiB-MTU data frame is one mbuf.
    #[arg(long = "copy_threshold", value_parser = clap::value_parser!(u16).range(0..=8192))]
    pub copy_threshold: Option<u16>,
    /// With `--loopback --shards N`: a ring pair with one queue pair, so
    /// that a dispatcher thread per side steers frames to the shards (the
    /// layout for ports with one queue), instead of a queue pair per shard.
    #[arg(long = "dispatcher")]
    pub dispatcher: bool,
    /// Run the server and the client in this process, back to back on a
    /// DPDK ring pair (`--dev` and the server address are not used; the
    /// server is `--ip`, the client the next address); prints the client's
    /// results.
    #[arg(long = "loopback")]
    pub loopback: bool,
    /// The server's address (TCP); absent: be the server.
    pub server: Option<std::net::IpAddr>,
}

impl Test {
    pub fn parts(&self) -> (&'static str, &Opts) {
        match self {
            Test::write_bw(o) => ("write_bw", o),
            Test::read_bw(o) => ("read_bw", o),
            Test::send_bw(o) => ("send_bw", o),
            Test::write_lat(o) => ("write_lat", o),
            Test::read_lat(o) => ("read_lat", o),
            Test::send_lat(o) => ("send_lat", o),
        }
    }

    /// The same test with changed options.
    pub fn with(&self, f: impl FnOnce(&mut Opts)) -> Test {
        let mut t = self.clone();
        match &mut t {
            Test::write_bw(o)
            | Test::read_bw(o)
            | Test::send_bw(o)
            | Test::write_lat(o)
            | Test::read_lat(o)
            | Test::send_lat(o) => f(o),
        }
        t
    }

    pub fn is_lat(&self) -> bool {
        self.parts().0.ends_with("_lat")
    }

    pub fn is_send(&self) -> bool {
        matches!(self, Test::send_bw(_) | Test::send_lat(_))
    }

    pub fn title(&self) -> &'static str {
        match self {
            Test::write_bw(_) => "RDMA_Write BW Test",
            Test::read_bw(_) => "RDMA_Read BW Test",
            Test::send_bw(_) => "Send BW Test",
            Test::write_lat(_) => "RDMA_Write Latency Test",
            Test::read_lat(_) => "RDMA_Read Latency Test",
            Test::send_lat(_) => "Send Latency Test",
        }
    }

    /// Message sizes: `-s`, or 2 .. 2^23 with `-a` (perftest's range).
    pub fn sizes(&self) -> Vec<u32> {
        let (_, o) = self.parts();
        if o.all {
            (1..=23).map(|p| 1u32 << p).collect()
        } else {
            vec![o.size.unwrap_or(if self.is_lat() { 2 } else { 65536 })]
        }
    }

    /// Iterations per size (`-n`, perftest's defaults).
    pub fn iters(&self) -> u64 {
        let (_, o) = self.parts();
        o.iters.unwrap_or(if self.is_lat() { 1000 } else { 5000 })
    }
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    let mut m = [0u8; 6];
    for (d, p) in m.iter_mut().zip(parts) {
        *d = u8::from_str_radix(p, 16).map_err(|_| format!("{s:?} is not a MAC address"))?;
    }
    Ok(m)
}
