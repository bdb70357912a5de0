//! pcapng capture off the datapath (docs/design.md §6 "optional pcapng capture";
//! docs/design.md §8: wire output is checked with independent decoders such as
//! tshark).
//!
//! Two parts:
//!
//! * [`PcapngWriter`]: writes a pcapng stream (one Section Header Block, one
//!   Interface Description Block per port with link type Ethernet and
//!   `if_tsresol = 9`, i.e. nanosecond timestamps, then one Enhanced Packet
//!   Block per packet with its timestamp, captured and original length) to any
//!   [`std::io::Write`]. Layout per the pcapng specification
//!   (draft-ietf-opsawg-pcapng), little-endian.
//! * [`capture_ring`]: the hand-off from the engine to a writer thread. The
//!   engine copies at most `SNAP` bytes of a packet into a fixed-size record
//!   and `try_send`s it into a bounded, preallocated queue; when the queue is
//!   full the packet is not captured and a drop is counted. Nothing blocks,
//!   allocates or makes a syscall on the datapath (docs/design.md §3); the file I/O
//!   happens on the thread started by [`spawn_writer`].

use std::io::{self, Write};
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

/// pcapng LINKTYPE_ETHERNET.
pub const LINKTYPE_ETHERNET: u16 = 1;

const SHB_TYPE: u32 = 0x0A0D_0D0A;
const IDB_TYPE: u32 = 0x0000_0001;
const EPB_TYPE: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const OPT_END: u16 = 0;
const OPT_SHB_USERAPPL: u16 = 4;
const OPT_IF_NAME: u16 = 2;
const OPT_IF_TSRESOL: u16 = 9;

/// One capture interface (a NIC or switch port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Name shown by Wireshark (`if_name`), e.g. `"port0"`.
    pub name: String,
    /// Maximum bytes kept per packet (0 = no limit in the file header; the
    /// writer then keeps whole packets).
    pub snaplen: u32,
}

fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

fn put_u16(b: &mut Vec<u8>, v: u16) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

fn put_opt(b: &mut Vec<u8>, code: u16, val: &[u8]) {
    put_u16(b, code);
    put_u16(b, val.len() as u16);
    b.extend_from_slice(val);
    b.resize(pad4(b.len()), 0);
}

/// Patches the total length at offset 4 and appends it at the end.
fn finish_block(b: &mut Vec<u8>) {
    let total = (b.len() + 4) as u32;
    b[4..8].copy_from_slice(&total.to_le_bytes());
    put_u32(b, total);
}

/// A pcapng stream writer; see the module docs.
#[derive(Debug)]
pub struct PcapngWriter<W: Write> {
    out: W,
    snaplens: Vec<u32>,
    /// Reused block buffer: no allocation per packet once it has grown.
    buf: Vec<u8>,
    packets: u64,
}

impl<W: Write> PcapngWriter<W> {
    /// Writes the Section Header Block and one Interface Description Block
    /// per entry of `interfaces` (interface id = index). Names longer than
    /// 255 bytes are cut.
    pub fn new(mut out: W, interfaces: &[Interface]) -> io::Result<Self> {
        let mut b = Vec::with_capacity(256);
        // Section Header Block.
        put_u32(&mut b, SHB_TYPE);
        put_u32(&mut b, 0);
        put_u32(&mut b, BYTE_ORDER_MAGIC);
        put_u16(&mut b, 1);
        put_u16(&mut b, 0);
        b.extend_from_slice(&(-1i64).to_le_bytes()); // section length unknown
        put_opt(&mut b, OPT_SHB_USERAPPL, b"rsnic");
        put_opt(&mut b, OPT_END, &[]);
        finish_block(&mut b);
        out.write_all(&b)?;
        for ifc in interfaces {
            b.clear();
            put_u32(&mut b, IDB_TYPE);
            put_u32(&mut b, 0);
            put_u16(&mut b, LINKTYPE_ETHERNET);
            put_u16(&mut b, 0);
            put_u32(&mut b, ifc.snaplen);
            let name = &ifc.name.as_bytes()[..ifc.name.len().min(255)];
            if !name.is_empty() {
                put_opt(&mut b, OPT_IF_NAME, name);
            }
            put_opt(&mut b, OPT_IF_TSRESOL, &[9]); // 10^-9 s
            put_opt(&mut b, OPT_END, &[]);
            finish_block(&mut b);
            out.write_all(&b)?;
        }
        Ok(PcapngWriter {
            out,
            snaplens: interfaces.iter().map(|i| i.snaplen).collect(),
            buf: b,
            packets: 0,
        })
    }

