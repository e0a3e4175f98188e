#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Runs inside the rxe VM (see benchmarks/BUILD, target //benchmarks:rxe): perftest and cqd's
# rxe_bench in the same boot, each RUNS times, interleaved; reports medians, writes /work/rxe.json.
# Arguments: SIZE ITERS STREAM_COUNT RUNS GAP_US.
#
# Matched settings: no inline data on either side (perftest -I 0; cqd posts without
# IBV_SEND_INLINE); the stream keeps 128 sends in flight and signals every 32nd (ib_send_bw
# -t 128 -Q 32). The low-rate ping-pong waits GAP_US between a reply and the next ping, past the
# poller's 50 us idle budget, so cqd's threads sleep; ib_send_lat -e is perftest's event mode.
SIZE=${1:-64}
ITERS=${2:-2000}
COUNT=${3:-200000}
RUNS=${4:-3}
GAP=${5:-1000}
GID=1
ADDR=10.0.2.15
LOG=/tmp/rxe_runs.txt
: > $LOG

# perftest: server in the background, client in the foreground; its result line.
perf() {
  tool=$1; shift
  $tool -d rxe0 -x $GID "$@" >/tmp/server.log 2>&1 &
  sleep 1
  $tool -d rxe0 -x $GID "$@" $ADDR > /tmp/client.log 2>&1
  wait
  awk -v s="$SIZE" '$1 == s { print; exit }' /tmp/client.log
}

# Every run is logged as "<name> <value>"; medians are taken from the log.
note() { echo "$1 $2" | tee -a $LOG; }
run=1
while [ $run -le "$RUNS" ]; do
  # ib_send_lat columns: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9.
  l=$(perf ib_send_lat -s $SIZE -n $ITERS -F -I 0)
  note ib_send_lat "$(echo "$l" | awk '{print $5}')"
  note ib_send_lat_p99 "$(echo "$l" | awk '{print $8}')"
  l=$(perf ib_send_lat -s $SIZE -n $ITERS -F -I 0 -e)
  note ib_send_lat_e "$(echo "$l" | awk '{print $5}')"
  # ib_send_bw columns: bytes iters bw_peak bw_avg msg_rate(Mpps).
  l=$(perf ib_send_bw -s $SIZE -n $COUNT -F -I 0 -t 128 -Q 32)
  note ib_send_bw "$(echo "$l" | awk '{print $5}')"
  # rxe_bench pingpong prints: pingpong MODE typical avg p99 idle_cpu.
  for mode in adaptive busy rtc rtc_busy; do
    l=$(rxe_bench pingpong $SIZE $ITERS $mode)
    note "cqd_$mode" "$(echo "$l" | awk '{print $3}')"
    note "cqd_${mode}_p99" "$(echo "$l" | awk '{print $5}')"
    note "cqd_${mode}_idle_cpu" "$(echo "$l" | awk '{print $6}')"
  done
  for mode in adaptive rtc; do
    l=$(rxe_bench pingpong $SIZE $((ITERS / 4)) $mode $GAP)
    note "cqd_${mode}_lowrate" "$(echo "$l" | awk '{print $3}')"
  done
  note cqd_stream "$(rxe_bench stream $SIZE $COUNT | awk '{print $3}')"
  note cqd_stream_rtc "$(rxe_bench stream $SIZE $COUNT rtc | awk '{print $3}')"
  run=$((run + 1))
done

median() { awk -v k="$1" '$1 == k { print $2 }' $LOG | sort -n | awk '{ v[NR] = $1 } END {
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { awk -v k="$1" '$1 == k { print $2 }' $LOG | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 }
  END { printf "%s-%s", lo, hi }'; }

keys="ib_send_lat ib_send_lat_p99 ib_send_lat_e ib_send_bw cqd_adaptive cqd_adaptive_p99
cqd_adaptive_idle_cpu cqd_busy cqd_busy_p99 cqd_busy_idle_cpu cqd_rtc cqd_rtc_p99
cqd_rtc_idle_cpu cqd_rtc_busy cqd_rtc_busy_p99 cqd_rtc_busy_idle_cpu cqd_adaptive_lowrate
cqd_rtc_lowrate cqd_stream cqd_stream_rtc"
echo
echo "medians of $RUNS runs [range]; latencies one-way us, rates Mmsg/s, idle CPU %"
{
  echo "{\"size\": $SIZE, \"iters\": $ITERS, \"stream_count\": $COUNT, \"runs\": $RUNS,"
  echo " \"lowrate_gap_us\": $GAP, \"perftest_flags\": \"-F -I 0; ib_send_bw -t 128 -Q 32\","
  echo " \"median\": {"
  first=1
  for k in $keys; do
    m=$(median $k)
    printf '  %-24s %10s  [%s]\n' "$k" "$m" "$(range $k)" >&2
    [ $first -eq 1 ] || echo ","
    printf '  "%s": %s' "$k" "${m:-null}"
    first=0
  done
  echo
  echo " },"
  echo " \"runs_log\": ["
  awk '{ printf "%s  [\"%s\", %s]", (NR > 1 ? ",\n" : ""), $1, ($2 == "" ? "null" : $2) } END { print "" }' $LOG
  echo " ]}"
} > /work/rxe.json
r() { awk -v a="$(median $1)" -v b="$(median $2)" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
echo "ratios (medians): rtc/ib_send_lat $(r cqd_rtc ib_send_lat), handoff/ib_send_lat" \
  "$(r cqd_adaptive ib_send_lat), busy handoff/ib_send_lat $(r cqd_busy ib_send_lat)," \
  "low-rate/ib_send_lat -e $(r cqd_adaptive_lowrate ib_send_lat_e)," \
  "stream/ib_send_bw $(r cqd_stream ib_send_bw), rtc stream/ib_send_bw $(r cqd_stream_rtc ib_send_bw)"
