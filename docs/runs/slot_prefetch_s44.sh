#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The consumer's slot prefetch, side by side: ROUNDS rounds of the handoff at batch 32 with 1000
# QPs in order and with 100000 QPs in random order, from each binary given (label=path), the
# order of the binaries rotating each round. Each line ends with the cross-core probe ("xcore
# B/A ns": both under 150 is the fast mode, both at or over it the slow one).
# Usage: docs/runs/slot_prefetch_s44.sh ROUNDS LABEL=BINARY... (on a quiet machine)
set -euo pipefail
rounds=${1:?usage: slot_prefetch_s44.sh ROUNDS LABEL=BINARY...}
shift
bins=("$@")
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); ${bins[*]}"
for r in $(seq 1 "$rounds"); do
  n=${#bins[@]}
  for k in $(seq 0 $((n - 1))); do
    entry=${bins[$(((k + r) % n))]}
    label=${entry%%=*}
    bin=${entry#*=}
    echo "round $r $label $("$bin" --seconds=0.5 --only=cqd:32:1000:1 2>&1 | grep -v '^\[')"
    echo "round $r $label $("$bin" --seconds=0.5 --random-order --only=cqd:32:100000:1 2>&1 |
      grep -v '^\[')"
  done
done
echo "# $(date -u +%FT%TZ) done"
