#!/usr/bin/env python3
"""Recompute the ICRC of every packet in a pcap with scapy.contrib.roce (an implementation
independent of ours) and compare with the ICRC the packet carries.

Usage: scapy_icrc.py FILE.pcap   -> prints one line per packet "idx ours theirs", exits 1
on any mismatch or if a packet is not decoded as RoCEv2 by scapy.
"""
import sys

from scapy.all import rdpcap, raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP

bad = 0
pkts = rdpcap(sys.argv[1])
for i, p in enumerate(pkts):
    if BTH not in p:
        print(f"{i} not-roce")
        bad += 1
        continue
    ip_end = 14 + p[IP].len
    ours = raw(p)[ip_end - 4:ip_end]
    theirs = p[BTH].compute_icrc(None)
    print(f"{i} {ours.hex()} {theirs.hex()}")
    if ours != theirs:
        bad += 1
print(f"packets={len(pkts)} mismatches={bad}")
sys.exit(1 if bad or not pkts else 0)
