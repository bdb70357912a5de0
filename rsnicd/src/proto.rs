//! The control protocol between `rsnicd` and its clients (programs through
//! `librsnic_verbs.so`, `rsnicctl`): one message per `SOCK_SEQPACKET`
//! datagram, so the socket keeps the boundaries and no length prefix can
//! desynchronise the stream. A message is a 16-byte header and a body:
//!
//! ```text
//! 0 magic "RSND" (u32 LE 0x444e5352) | 4 version (u16) | 6 kind (u16)
//! 8 sequence (u32: a reply carries its request's) | 12 body length (u32)
//! 16 body: fields in order, integers little-endian, a string as u16
//!    length + UTF-8 bytes, a list as u16 count + its items
//! ```
//!
//! Everything is checked: a wrong magic or version, an unknown kind, a body
//! shorter or longer than its fields, a length past [`MAX_MESSAGE`] or a
//! string that is not UTF-8 is a [`ProtoError`], which the daemon answers
//! with [`Message::Error`] and counts (`ctl_malformed`), never a panic.

use zerocopy::byteorder::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// "RSND", little-endian.
pub const MAGIC: u32 = 0x444e_5352;
/// The protocol's version; a peer of another version is refused at `Hello`.
pub const VERSION: u16 = 1;
/// The largest message (header and body) either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The fixed header of every message.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Header {
    magic: U32,
    version: U16,
    kind: U16,
    seq: U32,
    len: U32,
}

/// The header's length.
pub const HEADER_LEN: usize = std::mem::size_of::<Header>();

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Fewer bytes than the header or than a field needs.
    #[error("truncated message: {0}")]
    Truncated(&'static str),
    /// Not this protocol.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// Another version of it.
    #[error("protocol version {0}, this side speaks {VERSION}")]
    Version(u16),
    /// A kind this side does not know.
    #[error("unknown message kind {0}")]
    UnknownKind(u16),
    /// The header's length disagrees with the datagram's.
    #[error("body length {0} in the header, {1} bytes after it")]
    Length(u32, usize),
    /// Bytes left after the last field.
    #[error("{0} bytes after the last field")]
    Trailing(usize),
    /// Past [`MAX_MESSAGE`] (or a string past u16).
    #[error("message too long")]
    TooLong,
    /// A string that is not UTF-8.
    #[error("a string is not UTF-8")]
    Utf8,
    /// A field whose value this side does not know.
    #[error("bad value of field {0}")]
    Field(&'static str),
}

/// A program attached to the daemon, as `rsnicctl programs` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProgramInfo {
    /// Its process ID (from SO_PEERCRED, not from what it says).
    pub pid: u32,
    /// Its user ID (SO_PEERCRED).
    pub uid: u32,
    /// The name it gave in `Hello` (its command, for the listing).
    pub name: String,
    /// Seconds since it connected.
    pub connected_s: u64,
}

/// A QP the daemon holds for a program, as `rsnicctl qps` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QpInfo {
    /// The owning program's PID.
    pub pid: u32,
    /// The program's handle for it.
    pub handle: u32,
    /// Its QP number on the wire.
    pub qpn: u32,
    /// The engine's one-line description (state, PSNs, peer, CC).
    pub describe: String,
}

/// The service of a QP to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum QpService {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// The daemon's answer to `Hello`: the device it serves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Welcome {
    /// The daemon's process ID.
    pub daemon_pid: u32,
    /// The port's DPDK devargs.
    pub dev: String,
    /// The port's IPv4 address.
    pub ip: [u8; 4],
    /// The port's MAC.
    pub mac: [u8; 6],
    /// Engine shards.
    pub shards: u16,
    /// The largest path MTU the port takes.
    pub max_path_mtu: u32,
}

