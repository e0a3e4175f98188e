#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Issue 47's before/after: ROUNDS alternating rounds of the dispatch harness, before (47e74d5, the
# redesign's head, whose consumer listed each batch's slots for Unregister) and after (this
# commit), in one sitting on one machine:
#   docs/perf/issue47/ab.sh ROUNDS > docs/perf/issue47/ab.txt
# Each round runs, for each binary (before first in odd rounds, after first in even ones): the
# handoff to an owned consumer and run to completion with 1000 QPs, run to completion with one
# QP, the handoff with 1000 and 10^5 QPs in random order (batch 32, one consumer, --seconds=0.5
# each), and the busy-poll latency rows with their spin floor (--latency-only); and once per
# round (the after binary's: the before binary has no copy floor) the bounds: the inline loop
# (limit) with 1000 QPs and with one, the handlers alone, the copy floor and the mutex pipeline with 1000 QPs, and the
# inline loop, the handlers and the copy floor in random order with 1000 and 10^5 QPs; and the
# event-mode rows beside one eventfd wake (the after binary's --event-latency-only). Every line
# carries the cross-core probe taken around it, so that each mode of the machine can be read
# apart (summarize.py). Run on a quiet machine: every pipeline pins CPUs 0 and 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: ab.sh ROUNDS}
here=$(git rev-parse --short HEAD)
base_commit=47e74d5
base=/tmp/cqd-issue47-before
if [[ ! -d $base ]]; then git worktree add -f "$base" "$base_commit" > /dev/null; fi
(cd "$base" && bazel --output_base=/tmp/cqd-issue47-before-ob build -c opt //benchmarks:dispatch) >&2
bazel build -c opt //benchmarks:dispatch >&2
cp "$base/bazel-bin/benchmarks/dispatch" /tmp/cqd-issue47-dispatch-before
cp bazel-bin/benchmarks/dispatch /tmp/cqd-issue47-dispatch-after
# A row with an "r" after it runs with --random-order (the QPs' completions in random order).
rows=(cqd:32:1000:1 cqd_rtc:32:1000:1 cqd_rtc:32:1:1 cqd:32:1000:1:r cqd:32:100000:1:r)
bounds=(limit:32:1000:1 limit:32:1:1 handlers:32:1000:1 copy:32:1000:1 mutex:32:1000:1
  limit:32:1000:1:r limit:32:100000:1:r handlers:32:100000:1:r copy:32:100000:1:r)
# run BINARY ROW: one --only row (ROW as above) with BINARY (before or after).
run() {
  local only=$2 random=()
  if [[ $only == *:r ]]; then
    only=${only%:r}
    random=(--random-order)
  fi
  "/tmp/cqd-issue47-dispatch-$1" --seconds=0.5 "${random[@]}" --only="$only" 2>/dev/null
}
echo "# $(date -u +%FT%TZ) after = $here, before = $base_commit, $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for row in "${rows[@]}"; do
    for which in $order; do
      echo "round $r $which $(run "$which" "$row")"
    done
  done
  for row in "${bounds[@]}"; do
    echo "round $r bound $(run after "$row")"
  done
  for which in $order; do
    /tmp/cqd-issue47-dispatch-$which --latency-only 2>/dev/null | sed "s/^/round $r $which latency /"
  done
  /tmp/cqd-issue47-dispatch-after --event-latency-only 2>/dev/null | sed "s/^/round $r bound event /"
done
echo "# $(date -u +%FT%TZ) done"
