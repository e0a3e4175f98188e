#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# //tests:reactor_two_hosts_test under ASan, RUNS times, beside two busy loops this script starts
# (BUSY=0: none, the machine is loaded already), printing each run's result line and every
# AddressSanitizer report's first frames.
#   docs/runs/reactor_asan_busy.sh 4 > /tmp/reactor_asan_busy.txt 2>&1
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
runs=${1:-4}
pids=()
for ((k = 0; k < ${BUSY:-2}; ++k)); do
  (while :; do :; done) &
  pids+=($!)
done
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' plus uncommitted changes'), ${#pids[@]} busy loops, $runs runs"
bazel test --config=asan --runs_per_test="$runs" --test_output=errors //tests:reactor_two_hosts_test 2>&1 |
  grep -E "AddressSanitizer|^\[server\]     #[0-9] |result [0-9]|reactor_two_hosts_test .*(PASSED|FAILED)"
logs=$(bazel info --config=asan bazel-testlogs 2>/dev/null)/tests/reactor_two_hosts_test
for ((r = 1; r <= runs; ++r)); do
  echo "run $r: $(grep -h 'run_two_vms: .*result' "$logs/run_${r}_of_$runs/test.log" 2>/dev/null || echo 'no log')"
done
((${#pids[@]} > 0)) && kill "${pids[@]}"
echo "# end $(date -u +%FT%TZ)"
