#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# This session's two changes against the commit before them (a7808c6), alternating in one sitting:
#   docs/perf/issue47/s54.sh ROUNDS > docs/perf/issue47/s54.txt
# Each round runs, for each binary (before first in odd rounds): the event-mode rows beside one
# eventfd wake (--event-latency-only: the pre-wake), and the handoff with 1000 and 10^5 QPs in
# random order (batch 32, one consumer, --seconds=0.5: the handler prefetch); and once a round the
# inline loop with the same QPs. Every line carries the cross-core probe taken around it, so that
# each mode of the machine can be read apart (summarize.py reads these lines too). Run on a quiet
# machine: every pipeline pins CPUs 0 and 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: s54.sh ROUNDS}
here=$(git rev-parse --short HEAD)
base_commit=a7808c6
base=/tmp/cqd-s54-before
if [[ ! -d $base ]]; then git worktree add -f "$base" "$base_commit" > /dev/null; fi
(cd "$base" && bazel --output_base=/tmp/cqd-s54-before-ob build -c opt //benchmarks:dispatch) >&2
bazel build -c opt //benchmarks:dispatch >&2
cp "$base/bazel-bin/benchmarks/dispatch" /tmp/cqd-s54-dispatch-before
cp bazel-bin/benchmarks/dispatch /tmp/cqd-s54-dispatch-after
run() {  # BINARY ROW...: one random-order --only row
  "/tmp/cqd-s54-dispatch-$1" --seconds=0.5 --random-order --only="$2" 2>/dev/null
}
echo "# $(date -u +%FT%TZ) after = $here, before = $base_commit, $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for which in $order; do
    "/tmp/cqd-s54-dispatch-$which" --event-latency-only 2>/dev/null | sed "s/^/round $r $which event /"
  done
  for row in cqd:32:1000:1 cqd:32:100000:1; do
    for which in $order; do echo "round $r $which $(run "$which" "$row")"; done
  done
  for row in limit:32:1000:1 limit:32:100000:1; do echo "round $r bound $(run after "$row")"; done
done
echo "# $(date -u +%FT%TZ) done"
