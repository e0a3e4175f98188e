#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# bazel run -c opt //benchmarks:rxe [-- SIZE ITERS STREAM_COUNT RUNS GAP_US]: boots the rxe VM once,
# runs perftest and cqd's rxe_bench in it RUNS times (benchmarks/rxe.sh); writes
# docs/perf/rxe.json.
# bazel run -c opt //benchmarks:rxe_floor [-- SIZE ITERS RUNS]: the same VM, benchmarks/rxe_floor.sh
# (ib_send_lat against rxe_bench's ping-pong with and without cqd); writes docs/perf/rxe_floor.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
runfiles=${RUNFILES_DIR:-$0.runfiles}/cqd
bench=$runfiles/benchmarks/rxe_bench
script=$runfiles/benchmarks/rxe.sh
result=rxe.json
if [[ ${1:-} == --floor ]]; then
  shift
  script=$runfiles/benchmarks/rxe_floor.sh
  result=rxe_floor.txt
fi
runner=$runfiles/tools/vm/run_in_vm.sh
out=${BUILD_WORKSPACE_DIRECTORY:-$here}/docs/perf
mkdir -p "$out"
exec "$runner" --timeout 900 --with "$bench" --with "$(command -v ib_send_lat)" \
  --with "$(command -v ib_send_bw)" --fetch "/work/$result:$out/$result" "$script" "$@"
