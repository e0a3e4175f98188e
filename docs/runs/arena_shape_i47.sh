#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Issue 47 item 7: the arena shape (queue and spill of 1, arena consumers, an engine-driven shard,
# split CQs, 1000 QPs) for each seed, alternating ArenaConsumersOptions::linger at its default and
# at 0, with SOAK (a soak binary: bazel build -c opt //tools:soak). BUSY=2 (the default) starts two
# busy loops for the whole run; BUSY=0 starts none (the machine is loaded already: say by what).
#   docs/runs/arena_shape_i47.sh /tmp/soak 2 7 11 > docs/runs/arena_shape_i47.txt 2>&1
set -u
soak=$1
shift
busy=${BUSY:-2}
pids=()
for ((k = 0; k < busy; ++k)); do
  (while :; do :; done) &
  pids+=($!)
done
echo "# $(date -u +%FT%TZ) nproc $(nproc), $busy busy loops started by this script; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for seed in "$@"; do
  for linger in default 0; do
    flag=()
    [[ $linger == default ]] || flag=(--arena_linger_us="$linger")
    echo "=== seed $seed linger $linger $(date -u +%T): $soak --seconds=25 --queue_capacity=1 --spill_capacity=1 --arena=1 --engine_shard=1 --split_every=3 --qps=1000 --seed=$seed --progress=0 ${flag[*]}"
    "$soak" --seconds=25 --queue_capacity=1 --spill_capacity=1 --arena=1 --engine_shard=1 \
      --split_every=3 --qps=1000 --seed="$seed" --progress=0 "${flag[@]}" 2>&1 |
      grep -E '^soak:|^  (lost|duplicated|completions injected|delivered|orphans of live|arena drain|backpressure|consumer )|STUCK|still'
  done
done
((${#pids[@]} > 0)) && kill "${pids[@]}"
echo "# end $(date -u +%FT%TZ)"
