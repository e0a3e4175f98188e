#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
# Summarizes bare.sh's output by cross-core mode (a line is "fast" when both probes around it
# read under 200 ns, "slow" when both read over 300 ns; mixed lines are left out, and counted):
# per row and mode, the median p50 and p99 (range of the p50s, rows), and the p50 median over the
# spin floor's.
#   python3 docs/perf/issue47/bare.py docs/perf/issue47/bare.txt
import re
import statistics
import sys

rows = {}  # (mode, row) -> [(p50, p99)]
order = []
mixed = {}  # row -> lines left out
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"round \d+ (\S+)\s+poll->handler p50\s+(\d+) p99\s+(\d+) ns, "
                     r"xcore (\d+)/(\d+) ns", line)
        if not m:
            continue
        row, p50, p99, a, b = m.group(1), *map(int, m.groups()[1:])
        mode = "fast" if a < 200 and b < 200 else "slow" if a > 300 and b > 300 else None
        if mode is None:
            mixed[row] = mixed.get(row, 0) + 1
            continue
        if row not in order:
            order.append(row)
        rows.setdefault((mode, row), []).append((p50, p99))

print("| mode | row | p50, ns (range, rows) | p99, ns | p50 / spin floor's |")
print("| --- | --- | ---: | ---: | ---: |")
for mode in ("fast", "slow"):
    floor = rows.get((mode, "spin_handoff"))
    floor50 = statistics.median(p for p, _ in floor) if floor else None
    for row in order:
        got = rows.get((mode, row))
        if not got:
            continue
        p50s = [p for p, _ in got]
        med = statistics.median(p50s)
        ratio = f"{med / floor50:.2f}" if floor50 else "-"
        print(f"| {mode} | {row} | {med:g} ({min(p50s)}-{max(p50s)}, {len(p50s)}) | "
              f"{statistics.median(q for _, q in got):.0f} | {ratio} |")
print()
print("left out, the probes around them in different modes: " +
      (", ".join(f"{row} {n}" for row, n in mixed.items()) or "none"))
