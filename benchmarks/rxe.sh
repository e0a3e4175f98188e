#!/bin/sh
# Runs inside the rxe VM (see benchmarks/BUILD, target //benchmarks:rxe): perftest and cqd's
# rxe_bench, same message size, same boot; prints a table with the ratios and writes
# /work/rxe.json. Arguments: SIZE ITERS STREAM_COUNT.
SIZE=${1:-64}
ITERS=${2:-2000}
COUNT=${3:-200000}
GID=1
ADDR=10.0.2.15

# perftest: server in the background, client in the foreground; print its result line.
perf() {
  tool=$1; shift
  $tool -d rxe0 -x $GID "$@" >/tmp/server.log 2>&1 &
  sleep 1
  $tool -d rxe0 -x $GID "$@" $ADDR > /tmp/client.log 2>&1
  wait
  awk -v s="$SIZE" '$1 == s { print; exit }' /tmp/client.log
}

lat=$(perf ib_send_lat -s $SIZE -n $ITERS -F)
lat_e=$(perf ib_send_lat -s $SIZE -n $ITERS -F -e)
bw=$(perf ib_send_bw -s $SIZE -n $COUNT -F)
echo "ib_send_lat:    $lat"
echo "ib_send_lat -e: $lat_e"
echo "ib_send_bw:     $bw"
# Columns: ib_send_lat: bytes iters t_min t_max t_typical t_avg t_stdev p99 p99.9;
# ib_send_bw: bytes iters bw_peak bw_avg msg_rate(Mpps).
lat_typ=$(echo "$lat" | awk '{print $5}')
lat_p99=$(echo "$lat" | awk '{print $8}')
lat_e_typ=$(echo "$lat_e" | awk '{print $5}')
bw_mpps=$(echo "$bw" | awk '{print $5}')

# Software emulation makes single runs noisy: run cqd three times and keep the median run
# (by typical latency, or by message rate).
median3() { sort -n -k "$1" | sed -n 2p; }
adaptive=$(for i in 1 2 3; do rxe_bench pingpong $SIZE $ITERS adaptive; done | tee /dev/stderr |
           median3 3)
busy=$(for i in 1 2 3; do rxe_bench pingpong $SIZE $ITERS busy; done | tee /dev/stderr |
       median3 3)
stream=$(for i in 1 2 3; do rxe_bench stream $SIZE $COUNT; done | tee /dev/stderr | median3 2)
echo "cqd (median of 3): $adaptive"
echo "cqd (median of 3): $busy"
echo "cqd (median of 3): $stream"
a_typ=$(echo "$adaptive" | awk '{print $3}')
a_p99=$(echo "$adaptive" | awk '{print $5}')
a_idle=$(echo "$adaptive" | awk '{print $6}')
b_typ=$(echo "$busy" | awk '{print $3}')
b_idle=$(echo "$busy" | awk '{print $6}')
s_mpps=$(echo "$stream" | awk '{print $2}')

echo
echo "one-way latency, $SIZE-byte messages, us (typical = median)"
echo "  ib_send_lat (polling)    $lat_typ   p99 $lat_p99"
echo "  ib_send_lat -e (events)  $lat_e_typ"
echo "  cqd adaptive             $a_typ   p99 $a_p99   idle CPU ${a_idle}%"
echo "  cqd busy-poll            $b_typ   idle CPU ${b_idle}%"
echo "message rate, Mmsg/s"
echo "  ib_send_bw               $bw_mpps"
echo "  cqd stream               $s_mpps"
awk -v a="$a_typ" -v l="$lat_typ" -v e="$lat_e_typ" -v s="$s_mpps" -v b="$bw_mpps" 'BEGIN {
  printf "ratios: cqd adaptive / ib_send_lat = %.2f, cqd adaptive / ib_send_lat -e = %.2f, cqd stream / ib_send_bw = %.2f\n", a / l, a / e, s / b }'

cat > /work/rxe.json <<JSON
{"size": $SIZE, "iters": $ITERS, "stream_count": $COUNT,
 "ib_send_lat_typical_us": $lat_typ, "ib_send_lat_p99_us": $lat_p99,
 "ib_send_lat_events_typical_us": $lat_e_typ, "ib_send_bw_mpps": $bw_mpps,
 "cqd_adaptive_typical_us": $a_typ, "cqd_adaptive_p99_us": $a_p99,
 "cqd_adaptive_idle_cpu_percent": $a_idle,
 "cqd_busy_typical_us": $b_typ, "cqd_busy_idle_cpu_percent": $b_idle,
 "cqd_stream_mpps": $s_mpps}
JSON