    /// Writes one Enhanced Packet Block: `data` (cut to the interface's
    /// snaplen) captured on interface `port` at `ts_ns` (nanoseconds since the
    /// Unix epoch, or any epoch the reader agrees on) of a packet that was
    /// `orig_len` bytes on the wire (at least `data.len()`). An unknown
    /// `port` is an `InvalidInput` error.
    pub fn write_packet(
        &mut self,
        port: u32,
        ts_ns: u64,
        orig_len: u32,
        data: &[u8],
    ) -> io::Result<()> {
        let snap = *self.snaplens.get(port as usize).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no pcapng interface {port}"),
            )
        })?;
        let mut cap = data.len().min(u32::MAX as usize - 64);
        if snap != 0 {
            cap = cap.min(snap as usize);
        }
        let b = &mut self.buf;
        b.clear();
        put_u32(b, EPB_TYPE);
        put_u32(b, 0);
        put_u32(b, port);
        put_u32(b, (ts_ns >> 32) as u32);
        put_u32(b, ts_ns as u32);
        put_u32(b, cap as u32);
        put_u32(b, orig_len.max(cap as u32));
        b.extend_from_slice(&data[..cap]);
        b.resize(pad4(b.len()), 0);
        finish_block(b);
        self.out.write_all(b)?;
        self.packets += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One captured packet in the ring: fixed size, so the queue is preallocated
/// and the datapath never allocates.
#[derive(Clone, Copy)]
pub struct CaptureRecord<const SNAP: usize> {
    /// Timestamp, ns.
    pub ts_ns: u64,
    /// Interface id (port).
    pub port: u32,
    /// Length on the wire.
    pub orig_len: u32,
    /// Bytes valid in `data`.
    pub len: u32,
    /// The first `len` bytes of the packet.
    pub data: [u8; SNAP],
}

/// The engine's end of the capture ring (single producer; owned by one
/// lcore, so its counters are plain integers).
#[derive(Debug)]
pub struct CaptureProducer<const SNAP: usize> {
    tx: Sender<CaptureRecord<SNAP>>,
    captured: u64,
    drops: u64,
}

/// The writer thread's end of the capture ring.
#[derive(Debug)]
pub struct CaptureConsumer<const SNAP: usize> {
    rx: Receiver<CaptureRecord<SNAP>>,
}

/// Creates a bounded capture ring of `capacity` records of `SNAP` bytes each
/// (all allocated now: `capacity * (SNAP + 24)` bytes).
pub fn capture_ring<const SNAP: usize>(
    capacity: usize,
) -> (CaptureProducer<SNAP>, CaptureConsumer<SNAP>) {
    let (tx, rx) = bounded(capacity.max(1));
    (
        CaptureProducer {
            tx,
            captured: 0,
            drops: 0,
        },
        CaptureConsumer { rx },
    )
}

impl<const SNAP: usize> CaptureProducer<SNAP> {
    /// Copies the first `SNAP` bytes of `pkt` into the ring. Never blocks:
    /// returns false and counts a drop when the ring is full or the writer
    /// has gone. O(SNAP) copy, no allocation.
    pub fn capture(&mut self, port: u32, ts_ns: u64, pkt: &[u8]) -> bool {
        self.capture_head(port, ts_ns, pkt, pkt.len())
    }

    /// [`Self::capture`] of a packet of which the caller has copied out the
    /// first bytes only (`head`; a sent frame is read out of its mbufs):
    /// `orig_len` is its whole length, recorded as the original length so
    /// that a decoder sees a packet cut by the snap length, not a
    /// malformed one.
    pub fn capture_head(&mut self, port: u32, ts_ns: u64, head: &[u8], orig_len: usize) -> bool {
        let pkt = head;
        let len = pkt.len().min(SNAP);
        let mut rec = CaptureRecord {
            ts_ns,
            port,
            orig_len: orig_len.max(len).min(u32::MAX as usize) as u32,
            len: len as u32,
            data: [0u8; SNAP],
        };
        rec.data[..len].copy_from_slice(&pkt[..len]);
        match self.tx.try_send(rec) {
            Ok(()) => {
                self.captured += 1;
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.drops += 1;
                false
            }
        }
    }

    /// Packets handed to the writer.
    pub fn captured(&self) -> u64 {
        self.captured
    }

    /// Packets not captured because the ring was full (or the writer gone).
    pub fn drops(&self) -> u64 {
        self.drops
    }
}

impl<const SNAP: usize> CaptureConsumer<SNAP> {
    /// Writes records until every producer is dropped, then flushes and
    /// returns the writer. Blocks (this is the writer thread's loop).
    pub fn run<W: Write>(self, mut w: PcapngWriter<W>) -> io::Result<PcapngWriter<W>> {
        while let Ok(r) = self.rx.recv() {
            let len = (r.len as usize).min(SNAP);
            w.write_packet(r.port, r.ts_ns, r.orig_len, &r.data[..len])?;
        }
        w.flush()?;
        Ok(w)
    }
}

