//! Arbitrary frames through the switch core (classifier, WRED/ECN, queues,
//! shaper, INT push at dequeue): never a panic; what comes out is no longer
//! than what went in plus one INT hop record, and every frame is accounted
//! for (forwarded, queued or counted as dropped).
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use switch::{Config, FrameBuf, PacketBuf, Switch, SwitchSettings};

const CONFIG: &str = r#"
switch_id = 9
int_dscp = 24
[defaults]
speed = "10Gbps"
buf_max = "64KB"
k_min = "5KB"
k_max = "20KB"
p_max = 0.5
[[port]]
id = 0
mac = "02:00:00:00:00:01"
[[port]]
id = 1
mac = "02:00:00:00:00:02"
[[route]]
prefix = "10.0.0.0/8"
port = 1
next_hop_mac = "02:00:00:00:00:09"
[[route]]
prefix = "0.0.0.0/0"
port = 0
next_hop_mac = "02:00:00:00:00:08"
"#;

fuzz_target!(|data: &[u8]| {
    // Parsed once: the TOML parse was most of an input's time.
    static SETTINGS: OnceLock<SwitchSettings> = OnceLock::new();
    let settings = SETTINGS.get_or_init(|| Config::load_str(CONFIG).expect("fixed config"));
    let mut sw: Switch<FrameBuf> = Switch::new(settings);
    // The input is a sequence of frames: [port byte][len byte][len bytes]...
    let mut rest = data;
    let mut now = 0u64;
    let mut longest = 0usize;
    while rest.len() >= 2 {
        let port = u16::from(rest[0] & 1);
        let len = usize::from(rest[1]).min(rest.len() - 2);
        let frame = &rest[2..2 + len];
        rest = &rest[2 + len..];
        longest = longest.max(len);
        now += 1_000;
        if let Some(f) = FrameBuf::from_frame(frame) {
            let _ = sw.receive(port, f, now);
        }
        for out in [0u16, 1] {
            while let Some(p) = sw.dequeue(out, now) {
                let n = PacketBuf::len(&p);
                assert!(
                    n <= longest + rdma::wire::int::HOP_LEN,
                    "{n} > {longest} + hop"
                );
            }
        }
    }
    // Drain what is queued: the shaper releases it as time passes.
    now += 1_000_000_000;
    for out in [0u16, 1] {
        while sw.dequeue(out, now).is_some() {}
        assert_eq!(sw.queue_bytes(out), Some(0));
    }
});
