#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Server half of the two-host example tests, run by busybox sh in run_two_vms.sh's server VM.
#
#   server_side.sh 'SERVER ARGS...' ['LOCAL_CLIENT ARGS...' ['MUST_PRINT']]
#
# Starts SERVER (it prints "cqd-ready" once listening; the runner then starts the client VM),
# and optionally a client in this same VM ("@SERVER" in it becomes $CQD_SERVER_ADDR) that must
# keep working whatever happens to the other host. Waits for the runner's "cqd-client-done CODE"
# line on stdin, then for the local client, then gives the server 180 s to finish on its own (its
# --exit-after condition). A server run with --exit-when-told is sent SIGUSR1 once both client
# sides are done: no more clients will come, so it may end when its last connection has.
# Exit code: 0 iff the server and the local client (if any) exited 0 and the server's output
# matched MUST_PRINT (a grep -E pattern), if given; 1 otherwise, also when the server did not
# finish (the VM then powers off with it).
( { $1 2>&1; echo $? > /tmp/server.rc; } |
    while IFS= read -r line; do echo "$line"; echo "$line" >> /tmp/server.log; done ) &
server_pid=$!
local_pid=
if [ -n "$2" ]; then
  sleep 1
  local_cmd=$(echo "$2" | sed "s/@SERVER/$CQD_SERVER_ADDR/g")
  ( { $local_cmd 2>&1; echo $? > /tmp/local.rc; } |
      while IFS= read -r line; do echo "local: $line"; done ) &
  local_pid=$!
fi
read -r done_line
echo "server_side: $done_line"
if [ -n "$local_pid" ]; then
  wait $local_pid
  local_code=$(cat /tmp/local.rc 2>/dev/null || echo none)
  echo "server_side: local client exit $local_code"
fi
case "$1" in
  *--exit-when-told*) killall -USR1 "${1%% *}" ;;
esac
waited=0
while [ ! -f /tmp/server.rc ] && [ $waited -lt 180 ]; do sleep 1; waited=$((waited + 1)); done
if [ ! -f /tmp/server.rc ]; then
  echo "server_side: the server did not finish within 180 s of the client side"
  exit 1
fi
wait $server_pid
rc=0
code=$(cat /tmp/server.rc)
echo "server_side: server exit $code"
[ "$code" = 0 ] || rc=1
if [ -n "$local_pid" ]; then
  [ "$local_code" = 0 ] || rc=1
fi
if [ -n "$3" ] && ! grep -Eq "$3" /tmp/server.log; then
  echo "server_side: the server never printed a line matching: $3"
  rc=1
fi
exit $rc
