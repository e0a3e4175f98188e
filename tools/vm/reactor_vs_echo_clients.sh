#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Client half of tools/vm/reactor_vs_echo.sh, run by busybox sh in run_two_vms.sh's client VM
# (the other half is reactor_vs_echo_server.sh; the runner relays "cqd-relay: " lines).
#
#   reactor_vs_echo_clients.sh SERVERS 'PHASE=CMD ARGS[;CMD ARGS]...'...
#
# For each of the SERVERS servers, in turn: waits for "cqd-relay: ready K NAME", then runs each
# PHASE: says "cqd-relay: begin K PHASE", waits for "cqd-relay: go K PHASE", runs the phase's
# commands at once ("@SERVER" in them becomes $CQD_SERVER_ADDR), and says "cqd-relay: end K
# PHASE verified=N" (N: the replies the echo_clients verified). Prints, per phase,
#   compare: server=K:NAME phase=PHASE wall_cs=CENTISECONDS clients=C failed=F
# and each client's "echo_client: latency_us ..." line as
#   compare: server=K:NAME phase=PHASE client=J latency_us samples=... p50=... p99=...
# then says "cqd-relay: done K".
# Exit code: 0 iff every command of every phase exited 0.
servers=$1
shift
uptime_cs() { awk '{ split($1, t, "."); print t[1] * 100 + t[2] }' /proc/uptime; }
# expect WORDS: reads stdin until a line that is "cqd-relay: WORDS".
expect() {
  while IFS= read -r line; do
    [ "$line" = "cqd-relay: $*" ] && return 0
    case $line in
      "cqd-relay: ready "*) [ "$1" = ready ] && { set -- $line; name=$4; return 0; } ;;
    esac
  done
  echo "reactor_vs_echo_clients: stdin ended waiting for: $*"
  exit 1
}
rc=0
k=0
while [ $k -lt "$servers" ]; do
  k=$((k + 1))
  expect ready $k
  for phase in "$@"; do
    label=${phase%%=*}
    cmds=$(echo "${phase#*=}" | sed "s/@SERVER/$CQD_SERVER_ADDR/g")
    echo "cqd-relay: begin $k $label"
    expect go $k $label
    start=$(uptime_cs)
    j=0
    pids=
    IFS=';'
    for cmd in $cmds; do
      unset IFS
      j=$((j + 1))
      ( $cmd > /tmp/phase$j.log 2>&1; echo $? > /tmp/phase$j.rc ) &
      pids="$pids $!"
      IFS=';'
    done
    unset IFS
    wait $pids
    end=$(uptime_cs)
    verified=0
    failed=0
    i=1
    while [ $i -le $j ]; do
      code=$(cat /tmp/phase$i.rc 2>/dev/null || echo none)
      if [ "$code" != 0 ]; then
        failed=$((failed + 1))
        sed "s/^/client $i: /" /tmp/phase$i.log
      fi
      v=$(sed -n 's/.* verified=\([0-9]*\) of .*/\1/p' /tmp/phase$i.log)
      verified=$((verified + ${v:-0}))
      sed -n "s/^echo_client: \(latency_us .*\)/compare: server=$k:$name phase=$label client=$i \1/p" \
        /tmp/phase$i.log
      i=$((i + 1))
    done
    echo "compare: server=$k:$name phase=$label wall_cs=$((end - start)) clients=$j failed=$failed"
    [ $failed = 0 ] || rc=1
    echo "cqd-relay: end $k $label verified=$verified"
  done
  echo "cqd-relay: done $k"
done
exit $rc
