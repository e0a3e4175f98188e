#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Server half of tools/vm/reactor_vs_echo.sh, run by busybox sh in run_two_vms.sh's server VM
# (started with --relay '^cqd-relay: ', so that the two halves can take turns).
#
#   reactor_vs_echo_server.sh '[LABEL=]SERVER ARGS...'...
#
# Runs each SERVER in turn (all on the same port), named LABEL (default: the program's name) in
# what it prints. For server K: starts it, waits for its
# "cqd-ready", says "cqd-relay: ready K NAME" (to the client VM), then answers the client's
# lines on stdin: "cqd-relay: begin K PHASE" samples the server's CPU time (utime + stime of
# /proc/PID/stat, in clock ticks) and answers "cqd-relay: go K PHASE"; "cqd-relay: end K PHASE
# verified=N" samples it again and prints (W: the time between the two samples, 1/100 s)
#   compare: server=K:NAME phase=PHASE cpu_ticks=T hz=HZ server_wall_cs=W verified=N
# "cqd-relay: done K" sends the server SIGTERM (it ends cleanly, printing its summary) and waits
# for it. Then the next server. At the end it waits for the runner's "cqd-client-done CODE".
# Exit code: 0 iff every server exited 0 and the client side reported 0.
hz=100  # USER_HZ: /proc/PID/stat counts clock ticks of 1/100 s on Linux
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
uptime_cs() { awk '{ split($1, t, "."); print t[1] * 100 + t[2] }' /proc/uptime; }
rc=0
k=0
echo "cqd-ready reactor_vs_echo_server: $# servers"
for cmd in "$@"; do
  k=$((k + 1))
  first=${cmd%% *}
  name=$first
  case $first in
    *=*) name=${first%%=*}; cmd=${cmd#*=} ;;
  esac
  : > /tmp/server$k.log
  $cmd > /tmp/server$k.log 2>&1 &
  pid=$!
  i=0
  until grep -q '^cqd-ready' /tmp/server$k.log; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 $pid 2>/dev/null; then
      cat /tmp/server$k.log
      echo "reactor_vs_echo_server: $name did not get ready"
      exit 1
    fi
    sleep 0.1
  done
  sed "s/^/server $k: /" /tmp/server$k.log
  echo "cqd-relay: ready $k $name"
  while IFS= read -r line; do
    set -- $line
    if [ "$1" = cqd-client-done ]; then  # the client side ended before this server's turn did
      echo "reactor_vs_echo_server: $line before server $k was done"
      kill -TERM $pid
      wait $pid
      sed "s/^/server $k: /" /tmp/server$k.log
      exit 1
    fi
    [ "$1 $3" = "cqd-relay: $k" ] || { echo "reactor_vs_echo_server: unexpected: $line"; continue; }
    case $2 in
      begin)
        start=$(cpu $pid)
        start_cs=$(uptime_cs)
        echo "cqd-relay: go $k $4" ;;
      end)
        end=$(cpu $pid)
        wall=$(($(uptime_cs) - start_cs))
        echo "compare: server=$k:$name phase=$4 cpu_ticks=$((end - start)) hz=$hz" \
          "server_wall_cs=$wall ${5:-verified=0}" ;;
      done)
        break ;;
    esac
  done
  kill -TERM $pid
  wait $pid
  code=$?
  sed "s/^/server $k: /" /tmp/server$k.log | grep -v "^server $k: cqd-ready"
  echo "reactor_vs_echo_server: $name exit $code"
  [ $code = 0 ] || rc=1
done
read -r done_line
echo "reactor_vs_echo_server: $done_line"
case $done_line in
  "cqd-client-done 0") ;;
  *) rc=1 ;;
esac
exit $rc
