#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Issue 29's before and after, in one session on one machine: ROUNDS alternating full runs of the
# dispatch harness (before, after; then after, before; ...), each into its own folder:
#   docs/perf/issue29/run.sh ROUNDS [FIRST] [DIR]  (rounds FIRST.., 1 by default; DIR: where the
#                                                   runs go, docs/perf/issue29 by default)
# before = 13847e6 (the code the issue was filed against) built with this commit's benchmarks/
#          (the same harness, pipelines and cross-core probe; the runtime of 13847e6)
# after  = this commit
# Each run writes DIR/{before,after}/runN/dispatch.json and log.txt. Run on a quiet
# machine: every pipeline pins CPUs 0 and 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: run.sh ROUNDS [FIRST] [DIR]}
first=${2:-1}
out=${3:-docs/perf/issue29}
here=$(git rev-parse --short HEAD)
base=/tmp/cqd-issue29-before
if [[ ! -d $base ]]; then git worktree add -f "$base" 13847e6 > /dev/null; fi
cp benchmarks/{dispatch_bench.cc,machine.cc,machine.h,pipelines.cc,pipelines.h} "$base/benchmarks/"
(cd "$base" && bazel --output_base=/tmp/cqd-issue29-before-ob build -c opt //benchmarks:dispatch)
bazel build -c opt //benchmarks:dispatch
cp "$base/bazel-bin/benchmarks/dispatch" /tmp/cqd-issue29-dispatch-before
cp bazel-bin/benchmarks/dispatch /tmp/cqd-issue29-dispatch-after
echo "# $(date -u +%FT%TZ) after = $here, before = 13847e6 with $here's benchmarks/, $rounds rounds"
for r in $(seq "$first" $((first + rounds - 1))); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for which in $order; do
    dir=$out/$which/run$r
    mkdir -p "$dir"
    echo "round $r $which $(date -u +%T) $(/tmp/cqd-issue29-dispatch-after --probe)"
    /tmp/cqd-issue29-dispatch-$which --out="$dir" > "$dir/log.txt" 2>&1
  done
done
echo "# $(date -u +%FT%TZ) done"
