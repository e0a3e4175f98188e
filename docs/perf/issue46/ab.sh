#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Issue 46's check that the redesign kept the hot path as fast: ROUNDS alternating rounds of the
# dispatch harness, before (7c80674, the code the issue was filed against) and after (this
# commit), in one sitting on one machine:
#   docs/perf/issue46/ab.sh ROUNDS > docs/perf/issue46/ab.txt
# Each round runs, for each binary (before first in odd rounds, after first in even ones): the
# handoff to an owned consumer and run to completion with 1000 QPs, run to completion with one
# QP (batch 32, one consumer, --seconds=0.5 each), and the busy-poll latency rows with their
# spin floor (--latency-only). Every line carries the cross-core probe taken around it, so that
# each mode of the machine can be read apart. The benchmarks/ of both commits are the same.
# Run on a quiet machine: every pipeline pins CPUs 0 and 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: ab.sh ROUNDS}
here=$(git rev-parse --short HEAD)
base=/tmp/cqd-issue46-before
if [[ ! -d $base ]]; then git worktree add -f "$base" 7c80674 > /dev/null; fi
(cd "$base" && bazel --output_base=/tmp/cqd-issue46-before-ob build -c opt //benchmarks:dispatch) >&2
bazel build -c opt //benchmarks:dispatch >&2
cp "$base/bazel-bin/benchmarks/dispatch" /tmp/cqd-issue46-dispatch-before
cp bazel-bin/benchmarks/dispatch /tmp/cqd-issue46-dispatch-after
rows=(cqd:32:1000:1 cqd_rtc:32:1000:1 cqd_rtc:32:1:1)
echo "# $(date -u +%FT%TZ) after = $here, before = 7c80674, $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for row in "${rows[@]}"; do
    for which in $order; do
      echo "round $r $which $(/tmp/cqd-issue46-dispatch-$which --seconds=0.5 --only="$row" 2>/dev/null)"
    done
  done
  for which in $order; do
    /tmp/cqd-issue46-dispatch-$which --latency-only 2>/dev/null | sed "s/^/round $r $which latency /"
  done
done
echo "# $(date -u +%FT%TZ) done"
