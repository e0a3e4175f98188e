#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Prints a runtime_fuzz input (a corpus file or a crash-* artifact) as its operations."""
import sys

from make_corpus import OPS, SPILLS

for path in sys.argv[1:]:
    data = open(path, "rb").read()
    print(f"{path}: {len(data)} bytes")
    if len(data) < 3:
        continue
    c0, c1, c2 = data[0], data[1], data[2]
    other = "rtc" if c2 & 0x10 else "owned"
    print(f"  config: pollers={1 + (c0 & 1)} consumers={other + '+engine' if c0 & 2 else 'engine'}"
          f" edge={bool(c0 & 4)} ack_threshold={[1, 2, 4, 64][(c0 >> 3) & 3]}"
          f" idle_budget={20 if c0 & 0x20 else 0}us poll_batch={[1, 2, 4, 32][c0 >> 6]}"
          f" queue_capacity={[1, 2, 3, 4, 8, 16, 64, 1024][c1 & 7]}"
          f" dispatch_batch={[1, 2, 3, 4, 8, 16, 64, 256][(c1 >> 3) & 7]}"
          f" max_registrations={3 if c1 & 0x40 else 64}"
          f" spill_capacity={SPILLS[c2 & 3]} last_wqe_reached={not c2 & 4}"
          f" fatal_at_end={bool(c2 & 8)} engine_shard={bool(c2 & 0x20)} arena={bool(c2 & 0x40)}"
          f" linger={[200, 0, 1, 10000][((c1 >> 7) & 1) | ((c2 >> 7) & 1) << 1]}us")
    rest = data[3:]
    for i in range(0, min(len(rest), 3 * 400), 3):
        chunk = rest[i:i + 3] + bytes(3)
        print(f"  #{i // 3:<3} {OPS[chunk[0] % len(OPS)]:<18} a=0x{chunk[1]:02x} b=0x{chunk[2]:02x}")
