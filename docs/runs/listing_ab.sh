#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Alternating rounds, one process per row, random QP order, batch 32, one consumer:
# base = 7ae4078 (a batch's slots listed by stepping run by run), list = the listing by entry with
# a predicted branch over long runs. Usage: listing_ab.sh ROUNDS (binaries in /tmp/dispatch_*).
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# dispatch_base: bazel build -c opt //benchmarks:dispatch at 7ae4078; dispatch_list: the same with the new listing"
for r in $(seq 1 "$1"); do
  for row in "list limit2:32:1000:1" "list limit:32:1000:1" "list mutex:32:1000:1" \
             "list cqd:32:1000:1" "base cqd:32:1000:1" "list cqd_rtc:32:1000:1" "base cqd_rtc:32:1000:1" \
             "base cqd:32:1:1" "list cqd:32:1:1" "base cqd_rtc:32:1:1" "list cqd_rtc:32:1:1"; do
    set -- $row
    echo "round $r $1 $(/tmp/dispatch_$1 --random-order --seconds=0.5 --only=$2 2>&1 | grep 'M completions' | tail -1)"
  done
done
