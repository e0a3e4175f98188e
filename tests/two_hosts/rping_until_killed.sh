#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Client half of blockd_rping_host_dies_test: COUNT unmodified rping clients that ping without
# end, on a host that is about to lose its power.
#
#   rping_until_killed.sh COUNT SERVER PORT
#
# Starts COUNT `rping -c -v -C 100000000 -S 64` against SERVER:PORT, prints "rping-all-pinging"
# once each has printed a verified ping (their stdout is block-buffered: once each has pinged a
# few dozen times), then waits for the runner to kill this VM. Exit code: 1 if an rping exited
# first (the test then fails on the server side, which waits for connections that never come).
n=$1
i=1
while [ "$i" -le "$n" ]; do
  rping -c -v -C 100000000 -a "$2" -p "$3" -S 64 > "/tmp/rping$i.log" 2>&1 &
  i=$((i + 1))
done
while :; do
  pinging=0
  i=1
  while [ "$i" -le "$n" ]; do
    grep -q '^ping data' "/tmp/rping$i.log" 2>/dev/null && pinging=$((pinging + 1))
    i=$((i + 1))
  done
  [ "$pinging" = "$n" ] && break
  sleep 1
done
echo "rping-all-pinging"
wait
echo "rping_until_killed: an rping exited before the host was killed"
cat /tmp/rping*.log | grep -v '^ping data' | head -20
exit 1
