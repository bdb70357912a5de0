//! Arbitrary frames (ICRC not checked, so the fuzzer reaches the transport) into a
//! connected QP with posted work: the state machines never panic and never touch memory
//! outside the registered region (VecMemory would panic).
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdma::transport::*;
use rdma::wire::{parse_frame, ParseOptions};

fuzz_target!(|data: &[u8]| {
    // Byte 0: bit 0 the CC extension (RC only), bits 1-2 the service (1 UC, 2 UD).
    let b0 = data.first().copied().unwrap_or(0);
    let service = match (b0 >> 1) & 3 {
        1 => Service::Uc,
        2 => Service::Ud,
        _ => Service::Rc,
    };
    let cfg = QpConfig {
        qpn: 0x11,
        dest_qpn: 0x22,
        pmtu: 256,
        cc_ext: service == Service::Rc && b0 & 1 != 0,
        service,
        qkey: 0x1111_0000,
        ..Default::default()
    };
    let mut qp = Qp::new(cfg).unwrap();
    qp.modify(QpState::Init).unwrap();
    qp.modify(QpState::Rtr).unwrap();
    qp.modify(QpState::Rts).unwrap();
    let mut mrs = MrTable::new();
    let mr = mrs.register(0x1000, 0x4000, Access::all()).unwrap();
    let mut mem = VecMemory::new(0x1000, 0x4000);
    let s = |addr, len| Sge { addr, len, lkey: mr.lkey };
    qp.post_recv(RecvWr { wr_id: 1, sge: s(0x1000, 600) }, &mrs).unwrap();
    for (i, op) in [
        SendOp::Write { remote_va: 0, rkey: 1 },
        SendOp::Read { remote_va: 0, rkey: 1 },
        SendOp::FetchAdd { remote_va: 0, rkey: 1, add: 1 },
        SendOp::Send,
    ]
    .into_iter()
    .enumerate()
    {
        let len = if op.is_atomic() { 8 } else { 700 };
        let w = SendWr { wr_id: i as u64, op, sge: s(0x2000 + 0x400 * i as u64, len), signaled: true, solicited: false };
        match service {
            Service::Rc => qp.post_send(w, &mrs).unwrap(),
            // UC refuses READ/ATOMIC, UD everything but a short SEND.
            Service::Uc => { let _ = qp.post_send(w, &mrs); }
            Service::Ud => {
                let d = UdDest { ah: AhId(1.try_into().unwrap()), remote_qpn: 0x22, remote_qkey: 0x8000_0000 };
                let w = SendWr { sge: s(0x2000, 200), ..w };
                let _ = qp.post_send_ud(w, d, None, &mrs);
            }
        }
    }
    let mut now = 0;
    while qp.poll_tx(now).is_some() {}
    let opts = ParseOptions { int_dscp: Some(0x18), verify_icrc: false };
    // The input is a sequence of frames: [len_hi, len_lo, frame...]*
    let mut rest = data.get(1..).unwrap_or(&[]);
    while rest.len() >= 2 {
        let n = (usize::from(rest[0]) << 8 | usize::from(rest[1])).min(rest.len() - 2);
        let mut frame = rest[2..2 + n].to_vec();
        rest = &rest[2 + n..];
        // Repair the IPv4 checksum so the transport is reached.
        if frame.len() >= 34 {
            if let Ok(mut ip) = rdma::wire::Ipv4Packet::new_checked(&mut frame[14..]) {
                ip.fill_checksum();
            }
        }
        let frame = &frame[..];
        if let Ok(f) = parse_frame(frame, &opts, |_| cfg.cc_ext) {
            qp.on_rx(&f, now, &mut mrs, &mut mem);
        }
        now += 10_000;
        qp.on_timer(now);
        while qp.poll_tx(now).is_some() {}
        while qp.poll_cq().is_some() {}
        while qp.poll_event().is_some() {}
    }
});
