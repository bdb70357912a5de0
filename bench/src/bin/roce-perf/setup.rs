//! Opening the NIC, the out-of-band exchange (ours or perftest's) and the
//! test session: QPs, the buffer and the peer's parameters.
//!
//! Both exchanges follow perftest's sequence, so one test body serves both:
//! the key exchange (our `RSNIC1` line or perftest's key message, per QP),
//! then barriers (`handshake`: perftest's key message again, our `SYNC`
//! line), the bandwidth report and the close. The client writes first in
//! every step. Items of the setup must arrive within [`EXCHANGE_TIMEOUT`]; the
//! waits for the peer's end of a test are unbounded unless `--timeout`.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bench::perftest::{self, AddressLine};
use dpdk::{Eal, Port};
use nic::verbs::{CompletionQueue, Device, MemoryRegion, QpOptions, QueuePair, RemoteQp};
use oob::perftest::{self as pt, PerftestConn, Protocol, Role};
use rdma::transport::{Access, LossRecovery, WcStatus, WorkCompletion};

use crate::cli::{ExchangeArg, Opts, Test};
use crate::keys::{exchange_perftest, exchange_rsnic, Exchanged, Mine};
pub use crate::link::{Layout, Link, Remote};
use crate::Res;

/// How long one item of the exchange may take to arrive or to be sent
/// (docs/connection.md: "a few seconds"); perftest's client sleeps 1 s
/// after connecting before its first item.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// perftest's cycle buffer (the page size) and cache line when we are not
/// told otherwise.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

/// The session's completion queues: one per shard of the device (a QP
/// completes into its shard's), polled in turn.
pub struct Cqs {
    cqs: Vec<CompletionQueue>,
    next: usize,
}

impl Cqs {
    pub fn poll_one(&mut self) -> Option<WorkCompletion> {
        let n = self.cqs.len();
        for j in 0..n {
            let k = (self.next + j) % n;
            if let Some(wc) = self.cqs[k].poll_one() {
                self.next = (k + 1) % n;
                return Some(wc);
            }
        }
        None
    }

    /// As [`CompletionQueue::wait`] (spin, then park until the engine
    /// pushes a completion), over every CQ; with several (one per shard)
    /// nothing wakes a waiter on all of them, so it spins (not on an
    /// engine's CPU), then sleeps briefly between polls
    /// ([`nic::verbs::wait_until`]).
    pub fn wait(&mut self, timeout: Duration) -> Option<WorkCompletion> {
        if let [cq] = self.cqs.as_mut_slice() {
            return cq.wait(timeout);
        }
        nic::verbs::wait_until(timeout, || self.poll_one())
    }

    /// As [`CompletionQueue::wait_batch`] (once parked, sleep until `want`
    /// completions are queued) with one CQ; with several, as [`Self::wait`]
    /// and then what else is queued. Returns how many it put in `out`.
    pub fn wait_batch(
        &mut self,
        out: &mut [WorkCompletion],
        want: usize,
        timeout: Duration,
    ) -> usize {
        if let [cq] = self.cqs.as_mut_slice() {
            return cq.wait_batch(out, want, timeout);
        }
        let Some(wc) = self.wait(timeout) else {
            return 0;
        };
        out[0] = wc;
        let mut n = 1;
        // Take no completion there is no room for.
        while n < out.len() {
            let Some(wc) = self.poll_one() else { break };
            out[n] = wc;
            n += 1;
        }
        n
    }
}

/// How long a bandwidth client waits for its next completion with
/// `in_flight` bytes posted and not completed before it gives the peer up:
/// 10 s, and the time those bytes take at 64 MiB/s (a slow link: 2 GiB
/// messages, `-t 128` of them, take minutes to drain however fast it is).
pub fn completion_timeout(in_flight: u64) -> Duration {
    Duration::from_secs(10) + Duration::from_secs(in_flight >> 26)
}

/// The next completions (at least one, up to `out.len()`, sleeping until
/// `want` are there once the wait parks, for at most `timeout`), which must
/// be successes.
pub fn wait_wcs(
    cq: &mut Cqs,
    out: &mut [WorkCompletion],
    want: usize,
    timeout: Duration,
) -> Res<usize> {
    let n = cq.wait_batch(out, want, timeout);
    if n == 0 {
        return Err(format!("no completion within {} s (peer gone?)", timeout.as_secs()).into());
    }
    if let Some(wc) = out[..n].iter().find(|wc| wc.status != WcStatus::Success) {
        return Err(format!("work request failed: {:?}", wc.status).into());
    }
    Ok(n)
}

