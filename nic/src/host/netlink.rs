//! rtnetlink messages of host mode, built and parsed without I/O (the
//! socket is in crate::sys).
//!
//! Formats from the kernel's UAPI headers and `Documentation/userspace-api/
//! netlink/intro.rst`: every message is a `struct nlmsghdr` (16 bytes:
//! length, type, flags, sequence, port id, host byte order) followed by a
//! family header (`struct ndmsg` for neighbours, `ifaddrmsg` for addresses,
//! `rtmsg` for routes) and attributes (`struct rtattr`: 2-byte length
//! including its 4-byte header, 2-byte type, value, padded to 4 bytes).
//! Several messages may come in one datagram, each padded to 4 bytes.
//!
//! The parser takes what the kernel sends, which this process treats as
//! untrusted bytes: every length is checked, nothing panics, and a
//! malformed message is an error (fuzzed by `nic/fuzz` target `netlink`).

/// `NLMSG_ERROR`: an error or (errno 0) an acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// `NLMSG_DONE`: the end of a dump.
pub const NLMSG_DONE: u16 = 3;
/// `RTM_NEWADDR` (a dumped address).
pub const RTM_NEWADDR: u16 = 20;
/// `RTM_GETADDR`.
pub const RTM_GETADDR: u16 = 22;
/// `RTM_NEWROUTE` (the answer to a route get).
pub const RTM_NEWROUTE: u16 = 24;
/// `RTM_GETROUTE`.
pub const RTM_GETROUTE: u16 = 26;
/// `RTM_NEWNEIGH` (an entry; also the request that creates or uses one).
pub const RTM_NEWNEIGH: u16 = 28;
/// `RTM_GETNEIGH`.
pub const RTM_GETNEIGH: u16 = 30;

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_REPLACE`.
pub const NLM_F_REPLACE: u16 = 0x100;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;

/// `AF_INET`.
pub const AF_INET: u8 = 2;

/// Neighbour states (`NUD_*`, include/uapi/linux/neighbour.h).
pub mod nud {
    /// Resolution under way.
    pub const INCOMPLETE: u16 = 0x01;
    /// Confirmed recently.
    pub const REACHABLE: u16 = 0x02;
    /// Usable, to be confirmed at next use.
    pub const STALE: u16 = 0x04;
    /// Used, waiting for confirmation.
    pub const DELAY: u16 = 0x08;
    /// Being confirmed by unicast probes.
    pub const PROBE: u16 = 0x10;
    /// Resolution failed.
    pub const FAILED: u16 = 0x20;
    /// No ARP on this device.
    pub const NOARP: u16 = 0x40;
    /// Static.
    pub const PERMANENT: u16 = 0x80;
    /// States whose link-layer address may be used (the kernel's
    /// `NUD_VALID`).
    pub const VALID: u16 = PERMANENT | NOARP | REACHABLE | PROBE | STALE | DELAY;
}

/// `NTF_USE`: on `RTM_NEWNEIGH`, "use" the entry as a packet to it would,
/// which starts a resolution (`neigh_event_send`) instead of setting a state.
pub const NTF_USE: u8 = 0x01;

const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;

const NLMSG_HDRLEN: usize = 16;
const NDMSG_LEN: usize = 12;
const IFADDRMSG_LEN: usize = 8;
const RTMSG_LEN: usize = 12;

/// A message that could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Shorter than its header, or its length field runs past the data.
    #[error("netlink message truncated or with a bad length")]
    Truncated,
    /// An attribute's length is below its header or runs past the message.
    #[error("netlink attribute with a bad length")]
    BadAttribute,
}

/// A neighbour entry (`RTM_NEWNEIGH`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neigh {
    /// Address family.
    pub family: u8,
    /// Interface index.
    pub ifindex: u32,
    /// `NUD_*` state.
    pub state: u16,
    /// `NTF_*` flags.
    pub flags: u8,
    /// The IPv4 address (`NDA_DST`), when 4 bytes long.
    pub dst: Option<[u8; 4]>,
    /// The link-layer address (`NDA_LLADDR`), when 6 bytes long.
    pub lladdr: Option<[u8; 6]>,
}

/// An interface address (`RTM_NEWADDR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    /// Address family.
    pub family: u8,
    /// Prefix length.
    pub prefix_len: u8,
    /// Interface index.
    pub ifindex: u32,
    /// `IFA_LOCAL` (the interface's own address), when 4 bytes long.
    pub local: Option<[u8; 4]>,
    /// `IFA_ADDRESS` (the peer's on point-to-point links, else the same).
    pub address: Option<[u8; 4]>,
}

