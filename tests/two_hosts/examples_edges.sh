#!/bin/sh
# SPDX-License-Identifier: BSD-2-Clause
# The example programs at their edges, on rxe in one VM (tools/vm/run_in_vm.sh, busybox sh):
#   0. an address by host name (an /etc/hosts entry), through rdma_getaddrinfo, to a server
#      listening on :: (IPv6's any address, which takes IPv4 clients too);
#   1. a client pointed at a port nobody serves gives up with a message naming the address
#      (exit code 1), rather than retrying or hanging;
#   2. echo_server serves its metrics over --stats-tcp while clients run; SIGTERM then ends it:
#      it says it is stopping, ends its connections, prints its summary and its stats (no
#      registration left), and exits 0;
#   3. SIGINT does the same for blockd_server.
# Exit code: 0 iff every check passed.
addr=10.0.2.15
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
# wait_for FILE PATTERN: until FILE has a line matching PATTERN (the VM's timeout bounds it).
wait_for() { while ! grep -Eq "$2" "$1" 2>/dev/null; do sleep 1; done; }

# ---- 0. A host name, and a server on :: (rdma_getaddrinfo). ----
echo "$addr cqd-server" >>/etc/hosts
echo_server --addr=:: --exit-after=2 >/work/names_server.log 2>&1 &
server=$!
wait_for /work/names_server.log '^cqd-ready'
echo_client --server=cqd-server --connections=2 --requests=20 --rounds=1 >/work/by_name.log 2>&1
rc=$?
[ $rc = 0 ] && ok "echo_client --server=cqd-server (a host name): exit 0" ||
  { sed 's/^/  | /' /work/by_name.log; fail "by host name: exit $rc"; }
wait $server
rc=$?
sed 's/^/  | /' /work/names_server.log
[ $rc = 0 ] && ok "echo_server --addr=:: (IPv6 any) served an IPv4 client" ||
  fail "echo_server --addr=::: exit $rc"

# ---- 1. Nobody serves the port. ----
echo_client --server=$addr --port=7999 --connections=3 >/work/refused.log 2>&1
rc=$?
sed 's/^/  | /' /work/refused.log
[ $rc = 1 ] && ok "echo_client against an unserved port: exit 1" || fail "echo_client: exit $rc"
grep -Eq "^echo_client: $addr:7999 refused connection [0-9]+ \(.*\): is a server listening there\? giving up$" \
  /work/refused.log && ok "it says who refused, and gives up" || fail "no giving-up message"
[ "$(grep -c 'connecting again' /work/refused.log)" = 0 ] && ok "no retries" || fail "it retried"
blockd_client --server=$addr --port=7999 >/work/refused_blockd.log 2>&1
rc=$?
[ $rc = 1 ] && grep -q "refused connection .* giving up" /work/refused_blockd.log &&
  ok "blockd_client gives up too" || { cat /work/refused_blockd.log; fail "blockd_client: exit $rc"; }

# ---- 2. SIGTERM ends echo_server cleanly. ----
echo_server --stats-json=/work/echo_stats.json --stats-tcp=127.0.0.1:9464 \
  >/work/echo_server.log 2>&1 &
server=$!
wait_for /work/echo_server.log '^cqd-ready'
echo_client --server=$addr --connections=4 --requests=20 --rounds=1000000 >/work/echo_client.log 2>&1 &
client=$!
wait_for /work/echo_client.log '^echo_client: running'
# What Prometheus would scrape, over --stats-tcp: the version and the bounds beside the depths.
wget -q -O /work/metrics.txt http://127.0.0.1:9464/metrics
grep -Eq '^cqd_build_info\{version="[0-9]+\.[0-9]+\.[0-9]+"\} 1$' /work/metrics.txt &&
  grep -Eq '^cqd_consumer_queue_capacity\{.*\} [1-9]' /work/metrics.txt &&
  grep -Eq '^cqd_registrations [1-9]' /work/metrics.txt &&
  ok "--stats-tcp serves the metrics: build info, capacities, live registrations" ||
  fail "--stats-tcp: $(head -c 300 /work/metrics.txt)"
kill -TERM $server
wait $server
rc=$?
sed 's/^/  | /' /work/echo_server.log
[ $rc = 0 ] && ok "echo_server after SIGTERM: exit 0" || fail "echo_server after SIGTERM: exit $rc"
grep -Eq '^echo_server: stopping \(signal\): ending [1-9][0-9]* connections$' /work/echo_server.log &&
  ok "it ended its connections" || fail "no stopping line with live connections"
grep -q '^echo_server: connections=' /work/echo_server.log && ok "summary printed" ||
  fail "no summary"
grep -q '"registrations":0,' /work/echo_stats.json && ok "stats written, no registration left" ||
  fail "stats: $(head -c 300 /work/echo_stats.json)"
wait $client
rc=$?
[ $rc != 0 ] && ok "the client saw the server go (exit $rc)" || fail "the client exited 0"

# ---- 3. SIGINT ends blockd_server cleanly. ----
blockd_server --blocks=1024 --stats-tcp=127.0.0.1:9465 >/work/blockd_server.log 2>&1 &
server=$!
wait_for /work/blockd_server.log '^cqd-ready'
blockd_client --server=$addr --connections=2 --blocks-per-connection=16 --rounds=1000000 \
  >/work/blockd_client.log 2>&1 &
client=$!
# Until the server has a connection registered (its metrics say so), however slow the VMs are.
for _ in $(seq 1200); do
  wget -q -O /work/blockd_metrics.txt http://127.0.0.1:9465/metrics &&
    grep -Eq '^cqd_registrations [1-9]' /work/blockd_metrics.txt && break
  sleep 0.1
done
kill -INT $server
wait $server
rc=$?
sed 's/^/  | /' /work/blockd_server.log
[ $rc = 0 ] && ok "blockd_server after SIGINT: exit 0" || fail "blockd_server after SIGINT: exit $rc"
grep -Eq '^blockd_server: stopping \(signal\): ending [1-9][0-9]* connections$' \
  /work/blockd_server.log && ok "it ended its connections" || fail "no stopping line"
grep -q '^blockd_server: blockd_connections=' /work/blockd_server.log && ok "summary printed" ||
  fail "no summary"
wait $client

if [ $failures != 0 ]; then
  echo "examples_edges: $failures failure(s)"
  exit 1
fi
echo "examples_edges: PASS"
