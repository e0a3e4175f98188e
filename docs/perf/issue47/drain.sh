#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Does an engine-driven consumer's busy-poll handoff (the harness's cqd_busy_poll row: this thread
# spins on Runtime::Drain) pay system calls while a hand-over is in flight? Four binaries of the
# dispatch harness, built in turn from this tree: `head`; `wait`, with drain_wait.patch (a Drain
# that found nothing while depth is reserved looks again for up to 2 us before it makes the notify
# fd readable); `end`, with spin_on_end.patch (Dispatch waits on the lanes' published ends and the
# queued items' count, not on the depth line); `both`, with the two. ROUNDS rounds in one sitting,
# the order rotated each round; each run is `--latency-only` under `perf stat`, counting the
# process's write and read system calls (the notify fd's writes and reads; 20000 samples a row).
# Every row carries the cross-core probe taken around it, so that each mode can be read apart.
# Run on a quiet machine with a clean tree (CPUs 0 and 1 pinned):
#   docs/perf/issue47/drain.sh 4 > docs/perf/issue47/drain.txt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
rounds=${1:?usage: drain.sh ROUNDS}
dir=docs/perf/issue47
git diff --quiet -- runtime || { echo "drain.sh: runtime/ has changes" >&2; exit 1; }
build() {  # NAME [PATCH...]
  local name=$1 p
  shift
  for p in "$@"; do git apply "$dir/$p"; done
  bazel build -c opt //benchmarks:dispatch >&2
  cp -f bazel-bin/benchmarks/dispatch "/tmp/cqd-drain-$name"
  git checkout -q -- runtime
}
build head
build wait drain_wait.patch
build end spin_on_end.patch
build both drain_wait.patch spin_on_end.patch
echo "# docs/perf/issue47/drain.sh $rounds"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $rounds rounds, $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
names=(head wait end both)
for r in $(seq 1 "$rounds"); do
  for k in 0 1 2 3; do
    name=${names[$(((k + r - 1) % 4))]}
    perf stat -x, -e syscalls:sys_enter_write,syscalls:sys_enter_read -o "/tmp/cqd-drain-perf" -- \
      "/tmp/cqd-drain-$name" --latency-only 2>/dev/null | sed "s/^/round $r $name /"
    awk -F, -v r="$r" -v n="$name" '/sys_enter/ {print "round " r " " n " syscalls " $3 " " $1}' \
      /tmp/cqd-drain-perf
  done
done
echo "# $(date -u +%FT%TZ) done"
