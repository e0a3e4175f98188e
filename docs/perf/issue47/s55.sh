#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Does the consumer's handler prefetch (ff293b1) pay in each mode of the machine? This commit's
# dispatch harness against the same tree with no_handler_prefetch.patch applied (the slot
# prefetch kept), or against commit BASE, alternating in one sitting:
#   docs/perf/issue47/s55.sh ROUNDS > docs/perf/issue47/s55.txt            (at 20d0ecd)
#   docs/perf/issue47/s55.sh ROUNDS 20d0ecd > docs/perf/issue47/s55_gate.txt
# Each round runs, for each binary (head first in odd rounds): the handoff with 1000 QPs in order
# and in random order and with 10^5 in random order (batch 32, one consumer, --seconds=0.5); and
# once a round this commit's event-mode rows (--event-latency-only, with cqd_event_spin: the
# consumer at its default idle_spin). Every line carries the cross-core probe taken around it, so
# that each mode can be read apart (summarize.py reads these lines: "after" is this commit,
# "before" the patched tree or BASE). Run on a quiet machine: every pipeline pins CPUs 0 and 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: s55.sh ROUNDS [BASE]}
base_commit=${2:-}
here=$(git rev-parse --short HEAD)
patch=$PWD/docs/perf/issue47/no_handler_prefetch.patch
patched=/tmp/cqd-s55-nohp
rm -rf "$patched"
git worktree prune
git worktree add -f "$patched" "${base_commit:-HEAD}" > /dev/null
before_name="$here + no_handler_prefetch.patch"
if [[ -n $base_commit ]]; then
  before_name=$base_commit
else
  (cd "$patched" && git apply "$patch") >&2
fi
(cd "$patched" && bazel --output_base=/tmp/cqd-s55-nohp-ob build -c opt //benchmarks:dispatch) >&2
bazel build -c opt //benchmarks:dispatch >&2
cp -f "$patched/bazel-bin/benchmarks/dispatch" /tmp/cqd-s55-dispatch-before
cp -f bazel-bin/benchmarks/dispatch /tmp/cqd-s55-dispatch-after
run() {  # BINARY ROW [--random-order]
  "/tmp/cqd-s55-dispatch-$1" --seconds=0.5 ${3:-} --only="$2" 2>/dev/null
}
echo "# $(date -u +%FT%TZ) after = $here, before = $before_name, $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  order="after before"
  [[ $((r % 2)) == 0 ]] && order="before after"
  for which in $order; do echo "round $r $which $(run "$which" cqd:32:1000:1)"; done
  for row in cqd:32:1000:1 cqd:32:100000:1; do
    for which in $order; do echo "round $r $which $(run "$which" "$row" --random-order)"; done
  done
  /tmp/cqd-s55-dispatch-after --event-latency-only 2>/dev/null | sed "s/^/round $r bound event /"
done
echo "# $(date -u +%FT%TZ) done"
