#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Waits for the machine's slow cross-core mode (the mutex pipeline, 1000 QPs, under 100 M/s) and
# then runs the handoff (cqd, 1000 QPs, random order, batch 32, 0.5 s) of four binaries in
# alternating order: base = f757cec, da8 = da8ef62 (the last stop's final code), fix = 1439df5,
# new = this stop's final code. Fast-mode markers are logged too. Usage: stop41_modehunt.sh TRIES
# (binaries /tmp/dispatch_{base,da8,fix,new}).
run() { /tmp/dispatch_$1 --random-order --seconds=0.5 --only=$2 2>&1 | grep -oE '[0-9.]+ M comp' | cut -d' ' -f1; }
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); new = $(git rev-parse --short HEAD)"
for t in $(seq 1 "$1"); do
  m=$(run new mutex:32:1000:1)
  if awk -v m="$m" 'BEGIN {exit !(m < 100)}'; then
    order="base da8 fix new"; [[ $((t % 2)) == 0 ]] && order="new fix da8 base"
    line="try $t $(date -u +%T) mutex $m (slow)"
    for b in $order; do line="$line $b $(run $b cqd:32:1000:1)"; done
    echo "$line mutex-after $(run new mutex:32:1000:1)"
  else
    echo "try $t $(date -u +%T) mutex $m (fast)"
    sleep 5
  fi
done