/// A route (`RTM_NEWROUTE`, the answer to [`route_get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// Address family.
    pub family: u8,
    /// Route type (`RTN_UNICAST` 1, `RTN_LOCAL` 2, `RTN_UNREACHABLE` 7, ...).
    pub kind: u8,
    /// Output interface (`RTA_OIF`).
    pub oif: Option<u32>,
    /// Next hop when not on-link (`RTA_GATEWAY`).
    pub gateway: Option<[u8; 4]>,
    /// Preferred source address (`RTA_PREFSRC`).
    pub prefsrc: Option<[u8; 4]>,
}

/// One parsed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// `NLMSG_ERROR`: `errno` 0 is an acknowledgement, else a negative errno.
    Error {
        /// Sequence number of the message.
        seq: u32,
        /// The kernel's (negative) errno, 0 for an ACK.
        errno: i32,
    },
    /// `NLMSG_DONE`.
    Done {
        /// Sequence number.
        seq: u32,
    },
    /// A neighbour.
    Neigh {
        /// Sequence number.
        seq: u32,
        /// The entry.
        neigh: Neigh,
    },
    /// An address.
    Addr {
        /// Sequence number.
        seq: u32,
        /// The address.
        addr: Addr,
    },
    /// A route.
    Route {
        /// Sequence number.
        seq: u32,
        /// The route.
        route: Route,
    },
    /// Any other type (ignored).
    Other {
        /// Sequence number.
        seq: u32,
        /// `nlmsg_type`.
        kind: u16,
    },
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// The attributes in `b`: (type without the nested/byte-order bits, value).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), ParseError>> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            // Trailing padding shorter than a header is ignored.
            return None;
        }
        let len = usize::from(u16_at(b, 0)?);
        let kind = u16_at(b, 2)? & 0x3FFF;
        if len < 4 || len > b.len() {
            b = &[];
            return Some(Err(ParseError::BadAttribute));
        }
        let value = &b[4..len];
        b = b.get(align4(len)..).unwrap_or(&[]);
        Some(Ok((kind, value)))
    })
}

fn ipv4(v: &[u8]) -> Option<[u8; 4]> {
    v.try_into().ok()
}

/// Parses every message of one datagram.
pub fn parse(mut buf: &[u8]) -> Result<Vec<Message>, ParseError> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let len = u32_at(buf, 0).ok_or(ParseError::Truncated)? as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(ParseError::Truncated);
        }
        let kind = u16_at(buf, 4).ok_or(ParseError::Truncated)?;
        let seq = u32_at(buf, 8).ok_or(ParseError::Truncated)?;
        let body = &buf[NLMSG_HDRLEN..len];
        out.push(parse_one(kind, seq, body)?);
        buf = buf.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

fn parse_one(kind: u16, seq: u32, body: &[u8]) -> Result<Message, ParseError> {
    Ok(match kind {
        NLMSG_ERROR => Message::Error {
            seq,
            errno: u32_at(body, 0).ok_or(ParseError::Truncated)? as i32,
        },
        NLMSG_DONE => Message::Done { seq },
        RTM_NEWNEIGH => {
            let h = body.get(..NDMSG_LEN).ok_or(ParseError::Truncated)?;
            let mut n = Neigh {
                family: h[0],
                ifindex: u32_at(h, 4).ok_or(ParseError::Truncated)?,
                state: u16_at(h, 8).ok_or(ParseError::Truncated)?,
                flags: h[10],
                dst: None,
                lladdr: None,
            };
            for a in attrs(&body[NDMSG_LEN..]) {
                match a? {
                    (NDA_DST, v) => n.dst = ipv4(v),
                    (NDA_LLADDR, v) => n.lladdr = v.try_into().ok(),
                    _ => {}
                }
            }
            Message::Neigh { seq, neigh: n }
        }
        RTM_NEWADDR => {
            let h = body.get(..IFADDRMSG_LEN).ok_or(ParseError::Truncated)?;
            let mut a = Addr {
                family: h[0],
                prefix_len: h[1],
                ifindex: u32_at(h, 4).ok_or(ParseError::Truncated)?,
                local: None,
                address: None,
            };
            for at in attrs(&body[IFADDRMSG_LEN..]) {
                match at? {
                    (IFA_LOCAL, v) => a.local = ipv4(v),
                    (IFA_ADDRESS, v) => a.address = ipv4(v),
                    _ => {}
                }
            }
            Message::Addr { seq, addr: a }
        }
        RTM_NEWROUTE => {
            let h = body.get(..RTMSG_LEN).ok_or(ParseError::Truncated)?;
            let mut r = Route {
                family: h[0],
                kind: h[7],
                oif: None,
                gateway: None,
                prefsrc: None,
            };
            for at in attrs(&body[RTMSG_LEN..]) {
                match at? {
                    (RTA_OIF, v) => r.oif = u32_at(v, 0).filter(|_| v.len() == 4),
                    (RTA_GATEWAY, v) => r.gateway = ipv4(v),
                    (RTA_PREFSRC, v) => r.prefsrc = ipv4(v),
                    (RTA_DST, _) => {}
                    _ => {}
                }
            }
            Message::Route { seq, route: r }
        }
        kind => Message::Other { seq, kind },
    })
}

