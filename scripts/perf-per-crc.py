#!/usr/bin/env python3
"""An engine's time per message in units of its ICRC work, from a `perf
record -e cpu-clock` of one roce-perf run (recorded without `-g`).

    scripts/perf-per-crc.py PERF.DATA [TOP]

The engine thread (`rsnic-group`) is busy all through a loopback run, so its
samples measure its time; a 64 KiB message's ICRC work (the samples in
crc32fast's AVX-512 kernel) is the same whatever the number of QPs. Samples
of the engine over samples of that kernel are then a message's engine time in
units of its CRC work, which moves much less with the VM's speed of the
minute than a rate does (issue 24 item 4, docs/benchmarks.md "QP scale").
Only the samples between the first and the last of that kernel's, 0.3 s in
from each end, count: the set-up of 16k QPs and the teardown drop out.

Prints the total, the kernel's samples per second (a rate proxy), and the
TOP (default 0) largest symbols' shares in the same units.
"""
import collections
import subprocess
import sys

ENGINE = "rsnic-group"
KERNEL = "calculate_avx512"
TRIM_S = 0.3


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    out = subprocess.run(
        ["perf", "script", "-i", sys.argv[1], "-F", "comm,time,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    samples = []
    for line in out.splitlines():
        p = line.split(None, 3)
        if len(p) < 3:
            continue
        try:
            t = float(p[1].rstrip(":"))
        except ValueError:
            continue
        samples.append((p[0], t, p[3].strip() if len(p) > 3 else "?"))
    crc = [t for c, t, s in samples if c == ENGINE and KERNEL in s]
    if not crc:
        sys.exit(f"no samples of {KERNEL} in the engine thread")
    lo, hi = min(crc) + TRIM_S, max(crc) - TRIM_S
    if hi <= lo:
        sys.exit("the run is too short")
    syms = collections.Counter(s for c, t, s in samples if c == ENGINE and lo <= t <= hi)
    k = sum(n for s, n in syms.items() if KERNEL in s)
    total = sum(syms.values())
    print(f"units {total / k:.3f} crc_per_s {k / (hi - lo):.0f} window_s {hi - lo:.2f}")
    for s, n in syms.most_common(top):
        print(f"{n / k:8.4f} {s}")


if __name__ == "__main__":
    main()
