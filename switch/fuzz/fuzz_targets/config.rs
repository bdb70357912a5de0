//! Arbitrary text as a switch configuration: a typed error or valid settings,
//! never a panic; valid settings build a switch.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switch::{Config, Switch};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = Config::load_str(text) {
        let _sw: Switch<Vec<u8>> = Switch::new(&s);
        for p in &s.ports {
            assert!(p.k_min <= p.k_max, "validated config with K_min > K_max");
        }
    }
});
