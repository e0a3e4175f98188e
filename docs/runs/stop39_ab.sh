#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Alternating rounds, one process per row, random QP order, batch 32, one consumer, 0.5 s a row:
# base = 7ae4078 (the last stop's data path), new = this stop's (the batch's slots listed entry by
# entry, delivered completions counted once a piece), and the baselines from the new binary:
# handlers (the consumer's floor: the handlers called over the pattern, nothing polled or handed
# over), limit (the inline loop), limit2, mutex. Usage: stop39_ab.sh ROUNDS (binaries in /tmp).
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# dispatch_base: bazel build -c opt //benchmarks:dispatch at 7ae4078; dispatch_new: the same at $(git rev-parse --short HEAD)"
for r in $(seq 1 "$1"); do
  for row in "new limit2:32:1000:1" "new handlers:32:1000:1" "new limit:32:1000:1" "new mutex:32:1000:1" \
             "new cqd:32:1000:1" "base cqd:32:1000:1" "new cqd_rtc:32:1000:1" "base cqd_rtc:32:1000:1" \
             "base cqd:32:1:1" "new cqd:32:1:1" "base cqd_rtc:32:1:1" "new cqd_rtc:32:1:1" \
             "new limit:32:1:1"; do
    set -- $row
    echo "round $r $1 $(/tmp/dispatch_$1 --random-order --seconds=0.5 --only=$2 2>&1 | grep 'M completions' | tail -1)"
  done
done