/// The next completion, which must be a success.
pub fn wait_wc(cq: &mut Cqs) -> Res<WorkCompletion> {
    let wc = cq
        .wait(Duration::from_secs(10))
        .ok_or("no completion within 10 s (peer gone?)")?;
    if wc.status != WcStatus::Success {
        return Err(format!("work request failed: {:?}", wc.status).into());
    }
    Ok(wc)
}

pub struct Session {
    pub dev: Device,
    pub cq: Cqs,
    /// The test's QPs (`-q`; one for latency tests).
    pub qps: Vec<QueuePair>,
    pub mr: MemoryRegion,
    pub layout: Layout,
    /// The peer's QP parameters, by QP.
    pub remotes: Vec<Remote>,
    pub link: Link,
    pub server: bool,
    /// SGEs per bandwidth request (`--sge`).
    pub sges: u8,
}

/// Opens the NIC on `--dev` and waits for its link.
pub fn open_device(o: &Opts, eal: &'static Eal) -> Res<Device> {
    // Wait for the link as perftest waits for the port to be ACTIVE. A TAP
    // re-attached to a persistent multi-queue interface can come up without
    // carrier (the kernel then drops all we send, so every transfer would end
    // in retry-exceeded): the port is opened again, which attaches afresh.
    let mut attempt = 1;
    loop {
        let port = Port::open(eal, o.dev.as_str())?;
        let link = port.link_watch();
        let mut cfg = crate::device_config(o, o.ip);
        let ip = o.ip.octets();
        cfg.mac = o.mac.or_else(|| {
            o.dev
                .starts_with("net_tap")
                .then_some([0x02, 0x52, 0x53, ip[1], ip[2], ip[3]])
        });
        cfg.core = o.core;
        cfg.idle_yield = !o.busy_poll;
        cfg.pcap = o.pcap.as_ref().map(std::path::PathBuf::from);
        let dev = if let Some(shards) = o.shards.filter(|&n| n > 1) {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let (max_rx, max_tx) = port.max_queues()?;
            let dispatcher = max_rx.min(max_tx) < shards;
            let cores = crate::shard_cores(usize::from(shards), 1, dispatcher, cpus);
            Device::open_sharded(eal, port, cfg, &cores)?
        } else {
            Device::open(eal, port, cfg)?
        };
        if link.wait_up(Duration::from_secs(2)) {
            return Ok(dev);
        }
        drop(link);
        dev.close();
        if attempt == 3 {
            return Err(format!("the link of {} did not come up", o.dev).into());
        }
        attempt += 1;
        eprintln!(
            "roce-perf: the link of {} is down after start; opening it again",
            o.dev
        );
    }
}

