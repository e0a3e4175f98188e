#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds the busy-poll handoff's latency: the harness's --latency-only rows, ROUNDS times in
# one sitting. Each round prints cqd's busy-poll handoff and run to completion (poll -> handler),
# the spin floor (one cache line handed between the two cores) and four bare hand-over protocols,
# run with no runtime code around them (dispatch_bench.cc, RunBareHandOver): bare_depth_end
# (cqd's: a depth CAS, then the lane's published end, the entry's lines loaded once the depth
# moves), bare_end (a plain ring's published end, then the entry), bare_entry_seq (the entry's own
# sequence number in its metadata, then its ibv_wc) and bare_one_line (the same with the ibv_wc
# and the metadata in one 64-byte line). Every line carries the cross-core probe taken around it,
# so that bare.py reads each mode of the machine apart. Run on a quiet machine (CPUs 0 and 1
# pinned):
#   docs/perf/issue47/bare.sh 12 > docs/perf/issue47/bare.txt
#   python3 docs/perf/issue47/bare.py docs/perf/issue47/bare.txt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: bare.sh ROUNDS}
bazel build -c opt //benchmarks:dispatch >&2
cp -f bazel-bin/benchmarks/dispatch /tmp/cqd-bare-dispatch
echo "# docs/perf/issue47/bare.sh $rounds"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  /tmp/cqd-bare-dispatch --latency-only 2>/dev/null | sed "s/^/round $r /"
done
echo "# $(date -u +%FT%TZ) done"