/// One message, either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A client's first message: its protocol version and name.
    Hello {
        /// The client's protocol version (refused unless [`VERSION`]).
        version: u16,
        /// What the client calls itself (a program's command).
        name: String,
    },
    /// The answer to `Hello`.
    Welcome(Welcome),
    /// Asks for the port's counters.
    GetCounters,
    /// The port's counters, by name (the engine's and the daemon's own).
    Counters(Vec<(String, u64)>),
    /// Asks for the programs attached.
    GetPrograms,
    /// The programs attached.
    Programs(Vec<ProgramInfo>),
    /// Creates a QP (and its CQ) owned by this connection's program.
    CreateQp {
        /// RC, UC or UD.
        service: QpService,
        /// Send queue depth.
        sq_depth: u16,
        /// Receive queue depth.
        rq_depth: u16,
    },
    /// The QP created: the program's handle and its QPN.
    QpCreated {
        /// The handle the program names it by (its own table's).
        handle: u32,
        /// Its QP number on the wire.
        qpn: u32,
    },
    /// Destroys one of this program's QPs (and its CQ).
    DestroyQp {
        /// The program's handle.
        handle: u32,
    },
    /// A request done, with nothing to return.
    Done,
    /// Asks for every program's QPs.
    GetQps,
    /// Every program's QPs.
    Qps(Vec<QpInfo>),
    /// A refusal: an errno and why.
    Error {
        /// What the verb that asked returns (EINVAL for a malformed message).
        errno: i32,
        /// Why, for a person.
        message: String,
    },
}

mod kind {
    pub const HELLO: u16 = 1;
    pub const WELCOME: u16 = 2;
    pub const GET_COUNTERS: u16 = 3;
    pub const COUNTERS: u16 = 4;
    pub const GET_PROGRAMS: u16 = 5;
    pub const PROGRAMS: u16 = 6;
    pub const CREATE_QP: u16 = 7;
    pub const QP_CREATED: u16 = 8;
    pub const DESTROY_QP: u16 = 9;
    pub const DONE: u16 = 10;
    pub const GET_QPS: u16 = 11;
    pub const QPS: u16 = 12;
    pub const ERROR: u16 = 0xffff;
}

/// Appends fields to a body.
struct Writer(Vec<u8>);

impl Writer {
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) -> Result<(), ProtoError> {
        self.u16(u16::try_from(s.len()).map_err(|_| ProtoError::TooLong)?);
        self.bytes(s.as_bytes());
        Ok(())
    }
    fn count(&mut self, n: usize) -> Result<(), ProtoError> {
        self.u16(u16::try_from(n).map_err(|_| ProtoError::TooLong)?);
        Ok(())
    }
}

/// Reads fields off a body, each checked against what is left.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Truncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn str(&mut self, what: &'static str) -> Result<String, ProtoError> {
        let n = self.u16(what)?;
        let b = self.take(usize::from(n), what)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Utf8)
    }
    fn done(&self) -> Result<(), ProtoError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

impl Message {
    fn kind(&self) -> u16 {
        match self {
            Message::Hello { .. } => kind::HELLO,
            Message::Welcome(_) => kind::WELCOME,
            Message::GetCounters => kind::GET_COUNTERS,
            Message::Counters(_) => kind::COUNTERS,
            Message::GetPrograms => kind::GET_PROGRAMS,
            Message::Programs(_) => kind::PROGRAMS,
            Message::CreateQp { .. } => kind::CREATE_QP,
            Message::QpCreated { .. } => kind::QP_CREATED,
            Message::DestroyQp { .. } => kind::DESTROY_QP,
            Message::Done => kind::DONE,
            Message::GetQps => kind::GET_QPS,
            Message::Qps(_) => kind::QPS,
            Message::Error { .. } => kind::ERROR,
        }
    }

