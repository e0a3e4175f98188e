#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Ten soaks side by side with two busy loops (docs/runs/soak16_*.txt), for a lent 16-CPU machine
# without this project's libraries: run from a folder holding soak (bazel build -c opt
# //tools:soak), soak_chaos (bazel build --config=chaos //tools:soak), the Debian libraries they
# link and ld-linux-x86-64.so.2. About 90 runnable threads on 16 CPUs, so every thread of every
# soak is preempted at random points. Usage: OUT=DIR soak16.sh [seconds of injection]
# (each soak's log goes to DIR/soak_N.txt and all of them to DIR/all.txt; the verdicts to stdout).
# SEED_BASE=B seeds soak N with B + N (default 100).
D=$(cd "$(dirname "$0")" && pwd)
secs=${1:-240}
# mode queue spill teardown_permille teardown_timeout_ms split srq engine arena qps churn tag_bits
rows=(
  "opt 1 1 500 20 2 0 1 0 96 5 15"
  "opt 1 1 500 20 2 0 1 0 96 5 2"
  "chaos 1 1 500 20 2 0 1 0 96 5 15"
  "chaos 2 1 500 20 1 0 0 0 96 5 3"
  "opt 1 1 1000 5 1 3 0 0 96 5 15"
  "opt 1 1 500 5000 3 4 1 1 1000 5 15"
  "chaos 64 8 700 20 2 5 0 1 300 5 15"
  "opt 16 1 500 1000 2 2 1 0 200 5 2"
  "opt 8192 4096 500 0 2 0 1 0 96 5 1"
  "chaos 1 1 1000 20 2 0 1 0 96 1 15"
)
hogs=()
for _ in 1 2; do (while :; do :; done) & hogs+=($!); done
pids=()
n=0
for row in "${rows[@]}"; do
  n=$((n + 1))
  read -r mode queue spill td td_timeout split srq engine arena qps churn tag_bits <<<"$row"
  bin=$D/soak
  [[ $mode == chaos ]] && bin=$D/soak_chaos
  seed=$((${SEED_BASE:-100} + n))
  args=(--completions=2e9 --seconds="$secs" --queue_capacity="$queue" --spill_capacity="$spill"
        --teardown_permille="$td" --teardown_timeout_ms="$td_timeout" --split_every="$split"
        --srq_every="$srq" --engine_shard="$engine" --arena="$arena" --qps="$qps"
        --churn_ms="$churn" --fault_ms=5 --tag_bits="$tag_bits" --drain_timeout=150
        --seed="$seed" --progress=0)
  {
    echo "\$ $([[ $mode == chaos ]] && echo "CQD_CHAOS_SEED=$seed ")soak ${args[*]}   # $mode build, beside 9 other soaks and 2 busy loops on $(nproc) CPUs"
    CQD_CHAOS_SEED=$seed timeout --kill-after=30 $((secs + 200)) "$D/ld-linux-x86-64.so.2" \
      --library-path "$D" "$bin" "${args[@]}" 2>&1
    echo "exit=$?"
  } >"$OUT/soak_$n.txt" &
  pids+=($!)
done
wait "${pids[@]}"
kill "${hogs[@]}" 2>/dev/null
for i in $(seq 1 $n); do
  echo "soak $i: $(grep -m1 -oE '^soak: (PASS|FAIL)' "$OUT/soak_$i.txt") $(grep -m1 '^exit=' "$OUT/soak_$i.txt")" \
    "injected $(grep -m1 -E '^  completions injected' "$OUT/soak_$i.txt" | awk '{print $3}')" \
    "lost $(grep -m1 -E '^  lost ' "$OUT/soak_$i.txt" | awk '{print $2}')" \
    "consumer0 $(grep -m1 -E '^  consumer (owned0|rtc0)' "$OUT/soak_$i.txt" | awk '{print $4}' | tr -d ,)"
done
for i in $(seq 1 $n); do echo "== soak $i"; cat "$OUT/soak_$i.txt"; done >"$OUT/all.txt"
rm -f "$OUT"/soak_*.txt
