#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Client half of the two-host example tests, run by busybox sh in run_two_vms.sh's client VM:
# runs every command at once (each a client; "@SERVER" in it becomes $CQD_SERVER_ADDR), shows
# each one's output as it comes with a "client N: " prefix, waits for all, and prints each one's
# exit code.
#
#   clients.sh 'CMD ARGS...' ['CMD ARGS...']...
#
# Exit code: 0 iff every command exited 0.
i=0
for cmd in "$@"; do
  i=$((i + 1))
  cmd=$(echo "$cmd" | sed "s/@SERVER/$CQD_SERVER_ADDR/g")
  ( { $cmd 2>&1; echo $? > /tmp/client$i.rc; } |
      while IFS= read -r line; do echo "client $i: $line"; done ) &
done
wait
rc=0
j=1
while [ $j -le $i ]; do
  code=$(cat /tmp/client$j.rc 2>/dev/null || echo none)
  echo "client $j: exit $code"
  [ "$code" = 0 ] || rc=1
  j=$((j + 1))
done
exit $rc
