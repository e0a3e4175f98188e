#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds issue 47's fast-mode misses (docs/PERFORMANCE.md, "What bounds the busy-poll
# latency, and the fast mode's misses"): waits, probing once every 10 s for at most WAIT_MIN
# minutes, for the machine's fast cross-core mode (a probe under 200 ns), then takes 2 s
# self-time profiles of the handoff with 1000 QPs, the mutex pipeline and the inline loop with the
# same QPs, and run to completion with 1000 QPs and with one, batch 32, one consumer. Each profile
# prints its row's figure and the cross-core probes around it, so a row that left the fast mode is
# seen as such. From the repository root:
#   docs/runs/profile_s56_fast.sh [WAIT_MIN] > docs/runs/profile_s56_fast.txt
set -eu  # no pipefail: `head` ends perf report early on purpose
wait_min=${1:-30}
bazel build -c opt //benchmarks:dispatch >&2
bin=/tmp/cqd-s56-dispatch
cp -f bazel-bin/benchmarks/dispatch "$bin"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
probe() { "$bin" --probe 2>/dev/null | sed -E 's/^xcore ([0-9]+).*/\1/'; }
deadline=$(($(date +%s) + wait_min * 60))
until [[ $(probe) -lt 200 ]]; do
  if [[ $(date +%s) -ge $deadline ]]; then
    echo "# $(date -u +%FT%TZ) no fast mode within $wait_min minutes: no profile"
    exit 1
  fi
  sleep 10
done
echo "# $(date -u +%FT%TZ) fast mode: probe $(probe) ns"
for row in cqd:32:1000:1 mutex:32:1000:1 limit:32:1000:1 cqd_rtc:32:1000:1 cqd_rtc:32:1:1; do
  data=/tmp/s56_${row//:/_}.perf
  echo
  echo "## perf record -o $data $bin --seconds=2 --only=$row"
  perf record -q -o "$data" "$bin" --seconds=2 --only="$row" 2>&1 | grep -v '^\['
  echo "# self time per thread"
  perf report -i "$data" --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' |
    head -4
  echo "# self time per thread and symbol (top 12)"
  perf report -i "$data" --no-children --sort comm,sym 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -12 | cut -c1-120
done
echo "# $(date -u +%FT%TZ) done"
