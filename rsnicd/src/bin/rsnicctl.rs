//! rsnicctl: what an rsnicd serves, in the spirit of iproute2's `rdma`
//! (`rdma dev`, `rdma statistic`, `rdma resource show`): the device, its
//! counters, the programs attached; `--json` for scripts.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use rsnicd::proto::Message;
use rsnicd::sock::{refused, Client, SockError};

/// Shows what an rsnicd serves.
#[derive(Parser, Debug)]
#[command(name = "rsnicctl", version)]
struct Cli {
    /// The daemon's socket (default: RSNIC_SOCKET, else /run/rsnic/rsnicd.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// The device: port, addresses, shards, the daemon's PID.
    Status,
    /// The port's counters (the engine's and the daemon's).
    Counters,
    /// The programs attached.
    Programs,
    /// Every program's QPs: owner, handle, QPN, the engine's description.
    Qps,
}

fn run(cli: &Cli) -> Result<(), SockError> {
    let path = cli.socket.clone().unwrap_or_else(rsnicd::socket_path);
    let (mut c, welcome) = Client::connect(&path, "rsnicctl", Duration::from_secs(5))?;
    let json =
        |v: serde_json::Value| println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    match cli.what {
        What::Status => {
            if cli.json {
                json(serde_json::to_value(&welcome).expect("json"));
            } else {
                let ip = welcome.ip.map(|b| b.to_string()).join(".");
                let mac: Vec<String> = welcome.mac.iter().map(|b| format!("{b:02x}")).collect();
                println!(
                    "rsnic0 dev {} ip {ip} mac {} shards {} max_mtu {} daemon pid {}",
                    welcome.dev,
                    mac.join(":"),
                    welcome.shards,
                    welcome.max_path_mtu,
                    welcome.daemon_pid
                );
            }
        }
        What::Counters => match c.request(&Message::GetCounters)? {
            Message::Counters(list) => {
                if cli.json {
                    let map: serde_json::Map<String, serde_json::Value> =
                        list.into_iter().map(|(k, v)| (k, v.into())).collect();
                    json(serde_json::Value::Object(map));
                } else {
                    for (k, v) in list {
                        println!("{k:<28} {v}");
                    }
                }
            }
            other => return Err(refused(other)),
        },
        What::Programs => match c.request(&Message::GetPrograms)? {
            Message::Programs(list) => {
                if cli.json {
                    json(serde_json::to_value(&list).expect("json"));
                } else {
                    println!("{:>8} {:>6} {:>8}  name", "pid", "uid", "seconds");
                    for p in list {
                        println!("{:>8} {:>6} {:>8}  {}", p.pid, p.uid, p.connected_s, p.name);
                    }
                }
            }
            other => return Err(refused(other)),
        },
        What::Qps => match c.request(&Message::GetQps)? {
            Message::Qps(list) => {
                if cli.json {
                    json(serde_json::to_value(&list).expect("json"));
                } else {
                    println!("{:>8} {:>6} {:>8}  state", "pid", "handle", "qpn");
                    for q in list {
                        println!(
                            "{:>8} {:>6} {:>#8x}  {}",
                            q.pid, q.handle, q.qpn, q.describe
                        );
                    }
                }
            }
            other => return Err(refused(other)),
        },
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        eprintln!("rsnicctl: {e}");
        std::process::exit(1);
    }
}
