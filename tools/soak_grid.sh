#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Runs the soak tool across a grid of its options, each row three ways, and writes the table to
# docs/runs/soak_grid.md (one row per run, every figure read from that run's log; the logs are
# kept packed beside it in docs/runs/soak_grid.tar.xz, members soak_grid/run_N_MODE.txt:
# `tar -xJf docs/runs/soak_grid.tar.xz -C docs/runs` unpacks them where the table names them).
# Usage: tools/soak_grid.sh [seconds per run, default 15]
#
# The three ways: quiet (the optimised build, nothing else running), chaos (the chaos build,
# --config=chaos: seeded pauses at the runtime's synchronization points; the seed is the row's)
# and hog (the optimised build beside two busy loops that keep both cores of this machine busy).
# The rows go to the edges of the options that together broke the soak before: queue and spill
# from 1, teardown deadlines from 5 ms to 5 s, split and shared CQs, SRQ QPs, engine-driven
# shards and arena consumers, churn through plain Unregister and through teardowns, consumer
# pauses, incarnation tags narrow enough to wrap. Every run must show zero lost, duplicated, out
# of order and wrong-QP deliveries (the soak's PASS). Exits non-zero if any run failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-15}
out=docs/runs/soak_grid
rm -rf "$out"
mkdir -p "$out"
bazel build -c opt //tools:soak || exit 1
bazel build --config=chaos //tools:soak || exit 1
quiet_soak="$(bazel info -c opt bazel-bin 2>/dev/null)/tools/soak"
chaos_soak="$(bazel info --config=chaos bazel-bin 2>/dev/null)/tools/soak"

# queue spill teardown_permille teardown_timeout_ms(0: 5000+pause) split_every srq_every
# engine_shard arena qps churn_ms pause_every seed tag_bits
grid=(
  "1 1 500 50 2 0 1 0 96 5 4 1 15"
  "2 1 500 20 1 0 0 0 96 5 4 2 15"
  "1 2 500 200 3 0 0 0 96 5 4 3 15"
  "8192 4096 500 0 4 0 0 0 96 5 4 4 15"
  "1 1 1000 5 1 3 0 0 96 5 4 5 2"
  "1 1 0 0 2 0 1 0 96 2 4 6 15"
  "1 1 500 5000 3 4 1 1 1000 5 0 7 15"
  "64 8 700 20 2 5 0 1 300 5 0 8 15"
  "4 2 500 5 0 0 0 0 96 1 4 9 15"
  "16 1 500 1000 2 2 1 0 200 5 2 10 15"
  "1 1 500 20 2 0 1 0 96 5 4 11 2"
)

# Prints the number after `label` on the summary line that starts with it.
field() { grep -m1 -E "^  $1 " "$2" | sed -E "s/^  $1 +([0-9]+).*/\1/"; }

hog_pids=()
start_hog() { for _ in 1 2; do (while :; do :; done) & hog_pids+=($!); done; }
stop_hog() { kill "${hog_pids[@]}" 2>/dev/null; wait "${hog_pids[@]}" 2>/dev/null; hog_pids=(); }
trap stop_hog EXIT

table="$out/../soak_grid.md"
{
  echo "# Soak grid"
  echo
  echo "Written by \`tools/soak_grid.sh $seconds\` on $(date -u +%Y-%m-%d) at $(git rev-parse --short HEAD) ($(nproc) cores);"
  echo "each run injects for $seconds s (\`--seconds=$seconds --completions=2e9\`), then waits for every"
  echo "completion to be delivered or orphaned. Each row runs three ways: *quiet* (\`-c opt\`, nothing else"
  echo "running), *chaos* (\`--config=chaos\`, \`CQD_CHAOS_SEED\` = the row's seed) and *hog* (\`-c opt\` beside two"
  echo "busy loops that keep both cores busy). Logs: \`docs/runs/soak_grid/run_N_MODE.txt\` in \`docs/runs/soak_grid.tar.xz\`. Teardowns: drained"
  echo "OK / ended at the deadline (what they left fenced and orphaned) / failed. Refused: RegisterQp"
  echo "answered UNAVAILABLE (a retired QP's number still fenced in a held-back CQ) and was retried."
  echo "Consumer 0 is the runtime-owned thread, or, with the engine shard, the run-to-completion"
  echo "consumer on it (its figure shows that the row reached it). Tag bits: the wr_id bits naming a"
  echo "QP incarnation in the tool's books (2 makes them wrap every four incarnations of a qp_num)."
  echo
  echo "| run | mode | queue | spill | teardown permille | deadline ms | split every | SRQ every | engine shard | arena | QPs | churn ms | pause every s | seed | tag bits | completions | consumer 0 delivered | lost | duplicated | out of order | wrong QP | orphans | teardowns OK / deadline / failed | registrations refused | verdict |"
  echo "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"
} >"$table"

