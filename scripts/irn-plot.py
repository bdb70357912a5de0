#!/usr/bin/env python3
"""IRN's experiment (issue 43, docs/sim.md): FCT slowdown per flow-size bucket of
the three settings (no PFC + selective repeat, PFC + go-back-N, no PFC + go-back-N),
one panel per CC, from roce-sim's --out_json files. Writes one SVG; no plotting
library needed.

usage: scripts/irn-plot.py SR.json PFC.json GBN.json OUT.svg
"""
import json
import math
import sys

SETTINGS = [("no PFC + sr", "#1f77b4"), ("PFC + gbn", "#d62728"), ("no PFC + gbn", "#7f7f7f")]
LABELS = ["&lt;10KB", "&lt;100KB", "&lt;1MB", "&lt;3MB", "&lt;10MB", "&gt;10MB"]


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    docs = [json.load(open(p)) for p in sys.argv[1:4]]
    runs = [d["results"] for d in docs]
    load = round(docs[0]["params"]["load"] * 100)
    hosts = docs[0]["hosts"]
    ccs = [c for c in ["none", "dcqcn", "hpcc", "rx-hpcc", "ldcp"] if all(c in r for r in runs)]
    pw, ph, ml, mt, mb = 300, 230, 48, 40, 46
    width, height = ml + len(ccs) * (pw + 20), mt + ph + mb + 30
    ymin, ymax = 1.0, max(
        max(b["p99"] for b in r[c]["buckets"]) for r in runs for c in ccs
    ) * 1.3
    ly = lambda v: mt + ph - (math.log10(max(v, ymin)) - math.log10(ymin)) / (
        math.log10(ymax) - math.log10(ymin)) * ph
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">FCT slowdown per '
           f'flow size, p99 (solid) and p50 (dashed): roce-sim fat-tree, {hosts} hosts, WebSearch '
           f'{load} %, seed 1</text>']
    for k, c in enumerate(ccs):
        x0 = ml + k * (pw + 20)
        out.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
        out.append(f'<text x="{x0 + pw / 2}" y="{mt - 6}" text-anchor="middle" font-size="12">{c}</text>')
        for v in [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]:
            if v <= ymax:
                y = ly(v)
                out.append(f'<line x1="{x0}" x2="{x0 + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
                if k == 0:
                    out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{v}</text>')
        xs = [x0 + (i + 0.5) * pw / len(LABELS) for i in range(len(LABELS))]
        for i, lab in enumerate(LABELS):
            out.append(f'<text x="{xs[i]:.1f}" y="{mt + ph + 14}" text-anchor="middle" font-size="9">{lab}</text>')
        for (name, color), r in zip(SETTINGS, runs):
            b = r[c]["buckets"]
            for key, dash in [("p99", ""), ("p50", ' stroke-dasharray="4 3"')]:
                pts = " ".join(f"{xs[i]:.1f},{ly(b[i][key]):.1f}" for i in range(min(len(b), len(xs))))
                out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.8"{dash}/>')
    out.append(f'<text x="14" y="{mt + ph / 2}" transform="rotate(-90 14 {mt + ph / 2})" '
               'text-anchor="middle">slowdown (log)</text>')
    lx = ml
    for name, color in SETTINGS:
        out.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{height - 12}" y2="{height - 12}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{lx + 30}" y="{height - 8}">{name}</text>')
        lx += 150
    out.append("</svg>")
    open(sys.argv[4], "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
