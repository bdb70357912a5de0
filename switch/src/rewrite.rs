//! The forwarding rewrite of a queued frame: the Ethernet addresses from a per-next-hop
//! template, TTL - 1 and an optional CE mark, with the IPv4 header checksum updated
//! incrementally (RFC 1624 eq. 3) instead of recomputed.
//!
//! TTL and ECN are masked in the RoCEv2 ICRC (IBA annex A17.2.3, as the rxe driver
//! computes it), so a rewritten frame's ICRC stays valid.

use crate::classify::L3_OFF;

/// The first 12 bytes of an outgoing frame's Ethernet header (destination MAC of the
/// next hop, then the source MAC of the egress port), computed once per route when the
/// switch is built, so the per-frame MAC rewrite is a single 12-byte copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct L2Rewrite(pub [u8; 12]);

impl L2Rewrite {
    /// The template for a next hop `dst` reached through a port whose address is `src`.
    pub fn new(dst: &[u8; 6], src: &[u8; 6]) -> Self {
        let mut t = [0u8; 12];
        t[..6].copy_from_slice(dst);
        t[6..].copy_from_slice(src);
        Self(t)
    }
}

/// RFC 1624 eq. 3 incremental checksum update for one 16-bit word.
#[inline(always)]
pub(crate) fn csum_adjust(hc: u16, old: u16, new: u16) -> u16 {
    let mut s = u32::from(!hc) + u32::from(!old) + u32::from(new);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    !(s as u16)
}

/// Writes the Ethernet addresses from `l2`, decrements the TTL and, if `set_ce`, sets
/// ECN to CE, updating the IPv4 checksum for both words in one RFC 1624 step.
/// `b` is a frame [`crate::classify::classify`] accepted (so its IPv4 header is there)
/// with a TTL of at least 2 (so the decrement does not borrow from the protocol byte).
#[inline(always)]
pub(crate) fn rewrite(b: &mut [u8], l2: &L2Rewrite, set_ce: bool) {
    b[..12].copy_from_slice(&l2.0);
    let ip = &mut b[L3_OFF..L3_OFF + 12];
    let hc = u16::from_be_bytes([ip[10], ip[11]]);
    let w4 = u16::from_be_bytes([ip[8], ip[9]]);
    let n4 = w4.wrapping_sub(0x0100);
    let mut s = u32::from(!hc) + u32::from(!w4) + u32::from(n4);
    if set_ce {
        let w0 = u16::from_be_bytes([ip[0], ip[1]]);
        s += u32::from(!w0) + u32::from(w0 | 3);
        ip[1] |= 3;
    }
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    ip[8] = (n4 >> 8) as u8;
    ip[10..12].copy_from_slice(&(!(s as u16)).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_checksum_matches_recompute() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let l2 = L2Rewrite::new(&[1; 6], &[2; 6]);
        let mut marked = 0;
        for i in 0..5000 {
            let mut h = [0u8; 20];
            for b in h.iter_mut() {
                *b = rnd() as u8;
            }
            h[0] = 0x45;
            h[8] = h[8].max(2);
            // Corner cases: TTL 2, a header whose checksum field is 0 or 0xFFFF.
            if i == 0 {
                h[8] = 2;
            }
            h[10] = 0;
            h[11] = 0;
            let c = rdma::wire::internet_checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            let mut f = vec![0u8; 14];
            f[12] = 8;
            f.extend_from_slice(&h);
            let set_ce = i % 2 == 0;
            rewrite(&mut f, &l2, set_ce);
            assert_eq!(&f[..12], &l2.0);
            assert_eq!(f[14 + 8], h[8] - 1, "TTL");
            assert_eq!(f[14 + 9], h[9], "protocol untouched");
            if set_ce {
                assert_eq!(f[14 + 1], h[1] | 3);
                marked += 1;
            } else {
                assert_eq!(f[14 + 1], h[1]);
            }
            assert_eq!(
                rdma::wire::internet_checksum(&f[14..34]),
                0,
                "header {h:02x?}"
            );
        }
        assert_eq!(marked, 2500);
    }
}