status=0
n=0
for row in "${grid[@]}"; do
  n=$((n + 1))
  read -r queue spill td td_timeout split srq engine arena qps churn pause_every seed tag_bits \
    <<<"$row"
  args=(--completions=2e9 --seconds="$seconds" --queue_capacity="$queue" --spill_capacity="$spill"
        --teardown_permille="$td" --teardown_timeout_ms="$td_timeout" --split_every="$split"
        --srq_every="$srq" --engine_shard="$engine" --arena="$arena" --qps="$qps"
        --churn_ms="$churn" --pause_every="$pause_every" --seed="$seed" --tag_bits="$tag_bits"
        --progress=0)
  for mode in quiet chaos hog; do
    log="$out/run_${n}_$mode.txt"
    soak=$quiet_soak
    env_prefix=""
    [[ $mode == chaos ]] && soak=$chaos_soak && env_prefix="CQD_CHAOS_SEED=$seed "
    [[ $mode == hog ]] && start_hog
    echo "== run $n ($mode): soak ${args[*]}"
    {
      echo "\$ ${env_prefix}bazel run $([[ $mode == chaos ]] && echo --config=chaos || echo -c opt) //tools:soak -- ${args[*]}$([[ $mode == hog ]] && echo "   # beside 2 busy loops")"
      CQD_CHAOS_SEED=$seed "$soak" "${args[@]}" 2>&1
    } >"$log"
    rc=$?
    [[ $mode == hog ]] && stop_hog
    verdict=$(grep -m1 -oE '^soak: (PASS|FAIL)' "$log" | cut -d' ' -f2)
    [[ $rc -eq 0 && $verdict == PASS ]] || { verdict="FAIL (exit $rc)"; status=1; }
    injected=$(field "completions injected" "$log")
    lost=$(field "lost" "$log")
    dup=$(field "duplicated" "$log")
    ooo=$(field "out of order" "$log")
    wrong=$(field "wrong-QP deliveries" "$log")
    orphans=$(field "orphans" "$log")
    refused=$(field "registrations refused" "$log")
    # Consumer 0's line (the owned thread, or run to completion on the engine-driven shard).
    c0=$(grep -m1 -E '^  consumer (owned0|rtc0-shard1) ' "$log" | sed -E 's/.* delivered +([0-9]+).*/\1/')
    tdline=$(grep -m1 -E '^  drained teardowns ' "$log")
    td_ok=$(sed -E 's/^  drained teardowns +([0-9]+).*/\1/' <<<"$tdline")
    td_deadline=$(grep -oE 'ended at the deadline [0-9]+' <<<"$tdline" | grep -oE '[0-9]+$')
    td_failed=$(grep -oE 'failed [0-9]+' <<<"$tdline" | grep -oE '[0-9]+$')
    timeout_text=$td_timeout
    [[ $td_timeout == 0 ]] && timeout_text="5000 + pause"
    echo "| $n | $mode | $queue | $spill | $td | $timeout_text | $split | $srq | $engine | $arena | $qps | $churn | $pause_every | $seed | $tag_bits | $injected | $c0 | $lost | $dup | $ooo | $wrong | $orphans | $td_ok / $td_deadline / $td_failed | $refused | $verdict |" >>"$table"
    echo "   $verdict: injected $injected, lost $lost, duplicated $dup, out of order $ooo, wrong QP $wrong"
  done
done
tar -cJf docs/runs/soak_grid.tar.xz -C docs/runs soak_grid && rm -rf "$out"
echo "soak_grid: table in $table, logs in docs/runs/soak_grid.tar.xz"
exit $status
