//! rsnicd's control protocol parser: any datagram decodes or is refused,
//! never a panic, and what decodes encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rsnicd::proto::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok((m, seq)) = Message::decode(data) {
        let again = m.encode(seq).expect("a decoded message encodes");
        assert_eq!(again, data, "decode then encode changed the bytes");
    }
});
