#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds the busy-poll handoff's latency: the harness's --latency-only rows, ROUNDS times in
# one sitting. Each round prints cqd's busy-poll handoff and run to completion (poll -> handler),
# the spin floor (one cache line handed between the two cores) and the floors of three hand-over
# protocols with no runtime code around them (dispatch_bench.cc, RunHandOverFloor):
# floor_depth_end (cqd's: a depth CAS, then the lane's published end, then the entry),
# floor_end (a plain ring's published end, then the entry), floor_entry_seq (the entry's own
# sequence number in its metadata, then its ibv_wc) and floor_one_line (the same with the ibv_wc
# and the metadata in one 64-byte line). Every line carries the cross-core probe taken around it, so that
# floors.py reads each mode of the machine apart. Run on a quiet machine (CPUs 0 and 1 pinned):
#   docs/perf/issue47/floors.sh 12 > docs/perf/issue47/floors.txt
#   python3 docs/perf/issue47/floors.py docs/perf/issue47/floors.txt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: floors.sh ROUNDS}
bazel build -c opt //benchmarks:dispatch >&2
cp -f bazel-bin/benchmarks/dispatch /tmp/cqd-floors-dispatch
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  /tmp/cqd-floors-dispatch --latency-only 2>/dev/null | sed "s/^/round $r /"
done
echo "# $(date -u +%FT%TZ) done"
