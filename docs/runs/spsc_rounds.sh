#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Alternating rounds, one process per row: base = 348b569 (lanes handed over through moodycamel
# items), spsc = 29cbfda (lanes handed over by position). Rows at batch 32, one consumer.
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# dispatch_base: bazel build -c opt //benchmarks:dispatch at 348b569; dispatch_spsc: the same at 29cbfda"
for r in $(seq 1 $1); do
  for row in "spsc cqd:32:1000:1" "base cqd:32:1000:1" "spsc mutex:32:1000:1" "spsc limit2:32:1000:1" \
             "spsc cqd:32:1:1" "base cqd:32:1:1" "spsc cqd_rtc:32:1000:1" "base cqd_rtc:32:1000:1"; do
    set -- $row
    echo "round $r $1 $(/tmp/dispatch_$1 --only=$2 2>&1 | grep 'M completions' | tail -1)"
  done
done
