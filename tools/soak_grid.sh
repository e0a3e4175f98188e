#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Runs the soak tool across a grid of its options and writes the table to docs/runs/soak_grid.md
# (one row per run, with every figure read from that run's log, kept beside it in
# docs/runs/soak_grid/). Usage: tools/soak_grid.sh [seconds per run, default 20]
#
# The grid varies what together broke the soak before (queue and spill from 1 to the defaults,
# the share of drained teardowns, the fault rate, consumer pauses, split CQs, churn and error
# rates); every row must show zero lost, duplicated and out of order. Exits non-zero if any row
# failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-20}
out=docs/runs/soak_grid
mkdir -p "$out"
bazel build -c opt //tools:soak || exit 1
soak="$(bazel info -c opt bazel-bin 2>/dev/null)/tools/soak"

# queue spill teardown_permille teardown_timeout_ms(0: 5000+pause) fault_ms pause_every pause_ms split_every
# churn_ms error_permille qps seed
grid=(
  "1 1 1000 0 5 1 300 2 1 200 300 7"
  "4 2 1000 0 5 1 300 2 1 200 300 7"
  "4 2 1000 0 5 1 300 2 1 200 300 424242"
  "1 1 500 0 0 0 0 0 1 10 96 1"
  "2 1 1000 0 10 1 300 0 2 10 96 2"
  "64 8 500 0 5 2 500 4 5 10 96 3"
  "64 64 1000 0 0 1 300 2 1 50 200 4"
  "1024 256 0 0 5 1 300 2 1 100 300 5"
  "8192 4096 500 0 10 4 1500 4 5 10 96 6"
  "8192 4096 1000 0 1 1 300 2 1 200 300 8"
  "16 1 1000 0 2 0 0 2 1 200 300 9"
  "1 4096 1000 0 5 1 300 1 1 10 200 10"
  "1 1 1000 20 5 1 300 2 1 200 300 11"
  "4 2 1000 5 5 1 300 2 1 200 300 12"
  "64 8 1000 20 0 1 300 0 1 10 96 13"
  "8192 4096 1000 50 10 1 300 2 1 100 300 14"
)

# Prints the number after `label` on the summary line that starts with it.
field() { grep -m1 -E "^  $1 " "$2" | sed -E "s/^  $1 +([0-9]+).*/\1/"; }

table="$out/../soak_grid.md"
{
  echo "# Soak grid"
  echo
  echo "Written by \`tools/soak_grid.sh $seconds\` on $(date -u +%Y-%m-%d) ($(nproc) cores); each run injects"
  echo "for $seconds s (\`--seconds=$seconds --completions=2e9\`), then waits for every completion to be"
  echo "delivered or orphaned. Logs: \`docs/runs/soak_grid/run_N.txt\`. Teardowns: drained OK / ended at"
  echo "the deadline (their leftovers orphaned) / failed (refused, or any other result)."
  echo
  echo "| run | queue | spill | teardown permille | teardown timeout ms | fault ms | pause | split every | churn ms | error permille | QPs | seed | completions | lost | duplicated | out of order | orphans | teardowns OK / deadline / failed | handler waits (refused) | verdict |"
  echo "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |"
} >"$table"

status=0
n=0
for row in "${grid[@]}"; do
  n=$((n + 1))
  read -r queue spill td td_timeout fault pause_every pause_ms split churn errors qps seed <<<"$row"
  log="$out/run_$n.txt"
  args=(--completions=2e9 --seconds="$seconds" --queue_capacity="$queue" --spill_capacity="$spill"
        --teardown_permille="$td" --teardown_timeout_ms="$td_timeout" --fault_ms="$fault" --pause_every="$pause_every"
        --pause_ms="$pause_ms" --split_every="$split" --churn_ms="$churn"
        --error_permille="$errors" --qps="$qps" --seed="$seed" --progress=0)
  echo "== run $n: soak ${args[*]}"
  { echo "\$ bazel run -c opt //tools:soak -- ${args[*]}"; "$soak" "${args[@]}" 2>&1; } >"$log"
  rc=$?
  verdict=$(grep -m1 -oE '^soak: (PASS|FAIL)' "$log" | cut -d' ' -f2)
  [[ $rc -eq 0 && $verdict == PASS ]] || { verdict="FAIL (exit $rc)"; status=1; }
  injected=$(field "completions injected" "$log")
  lost=$(field "lost" "$log")
  dup=$(field "duplicated" "$log")
  ooo=$(field "out of order" "$log")
  orphans=$(field "orphans" "$log")
  tdline=$(grep -m1 -E '^  drained teardowns ' "$log")
  td_ok=$(sed -E 's/^  drained teardowns +([0-9]+).*/\1/' <<<"$tdline")
  td_deadline=$(grep -oE 'ended at the deadline [0-9]+' <<<"$tdline" | grep -oE '[0-9]+$')
  td_failed=$(grep -oE 'failed [0-9]+' <<<"$tdline" | grep -oE '[0-9]+$')
  wline=$(grep -m1 -E '^  waits from handlers ' "$log")
  waits=$(sed -E 's/^  waits from handlers +([0-9]+).*/\1/' <<<"$wline")
  refused=$(grep -oE 'refused [0-9]+' <<<"$wline" | grep -oE '[0-9]+$')
  timeout_text=$td_timeout
  [[ $td_timeout == 0 ]] && timeout_text="5000 + pause"
  pause="none"
  [[ $pause_every != 0 ]] && pause="${pause_ms} ms every ${pause_every} s"
  echo "| $n | $queue | $spill | $td | $timeout_text | $fault | $pause | $split | $churn | $errors | $qps | $seed | $injected | $lost | $dup | $ooo | $orphans | $td_ok / $td_deadline / $td_failed | $waits ($refused) | $verdict |" >>"$table"
  echo "   $verdict: injected $injected, lost $lost, duplicated $dup, out of order $ooo"
done
echo "soak_grid: table in $table"
exit $status
