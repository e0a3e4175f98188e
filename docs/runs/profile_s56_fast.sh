#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds issue 47's fast-mode misses (docs/PERFORMANCE.md, "What bounds the busy-poll
# latency, and a fast-mode profile"): before each row, waits, probing once every 10 s, for the
# machine's fast cross-core mode (a probe under 200 ns; at most WAIT_MIN minutes in all), then
# takes a 2 s self-time profile of that row (batch 32, one consumer; `--only` rows, default: the
# handoff with 1000 QPs, the mutex pipeline and the inline loop with the same QPs, and run to
# completion with 1000 QPs and with one). Each profile prints its row's figure and the
# cross-core probes around it, so a row that left the fast mode while it ran is seen as such.
# From the repository root:
#   docs/runs/profile_s56_fast.sh [WAIT_MIN [ROW...]] > docs/runs/profile_s56_fast.txt
set -eu  # no pipefail: `head` ends perf report early on purpose
wait_min=${1:-30}
shift || true
rows=("$@")
if [[ ${#rows[@]} -eq 0 ]]; then
  rows=(cqd:32:1000:1 mutex:32:1000:1 limit:32:1000:1 cqd_rtc:32:1000:1 cqd_rtc:32:1:1)
fi
bazel build -c opt //benchmarks:dispatch >&2
bin=/tmp/cqd-s56-dispatch
cp -f bazel-bin/benchmarks/dispatch "$bin"
echo "# docs/runs/profile_s56_fast.sh $wait_min ${rows[*]}"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
probe() { "$bin" --probe 2>/dev/null | sed -E 's/^xcore ([0-9]+).*/\1/'; }
deadline=$(($(date +%s) + wait_min * 60))
for row in "${rows[@]}"; do
  until [[ $(probe) -lt 200 ]]; do
    if [[ $(date +%s) -ge $deadline ]]; then
      echo "# $(date -u +%FT%TZ) no fast mode within $wait_min minutes: no more profiles"
      exit 1
    fi
    sleep 10
  done
  data=/tmp/s56_${row//:/_}.perf
  echo
  echo "## $(date -u +%FT%TZ) fast mode: perf record -o $data $bin --seconds=2 --only=$row"
  perf record -q -o "$data" "$bin" --seconds=2 --only="$row" 2>&1 | grep -v '^\['
  echo "# self time per thread"
  perf report -i "$data" --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' |
    head -4
  echo "# self time per thread and symbol (top 12)"
  perf report -i "$data" --no-children --sort comm,sym 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -12 | cut -c1-120
  for sym in cqd::internal::Consumer::Run cqd::internal::Router::RouteInLane \
    cqd::internal::FusedPoll::Poll; do
    echo "# perf annotate $sym (if sampled): the instructions holding most of its samples"
    perf annotate -i "$data" --stdio -s "$sym" 2>/dev/null | grep -E '^ +[0-9]+\.[0-9]+ :' |
      sort -rn | head -6
  done
done
echo "# $(date -u +%FT%TZ) done"
