#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# What bounds the handoff with 10^5 QPs in random order (docs/PERFORMANCE.md, issue 47): a 4 s run
# (so that steady state, not the harness's setup of 10^5 QPs, holds most samples) of the before
# and after binaries of docs/perf/issue47/s54.sh (/tmp/cqd-s54-dispatch-{before,after}: a7808c6,
# and the handler prefetch), each with self time per thread and symbol, and the instructions that
# hold the samples of the consumer's hottest functions and of the poller's stage loop. From the
# repository root:
#   docs/runs/profile_s54.sh > docs/runs/profile_s54.txt
set -eu  # no pipefail: `head` ends perf report early on purpose
echo "# $(date -u +%FT%TZ) $(nproc) CPUs:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"
for which in before after; do
  bin=/tmp/cqd-s54-dispatch-$which
  data=/tmp/s54_$which.perf
  echo
  echo "## $which: perf record -o $data $bin --seconds=4 --random-order --only=cqd:32:100000:1"
  perf record -q -o "$data" "$bin" --seconds=4 --random-order --only=cqd:32:100000:1 2>&1 |
    grep -v '^\['
  echo "# self time per thread"
  perf report -i "$data" --no-children --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' |
    head -4
  echo "# self time per thread and symbol (top 14)"
  perf report -i "$data" --no-children --sort comm,sym 2>/dev/null | grep -v '^#' |
    grep -v '^$' | head -14 | cut -c1-120
  for sym in cqd::internal::Consumer::DeliverRun cqd::internal::Consumer::PrefetchRun \
    cqd::internal::Shard::Run; do
    echo "# perf annotate $sym: the instructions holding most of its samples"
    perf annotate -i "$data" --stdio -s "$sym" 2>/dev/null | grep -E '^ +[0-9]+\.[0-9]+ :' |
      sort -rn | head -3
  done
done
echo "# $(date -u +%FT%TZ) done"