/// Server: waits for one client (forever unless `--timeout`), then stops
/// listening, so that a second client is refused, as by perftest's server.
fn accept(o: &Opts, quiet: bool) -> Res<TcpStream> {
    let l = TcpListener::bind(("0.0.0.0", o.port))
        .map_err(|e| format!("cannot listen on TCP port {}: {e}", o.port))?;
    if !quiet {
        println!("\n************************************\n* Waiting for client to connect... *\n************************************");
    }
    let s = match o.timeout {
        None => l.accept()?.0,
        Some(t) => {
            let deadline = Instant::now() + Duration::from_secs(t);
            l.set_nonblocking(true)?;
            loop {
                match l.accept() {
                    Ok((s, _)) => break s,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::Interrupted =>
                    {
                        if Instant::now() >= deadline {
                            return Err(format!("no client connected within {t} s").into());
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    };
    drop(l);
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Client: connects, retrying every connection failure (refused, timed out,
/// unreachable) for `--timeout` (10 s).
fn connect(o: &Opts, addr: std::net::IpAddr) -> Res<TcpStream> {
    let limit = Duration::from_secs(o.timeout.unwrap_or(10));
    oob::exchange::connect_until(&[(addr, o.port).into()], Instant::now() + limit).map_err(|e| {
        format!(
            "cannot reach the server at {addr}:{} within {} s: {e} (no server, or it is serving another client)",
            o.port,
            limit.as_secs()
        )
        .into()
    })
}

/// The protocol a client speaks, from its first bytes.
fn detect(s: &TcpStream) -> Res<Protocol> {
    let mut first = [0u8; 1];
    // The TAP PMD's SIGIO may interrupt the wait: wait again.
    let peeked = loop {
        match s.peek(&mut first) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => break r,
        }
    };
    match peeked {
        Ok(0) => Err("the client closed the connection before the exchange".into()),
        Ok(_) => pt::detect(&first).ok_or_else(|| {
            format!(
                "the client speaks neither our exchange nor perftest's (first byte {:#04x})",
                first[0]
            )
            .into()
        }),
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            Err("the client sent nothing within the timeout".into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Opens the device on `--dev` (or takes `given`), connects the exchange,
/// creates the QPs and the buffer, and runs the key exchange and the
/// barriers before the test (perftest's order for `test`); prints perftest's
/// preamble unless `quiet`.
pub fn setup(test: &Test, eal: &'static Eal, given: Option<Device>, quiet: bool) -> Res<Session> {
    let (name, o) = test.parts();
    let server = o.server.is_none();
    if test.is_lat() && o.qps > 1 {
        return Err(
            "-q applies to the bandwidth tests (perftest's latency tests use one QP)".into(),
        );
    }
    let dev = match given {
        Some(d) => d,
        None => open_device(o, eal)?,
    };
    let mut mtu = checked_mtu(o, &dev)?;
    let max_size = test.sizes().into_iter().max().unwrap_or(2);
    // The buffer as it will be (perftest's hello may change the cycle and
    // line a little): the peer registers about as much before it answers.
    let region = Layout::new(
        max_size,
        CYCLE_BUFFER,
        CACHE_LINE,
        usize::from(o.qps.max(1)),
        o.shared_buffer,
    )
    .bytes();
    let (stream, protocol) = open_exchange(o, server, quiet, region as u64)?;
    let role = if server { Role::Server } else { Role::Client };
    let (mut cycle, mut cache_line) = (CYCLE_BUFFER, CACHE_LINE);
    let mut perftest_conn = None;
    if protocol == Protocol::Perftest {
        if o.cc.uses_extensions() {
            return Err(format!(
                "--cc {}: perftest peers negotiate no extensions; use --cc none or dcqcn",
                o.cc
            )
            .into());
        }
        let mut conn = PerftestConn::new(stream.try_clone()?, role);
        let hello = conn.hello(CYCLE_BUFFER, CACHE_LINE, mtu)?;
        (cycle, cache_line, mtu) = (hello.cycle_buffer, hello.cache_line, hello.mtu);
        perftest_conn = Some(conn);
    }
    let mut loss_recovery = o.loss_recovery;
    if protocol == Protocol::Perftest && loss_recovery != LossRecovery::Gbn {
        // Selective repeat is between rsnic peers that agreed on it.
        if !quiet {
            eprintln!("roce-perf: --loss-recovery {loss_recovery}: a perftest peer gets gbn");
        }
        loss_recovery = LossRecovery::Gbn;
    }
    let (cq, mut qps, qopts) = create_qps(test, o, &dev, mtu, loss_recovery)?;
    let nq = qps.len();
    let layout = Layout::new(max_size, cycle, cache_line, nq, o.shared_buffer);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = dev.reg_mr(layout.bytes(), access)?;
    let mine = Mine {
        qps: &qps,
        qopts: &qopts,
        mr: &mr,
        layout: &layout,
        mtu,
        server,
    };
    let ex = match perftest_conn {
        Some(conn) => exchange_perftest(test, o, conn, &mine)?,
        None => {
            let test_name = if nq > 1 {
                format!("{name}-q{nq}")
            } else {
                name.to_string()
            };
            exchange_rsnic(o, stream, &dev, &test_name, &mine)?
        }
    };
    let Exchanged {
        mut link,
        remotes,
        lines,
        macs,
    } = ex;
    for (q, (qp, r)) in qps.iter_mut().zip(&remotes).enumerate() {
        // Our exchange carried the mode (`ext=sr`) and refused a mismatch; a
        // perftest peer got gbn above.
        qp.set_peer_loss_recovery(loss_recovery);
        qp.connect(&RemoteQp {
            qpn: r.qpn,
            psn: r.psn,
            ip: r.ip.octets(),
            mac: o.peer_mac.or(macs.get(q).copied()),
            mtu,
            cc: o.cc,
        })?;
    }
    barriers(&mut link, test, nq)?;
    if !quiet {
        print_preamble(test, o, nq, mtu, &link, &lines);
    }
    // What follows waits for the peer's test, as long as it takes.
    link.set_wait(o.timeout.map(Duration::from_secs))?;
    Ok(Session {
        dev,
        cq,
        qps,
        mr,
        layout,
        remotes,
        link,
        server,
        sges: o.sge,
    })
}

/// The path MTU: `-m`, or the largest the port carries. As ibverbs' active_mtu
/// follows the netdev's MTU, a path MTU whose frames the port would drop is refused
/// up front.
fn checked_mtu(o: &Opts, dev: &Device) -> Res<u32> {
    let mtu = o.mtu.map_or(dev.max_path_mtu(), u32::from);
    if mtu > dev.max_path_mtu() {
        return Err(format!(
            "-m {mtu}: {} carries RoCE MTUs up to {} (its frames are too short for more)",
            o.dev,
            dev.max_path_mtu()
        )
        .into());
    }
    Ok(mtu)
}

/// The TCP connection of the exchange (accepted as a server, connected as a
/// client) with its timeouts, and the exchange it speaks: a server detects it, a
/// client speaks `--exchange`. `region` is the size of the buffer this end
/// will register (the peer's is about the same).
fn open_exchange(o: &Opts, server: bool, quiet: bool, region: u64) -> Res<(TcpStream, Protocol)> {
    let stream = match o.server {
        None => accept(o, quiet)?,
        Some(addr) => connect(o, addr)?,
    };
    // Each end creates its QPs and registers (and so zeroes) its buffer
    // between connecting and its first line: the peer's wait grows with
    // their number and its size (16k QPs, or 2 x 2 GiB, take tens of
    // seconds on a loaded machine: 5 ms per QP, 1 s per 128 MiB here), and
    // `--timeout` may make it longer.
    let exchange_timeout = (EXCHANGE_TIMEOUT
        + Duration::from_millis(5 * u64::from(o.qps))
        + Duration::from_secs(region >> 27))
    .max(Duration::from_secs(o.timeout.unwrap_or(0)));
    stream.set_read_timeout(Some(exchange_timeout))?;
    stream.set_write_timeout(Some(exchange_timeout))?;
    stream.set_nodelay(true)?;
    let protocol = if server {
        detect(&stream)?
    } else {
        match o.exchange {
            ExchangeArg::Rsnic => Protocol::Rsnic,
            ExchangeArg::Perftest => Protocol::Perftest,
        }
    };
    Ok((stream, protocol))
}

/// One CQ per shard (a QP completes on its own shard) and `-q` RC QPs, QP j on CQ
/// j, posted to round robin and sharing the buffer.
fn create_qps(
    test: &Test,
    o: &Opts,
    dev: &Device,
    mtu: u32,
    loss_recovery: LossRecovery,
) -> Res<(Cqs, Vec<QueuePair>, QpOptions)> {
    let mut cq = Cqs {
        cqs: Vec::new(),
        next: 0,
    };
    let rq_depth = if test.is_send() {
        512
    } else {
        o.tx_depth.max(1)
    };
    for _ in 0..dev.shards() {
        cq.cqs
            .push(dev.create_cq((usize::from(o.tx_depth) + usize::from(rq_depth)) * 2 + 64)?);
    }
    let qopts = QpOptions {
        sq_depth: o.tx_depth.max(1),
        rq_depth,
        mtu,
        cc: o.cc,
        timeout_ns: 4_096u64 << o.qp_timeout,
        max_send_sge: o.sge,
        loss_recovery,
        ..QpOptions::default()
    };
    let nq = usize::from(o.qps.max(1));
    let mut qps = Vec::with_capacity(nq);
    for j in 0..nq {
        let c = &cq.cqs[j % cq.cqs.len()];
        qps.push(dev.create_qp(c, c, qopts)?);
    }
    Ok((cq, qps, qopts))
}

/// The barriers after the QPs are ready (perftest: one per QP and one more; the
/// SEND tests in the other order).
fn barriers(link: &mut Link, test: &Test, nq: usize) -> Res<()> {
    let nq_shakes = |link: &mut Link| -> Res<()> {
        for _ in 0..nq {
            link.handshake()?;
        }
        Ok(())
    };
    if test.is_send() {
        link.handshake()?;
        nq_shakes(link)
    } else {
        nq_shakes(link)?;
        link.handshake()
    }
}

/// perftest's preamble: the settings, then one local and one remote address line
/// per QP.
fn print_preamble(
    test: &Test,
    o: &Opts,
    nq: usize,
    mtu: u32,
    link: &Link,
    lines: &[(AddressLine, AddressLine)],
) {
    let mut settings = vec![
        ("Dual-port", "OFF".to_string()),
        ("Device", o.dev.as_str().to_string()),
        ("Number of qps", nq.to_string()),
        ("Transport type", "RoCEv2 (rsnic, DPDK)".to_string()),
        ("Connection type", "RC".to_string()),
        ("TX depth", o.tx_depth.to_string()),
        ("Mtu", format!("{mtu}[B]")),
        ("Link type", "Ethernet".to_string()),
        ("Congestion ctl", o.cc.to_string()),
        (
            "Data ex. method",
            format!("Ethernet ({} exchange)", link.protocol()),
        ),
    ];
    if o.loss_recovery != LossRecovery::Gbn && link.protocol() != Protocol::Perftest {
        settings.push(("Loss recovery", o.loss_recovery.to_string()));
    }
    print!("{}", perftest::preamble(test.title(), &settings));
    for (l, _) in lines {
        print!("{}", l.format("local"));
    }
    for (_, r) in lines {
        print!("{}", r.format("remote"));
    }
    println!("{}", perftest::RULE);
}