/// A message of `kind` with `flags`, sequence `seq`, family header `fam`
/// and attributes `attrs` (type, value).
fn message(kind: u16, flags: u16, seq: u32, fam: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDRLEN];
    m.extend_from_slice(fam);
    m.resize(align4(m.len()), 0);
    for (t, v) in attrs {
        let len = 4 + v.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(v);
        m.resize(align4(m.len()), 0);
    }
    let total = m.len() as u32;
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&kind.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in our port id.
    m
}

fn ndmsg(ifindex: u32, state: u16, flags: u8) -> [u8; NDMSG_LEN] {
    let mut h = [0u8; NDMSG_LEN];
    h[0] = AF_INET;
    h[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    h[8..10].copy_from_slice(&state.to_ne_bytes());
    h[10] = flags;
    h
}

/// `RTM_GETNEIGH` for `ip` on `ifindex` (a "get", not a dump: kernel >= 5.0;
/// the kernel answers one `RTM_NEWNEIGH` or `ENOENT`).
pub fn neigh_get(seq: u32, ifindex: u32, ip: [u8; 4]) -> Vec<u8> {
    message(
        RTM_GETNEIGH,
        NLM_F_REQUEST,
        seq,
        &ndmsg(ifindex, 0, 0),
        &[(NDA_DST, &ip)],
    )
}

/// `RTM_NEWNEIGH` with `NTF_USE` for `ip` on `ifindex`, created if absent:
/// the kernel starts resolving it as if a packet were queued to it
/// (net/core/neighbour.c `neigh_add`), without sending any packet of ours.
/// Acknowledged (`NLM_F_ACK`).
pub fn neigh_use(seq: u32, ifindex: u32, ip: [u8; 4]) -> Vec<u8> {
    message(
        RTM_NEWNEIGH,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
        seq,
        &ndmsg(ifindex, 0, NTF_USE),
        &[(NDA_DST, &ip)],
    )
}

/// `RTM_GETROUTE` for the host route to `ip` (what `ip route get` asks).
pub fn route_get(seq: u32, ip: [u8; 4]) -> Vec<u8> {
    let mut h = [0u8; RTMSG_LEN];
    h[0] = AF_INET;
    h[1] = 32; // rtm_dst_len
    message(RTM_GETROUTE, NLM_F_REQUEST, seq, &h, &[(RTA_DST, &ip)])
}

/// `RTM_GETADDR` dump of the IPv4 addresses.
pub fn addr_dump(seq: u32) -> Vec<u8> {
    let mut h = [0u8; IFADDRMSG_LEN];
    h[0] = AF_INET;
    message(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, &h, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel-style message for the parser (the same layout as requests).
    fn reply(kind: u16, seq: u32, fam: &[u8], attrs: &[(u16, &[u8])]) -> Vec<u8> {
        message(kind, 0, seq, fam, attrs)
    }

    #[test]
    fn requests_have_the_kernel_layout() {
        let m = neigh_get(7, 3, [10, 0, 0, 2]);
        // nlmsghdr 16 + ndmsg 12 + rtattr 4 + 4.
        assert_eq!(m.len(), 36);
        assert_eq!(u32_at(&m, 0), Some(36));
        assert_eq!(u16_at(&m, 4), Some(RTM_GETNEIGH));
        assert_eq!(u16_at(&m, 6), Some(NLM_F_REQUEST));
        assert_eq!(u32_at(&m, 8), Some(7));
        assert_eq!(m[16], AF_INET);
        assert_eq!(u32_at(&m, 20), Some(3));
        assert_eq!((u16_at(&m, 28), u16_at(&m, 30)), (Some(8), Some(NDA_DST)));
        assert_eq!(&m[32..36], &[10, 0, 0, 2]);

        let u = neigh_use(8, 3, [10, 0, 0, 2]);
        assert_eq!(u16_at(&u, 4), Some(RTM_NEWNEIGH));
        assert_eq!(
            u16_at(&u, 6),
            Some(NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE)
        );
        assert_eq!((u16_at(&u, 24), u[26]), (Some(0), NTF_USE));

        let r = route_get(9, [192, 168, 1, 1]);
        assert_eq!((r.len(), r[16], r[17]), (16 + 12 + 8, AF_INET, 32));
        let a = addr_dump(10);
        assert_eq!(
            (a.len(), u16_at(&a, 6)),
            (24, Some(NLM_F_REQUEST | NLM_F_DUMP))
        );
    }

    #[test]
    fn a_neighbour_entry_parses() {
        let mac = [0x02, 0, 0, 0, 0, 0x22];
        let m = reply(
            RTM_NEWNEIGH,
            5,
            &ndmsg(4, nud::REACHABLE, 0),
            &[
                (NDA_DST, &[10, 0, 0, 2]),
                (NDA_LLADDR, &mac),
                (9, &[1, 2, 3, 4, 5, 6, 7, 8]),
            ],
        );
        let msgs = parse(&m).unwrap();
        assert_eq!(
            msgs,
            [Message::Neigh {
                seq: 5,
                neigh: Neigh {
                    family: AF_INET,
                    ifindex: 4,
                    state: nud::REACHABLE,
                    flags: 0,
                    dst: Some([10, 0, 0, 2]),
                    lladdr: Some(mac),
                }
            }]
        );
    }

    #[test]
    fn several_messages_in_one_datagram_and_errors() {
        let mut d = Vec::new();
        let mut a = [0u8; IFADDRMSG_LEN];
        a[0] = AF_INET;
        a[1] = 24;
        a[4..8].copy_from_slice(&6u32.to_ne_bytes());
        d.extend(reply(
            RTM_NEWADDR,
            1,
            &a,
            &[(IFA_ADDRESS, &[10, 7, 0, 1]), (IFA_LOCAL, &[10, 7, 0, 1])],
        ));
        d.extend(reply(NLMSG_DONE, 1, &[0; 4], &[]));
        d.extend(reply(NLMSG_ERROR, 2, &(-2i32).to_ne_bytes(), &[]));
        let m = parse(&d).unwrap();
        assert_eq!(m.len(), 3);
        assert!(matches!(
            m[0],
            Message::Addr {
                addr: Addr {
                    ifindex: 6,
                    prefix_len: 24,
                    local: Some([10, 7, 0, 1]),
                    ..
                },
                ..
            }
        ));
        assert_eq!(m[1], Message::Done { seq: 1 });
        assert_eq!(m[2], Message::Error { seq: 2, errno: -2 });
    }

    #[test]
    fn a_route_with_a_gateway_parses() {
        let mut h = [0u8; RTMSG_LEN];
        h[0] = AF_INET;
        h[7] = 1;
        let m = reply(
            RTM_NEWROUTE,
            3,
            &h,
            &[
                (RTA_DST, &[8, 8, 8, 8]),
                (RTA_OIF, &2u32.to_ne_bytes()),
                (RTA_GATEWAY, &[10, 0, 0, 1]),
                (RTA_PREFSRC, &[10, 0, 0, 5]),
            ],
        );
        let r = parse(&m).unwrap();
        assert_eq!(
            r,
            [Message::Route {
                seq: 3,
                route: Route {
                    family: AF_INET,
                    kind: 1,
                    oif: Some(2),
                    gateway: Some([10, 0, 0, 1]),
                    prefsrc: Some([10, 0, 0, 5]),
                }
            }]
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let good = neigh_get(1, 1, [1, 2, 3, 4]);
        // Any truncation of a valid message.
        for n in 1..good.len() {
            assert!(parse(&good[..n]).is_err(), "cut at {n}");
        }
        // A length field above the data, below the header.
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&100u32.to_ne_bytes());
        assert_eq!(parse(&bad), Err(ParseError::Truncated));
        bad[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert_eq!(parse(&bad), Err(ParseError::Truncated));
        // An attribute longer than its message (a reply type, so it is read).
        let mut n = reply(
            RTM_NEWNEIGH,
            1,
            &ndmsg(1, 0, 0),
            &[(NDA_DST, &[1, 2, 3, 4])],
        );
        n[28..30].copy_from_slice(&40u16.to_ne_bytes());
        assert_eq!(parse(&n), Err(ParseError::BadAttribute));
        n[28..30].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(parse(&n), Err(ParseError::BadAttribute));
        // Short or odd-sized attribute values are ignored, not misread.
        let m = reply(
            RTM_NEWNEIGH,
            1,
            &ndmsg(1, 2, 0),
            &[(NDA_DST, &[1, 2, 3]), (NDA_LLADDR, &[1; 8])],
        );
        assert!(matches!(
            parse(&m).unwrap()[0],
            Message::Neigh {
                neigh: Neigh {
                    dst: None,
                    lladdr: None,
                    ..
                },
                ..
            }
        ));
        assert_eq!(parse(&[]), Ok(vec![]));
    }
}
