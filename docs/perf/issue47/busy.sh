#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The busy-poll handoff's p50 moves about twofold from run to run of one binary in the slow mode
# (drain.txt): is it the address-space layout, or the notify fd's system calls? The harness's
# --busy-latency-only (cqd_busy_poll, where this thread spins on Runtime::Drain of an
# engine-driven consumer, and the spin floor; 20000 samples each) with the four binaries of
# drain.sh (head; wait: drain_wait.patch; end: spin_on_end.patch; both), each with the kernel's
# address-space randomization as it is, and head also under `setarch -R` (none: every run gets
# the same layout), ROUNDS rounds in one sitting, the order rotated each round; each run under
# `perf stat`, counting the process's write and read system calls. Every row carries the
# cross-core probe taken around it, so that each mode can be read apart. Run on a quiet machine
# with a clean runtime/ (CPUs 0 and 1 pinned):
#   docs/perf/issue47/busy.sh 10 > docs/perf/issue47/busy.txt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: busy.sh ROUNDS}
dir=docs/perf/issue47
git diff --quiet -- runtime || { echo "busy.sh: runtime/ has changes" >&2; exit 1; }
build() {  # NAME [PATCH...]
  local name=$1 p
  shift
  for p in "$@"; do git apply "$dir/$p"; done
  bazel build -c opt //benchmarks:dispatch >&2
  cp -f bazel-bin/benchmarks/dispatch "/tmp/cqd-busy-$name"
  git checkout -q -- runtime
}
build head
build wait drain_wait.patch
build end spin_on_end.patch
build both drain_wait.patch spin_on_end.patch
echo "# docs/perf/issue47/busy.sh $rounds"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
runs=(head head_norand wait end both)
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2 3 4; do
    run=${runs[$(((k + r - 1) % 5))]}
    prefix=()
    binary=/tmp/cqd-busy-$run
    if [[ $run == head_norand ]]; then
      prefix=(setarch -R)
      binary=/tmp/cqd-busy-head
    fi
    perf stat -x, -e syscalls:sys_enter_write,syscalls:sys_enter_read -o /tmp/cqd-busy-perf -- \
      "${prefix[@]}" "$binary" --busy-latency-only 2>/dev/null | sed "s/^/round $r $run /"
    awk -F, -v r="$r" -v n="$run" '/sys_enter/ {print "round " r " " n " syscalls " $3 " " $1}' \
      /tmp/cqd-busy-perf
  done
done
echo "# $(date -u +%FT%TZ) done"
