#!/usr/bin/env python3
"""Where a cachegrind run's extra last-level misses come from, source line by
source line: the difference of two cachegrind output files (`MORE` minus
`LESS`, e.g. `-n 3` minus `-n 1` messages per QP) divided by the messages
between them.

    scripts/cachegrind-lines.py LESS.out MORE.out MESSAGES [THRESHOLD]

Prints the LL read and write misses per message of each source line whose
sum is at least THRESHOLD (default 0.1), largest first, with the function and
the line's text, then the listed total. (`cg_diff` drops the line numbers, so
this does the difference itself.) `KEEP=DIR scripts/qp-scale-cachegrind.sh`
leaves the output files of its runs in DIR.
"""
import collections
import signal
import sys

# Column order of cachegrind's `events:` line with --cache-sim=yes.
EVENTS = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"]


def load(path):
    counts = collections.defaultdict(lambda: [0] * len(EVENTS))
    fl = fn = None
    events = EVENTS
    with open(path) as f:
        for line in f:
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("fl="):
                fl = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
            elif line[:1].isdigit() and fl:
                parts = line.split()
                row = counts[(fl, int(parts[0]), fn)]
                for name, v in zip(events, parts[1:]):
                    if name in EVENTS:
                        row[EVENTS.index(name)] += int(v)
    return counts


def source_line(cache, path, n):
    if path not in cache:
        try:
            with open(path) as f:
                cache[path] = f.read().split("\n")
        except OSError:
            cache[path] = None
    text = cache[path]
    return text[n - 1].strip()[:70] if text and 0 < n <= len(text) else ""


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends us quietly
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    less, more = load(sys.argv[1]), load(sys.argv[2])
    messages = float(sys.argv[3])
    threshold = float(sys.argv[4]) if len(sys.argv) == 5 else 0.1
    r, w = EVENTS.index("DLmr"), EVENTS.index("DLmw")
    zero = [0] * len(EVENTS)
    rows = []
    for key in set(less) | set(more):
        a, b = less.get(key, zero), more.get(key, zero)
        rd, wr = (b[r] - a[r]) / messages, (b[w] - a[w]) / messages
        if abs(rd) + abs(wr) >= threshold:
            rows.append((rd, wr, key))
    rows.sort(key=lambda x: -(x[0] + x[1]))
    cache = {}
    for rd, wr, (path, n, fn) in rows:
        where = "/".join(path.split("/")[-2:])[:28]
        func = fn.split("::")[-1][:22]
        print(f"{rd:5.2f} {wr:5.2f} {where:28s}:{n:<5d} {func:22s} {source_line(cache, path, n)}")
    print(f"listed total {sum(x[0] + x[1] for x in rows):.2f} (read, write LL misses per message)")


if __name__ == "__main__":
    main()
