#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Server half of blockd_rping_host_dies_test, in the server VM.
#
#   blockd_dead_host.sh COUNT
#
# Runs blockd_server with 500 ms keepalives until it has had COUNT connections and let every one
# of them go (--exit-after). The client host dies holding COUNT rping connections, whose QPs
# inherit rping's retry_count 7, which rxe never counts down: only the server's keepalive can
# release them. server_side.sh gives the server 180 s after the host died, so a keepalive that
# waited for the transport fails the test there.
# Exit code: 0 iff blockd_server exited, having served COUNT rping connections, and logged each as
# failed (by its keepalive or by the transport) exactly once.
n=$1
blockd_server --exit-after="$n" --keepalive-ms=500 2>&1 | tee /tmp/blockd_dead_host.log
log=/tmp/blockd_dead_host.log
if ! grep -q "rping_connections=$n " "$log"; then
  echo "blockd_dead_host: want $n rping connections"
  exit 1
fi
failed=$(grep -cE "^blockd_server: rping connection qp [0-9]+ failed: " "$log")
if [ "$failed" != "$n" ]; then
  echo "blockd_dead_host: $failed failure lines, want one for each of the $n connections"
  exit 1
fi
echo "blockd_dead_host: the dead host's $n rping connections were released:"
grep -E "failed: " "$log" | sed 's/^/  /'
