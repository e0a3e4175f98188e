#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The handoff (cqd, 1000 QPs, random order, batch 32, 0.5 s) of three binaries in alternating
# order, each group led by the mutex pipeline as the marker of the machine's cross-core mode:
# base = f757cec, fix = 1439df5 (the fence and teardown fixes), new = this stop's final code.
# Usage: stop41_pairs.sh GROUPS (binaries /tmp/dispatch_{base,fix,new}).
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); new = $(git rev-parse --short HEAD)"
for g in $(seq 1 "$1"); do
  line="group $g mutex $(/tmp/dispatch_new --random-order --seconds=0.5 --only=mutex:32:1000:1 2>&1 | grep -oE '[0-9.]+ M comp' | cut -d' ' -f1)"
  order="base fix new"; [[ $((g % 2)) == 0 ]] && order="new fix base"
  for b in $order; do
    line="$line $b $(/tmp/dispatch_$b --random-order --seconds=0.5 --only=cqd:32:1000:1 2>&1 | grep -oE '[0-9.]+ M comp' | cut -d' ' -f1)"
  done
  echo "$line"
done
