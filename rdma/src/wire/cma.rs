//! rdma_cm's conventions on top of the IB CM (Linux `drivers/infiniband/core/cma.c`,
//! librdmacm's `rdma_cma.h`): the port spaces and the service ID a port maps to, the
//! Q_Key of UD ids, and the 36-byte `cma_hdr` at the start of a REQ's (or SIDR_REQ's)
//! private data that names the IP addresses and source port of the connection.

use super::{need, need_out, Result, WireError};

/// rdma_cm's TCP port space (`RDMA_PS_TCP`): RC connections.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// rdma_cm's UDP port space (`RDMA_PS_UDP`): UD ids, resolved with SIDR.
pub const RDMA_PS_UDP: u16 = 0x0111;
/// rdma_cm's IB port space (`RDMA_PS_IB`).
pub const RDMA_PS_IB: u16 = 0x013F;
/// The Q_Key of a UD id of the UDP port space (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The service ID of `port` in port space `ps` (`rdma_get_service_id`: `ps << 16 |
/// port`, carried big-endian): perftest's 18515 in the TCP space is
/// `0x0000_0000_0106_4853`.
pub const fn service_id(ps: u16, port: u16) -> u64 {
    ((ps as u64) << 16) | port as u64
}

/// rdma_cm's header at the start of a REQ's (or SIDR_REQ's) private data (Linux
/// `cma.c`, `struct cma_hdr`): which addresses and port the connection is between.
///
/// ```text
/// 0 version (0) | 1 IP version << 4 | 2 source port u16
/// 4 source address (16) | 20 destination address (16)   (IPv4: the last 4 bytes)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHdr {
    /// IP version: 4 or 6.
    pub ip_version: u8,
    /// The active side's port.
    pub src_port: u16,
    /// Source address (IPv4 in bytes 12..16, the rest zero).
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
}

impl CmaHdr {
    /// Its length; user private data follows.
    pub const LEN: usize = 36;

    /// A header for IPv4 addresses.
    pub fn ipv4(src: [u8; 4], src_port: u16, dst: [u8; 4]) -> Self {
        let mut s = [0u8; 16];
        let mut d = [0u8; 16];
        s[12..].copy_from_slice(&src);
        d[12..].copy_from_slice(&dst);
        Self {
            ip_version: 4,
            src_port,
            src: s,
            dst: d,
        }
    }

    /// The source IPv4 address (its last 4 bytes).
    pub fn src_v4(&self) -> [u8; 4] {
        self.src[12..].try_into().expect("4 bytes")
    }

    /// The destination IPv4 address.
    pub fn dst_v4(&self) -> [u8; 4] {
        self.dst[12..].try_into().expect("4 bytes")
    }

    /// Parses the first 36 bytes of private data: version 0, IP version 4 or 6.
    pub fn parse(b: &[u8]) -> Result<Self> {
        need("cma_hdr", Self::LEN, b.len())?;
        if b[0] != 0 {
            return Err(WireError::FieldRange("cma_hdr version is not 0"));
        }
        let ip_version = b[1] >> 4;
        if ip_version != 4 && ip_version != 6 {
            return Err(WireError::FieldRange("cma_hdr IP version"));
        }
        Ok(Self {
            ip_version,
            src_port: u16::from_be_bytes([b[2], b[3]]),
            src: b[4..20].try_into().expect("16 bytes"),
            dst: b[20..36].try_into().expect("16 bytes"),
        })
    }

    /// Writes the 36 bytes.
    pub fn emit(&self, b: &mut [u8]) -> Result<usize> {
        need_out("cma_hdr", Self::LEN, b.len())?;
        b[0] = 0;
        b[1] = self.ip_version << 4;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        b[4..20].copy_from_slice(&self.src);
        b[20..36].copy_from_slice(&self.dst);
        Ok(Self::LEN)
    }
}
