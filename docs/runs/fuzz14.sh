#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# 14 independent chaos fuzz workers (docs/runs/fuzz_16cpu_14workers.txt), for a lent machine
# without this project's libraries: run from a folder holding runtime_fuzz (the binary that
# CQD_FUZZ_CHAOS=1 tests/fuzz/run_fuzz.sh builds), tests/fuzz/corpus as corpus/, and the Debian
# libraries it links with ld-linux-x86-64.so.2 beside them. Usage: OUT=DIR fuzz14.sh [seconds]
# (findings and the logs of failed workers go to DIR).
D=$(cd "$(dirname "$0")" && pwd)
secs=${1:-450}
for i in $(seq 1 14); do
  w=/tmp/fz$i; rm -rf $w; mkdir -p $w/corpus; cp $D/corpus/* $w/corpus/
  seed=$((7000 + i))
  (cd $w && CQD_CHAOS_SEED=$seed timeout --kill-after=30 $((secs + 60)) $D/ld-linux-x86-64.so.2 --library-path $D $D/runtime_fuzz \
     -seed=$seed -max_total_time=$secs -timeout=30 -rss_limit_mb=4096 -max_len=1203 -print_final_stats=1 \
     -artifact_prefix=$OUT/w$i- corpus > $w/fuzz.log 2>&1; echo "worker $i seed $seed exit $?" >> $w/fuzz.log) &
done
wait
for i in $(seq 1 14); do
  grep -E '^(Done|stat::number_of_executed_units|worker)' /tmp/fz$i/fuzz.log
  if ! grep -q "exit 0" /tmp/fz$i/fuzz.log; then grep -v '^#[0-9]' /tmp/fz$i/fuzz.log | tail -40 > $OUT/w$i-log.txt; fi
done
