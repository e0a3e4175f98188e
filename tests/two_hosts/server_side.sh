#!/bin/sh
# Server half of the two-host example tests, run by busybox sh in run_two_vms.sh's server VM.
#
#   server_side.sh SERVER [SERVER_ARGS...] [-- LOCAL_CLIENT [CLIENT_ARGS...]]
#
# Starts SERVER (it prints "cqd-ready" once listening; the runner then starts the client VM),
# and optionally a client of this same VM (LOCAL_CLIENT, run against $CQD_SERVER_ADDR) that must
# keep working whatever happens to the other host. Waits for the runner's "cqd-client-done CODE"
# line on stdin, then gives the server 180 s to finish on its own (its --exit-after condition).
# Exit code: 0 iff the server and the local client (if any) exited 0; 1 otherwise, also when the
# server had to be killed.
server=
while [ $# -gt 0 ] && [ "$1" != -- ]; do server="$server $1"; shift; done
[ "$1" = -- ] && shift
$server &
server_pid=$!
local_pid=
if [ $# -gt 0 ]; then
  sleep 1
  "$@" &
  local_pid=$!
fi
read -r done_line
echo "server_side: $done_line"
waited=0
while kill -0 $server_pid 2>/dev/null && [ $waited -lt 180 ]; do sleep 1; waited=$((waited + 1)); done
rc=0
if kill -0 $server_pid 2>/dev/null; then
  echo "server_side: the server did not finish within 180 s of the client side"
  kill -9 $server_pid
  rc=1
fi
wait $server_pid || rc=1
if [ -n "$local_pid" ]; then
  wait $local_pid || { echo "server_side: the local client failed"; rc=1; }
fi
exit $rc
