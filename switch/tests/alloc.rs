//! docs/design.md §3: no heap allocation per packet. A counting global allocator
//! checks that `receive` and `dequeue` (WRED marking, INT push, control class, drops)
//! allocate nothing once the switch is built, with mbuf-like `FrameBuf` packets.

mod common;

use common::*;
use rdma::wire::Ecn;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use switch::{FrameBuf, Switch};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Counting is on for the datapath's thread only: the test harness's
    /// other threads (output capture, the 60 s notice) allocate as they like.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        System.realloc(p, l, n)
    }
}

#[global_allocator]
static A: Counting = Counting;

#[test]
fn no_allocation_per_packet() {
    no_allocation(false);
}

#[test]
fn no_allocation_per_burst() {
    no_allocation(true);
}

/// Runs every path of the datapath with counting on: frame by frame (`receive`,
/// `dequeue`) or in bursts (`receive_burst`, `dequeue_burst`).
fn no_allocation(burst: bool) {
    let mut s = settings(10_000_000_000, 64 * 1024);
    s.ports[1].k_min = 1000;
    s.ports[1].k_max = 40_000;
    s.ports[1].p_max = 0.5;
    let mut sw: Switch<FrameBuf> = Switch::new(&s);
    let templates = [
        write_frame(1000, Ecn::Ect0, Some(4)),
        write_frame(64, Ecn::NotEct, Some(4)),
        write_frame(200, Ecn::Ect1, None),
        roce_raw(0x11, 4, Some(2)),
        roce_raw(0x81, 16, None),
        udp_frame(300, 0),
        vec![0u8; 20], // not IPv4
    ];
    // Allocate every buffer before counting.
    let mut pool: Vec<FrameBuf> = (0..256)
        .map(|i| FrameBuf::from_frame(&templates[i % templates.len()]).unwrap())
        .collect();
    let mut out: Vec<FrameBuf> = Vec::with_capacity(256);
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTING.with(|c| c.set(true));
    let mut now = 0;
    for round in 0..20 {
        if burst {
            for (i, p) in pool.iter_mut().enumerate() {
                p.reset(
                    &templates[(i + round) % templates.len()],
                    FrameBuf::HEADROOM,
                );
            }
            while !pool.is_empty() {
                let n = pool.len().min(switch::BURST);
                sw.receive_burst(0, pool.drain(..n), now, |r| out.push(r.pkt));
                now += 50 * n as u64;
                while sw.dequeue_burst(1, now, switch::BURST, |p| out.push(p)) > 0 {}
            }
        } else {
            for (i, mut p) in pool.drain(..).enumerate() {
                let t = &templates[(i + round) % templates.len()];
                p.reset(t, FrameBuf::HEADROOM);
                match sw.receive(0, p, now) {
                    Ok(_) => {}
                    Err(r) => out.push(r.pkt),
                }
                now += 50;
                while let Some(p) = sw.dequeue(1, now) {
                    out.push(p);
                }
            }
        }
        while let Some(t) = sw.next_departure(1) {
            now = now.max(t);
            while sw.dequeue_burst(1, now, switch::BURST, |p| out.push(p)) > 0 {}
        }
        std::mem::swap(&mut pool, &mut out);
    }
    COUNTING.with(|c| c.set(false));
    let after = ALLOCS.load(Ordering::Relaxed);
    let c = *sw.counters(1).unwrap();
    assert_eq!(after - before, 0, "allocations in the datapath");
    // The run did exercise marking, drops, INT and the control class.
    assert!(c.ce_marked > 0 && c.int_pushed > 0 && c.enqueued_ctrl > 0);
    assert!(c.wred_drops + c.tail_drops > 0, "{c:?}");
    assert!(sw.counters(0).unwrap().rx_not_ipv4 > 0);
    assert_eq!(pool.len(), 256);
}
