#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
# Summarizes ab.sh's output by cross-core mode (a line is "fast" when both probes around it read
# under 200 ns, "slow" when both read over 300 ns; mixed lines are left out). Prints, per row and
# mode, each binary's median, its range and count, and after/before; then, per mode, issue 47's
# ratios from the medians: the handoff against its bound (the smallest of the inline loop, the
# handlers alone and the copy floor), its CPU per completion against the mutex pipeline's, run to
# completion against the inline loop, 10^5 QPs against 1000 in random order for the handoff and
# the inline loop, the busy-poll p50 against the spin floor, and (the after binary only) the
# event-mode added->handler p50, handoff and run to completion, against one eventfd wake (the
# after binary's in ab.sh; each binary's in s54.sh, whose output it reads as well).
#   python3 docs/perf/issue47/summarize.py docs/perf/issue47/ab.txt
import re
import statistics
import sys

vals = {}  # (key, mode, which) -> [values]
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"round (\d+) (before|after|bound) (.*)", line)
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
        t = re.match(r"(\S+) batch (\d+) qps (\d+) consumers (\d+)( random)?: ([\d.]+) M "
                     r"completions/s, ([\d.]+) CPU ns", rest)
        if t:
            key = f"{t.group(1)} qps {t.group(3)}{' random' if t.group(5) else ''}"
            vals.setdefault((key + " (M/s)", mode, which), []).append(float(t.group(6)))
            vals.setdefault((key + " (CPU ns)", mode, which), []).append(float(t.group(7)))
            continue
        l = re.match(r"latency (\S+)\s+poll->handler p50\s+(\d+)", rest)
        if l:
            vals.setdefault((f"{l.group(1)} p50 (ns)", mode, which), []).append(float(l.group(2)))
            continue
        e = re.match(r"event (\S+)\s+added->handler p50\s+(\d+)", rest)
        if e:
            vals.setdefault((f"{e.group(1)} added p50 (ns)", mode, which), []).append(
                float(e.group(2)))


def med(key, mode, which):
    v = vals.get((key, mode, which))
    return statistics.median(v) if v else None


def fmt(v):
    if not v:
        return "-"
    return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}, {len(v)})"


keys = sorted({(k, m) for (k, m, _) in vals})
print("| row | mode | before | after | bound rows | after / before |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for key, mode in keys:
    b, a, o = (vals.get((key, mode, w), []) for w in ("before", "after", "bound"))
    ratio = f"{statistics.median(a) / statistics.median(b):.3f}" if a and b else "-"
    print(f"| {key} | {mode} | {fmt(b)} | {fmt(a)} | {fmt(o)} | {ratio} |")


def ratio(x, y):
    return f"{x / y:.2f}" if x is not None and y else "-"


print()
print("| mode | binary | handoff / bound | CPU / mutex CPU | rtc 1000 / limit | rtc 1 / limit |"
      " handoff 1e5/1e3 | limit 1e5/1e3 | busy p50 / spin floor |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for mode in ("fast", "slow"):
    limit = med("limit qps 1000 (M/s)", mode, "bound")
    parts = [med(f"{b} qps 1000 (M/s)", mode, "bound") for b in ("limit", "handlers", "copy")]
    parts = [v for v in parts if v is not None]
    bound = min(parts) if parts else None
    mutex_cpu = med("mutex qps 1000 (CPU ns)", mode, "bound")
    limit_r = med("limit qps 1000 random (M/s)", mode, "bound")
    limit_1e5 = med("limit qps 100000 random (M/s)", mode, "bound")
    for which in ("before", "after"):
        handoff = med("cqd qps 1000 (M/s)", mode, which)
        print(f"| {mode} | {which} | {ratio(handoff, bound)} | "
              f"{ratio(med('cqd qps 1000 (CPU ns)', mode, which), mutex_cpu)} | "
              f"{ratio(med('cqd_rtc qps 1000 (M/s)', mode, which), limit)} | "
              f"{ratio(med('cqd_rtc qps 1 (M/s)', mode, which), med('limit qps 1 (M/s)', mode, 'bound'))} | "
              f"{ratio(med('cqd qps 100000 random (M/s)', mode, which), med('cqd qps 1000 random (M/s)', mode, which))} | "
              f"{ratio(limit_1e5, limit_r)} | "
              f"{ratio(med('cqd_busy_poll p50 (ns)', mode, which), med('spin_handoff p50 (ns)', mode, which))} |")

print()
print("| mode | binary | event handoff p50 / eventfd wake | event handoff, default idle_spin, p50 / eventfd wake | event rtc p50 / eventfd wake |")
print("| --- | --- | ---: | ---: | ---: |")
for mode in ("fast", "slow"):
    # ab.sh runs the event rows once a round ("bound"); s54.sh runs them for each binary.
    for which in ("bound", "before", "after"):
        wake = med("eventfd_pingpong added p50 (ns)", mode, which)
        if wake is None:
            continue
        print(f"| {mode} | {which} | {ratio(med('cqd_event added p50 (ns)', mode, which), wake)} | "
              f"{ratio(med('cqd_event_spin added p50 (ns)', mode, which), wake)} | "
              f"{ratio(med('cqd_rtc_event added p50 (ns)', mode, which), wake)} |")
