#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# stop41_modehunt.sh's loop with pg (4fe2b0c plus the lane rings allocated page-aligned, built at the
# terminal before 8dcc5ec) in place of fix, and in fast groups pg and new as well; wrote
# docs/runs/stop41_pagering_amd.txt (killed by hand after try 36). Usage: stop41_pagering.sh TRIES
# (binaries /tmp/dispatch_{base,da8,pg,new}).
run() { /tmp/dispatch_$1 --random-order --seconds=0.5 --only=$2 2>&1 | grep -oE '[0-9.]+ M comp' | cut -d' ' -f1; }
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); stop41_modehunt.sh's loop with pg = 4fe2b0c plus the lane rings allocated page-aligned (aligned_alloc), in place of fix"
for t in $(seq 1 "$1"); do
  m=$(run new mutex:32:1000:1)
  if awk -v m="$m" 'BEGIN {exit !(m < 100)}'; then
    order="base da8 pg new"; [[ $((t % 2)) == 0 ]] && order="new pg da8 base"
    line="try $t $(date -u +%T) mutex $m (slow)"
    for b in $order; do line="$line $b $(run $b cqd:32:1000:1)"; done
    echo "$line mutex-after $(run new mutex:32:1000:1)"
  else
    echo "try $t $(date -u +%T) mutex $m (fast) pg $(run pg cqd:32:1000:1) new $(run new cqd:32:1000:1)"
    sleep 3
  fi
done
