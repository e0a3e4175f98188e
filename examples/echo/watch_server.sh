#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# Server half of a watched two-host echo run (docs/runs/echo_two_hosts_top.txt): echo_server with
# its stats endpoint and latency histogram on, cqd_top printing its rates every 2 s meanwhile,
# and the final stats as JSON. For run_two_vms.sh's server VM:
#
#   tools/vm/run_two_vms.sh --with bazel-bin/examples/echo_server \
#     --with bazel-bin/examples/echo_client --with bazel-bin/tools/cqd_top \
#     examples/echo/watch_server.sh 128 -- tests/two_hosts/clients.sh \
#     'echo_client --server=@SERVER --connections=16 --requests=400 --rounds=2' (four times)
#
# Exit code: echo_server's.
echo_server --exit-after="$1" --stats-socket=/tmp/cqd.sock --latency --stats-json=/tmp/stats.json &
server=$!
while [ ! -S /tmp/cqd.sock ]; do sleep 0.1; done
cqd_top /tmp/cqd.sock --interval 2 &
top=$!
wait $server
rc=$?
kill $top
echo "final stats (JSON):"
cat /tmp/stats.json
exit $rc
