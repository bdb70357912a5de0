//! perftest's exchange items from arbitrary bytes: the key message, version
//! and MTU parsers give a typed error or a value, never a panic; a parsed
//! key message formats back to the same bytes' meaning. The whole server
//! side of a session (opening, two handshakes, reports, close) fed from the
//! input ends in a typed error, never a panic or a hang.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nic::perftest_exchange::{
    detect, parse_mtu, parse_version, BwReport, KeyMsg, PerftestConn, Role, KEY_MSG_LEN,
};

/// A stream that reads the fuzz input and swallows writes.
struct Input<'a>(&'a [u8]);

impl std::io::Read for Input<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

impl std::io::Write for Input<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = detect(data);
    let _ = parse_version(&data[..data.len().min(16)]);
    let _ = parse_mtu(&data[..data.len().min(2)]);
    if data.len() >= KEY_MSG_LEN {
        if let Ok(k) = KeyMsg::parse(&data[..KEY_MSG_LEN]) {
            assert_eq!(KeyMsg::parse(&k.format()).expect("own format parses"), k);
        }
    }
    let mut p = PerftestConn::new(Input(data), Role::Server);
    let me = KeyMsg {
        lid: 0,
        out_reads: 16,
        qpn: 0x11,
        psn: 1,
        rkey: 2,
        vaddr: 3,
        gid: [0; 16],
        srqn: 0,
    };
    let _ = (|| {
        p.hello(4096, 64, 1024)?;
        p.handshake(&me)?;
        p.handshake(&me)?;
        p.xchg_report(&BwReport { size: 1, iters: 1, bw_peak: 0.0, bw_avg: 0.0, msg_rate: 0.0 })?;
        p.close(&me)
    })();
});
