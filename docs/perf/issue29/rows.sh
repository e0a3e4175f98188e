#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The rows the full runs (run.sh) do not have, from the same two binaries, ROUNDS alternating
# rounds, one process per row, batch 32, one consumer, QPs in random order: the consumer's floor
# (`handlers`: one thread calling the handlers, nothing polled or handed over), the inline loop
# with 1, 1000 and 100000 QPs, the mutex pipeline, the handoff with 1000 and 100000 QPs, and run to
# completion with 1000, 100000 and 1, each from both binaries (the benchmark's own pipelines
# too: their speed moves with the binary's layout). Each line ends with the cross-core probe
# taken before and after its row ("xcore BEFORE/AFTER ns").
#   docs/perf/issue29/rows.sh ROUNDS > docs/perf/issue29/rows.txt   (after run.sh built them)
# With `--in-order ROW...` after ROUNDS it runs those rows instead, QPs in order (batches.sh).
set -euo pipefail
rounds=${1:?usage: rows.sh ROUNDS [--in-order ROW...]}
shift
bin=/tmp/cqd-issue29-dispatch
order_flag=(--random-order)
rows=(handlers:32:1000:1 limit:32:1000:1 limit:32:100000:1 limit:32:1:1 mutex:32:1000:1
      cqd:32:1000:1 cqd:32:100000:1 cqd_rtc:32:1000:1 cqd_rtc:32:100000:1 cqd_rtc:32:1:1)
if [[ ${1:-} == --in-order ]]; then
  shift
  order_flag=()
  rows=("$@")
fi
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq 1 "$rounds"); do
  order="before after"
  [[ $((r % 2)) == 0 ]] && order="after before"
  for row in "${rows[@]}"; do
    for which in $order; do
      echo "round $r $which $("$bin-$which" "${order_flag[@]}" --seconds=0.5 --only="$row")"
    done
  done
done
echo "# $(date -u +%FT%TZ) done"
