//! The INT-MD hop push at dequeue: this hop's record goes in front of the hop stack of
//! a frame that carries an INT container, the headers before it move into the
//! headroom (P4.org INT v2.0 section 5.7, the same bytes as
//! `rdma::wire::int::push_hop_front`). The record carries what HPCC++ needs per hop
//! (000 section 3: ts, qLen, txBytes, B, switch_ID, port_ID), in the 16-byte layout of
//! `rdma::wire::int::HopRecord`.

use rdma::wire::int::{self, HopRecord};

use crate::classify::L3_OFF;
use crate::packet::PacketBuf;
use crate::rewrite::csum_adjust;

/// Bytes up to the end of the INT MD header when IPv4 has no options: Ethernet 14,
/// IPv4 20, UDP 8, shim + MD header 16.
pub(crate) const MD_END_NO_OPTIONS: usize =
    L3_OFF + 20 + rdma::wire::udp::HEADER_LEN + int::HEADER_LEN;

/// Outcome of this hop's INT push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntPush {
    Pushed,
    Full,
    Error,
}

/// Pushes `hop` after the MD header of a frame that [`crate::classify::classify`] accepted with an INT
/// container, its IPv4 header `ihl` words long (INT v2.0 section 5.7, the same bytes
/// as `rdma::wire::int::push_hop_front`): the headers up to the MD header move 16
/// bytes into the headroom that [`PacketBuf::prepend`] opens, the payload stays; shim
/// length +4 words, RemainingHopCnt -1, IPv4 total length and UDP length +16, UDP
/// checksum 0 (RoCEv2 sends none), IPv4 checksum updated incrementally (RFC 1624).
/// E is set instead when RemainingHopCnt is 0 or the stack is full. A frame without
/// headroom, or whose lengths would overflow, is an `Error` and untouched.
///
/// `classify` checked the container (type, version, HopML, length within UDP) and
/// nothing has changed those bytes since, so only the offsets are computed here.
#[inline]
pub(crate) fn push_int<P: PacketBuf>(pkt: &mut P, hop: &HopRecord, ihl: u8) -> IntPush {
    let udp_off = L3_OFF + usize::from(ihl) * 4;
    let int_off = udp_off + rdma::wire::udp::HEADER_LEN;
    let md_end = int_off + int::HEADER_LEN;
    let b = pkt.bytes();
    if b.len() < md_end {
        return IntPush::Error;
    }
    let int_len = usize::from(b[int_off + 1]) * 4;
    if b[int_off + int::SHIM_LEN + 3] == 0
        || int_len + int::HOP_LEN > int::MAX_HOPS_WIRE * int::HOP_LEN + int::HEADER_LEN
    {
        pkt.bytes_mut()[int_off + int::SHIM_LEN] |= (int::MdFlags::E.bits() >> 24) as u8;
        return IntPush::Full;
    }
    let tl = u16::from_be_bytes([b[L3_OFF + 2], b[L3_OFF + 3]]);
    let ul = u16::from_be_bytes([b[udp_off + 4], b[udp_off + 5]]);
    let (Some(ntl), Some(nul)) = (
        tl.checked_add(int::HOP_LEN as u16),
        ul.checked_add(int::HOP_LEN as u16),
    ) else {
        return IntPush::Error;
    };
    if !pkt.prepend(int::HOP_LEN) {
        return IntPush::Error;
    }
    let b = pkt.bytes_mut();
    if md_end == MD_END_NO_OPTIONS {
        // The common case, a constant length: a few vector moves instead of a memmove
        // call (the source and destination overlap; the copy goes through registers).
        let mut hdr = [0u8; MD_END_NO_OPTIONS];
        hdr.copy_from_slice(&b[int::HOP_LEN..int::HOP_LEN + MD_END_NO_OPTIONS]);
        b[..MD_END_NO_OPTIONS].copy_from_slice(&hdr);
    } else {
        b.copy_within(int::HOP_LEN..int::HOP_LEN + md_end, 0);
    }
    let mut rec = [0u8; int::HOP_LEN];
    let _ = hop.emit(&mut rec);
    b[md_end..md_end + int::HOP_LEN].copy_from_slice(&rec);
    b[int_off + 1] += int::HOP_ML_WORDS;
    b[int_off + int::SHIM_LEN + 3] -= 1;
    let hc = u16::from_be_bytes([b[L3_OFF + 10], b[L3_OFF + 11]]);
    b[L3_OFF + 10..L3_OFF + 12].copy_from_slice(&csum_adjust(hc, tl, ntl).to_be_bytes());
    b[L3_OFF + 2..L3_OFF + 4].copy_from_slice(&ntl.to_be_bytes());
    b[udp_off + 4..udp_off + 6].copy_from_slice(&nul.to_be_bytes());
    b[udp_off + 6] = 0;
    b[udp_off + 7] = 0;
    IntPush::Pushed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use crate::classify::tests::int_frame;
    use rdma::wire::int::PushOutcome;

    #[test]
    fn int_push_through_packet_headroom_equals_push_hop_front() {
        let hop = HopRecord::from_units(3, 2, 123_456_789, 987_654, 12_800, 25e9 as u64);
        let mut cases = 0;
        for (max_hops, have) in [
            (8, 0),
            (8, 3),
            (8, 7),
            (8, 8),
            (2, 2),
            (1, 0),
            (62, 61),
            (62, 62),
        ] {
            for payload in [0, 64, 1024] {
                let frame = int_frame(max_hops, have, payload);
                // Reference: rdma's push into a buffer with 128 bytes of headroom.
                let mut r = vec![0u8; 128 + frame.len()];
                r[128..].copy_from_slice(&frame);
                let want = match int::push_hop_front(&mut r, 128, frame.len(), L3_OFF, 0x18, &hop)
                    .unwrap()
                {
                    PushOutcome::Pushed { start, len } => {
                        (IntPush::Pushed, r[start..start + len].to_vec())
                    }
                    PushOutcome::Full => (IntPush::Full, r[128..].to_vec()),
                };
                // The push trusts what classify found: the container and the IHL.
                let c = classify(&frame, 0x18).unwrap();
                assert!(c.int());
                let mut f = crate::FrameBuf::from_frame(&frame).unwrap();
                let got = push_int(&mut f, &hop, c.ihl());
                assert_eq!(
                    (got, f.bytes().to_vec()),
                    want,
                    "max_hops {max_hops} have {have}"
                );
                // Without headroom: E still set on a full stack, else an error, frame intact.
                let mut f = crate::FrameBuf::new(&frame, 0, frame.len()).unwrap();
                let got = push_int(&mut f, &hop, c.ihl());
                if want.0 == IntPush::Full {
                    assert_eq!((got, f.bytes().to_vec()), want);
                } else {
                    assert_eq!((got, f.bytes()), (IntPush::Error, &frame[..]));
                }
                cases += 1;
            }
        }
        assert_eq!(cases, 24);
        // A truncated frame never gets that far: classify rejects it.
        let frame = int_frame(8, 1, 0);
        for cut in [0, 10, 14, 40, 57, frame.len() - 1] {
            assert!(classify(&frame[..cut], 0x18).is_err(), "cut {cut}");
        }
    }
}
