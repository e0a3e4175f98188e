#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds issue 29's missed goals, at the final runtime (docs/PERFORMANCE.md, "What bounds the
# misses"). Three parts, on a quiet machine:
#  1. Self-time profiles (perf, cpu-clock) of the handoff and of the mutex pipeline at batch 32 with
#     1000 QPs: per thread, per symbol, and the hottest instructions of each consumer's loop.
#  2. What the consumer's list of the slots a batch may call costs (the list Unregister's wait
#     reads; runtime/core/consumer.h): ROUNDS alternating rows of today's binary and of one built
#     with docs/runs/no_listing_s44.patch, which lists nothing. That binary breaks Unregister's
#     guarantee and exists only to be measured. Each line ends with the cross-core probe ("xcore
#     B/A ns": both under 150 is the fast mode, both at or over it the slow one).
#  3. Profiles of the handoff and of the inline loop with 10^5 QPs in random order.
# Usage: docs/runs/bounds_s44.sh ROUNDS > docs/runs/bounds_s44.txt (from the repository root).
set -eu  # no pipefail: `head` ends perf report early on purpose
rounds=${1:?usage: bounds_s44.sh ROUNDS}
root=$(pwd)
head_bin=/tmp/cqd-s44-dispatch-head
nolist_bin=/tmp/cqd-s44-dispatch-nolist
tree=/tmp/cqd-s44-nolist

echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)," \
  "at $(git rev-parse --short HEAD)"
bazel build -c opt //benchmarks:dispatch >/dev/null 2>&1
cp -f bazel-out/k8-opt/bin/benchmarks/dispatch "$head_bin"
if [[ ! -d $tree ]]; then git worktree add -f --detach "$tree" HEAD >/dev/null 2>&1; fi
git -C "$tree" checkout -q --detach HEAD
git -C "$tree" checkout -q -- .
git -C "$tree" apply "$root/docs/runs/no_listing_s44.patch"
(cd "$tree" && bazel build -c opt //benchmarks:dispatch >/dev/null 2>&1 &&
  cp -f bazel-out/k8-opt/bin/benchmarks/dispatch "$nolist_bin" && bazel shutdown >/dev/null 2>&1)

row() { "$1" --seconds=0.5 "${@:2}" 2>&1 | grep -v '^\['; }

profile() {  # NAME ARGS...: one perf record, then per thread, per symbol, hottest instructions
  local name=$1
  shift
  echo
  echo "## perf record -o /tmp/s44_$name.perf dispatch --seconds=1 $*"
  perf record -q -o "/tmp/s44_$name.perf" "$head_bin" --seconds=1 "$@" 2>&1 | grep -v '^\['
  echo "# perf report --no-children --sort comm (self time per thread)"
  perf report -i "/tmp/s44_$name.perf" --no-children --sort comm 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -6
  echo "# perf report --no-children --sort comm,sym (top 20)"
  perf report -i "/tmp/s44_$name.perf" --no-children --sort comm,sym 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -20 | cut -c1-150
}

hottest() {  # NAME SYMBOL: the instructions of SYMBOL with the most samples (a stall is charged
  # to the instruction after the one that waits)
  echo "# perf annotate -s '$2' (samples of that symbol, top 6 instructions)"
  perf annotate -i "/tmp/s44_$1.perf" --stdio -s "$2" 2>/dev/null |
    grep -E '^ +[0-9]+\.[0-9]+ :' | sort -rn | head -6 | cut -c1-150
}

echo
echo "# part 2: the listing, ROUNDS=$rounds alternating pairs, then the mutex pipeline"
for r in $(seq 1 "$rounds"); do
  order="head nolist"
  [[ $((r % 2)) == 0 ]] && order="nolist head"
  for which in $order; do
    bin=$head_bin
    [[ $which == nolist ]] && bin=$nolist_bin
    echo "round $r $which $(row "$bin" --only=cqd:32:1000:1)"
  done
  echo "round $r head $(row "$head_bin" --only=mutex:32:1000:1)"
done

echo
echo "# part 1: the handoff and the mutex pipeline, batch 32, 1000 QPs"
profile cqd --only=cqd:32:1000:1
hottest cqd 'cqd::bench::CountingHandler::OnCompletions'
profile mutex --only=mutex:32:1000:1
mutex_consumer=$(perf report -i /tmp/s44_mutex.perf --no-children --sort comm,sym 2>/dev/null |
  grep -m1 'consume0.*lambda()#1' | sed 's/.*\[\.\] //; s/ *$//')
hottest mutex "$mutex_consumer"

echo
echo "# part 3: 10^5 QPs in random order"
profile cqd_1e5 --random-order --only=cqd:32:100000:1
hottest cqd_1e5 'cqd::internal::Consumer::DeliverRun'
profile limit_1e5 --random-order --only=limit:32:100000:1
echo
echo "# $(date -u +%FT%TZ) done"
