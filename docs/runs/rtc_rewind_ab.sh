#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Run to completion before and after the lane rewind (docs/runs/rtc_rewind_amd.txt): two dispatch
# builds alternating, one process per row, ROUNDS rounds (default 5), with the inline loop beside
# them. Usage: rtc_rewind_ab.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]
before=$1 after=$2 rounds=${3:-5}
run() { "$1" --seconds=1.5 --only="$2" 2>&1 | grep -v '^#' | tail -1; }
for r in $(seq "$rounds"); do
  echo "== round $r $(date -u +%T)"
  for spec in cqd_rtc:32:1000:1 cqd_rtc:32:1:1; do
    echo "before $(run "$before" "$spec")"
    echo "after $(run "$after" "$spec")"
  done
  echo "before $(run "$before" limit:32:1000:1)"
  echo "before $(run "$before" limit:32:1:1)"
done
