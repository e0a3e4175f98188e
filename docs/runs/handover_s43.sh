#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Session 43's two handoff measurements, on a quiet machine (docs/PERFORMANCE.md, "Small poll
# batches: what a hand-over costs"):
#   1. How many entries the consumer takes per batch at poll batch 8, 1000 QPs, in three builds
#      counted by a few lines added to Consumer::Dispatch and ReserveUpTo (not committed; the
#      patch is below): 13847e6 (the issue's start), 509b66b (the runtime before the hold) and
#      7ac2744 (the hold of four consumer batches). Each run prints, at exit, the cumulative
#      counts of its three windows: the poller's reservations (hand-overs) and entries, the
#      consumer's Dispatch calls, those that found the depth raised but nothing published, its
#      batches and their entries.
#   2. The hold's size: alternating rows of plain builds holding up to one consumer batch
#      (1ca4855), four (7ac2744) and eight (7ac2744 with kHeldBatches 8, kMaxHeldPasses 32).
# Usage: docs/runs/handover_s43.sh ROUNDS > docs/runs/handover_s43.txt
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rounds=${1:?usage: handover_s43.sh ROUNDS}
tree=/tmp/cqd-s43-variants
ob=/tmp/cqd-s43-variants-ob
bins=/tmp/cqd-s43-bin
mkdir -p "$bins"
[[ -d $tree ]] || git worktree add -f --detach "$tree" HEAD > /dev/null
benchmarks=$(git rev-parse HEAD)

# The counters: plain loads and stores of relaxed atomics, each written by one thread.
count_patch() {
  python3 - "$1" << 'EOF'
import sys
path = sys.argv[1]
s = open(path).read()
def sub(old, new):
    global s
    assert old in s, old
    s = s.replace(old, new, 1)
def bump(name, by="1"):
    return f"{name}.store({name}.load(std::memory_order_relaxed) + {by}, std::memory_order_relaxed);"
sub("namespace cqd::internal {\nnamespace {",
    "namespace cqd::internal {\nstd::atomic<uint64_t> g_res{0}, g_resn{0}, g_calls{0}, g_empty{0},"
    " g_batches{0}, g_entries{0};\nnamespace {")
sub("#include <algorithm>", "#include <algorithm>\n#include <cstdio>")
sub("Consumer::~Consumer() {\n  Stop();",
    "Consumer::~Consumer() {\n  Stop();\n  fprintf(stderr, \"COUNT hand-overs %lu entries %lu |"
    " Dispatch calls %lu empty %lu batches %lu entries %lu\\n\", (unsigned long)g_res.load(),"
    " (unsigned long)g_resn.load(), (unsigned long)g_calls.load(), (unsigned long)g_empty.load(),"
    " (unsigned long)g_batches.load(), (unsigned long)g_entries.load());")
sub("  NoteDepth(depth + take);\n  return take;",
    "  " + bump("g_res") + " " + bump("g_resn", "take") + "\n  NoteDepth(depth + take);\n  return take;")
sub("int Consumer::Dispatch(int max) noexcept {\n",
    "int Consumer::Dispatch(int max) noexcept {\n  " + bump("g_calls") + "\n")
sub("  if (entries == 0) return 0;\n  RunBatch(pieces);",
    "  if (entries == 0) {\n    " + bump("g_empty") + "\n    return 0;\n  }\n  " + bump("g_batches") +
    " " + bump("g_entries", "entries") + "\n  RunBatch(pieces);")
open(path, "w").write(s)
EOF
}

# Builds the dispatch harness at runtime commit $1 with HEAD's benchmarks/ into $bins/$2; $3:
# "count" adds the counters, "hold8" sets the hold to eight batches.
build() {
  (cd "$tree" && git checkout -q -f "$1" && git checkout -q "$benchmarks" -- benchmarks/{dispatch_bench.cc,machine.cc,machine.h,pipelines.cc,pipelines.h})
  case ${3:-} in
    count) count_patch "$tree/runtime/core/consumer.cc" ;;
    hold8) sed -i 's/kHeldBatches = 4;/kHeldBatches = 8;/; s/kMaxHeldPasses = 16;/kMaxHeldPasses = 32;/' \
             "$tree/runtime/core/poller.h" ;;
  esac
  (cd "$tree" && bazel --output_base="$ob" build -c opt //benchmarks:dispatch > /dev/null 2>&1)
  cp -f "$ob"/execroot/*/bazel-out/k8-opt/bin/benchmarks/dispatch "$bins/$2"
}
build 13847e6 count-13847e6 count
build 509b66b count-509b66b count
build 7ac2744 count-7ac2744 count
build 1ca4855 hold1
build 7ac2744 hold4
build 7ac2744 hold8 hold8
(cd "$tree" && git checkout -q -f "$benchmarks")

echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "# 1. counted builds, poll batch 8, 1000 QPs, 3 windows of 0.5 s each"
for r in $(seq 1 "$rounds"); do
  for which in 13847e6 509b66b 7ac2744; do
    out=$("$bins/count-$which" --seconds=0.5 --only=cqd:8:1000:1 2>&1)
    echo "round $r $which: $(grep 'M completions' <<< "$out")"
    echo "  $(grep COUNT <<< "$out" | tail -1)"
  done
done
echo "# 2. the hold's size, 1000 QPs"
for r in $(seq 1 "$rounds"); do
  order="hold1 hold4 hold8"
  [[ $((r % 2)) == 0 ]] && order="hold8 hold4 hold1"
  for which in $order; do
    for row in cqd:32:1000:1 cqd:8:1000:1 cqd:64:1000:1 mutex:32:1000:1; do
      echo "round $r $which $("$bins/$which" --seconds=0.5 --only="$row")"
    done
  done
done
echo "# $(date -u +%FT%TZ) done"
