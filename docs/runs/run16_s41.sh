#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Run as OUT=DIR run16_s41.sh from a folder holding dispatch, dispatch_base, soak, soak_chaos, soak16.sh and their libraries with ld-linux-x86-64.so.2.
# One lent-machine call (stop 41): scaling at head, busy latency, a base/new A/B, soaks beside load.
D=$(cd "$(dirname "$0")" && pwd)
L="$D/ld-linux-x86-64.so.2 --library-path $D"
t0=$(date +%s); el() { echo "$1 after $(( $(date +%s) - t0 )) s"; }
date -u; nproc; grep -m1 "model name" /proc/cpuinfo
timeout 170 $L $D/dispatch --seconds=0.3 --scaling=3 > $OUT/scaling.txt 2>&1; el "scaling exit $?"
{ echo "# for r in 1..5: dispatch --latency-only, $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ)"
  for r in 1 2 3 4 5; do echo "== round $r"; timeout 40 $L $D/dispatch --latency-only 2>&1 | grep -E "p50"; done; } > $OUT/latency.txt; el latency
{ echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  for r in 1 2 3; do
  for row in "new limit2:32:1000:1" "new limit:32:1000:1" "new mutex:32:1000:1" "new cqd:32:1000:1" "base cqd:32:1000:1" \
             "new cqd_rtc:32:1000:1" "base cqd_rtc:32:1000:1" "base cqd_rtc:32:1:1" "new cqd_rtc:32:1:1" "new limit:32:1:1"; do
    set -- $row; b=$D/dispatch; [[ $1 == base ]] && b=$D/dispatch_base
    echo "round $r $1 $(timeout 30 $L $b --random-order --seconds=0.4 --only=$2 2>&1 | grep 'M completions' | tail -1)"
  done; done; } > $OUT/ab.txt; el ab
SEED_BASE=400 timeout 230 bash $D/soak16.sh 100 > $OUT/verdicts.txt 2>&1; el "soak16 exit $?"; cat $OUT/verdicts.txt
for row in "new limit:32:100000:1" "new cqd_rtc:32:100000:1" "base cqd_rtc:32:100000:1"; do
  set -- $row; b=$D/dispatch; [[ $1 == base ]] && b=$D/dispatch_base
  echo "round 1 $1 $(timeout 40 $L $b --random-order --seconds=0.4 --only=$2 2>&1 | grep 'M completions' | tail -1)" >> $OUT/ab.txt
done; el big
ls $OUT
