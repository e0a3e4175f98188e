#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
# Summarizes ab.sh's outputs (one or more files, read as one set) by cross-core mode: a line is "fast" when
# both probes around it read under 200 ns, "slow" when both read over 300 ns, and mixed (left
# out) otherwise. Prints, per row and mode, each binary's median and its range, and after/before.
#   python3 docs/perf/issue46/summarize.py docs/perf/issue46/ab.txt docs/perf/issue46/ab_2.txt
import re
import statistics
import sys

rows = {}
lines = [line for path in sys.argv[1:] for line in open(path)]
for line in lines:
    m = re.match(r"round (\d+) (before|after) (.*)", line)
    if not m:
        continue
    _, which, rest = m.groups()
    x = re.search(r"xcore (\d+)/(\d+) ns", rest)
    if not x:
        continue
    a, b = int(x.group(1)), int(x.group(2))
    mode = "fast" if a < 200 and b < 200 else "slow" if a > 300 and b > 300 else None
    if mode is None:
        continue
    t = re.match(r"(\S+) batch (\d+) qps (\d+) consumers (\d+): ([\d.]+) M completions/s, ([\d.]+) CPU ns", rest)
    if t:
        key = f"{t.group(1)} qps {t.group(3)} (M/s)"
        rows.setdefault((key, mode), {}).setdefault(which, []).append(float(t.group(5)))
        continue
    l = re.match(r"latency (\S+)\s+poll->handler p50\s+(\d+)", rest)
    if l:
        key = f"{l.group(1)} p50 (ns)"
        rows.setdefault((key, mode), {}).setdefault(which, []).append(float(l.group(2)))

print("| row | mode | before median (range, n) | after median (range, n) | after / before |")
print("| --- | --- | ---: | ---: | ---: |")
for (key, mode), d in sorted(rows.items()):
    b, a = d.get("before", []), d.get("after", [])
    def fmt(v):
        if not v:
            return "-"
        return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}, {len(v)})"
    ratio = f"{statistics.median(a) / statistics.median(b):.3f}" if a and b else "-"
    print(f"| {key} | {mode} | {fmt(b)} | {fmt(a)} | {ratio} |")