/// Starts the writer thread: it drains `consumer` into `writer` until the
/// producer is dropped, and returns the writer (with its packet count).
pub fn spawn_writer<W: Write + Send + 'static, const SNAP: usize>(
    consumer: CaptureConsumer<SNAP>,
    writer: PcapngWriter<W>,
) -> io::Result<JoinHandle<io::Result<PcapngWriter<W>>>> {
    std::thread::Builder::new()
        .name("pcapng-writer".into())
        .spawn(move || consumer.run(writer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }

    /// Walks the blocks, checking the repeated lengths; returns block types.
    fn blocks(b: &[u8]) -> Vec<(u32, usize)> {
        let mut v = Vec::new();
        let mut o = 0;
        while o < b.len() {
            let t = u32_at(b, o);
            let len = u32_at(b, o + 4) as usize;
            assert_eq!(len % 4, 0);
            assert_eq!(u32_at(b, o + len - 4) as usize, len);
            v.push((t, o));
            o += len;
        }
        assert_eq!(o, b.len());
        v
    }

    #[test]
    fn layout() {
        let ifs = [
            Interface {
                name: "port0".into(),
                snaplen: 64,
            },
            Interface {
                name: "p1".into(),
                snaplen: 0,
            },
        ];
        let mut w = PcapngWriter::new(Vec::new(), &ifs).unwrap();
        w.write_packet(1, 0x1_0000_0002, 1000, &[0xab; 99]).unwrap();
        w.write_packet(0, 5, 1000, &[0xcd; 99]).unwrap();
        assert!(w.write_packet(2, 5, 1, &[0]).is_err());
        let b = w.into_inner().unwrap();
        let bl = blocks(&b);
        let types: Vec<u32> = bl.iter().map(|x| x.0).collect();
        assert_eq!(
            types,
            vec![SHB_TYPE, IDB_TYPE, IDB_TYPE, EPB_TYPE, EPB_TYPE]
        );
        assert_eq!(u32_at(&b, 8), BYTE_ORDER_MAGIC);
        let e1 = bl[3].1;
        assert_eq!(u32_at(&b, e1 + 8), 1); // interface
        assert_eq!(u32_at(&b, e1 + 12), 1); // ts high
        assert_eq!(u32_at(&b, e1 + 16), 2); // ts low
        assert_eq!(u32_at(&b, e1 + 20), 99); // captured
        assert_eq!(u32_at(&b, e1 + 24), 1000); // original
        let e2 = bl[4].1;
        assert_eq!(u32_at(&b, e2 + 20), 64, "cut to snaplen");
    }

    #[test]
    fn ring_counts_drops_when_full() {
        let (mut p, c) = capture_ring::<32>(2);
        assert!(p.capture(0, 1, &[1; 100]));
        assert!(p.capture(0, 2, &[2; 10]));
        assert!(!p.capture(0, 3, &[3; 10]));
        assert_eq!((p.captured(), p.drops()), (2, 1));
        drop(p);
        let w = PcapngWriter::new(
            Vec::new(),
            &[Interface {
                name: "x".into(),
                snaplen: 0,
            }],
        )
        .unwrap();
        let w = c.run(w).unwrap();
        assert_eq!(w.packets(), 2);
        let b = w.into_inner().unwrap();
        let bl = blocks(&b);
        let e = bl[2].1;
        assert_eq!(u32_at(&b, e + 20), 32);
        assert_eq!(u32_at(&b, e + 24), 100);
    }

    /// Independent decoder: tshark must read our file, with ns timestamps.
    /// Fails (does not skip) if tshark is missing.
    #[test]
    fn tshark_decodes_lengths_and_ns_timestamps() {
        let path =
            std::env::temp_dir().join(format!("nic-pcapng-unit-{}.pcapng", std::process::id()));
        let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let ifs = [Interface {
            name: "port0".into(),
            snaplen: 128,
        }];
        let mut w = PcapngWriter::new(f, &ifs).unwrap();
        let ts = [1_700_000_000_123_456_789u64, 1_700_000_001_000_000_001];
        let mut frame = vec![0u8; 300];
        frame[12] = 0x08; // ethertype IPv4 (content does not matter)
        w.write_packet(0, ts[0], 60, &frame[..60]).unwrap();
        w.write_packet(0, ts[1], 300, &frame).unwrap();
        w.into_inner().unwrap();
        let out = Command::new("tshark")
            .args(["-r"])
            .arg(&path)
            .args([
                "-T",
                "fields",
                "-e",
                "frame.len",
                "-e",
                "frame.cap_len",
                "-e",
                "frame.time_epoch",
            ])
            .output()
            .expect("tshark must be installed (scripts/setup installs it)");
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert_eq!(rows[0][..2], ["60", "60"]);
        assert_eq!(rows[1][..2], ["300", "128"]);
        assert_eq!(rows[0][2], "1700000000.123456789");
        assert_eq!(rows[1][2], "1700000001.000000001");
    }
}
