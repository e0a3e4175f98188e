#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The handoff at poll batch 8 with 1000 QPs (round robin), the row docs/PERFORMANCE.md found
# 0.72x worse than 13847e6: ROUNDS alternating pairs of the two binaries of docs/perf/issue29/run.sh
# (/tmp/cqd-issue29-dispatch-{before,after}), each row with its cross-core probe, then one
# `perf record` of each binary on the same row and its self-time profile, per thread and per
# symbol. Usage: docs/runs/batch8_s42.sh ROUNDS (on a quiet machine).
set -eu  # no pipefail: `head` ends perf report early on purpose
bin=/tmp/cqd-issue29-dispatch
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$1"); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for which in $order; do
    echo "round $r $which $("$bin-$which" --seconds=0.5 --only=cqd:8:1000:1)"
  done
done
for which in before after; do
  echo "# perf record -o /tmp/b8_$which.perf $bin-$which --seconds=0.5 --only=cqd:8:1000:1"
  perf record -q -o "/tmp/b8_$which.perf" "$bin-$which" --seconds=0.5 --only=cqd:8:1000:1 2>&1 |
    grep -v '^\['
  echo "# perf report --no-children --sort comm (self time per thread)"
  perf report -i "/tmp/b8_$which.perf" --no-children --sort comm 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -8
  echo "# perf report --no-children --sort comm,sym (top 30)"
  perf report -i "/tmp/b8_$which.perf" --no-children --sort comm,sym 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -30
done
echo "# $(date -u +%FT%TZ) done"
