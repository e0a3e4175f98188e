#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Server half of //tools/vm:two_vm_rping_test, run by busybox sh in run_two_vms.sh's server VM.
#
#   rping_server.sh [CLIENTS] [SIZE]      (defaults 3, 100)
#
# Starts Debian's rping as a persistent server (-P: a thread per connection; a plain -s server
# serves one client and exits) on $CQD_SERVER_ADDR with SIZE-byte buffers (rping's server needs
# the client's -S: it RDMA-reads the client's buffer into its own), prints "cqd-ready" once the
# listener shows in `rdma resource show cm_id`, then waits for the runner's
# "cqd-client-done CODE" line on stdin. Its ping data goes to the console ("server ping data:
# ..."); rping's stderr goes to the console and to /tmp/rping.err.
# Exit code: 0 iff rping is still running at the end and saw CLIENTS disconnects; else 1.
clients=${1:-3}
size=${2:-100}
: > /tmp/rping.err
rping -s -P -a "$CQD_SERVER_ADDR" -S "$size" -v 2>/tmp/rping.err &
rping=$!
tail -f /tmp/rping.err &
i=0
until rdma resource show cm_id | grep -q 'state LISTEN'; do
  i=$((i + 1))
  [ $i -lt 100 ] && kill -0 $rping 2>/dev/null || { echo "rping_server: no listener"; exit 1; }
  sleep 0.1
done
echo cqd-ready
read -r done_line
echo "rping_server: runner says: $done_line"
# The clients' disconnects may still be on their way.
i=0
while [ "$(grep -c 'server DISCONNECT EVENT' /tmp/rping.err)" -lt "$clients" ] && [ $i -lt 100 ]; do
  i=$((i + 1))
  sleep 0.2
done
seen=$(grep -c 'server DISCONNECT EVENT' /tmp/rping.err)
rc=0
kill -0 $rping 2>/dev/null || { echo "rping_server: rping died"; rc=1; }
[ "$seen" -eq "$clients" ] || { echo "rping_server: $seen disconnects, want $clients"; rc=1; }
kill $rping
echo "rping_server: $seen clients came and went; exit $rc"
exit $rc
