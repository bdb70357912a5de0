//! What two rsnic CMs tell each other beside the consumer's private data (issue 43,
//! "choosing the mode"): whether the connection's QPs run selective repeat
//! ([`crate::transport::sack`]). IBA 12.6.5 and 12.6.8 leave a REQ's 92 and a REP's
//! 196 bytes of private data to the consumer, and rdma_cm puts its 36-byte `cma_hdr`
//! first; nothing in the REQ or REP themselves is free for a vendor's use (their
//! reserved fields must be sent as zero, IBA 12.6.2, and the vendor ID names a
//! vendor, not a feature). So the offer rides in the last [`TAIL_LEN`] bytes of the
//! private data, only where the consumer's data leaves them free (rdma_cm's user
//! data of at most 48 bytes in a REQ, 188 in a REP), and the receiving rsnic CM
//! takes it off (zeroes it) before the consumer sees the data:
//!
//! | bytes | value |
//! |---|---|
//! | 0-3 | [`MAGIC`], `"rsNC"` |
//! | 4 | [`VERSION`] (1); a later version keeps byte 5's bits |
//! | 5 | flags: bit 0 [`SELECTIVE_REPEAT`] (REQ: offered; REP: agreed) |
//! | 6-7 | the ones' complement of bytes 4-5, a check that zeros and ordinary text fail |
//!
//! A CM that does not know it (Linux's `ib_cm`, rdma_cm) passes the bytes to its
//! consumer, which reads its own structure from the front and ignores what follows
//! (a REQ carries the tail only from a QP configured `sr`); it never answers with
//! one, so the connection stays go-back-N, the default (docs/reliability.md).

/// Bytes the tail takes at the end of the private data.
pub const TAIL_LEN: usize = 8;
/// What the tail starts with.
pub const MAGIC: [u8; 4] = *b"rsNC";
/// The tail's version.
pub const VERSION: u8 = 1;
/// Flag: selective repeat (offered in a REQ, agreed in a REP).
pub const SELECTIVE_REPEAT: u8 = 1;

/// Writes the tail carrying `flags` at the end of `buf`, whose first `used` bytes
/// are the consumer's; false (nothing written) when they leave no room.
pub fn put(buf: &mut [u8], used: usize, flags: u8) -> bool {
    let Some(at) = buf.len().checked_sub(TAIL_LEN) else {
        return false;
    };
    if used > at {
        return false;
    }
    let t = &mut buf[at..];
    t[..4].copy_from_slice(&MAGIC);
    t[4] = VERSION;
    t[5] = flags;
    t[6] = !VERSION;
    t[7] = !flags;
    true
}

/// The flags of the tail at the end of `buf`, if it carries one; the tail is
/// zeroed then, so that the consumer sees only its own data.
pub fn take(buf: &mut [u8]) -> Option<u8> {
    let at = buf.len().checked_sub(TAIL_LEN)?;
    let t = &mut buf[at..];
    let ok = t[..4] == MAGIC && t[4] >= VERSION && t[6] == !t[4] && t[7] == !t[5];
    if !ok {
        return None;
    }
    let flags = t[5];
    t.fill(0);
    Some(flags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any consumer data that leaves room comes back byte for byte once the tail
        /// is taken off, with the flags put; data that leaves none gets no tail.
        #[test]
        fn the_tail_round_trips_and_leaves_the_consumers_data(
            len in prop_oneof![Just(92usize), Just(196usize)],
            data in proptest::collection::vec(any::<u8>(), 0..=196),
            flags in any::<u8>(),
        ) {
            let used = data.len().min(len);
            let mut buf = vec![0u8; len];
            buf[..used].copy_from_slice(&data[..used]);
            let fits = put(&mut buf, used, flags);
            prop_assert_eq!(fits, used <= len - TAIL_LEN);
            let got = take(&mut buf);
            if fits {
                prop_assert_eq!(got, Some(flags));
                prop_assert!(buf[used..].iter().all(|&b| b == 0));
            } else {
                // The consumer's own bytes, if they happen to end like a tail, are
                // the only way to get one here; random bytes never do.
                prop_assert_eq!(got, None);
            }
            prop_assert_eq!(&buf[..used], &data[..used]);
        }

        /// Private data without a tail (any bytes a standard CM's consumer sends)
        /// is left alone.
        #[test]
        fn data_without_a_tail_is_left_alone(
            data in proptest::collection::vec(any::<u8>(), 92),
        ) {
            let mut buf = data.clone();
            prop_assert_eq!(take(&mut buf), None);
            prop_assert_eq!(buf, data);
        }
    }

    #[test]
    fn the_tail_on_the_wire() {
        let mut buf = [0u8; 92];
        buf[..5].copy_from_slice(b"hello");
        assert!(put(&mut buf, 5, SELECTIVE_REPEAT));
        assert_eq!(&buf[84..], b"rsNC\x01\x01\xfe\xfe");
        // Zeros (a consumer that sent nothing) and a tail of a wrong check are not one.
        assert_eq!(take(&mut [0u8; 92]), None);
        let mut bad = buf;
        bad[91] ^= 1;
        assert_eq!(take(&mut bad), None);
        // A later version's tail still tells the flags.
        let mut v2 = buf;
        v2[88] = 2;
        v2[90] = !2;
        assert_eq!(take(&mut v2), Some(SELECTIVE_REPEAT));
        assert_eq!(take(&mut buf), Some(SELECTIVE_REPEAT));
        assert_eq!(&buf[..5], b"hello");
        assert!(buf[5..].iter().all(|&b| b == 0));
        // No room: 85 bytes of consumer data in a REQ.
        assert!(!put(&mut [0u8; 92], 85, SELECTIVE_REPEAT));
        assert!(put(&mut [0u8; 92], 84, SELECTIVE_REPEAT));
    }
}
