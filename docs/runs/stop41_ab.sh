#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Alternating rounds, one process per row, random QP order, batch 32, one consumer, 0.5 s a row:
# base = f757cec (the data path before the fused pass), new = this stop's final code; the
# baselines from the new binary: handlers (the consumer's floor), limit (the inline loop), limit2,
# mutex; 1000 QPs, one QP and 10^5 QPs (new only: base's retiring of 10^5 QPs takes about 40 s);
# then one round of dispatch --latency-only (busy poll -> handler p50 against the spin floor).
# Usage: stop41_ab.sh ROUNDS (binaries /tmp/dispatch_base and /tmp/dispatch_new).
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# dispatch_base: bazel build -c opt //benchmarks:dispatch at f757cec; dispatch_new: the same at $(git rev-parse --short HEAD)"
for r in $(seq 1 "$1"); do
  for row in "new limit2:32:1000:1" "new handlers:32:1000:1" "new limit:32:1000:1" "new mutex:32:1000:1" \
             "new cqd:32:1000:1" "base cqd:32:1000:1" "new cqd_rtc:32:1000:1" "base cqd_rtc:32:1000:1" \
             "base cqd_rtc:32:1:1" "new cqd_rtc:32:1:1" "new limit:32:1:1" \
             "new limit:32:100000:1" "new cqd_rtc:32:100000:1" "new cqd:32:100000:1"; do
    set -- $row
    echo "round $r $1 $(/tmp/dispatch_$1 --random-order --seconds=0.5 --only=$2 2>&1 | grep 'M completions' | tail -1)"
  done
  echo "round $r latency (new)"; /tmp/dispatch_new --latency-only 2>&1 | grep -E "p50"
done