    /// The message as one datagram, with sequence number `seq`.
    pub fn encode(&self, seq: u32) -> Result<Vec<u8>, ProtoError> {
        let mut w = Writer(Vec::with_capacity(64));
        match self {
            Message::Hello { version, name } => {
                w.u16(*version);
                w.str(name)?;
            }
            Message::Welcome(x) => {
                w.u32(x.daemon_pid);
                w.str(&x.dev)?;
                w.bytes(&x.ip);
                w.bytes(&x.mac);
                w.u16(x.shards);
                w.u32(x.max_path_mtu);
            }
            Message::GetCounters | Message::GetPrograms | Message::Done | Message::GetQps => {}
            Message::CreateQp {
                service,
                sq_depth,
                rq_depth,
            } => {
                w.u16(match service {
                    QpService::Rc => 0,
                    QpService::Uc => 1,
                    QpService::Ud => 2,
                });
                w.u16(*sq_depth);
                w.u16(*rq_depth);
            }
            Message::QpCreated { handle, qpn } => {
                w.u32(*handle);
                w.u32(*qpn);
            }
            Message::DestroyQp { handle } => w.u32(*handle),
            Message::Qps(list) => {
                w.count(list.len())?;
                for q in list {
                    w.u32(q.pid);
                    w.u32(q.handle);
                    w.u32(q.qpn);
                    w.str(&q.describe)?;
                }
            }
            Message::Counters(list) => {
                w.count(list.len())?;
                for (name, v) in list {
                    w.str(name)?;
                    w.u64(*v);
                }
            }
            Message::Programs(list) => {
                w.count(list.len())?;
                for p in list {
                    w.u32(p.pid);
                    w.u32(p.uid);
                    w.str(&p.name)?;
                    w.u64(p.connected_s);
                }
            }
            Message::Error { errno, message } => {
                w.u32(*errno as u32);
                w.str(message)?;
            }
        }
        let body = w.0;
        if HEADER_LEN + body.len() > MAX_MESSAGE {
            return Err(ProtoError::TooLong);
        }
        let h = Header {
            magic: MAGIC.into(),
            version: VERSION.into(),
            kind: self.kind().into(),
            seq: seq.into(),
            len: (body.len() as u32).into(),
        };
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// One datagram as a message and its sequence number.
    pub fn decode(b: &[u8]) -> Result<(Message, u32), ProtoError> {
        if b.len() > MAX_MESSAGE {
            return Err(ProtoError::TooLong);
        }
        let (h, body) = Header::ref_from_prefix(b).map_err(|_| ProtoError::Truncated("header"))?;
        if h.magic.get() != MAGIC {
            return Err(ProtoError::BadMagic(h.magic.get()));
        }
        if h.version.get() != VERSION {
            return Err(ProtoError::Version(h.version.get()));
        }
        if h.len.get() as usize != body.len() {
            return Err(ProtoError::Length(h.len.get(), body.len()));
        }
        let mut r = Reader(body);
        let m = match h.kind.get() {
            kind::HELLO => Message::Hello {
                version: r.u16("version")?,
                name: r.str("name")?,
            },
            kind::WELCOME => Message::Welcome(Welcome {
                daemon_pid: r.u32("daemon pid")?,
                dev: r.str("dev")?,
                ip: r.array("ip")?,
                mac: r.array("mac")?,
                shards: r.u16("shards")?,
                max_path_mtu: r.u32("max path MTU")?,
            }),
            kind::GET_COUNTERS => Message::GetCounters,
            kind::COUNTERS => {
                let n = r.u16("count")?;
                let mut list = Vec::new();
                for _ in 0..n {
                    list.push((r.str("counter name")?, r.u64("counter value")?));
                }
                Message::Counters(list)
            }
            kind::GET_PROGRAMS => Message::GetPrograms,
            kind::PROGRAMS => {
                let n = r.u16("count")?;
                let mut list = Vec::new();
                for _ in 0..n {
                    list.push(ProgramInfo {
                        pid: r.u32("pid")?,
                        uid: r.u32("uid")?,
                        name: r.str("name")?,
                        connected_s: r.u64("connected")?,
                    });
                }
                Message::Programs(list)
            }
            kind::CREATE_QP => Message::CreateQp {
                service: match r.u16("service")? {
                    0 => QpService::Rc,
                    1 => QpService::Uc,
                    2 => QpService::Ud,
                    _ => return Err(ProtoError::Field("service")),
                },
                sq_depth: r.u16("sq depth")?,
                rq_depth: r.u16("rq depth")?,
            },
            kind::QP_CREATED => Message::QpCreated {
                handle: r.u32("handle")?,
                qpn: r.u32("qpn")?,
            },
            kind::DESTROY_QP => Message::DestroyQp {
                handle: r.u32("handle")?,
            },
            kind::DONE => Message::Done,
            kind::GET_QPS => Message::GetQps,
            kind::QPS => {
                let n = r.u16("count")?;
                let mut list = Vec::new();
                for _ in 0..n {
                    list.push(QpInfo {
                        pid: r.u32("pid")?,
                        handle: r.u32("handle")?,
                        qpn: r.u32("qpn")?,
                        describe: r.str("describe")?,
                    });
                }
                Message::Qps(list)
            }
            kind::ERROR => Message::Error {
                errno: r.u32("errno")? as i32,
                message: r.str("message")?,
            },
            k => return Err(ProtoError::UnknownKind(k)),
        };
        r.done()?;
        Ok((m, h.seq.get()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn samples() -> Vec<Message> {
        vec![
            Message::Hello {
                version: VERSION,
                name: "ib_write_bw".into(),
            },
            Message::Welcome(Welcome {
                daemon_pid: 42,
                dev: "net_tap0,iface=rs0".into(),
                ip: [10, 0, 0, 1],
                mac: [2, 0, 0, 0, 0, 1],
                shards: 2,
                max_path_mtu: 4096,
            }),
            Message::GetCounters,
            Message::Counters(vec![("rx_packets".into(), 7), ("ctl_malformed".into(), 0)]),
            Message::GetPrograms,
            Message::Programs(vec![ProgramInfo {
                pid: 9,
                uid: 0,
                name: "qperf".into(),
                connected_s: 3,
            }]),
            Message::CreateQp {
                service: QpService::Ud,
                sq_depth: 64,
                rq_depth: 128,
            },
            Message::QpCreated {
                handle: 3,
                qpn: 0x11,
            },
            Message::DestroyQp { handle: 3 },
            Message::Done,
            Message::GetQps,
            Message::Qps(vec![QpInfo {
                pid: 9,
                handle: 1,
                qpn: 0x12,
                describe: "RTS".into(),
            }]),
            Message::Error {
                errno: libc::EINVAL,
                message: "bad".into(),
            },
        ]
    }

    #[test]
    fn every_message_survives_encode_then_decode() {
        for (i, m) in samples().into_iter().enumerate() {
            let b = m.encode(i as u32).unwrap();
            assert_eq!(Message::decode(&b).unwrap(), (m, i as u32));
        }
    }

    #[test]
    fn every_shorter_datagram_is_refused() {
        for m in samples() {
            let b = m.encode(1).unwrap();
            for n in 0..b.len() {
                assert!(Message::decode(&b[..n]).is_err(), "{m:?} cut at {n}");
            }
        }
    }

    #[test]
    fn bad_headers_and_trailing_bytes_are_refused() {
        let good = Message::GetCounters.encode(5).unwrap();
        let mut b = good.clone();
        b[0] ^= 1;
        assert!(matches!(Message::decode(&b), Err(ProtoError::BadMagic(_))));
        let mut b = good.clone();
        b[4] = 9;
        assert_eq!(Message::decode(&b), Err(ProtoError::Version(9)));
        let mut b = good.clone();
        b[6] = 0x77;
        assert_eq!(Message::decode(&b), Err(ProtoError::UnknownKind(0x77)));
        // A body byte the kind has no field for: the header's length must
        // cover it (else Length), and then it is trailing.
        let mut b = good.clone();
        b.push(0);
        assert_eq!(Message::decode(&b), Err(ProtoError::Length(0, 1)));
        b[12] = 1;
        assert_eq!(Message::decode(&b), Err(ProtoError::Trailing(1)));
        assert_eq!(
            Message::decode(&vec![0u8; MAX_MESSAGE + 1]),
            Err(ProtoError::TooLong)
        );
    }

    #[test]
    fn an_unknown_qp_service_is_refused() {
        let mut b = Message::CreateQp {
            service: QpService::Rc,
            sq_depth: 1,
            rq_depth: 1,
        }
        .encode(1)
        .unwrap();
        b[HEADER_LEN] = 7;
        assert_eq!(Message::decode(&b), Err(ProtoError::Field("service")));
    }

    #[test]
    fn a_string_past_u16_is_refused_at_encode() {
        let m = Message::Hello {
            version: VERSION,
            name: "x".repeat(70_000),
        };
        assert_eq!(m.encode(0), Err(ProtoError::TooLong));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Message::decode(&b);
        }

        #[test]
        fn a_valid_header_over_arbitrary_bodies_never_panics(
            k in 0u16..14, body in proptest::collection::vec(any::<u8>(), 0..128)
        ) {
            let mut b = Message::GetCounters.encode(0).unwrap();
            b[6..8].copy_from_slice(&k.to_le_bytes());
            b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
            b.extend_from_slice(&body);
            let _ = Message::decode(&b);
        }
    }
}
