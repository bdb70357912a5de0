//! rtnetlink datagrams (nic::host::netlink, host mode's parser of what the
//! kernel sends) from arbitrary bytes: a typed error or messages, never a
//! panic; a datagram that parses still parses with trailing padding cut.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nic::host::netlink;

fuzz_target!(|data: &[u8]| {
    if let Ok(msgs) = netlink::parse(data) {
        // Every message consumed at least a header.
        assert!(msgs.len() * 16 <= data.len());
    }
});
