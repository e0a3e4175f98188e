#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Runs inside the rxe VM: what the run-to-completion ping-pong's distance from ib_send_lat is made
# of. RUNS rounds of: perftest's ib_send_lat (two processes, each polling its own QP); then
# rxe_bench's ping-pong (benchmarks/rxe_bench.cc) one thread for both sides, without cqd (verbs)
# and with cqd run to completion busy-polling (rtc_busy), each with every send signaled (as
# benchmarks/rxe.sh runs them) and one in 32 (perftest leaves its latency sends unsignaled); then
# a thread per side, without cqd (verbs_split) and with cqd (rtc_busy_split: a poller per side).
# Writes /work/rxe_floor.txt: "<name> <one-way us typical>" lines.
# Arguments: SIZE ITERS RUNS. Started by: bazel run -c opt //benchmarks:rxe_floor
SIZE=${1:-64}
ITERS=${2:-2000}
RUNS=${3:-3}
OUT=/work/rxe_floor.txt
echo "# bazel run -c opt //benchmarks:rxe_floor -- $SIZE $ITERS $RUNS (benchmarks/rxe_floor.sh)" > $OUT
echo "# one-way us, typical (median of ITERS round trips, halved); medians of the runs at the end" >> $OUT
note() { echo "$1 $2" | tee -a $OUT; }
run=1
while [ $run -le "$RUNS" ]; do
  ib_send_lat -d rxe0 -x 1 -s $SIZE -n $ITERS -F -I 0 >/tmp/server.log 2>&1 &
  sleep 1
  ib_send_lat -d rxe0 -x 1 -s $SIZE -n $ITERS -F -I 0 10.0.2.15 >/tmp/client.log 2>&1
  wait
  note ib_send_lat "$(awk -v s="$SIZE" '$1 == s { print $5; exit }' /tmp/client.log)"
  for every in 1 32; do
    for mode in verbs rtc_busy; do
      l=$(CQD_BENCH_SIGNAL_EVERY=$every rxe_bench pingpong $SIZE $ITERS $mode)
      note "${mode}_signal_every_$every" "$(echo "$l" | awk '{print $3}')"
    done
  done
  for mode in verbs_split rtc_busy_split; do
    note "$mode" "$(rxe_bench pingpong $SIZE $ITERS $mode | awk '{print $3}')"
  done
  run=$((run + 1))
done
median() { awk -v k="$1" '$1 == k { print $2 }' $OUT | sort -n | awk '{ v[NR] = $1 } END {
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { awk -v k="$1" '$1 == k { print $2 }' $OUT | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 }
  END { printf "%s-%s", lo, hi }'; }
echo "# medians [range] over $RUNS runs" >> $OUT
for k in ib_send_lat verbs_signal_every_1 rtc_busy_signal_every_1 verbs_signal_every_32 \
    rtc_busy_signal_every_32 verbs_split rtc_busy_split; do
  echo "median $k $(median $k) [$(range $k)]" | tee -a $OUT
done
