#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
# Summarizes busy.sh's output (or drain.sh's) per binary and mode of the machine: the busy-poll
# handoff's p50 and the spin floor's, and the write and read system calls per run beyond one per
# sample (20000). A run counts as slow when both probes around its cqd_busy_poll row read over
# 300 ns, fast when both read under 200; the rest are left out and counted. The spin floor's rows
# are sorted by their own probes, and the ratio is of the two medians. The last column is the
# Spearman rank correlation, over one binary's runs in one mode, of the p50 and the extra writes.
# Then the slow runs by round: each round's median, and each binary against head in its round.
#   python3 docs/perf/issue47/busy.py docs/perf/issue47/busy.txt
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r'round (\d+) (\S+) (\S+)\s+poll->handler p50\s+(\d+) .*xcore (\d+)/(\d+)', line)
    if m:
        r, name, row, p50, a, b = m.groups()
        runs[(int(r), name)][row] = (int(p50), int(a), int(b))
    m = re.match(r'round (\d+) (\S+) syscalls syscalls:sys_enter_(\w+) (\d+)', line)
    if m:
        runs[(int(m.group(1)), m.group(2))][m.group(3)] = int(m.group(4)) - 20000


def mode(a, b):
    return 'slow' if a > 300 and b > 300 else 'fast' if a < 200 and b < 200 else None


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(xs, ys):  # rank correlation of the runs' p50 and extra writes
    if len(xs) < 3:
        return '-'
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return f'{num / den:.2f}' if den else '-'


def cell(values):
    if not values:
        return '-'
    return f'{statistics.median(values):g} ({min(values)}-{max(values)}, {len(values)})'


order = ['head', 'head_norand', 'wait', 'end', 'both']
names = sorted({name for _, name in runs}, key=order.index)
left_out = 0
print('| binary | mode | cqd_busy_poll p50, ns | spin floor p50, ns | p50 / floor | extra writes | '
      'extra reads | rank corr. p50 ~ writes |')
print('| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |')
for want in ('slow', 'fast'):
    for name in names:
        rows = [v for (r, n), v in sorted(runs.items()) if n == name and 'cqd_busy_poll' in v]
        picked = [v for v in rows if mode(*v['cqd_busy_poll'][1:]) == want]
        if want == 'slow':
            left_out += sum(1 for v in rows if mode(*v['cqd_busy_poll'][1:]) is None)
        if not picked:
            continue
        p50 = [v['cqd_busy_poll'][0] for v in picked]
        floor = [v['spin_handoff'][0] for v in rows
                 if 'spin_handoff' in v and mode(*v['spin_handoff'][1:]) == want]
        ratio = f'{statistics.median(p50) / statistics.median(floor):.2f}' if floor else '-'
        writes = [v['write'] for v in picked]  # a run without its counts is an error
        print(f'| {name} | {want} | {cell(p50)} | {cell(floor)} | {ratio} | {cell(writes)} | '
              f'{cell([v["read"] for v in picked])} | {spearman(p50, writes)} |')
print(f'\n{left_out} runs left out (their probes disagree on the mode).')

# The same slow runs by round: each round's median over its binaries (the rounds run one after
# another, about 45 s each), and each binary's p50 over head's in the same round (paired).
by_round = defaultdict(dict)
for (r, name), v in runs.items():
    if 'cqd_busy_poll' in v and mode(*v['cqd_busy_poll'][1:]) == 'slow':
        by_round[r][name] = v['cqd_busy_poll'][0]
print('\n| round | slow runs | median p50 of the round, ns |')
print('| ---: | ---: | ---: |')
for r in sorted(by_round):
    print(f'| {r} | {len(by_round[r])} | {statistics.median(by_round[r].values()):g} |')
print('\n| binary | p50 / head\'s in the same round: median (range, rounds) | rounds below 1 |')
print('| --- | ---: | ---: |')
for name in names:
    if name == 'head':
        continue
    ratios = [by_round[r][name] / by_round[r]['head'] for r in sorted(by_round)
              if name in by_round[r] and 'head' in by_round[r]]
    if ratios:
        print(f'| {name} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}, '
              f'{len(ratios)}) | {sum(x < 1 for x in ratios)} |')
