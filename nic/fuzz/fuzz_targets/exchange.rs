//! The connection-exchange line (docs/connection.md) from arbitrary bytes:
//! a typed error or a ConnInfo, never a panic; what parses formats back to a
//! line that parses to the same ConnInfo.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nic::exchange::ConnInfo;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    if let Ok(c) = ConnInfo::parse(&line) {
        let again = c.format().expect("a parsed ConnInfo formats");
        assert_eq!(ConnInfo::parse(&again).expect("its own line parses"), c);
    }
});
