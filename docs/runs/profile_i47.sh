#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds issue 47's missed goals (docs/PERFORMANCE.md, "The consumer without the batch
# listing"): self-time profiles (perf, cpu-clock) of the after binary of docs/perf/issue47/ab.sh
# (/tmp/cqd-issue47-dispatch-after), each beside the pipeline it is measured against, with the
# cross-core probe around each row. On a quiet machine, from the repository root:
#   docs/runs/profile_i47.sh > docs/runs/profile_i47.txt
#  1. run to completion, batch 32, 1000 QPs, against the inline loop;
#  2. the handoff with 10^5 QPs in random order, against the inline loop with the same QPs.
set -eu  # no pipefail: `head` ends perf report early on purpose
bin=/tmp/cqd-issue47-dispatch-after
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)," \
  "the binary built at $(git rev-parse --short HEAD) by docs/perf/issue47/ab.sh"

profile() {  # NAME ARGS...: one perf record, then self time per thread and per symbol
  local name=$1
  shift
  echo
  echo "## perf record -o /tmp/i47_$name.perf dispatch --seconds=1 $*"
  perf record -q -o "/tmp/i47_$name.perf" "$bin" --seconds=1 "$@" 2>&1 | grep -v '^\['
  echo "# perf report --no-children --sort comm (self time per thread)"
  perf report -i "/tmp/i47_$name.perf" --no-children --sort comm 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -6
  echo "# perf report --no-children --sort comm,sym (top 16)"
  perf report -i "/tmp/i47_$name.perf" --no-children --sort comm,sym 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -16 | cut -c1-150
}

echo
echo "# part 1: run to completion against the inline loop, batch 32, 1000 QPs"
profile rtc --only=cqd_rtc:32:1000:1
profile limit --only=limit:32:1000:1
echo
echo "# part 2: 10^5 QPs in random order, the handoff against the inline loop"
profile cqd_1e5 --random-order --only=cqd:32:100000:1
profile limit_1e5 --random-order --only=limit:32:100000:1
echo "# $(date -u +%FT%TZ) done"
