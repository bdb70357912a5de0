//! Frame builders and settings shared by the integration tests.
#![allow(dead_code)]

use rdma::wire::frame::{IntInsert, NetHeaders, RoceRepr};
use rdma::wire::int::IntRepr;
use rdma::wire::{BthRepr, Ecn, EthernetAddress, FrameBuilder, Ipv4Address, Opcode, RethRepr};
use switch::{PortSettings, Route, SwitchSettings};

pub const HOST_A: [u8; 4] = [10, 0, 0, 1];
pub const HOST_B: [u8; 4] = [10, 0, 1, 2];
pub const NH_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const PORT1_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 1];

/// Two ports (0 and 1); 10.0.1.0/24 -> port 1, 10.0.0.0/24 -> port 0.
pub fn settings(speed_bps: u64, buf_max: u64) -> SwitchSettings {
    let port = |id: u16| PortSettings {
        id,
        mac: [0x02, 0, 0, 0, 1, id as u8],
        speed_bps,
        buf_max,
        k_min: buf_max / 8,
        k_max: buf_max / 2,
        p_max: 0.1,
        k_drop: buf_max / 4,
        ctrl_buf_max: 64 * 1024,
        burst: 16 * 1024,
    };
    SwitchSettings {
        switch_id: 7,
        int_dscp: 0x18,
        seed: 1,
        fcs_in_frame: false,
        ports: vec![port(0), port(1)],
        routes: vec![
            Route {
                net: 0x0A00_0000,
                len: 24,
                port: 0,
                next_hop_mac: [0x02, 0, 0, 0, 0, 0x01],
            },
            Route {
                net: 0x0A00_0100,
                len: 24,
                port: 1,
                next_hop_mac: NH_MAC,
            },
        ],
    }
}

/// A RoCEv2 RDMA WRITE Only frame to HOST_B with `payload` bytes, built by rdma's
/// FrameBuilder (valid ICRC); with an empty INT container of `int_hops` if given.
pub fn write_frame(payload: usize, ecn: Ecn, int_hops: Option<u8>) -> Vec<u8> {
    let fb = FrameBuilder {
        net: NetHeaders {
            src_mac: EthernetAddress([0x02, 0, 0, 0, 0, 0x01]),
            dst_mac: EthernetAddress([0x02, 0, 0, 0, 1, 0]),
            src_ip: Ipv4Address(HOST_A),
            dst_ip: Ipv4Address(HOST_B),
            udp_src_port: 0xC000,
            dscp: 3,
            ttl: 64,
        },
        int: int_hops.map(|h| IntInsert {
            int_dscp: 0x18,
            max_hops: h,
        }),
    };
    let mut p = RoceRepr::new(BthRepr::new(Opcode::WriteOnly, 0x11, 5));
    p.reth = Some(RethRepr {
        va: 0x1000,
        rkey: 0x42,
        dma_len: payload as u32,
    });
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut buf = vec![0u8; payload + 256];
    let n = fb.emit_frame(&p, &data, ecn, &mut buf).expect("emit");
    buf.truncate(n);
    buf
}

fn ipv4_header(b: &mut [u8], total_len: u16, dscp: u8, ecn: u8, ttl: u8, proto: u8, dst: [u8; 4]) {
    b[0] = 0x45;
    b[1] = (dscp << 2) | ecn;
    b[2..4].copy_from_slice(&total_len.to_be_bytes());
    b[4..8].copy_from_slice(&[0, 0, 0x40, 0]);
    b[8] = ttl;
    b[9] = proto;
    b[10] = 0;
    b[11] = 0;
    b[12..16].copy_from_slice(&HOST_A);
    b[16..20].copy_from_slice(&dst);
    let c = rdma::wire::internet_checksum(&b[..20]);
    b[10..12].copy_from_slice(&c.to_be_bytes());
}

/// A hand-made Ethernet/IPv4/UDP frame of exactly `len` bytes (>= 42) to `dst`, UDP
/// destination `dport`, with `udp_payload` written after the UDP header.
pub fn udp_frame_to(
    len: usize,
    ecn: u8,
    dscp: u8,
    dport: u16,
    dst: [u8; 4],
    udp_payload: &[u8],
) -> Vec<u8> {
    assert!(len >= 42 + udp_payload.len());
    let mut b = vec![0u8; len];
    b[..6].copy_from_slice(&[0x02, 0, 0, 0, 1, 0]);
    b[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
    b[12] = 0x08;
    ipv4_header(&mut b[14..34], (len - 14) as u16, dscp, ecn, 64, 17, dst);
    b[34..36].copy_from_slice(&1234u16.to_be_bytes());
    b[36..38].copy_from_slice(&dport.to_be_bytes());
    b[38..40].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    b[42..42 + udp_payload.len()].copy_from_slice(udp_payload);
    b
}

/// Non-RoCE UDP frame of exactly `len` bytes to HOST_B.
pub fn udp_frame(len: usize, ecn: u8) -> Vec<u8> {
    udp_frame_to(len, ecn, 0, 9, HOST_B, &[])
}

/// A RoCEv2 frame with BTH `opcode` (raw) and `extra` bytes after the BTH, optionally
/// with an INT container (`int_hops`), ECT(0).
pub fn roce_raw(opcode: u8, extra: usize, int_hops: Option<u8>) -> Vec<u8> {
    let mut l4 = Vec::new();
    let dscp = if let Some(h) = int_hops {
        let mut c = [0u8; 16];
        IntRepr::new_empty(h, 3).emit(&mut c).unwrap();
        l4.extend_from_slice(&c);
        0x18
    } else {
        0
    };
    let mut bth = [0u8; 12];
    bth[0] = opcode;
    bth[2] = 0xFF;
    bth[3] = 0xFF;
    l4.extend_from_slice(&bth);
    l4.extend(std::iter::repeat(0xAB).take(extra));
    udp_frame_to(42 + l4.len(), 2, dscp, 4791, HOST_B, &l4)
}
