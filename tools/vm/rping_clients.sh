#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Client half of //tools/vm:two_vm_rping_test, run by busybox sh in run_two_vms.sh's client VM.
#
#   rping_clients.sh [CLIENTS] [COUNT] [SIZE]      (defaults 3, 10, 100)
#
# Runs CLIENTS verifying rping clients side by side (rping -c -V -v against $CQD_SERVER_ADDR,
# COUNT pings of SIZE bytes each), waits for all of them, and prints each one's output with a
# "client N: " prefix and a verdict line "client N: ok, COUNT pings verified" or
# "client N: FAILED ...". rping -V compares each echoed buffer with what it sent and prints a
# "ping data: rdma-ping-K: ..." line only after the comparison passed.
# The clients connect one after another (each once the one before has its QP in RTS, or has
# ended), then ping concurrently: Debian 12's rping -P (rdma-core 44) may hand one connection
# request to two server threads when requests arrive together (rdma_accept: Invalid argument,
# a client hung for good); rdma-core fixed that upstream in 2025 (PR #1568).
# Exit code: 0 iff every client printed pings 0..COUNT-1 in order and exited 0 (or ended only
# through rping's own exit race after the last ping, as tests/two_hosts/rping_verified.sh
# explains); else 1.
clients=${1:-3}
count=${2:-10}
size=${3:-100}
pids=
i=1
while [ $i -le "$clients" ]; do
  # stdout and stderr apart: in one file rping's stderr could split a block-buffered ping line.
  rping -c -a "$CQD_SERVER_ADDR" -C "$count" -S "$size" -V -v > /tmp/client$i.log \
    2> /tmp/client$i.err &
  eval "pid$i=$!"
  pids="$pids $!"
  t=0
  while [ $t -lt 300 ]; do
    ended=0
    for p in $pids; do  # gone, or a zombie not yet waited for
      case $(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null) in ''|Z) ended=$((ended + 1)) ;; esac
    done
    [ $(( $(rdma resource show qp | grep -c 'type RC state RTS') + ended )) -ge $i ] && break
    t=$((t + 1))
    sleep 0.1
  done
  i=$((i + 1))
done
rc=0
i=1
while [ $i -le "$clients" ]; do
  eval "wait \$pid$i"
  code=$?
  sed "s/^/client $i: /" /tmp/client$i.log /tmp/client$i.err
  got=$(grep '^ping data: rdma-ping-' /tmp/client$i.log | sed 's/^ping data: rdma-ping-\([0-9]*\):.*/\1/' | tr '\n' ' ')
  want=$(seq 0 $((count - 1)) | tr '\n' ' ')
  # rping's own exit race (its CM thread reading an event while its main thread destroys the
  # id) can end a client that verified every ping with "rdma_get_cm_event: Bad file descriptor".
  if [ "$code" -ne 0 ] && [ "$got" = "$want" ] &&
     [ "$(grep -cvE 'DISCONNECT EVENT' /tmp/client$i.err)" = 1 ] &&
     grep -q '^rdma_get_cm_event: Bad file descriptor$' /tmp/client$i.err; then
    echo "client $i: rping exited $code in its own exit race, after the last ping"
    echo "client $i: ok, $count pings verified"
  elif [ "$code" -eq 0 ] && [ "$got" = "$want" ]; then
    echo "client $i: ok, $count pings verified"
  else
    echo "client $i: FAILED: exit $code, pings [$got]"
    rc=1
  fi
  i=$((i + 1))
done
exit $rc
