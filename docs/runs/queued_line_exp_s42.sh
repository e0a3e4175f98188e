#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# An experiment, not a change: is the small-batch handoff's cost the depth counter's line? `exp`
# is this commit's dispatch harness built with one change to runtime/core/consumer.h,
# `queued_items_` on a cache line of its own (alignas(64)) instead of on depth_'s; `after` is
# docs/perf/issue29/run.sh's after binary. ROUNDS alternating rounds of the handoff, 1000 QPs, at
# batch 8, 1 and 32, one process per row, each with its cross-core probe.
#   docs/runs/queued_line_exp_s42.sh ROUNDS   (binaries /tmp/cqd-issue29-dispatch-after, /tmp/cqd-exp-dispatch)
set -eu
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$1"); do
  order="after exp"
  [[ $((r % 2)) == 0 ]] && order="exp after"
  for row in cqd:8:1000:1 cqd:1:1000:1 cqd:32:1000:1; do
    for which in $order; do
      if [[ $which == exp ]]; then bin=/tmp/cqd-exp-dispatch; else bin=/tmp/cqd-issue29-dispatch-after; fi
      echo "round $r $which $("$bin" --seconds=0.5 --only="$row")"
    done
  done
done
echo "# $(date -u +%FT%TZ) done"
