#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# //tools:cqd_top_test: checks cqd_top's and the demo's --help and --version; runs the demo with a
# stats endpoint (the dashed flag spelling) and latency recording, then
# cqd_top for two frames against it, and checks that the frames hold the poller, CQ and consumer
# tables with latency figures. Nothing here depends on speed: only on the demo running.
set -uo pipefail
demo=$1
top=$2
dir=${TEST_TMPDIR:-}
if [[ -z $dir || ${#dir} -gt 90 ]]; then  # a Unix socket path holds at most 107 bytes
  dir=$(mktemp -d /tmp/cqd_top_test.XXXXXX)
  cleanup_dir=$dir
fi
sock=$dir/cqd.sock
# The command lines first: --help to stdout with status 0, --version, a bad flag with status 2.
"$top" --help | grep -q '^usage: cqd_top ENDPOINT' || { echo "cqd_top --help failed" >&2; exit 1; }
"$top" --version | grep -Eq '^cqd_top \(cqd\) [0-9]+\.[0-9]+\.[0-9]+$' ||
  { echo "cqd_top --version failed" >&2; exit 1; }
"$demo" --version | grep -Eq '^demo \(cqd\) [0-9]+\.[0-9]+\.[0-9]+$' ||
  { echo "demo --version failed" >&2; exit 1; }
"$top" --bogus 2>/dev/null
[[ $? == 2 ]] || { echo "cqd_top --bogus: want status 2" >&2; exit 1; }
port=$((20000 + RANDOM % 30000))
"$demo" --seconds=60 --qps=16 --stats-socket="$sock" --stats-tcp="127.0.0.1:$port" --latency \
  >"$dir/demo.out" 2>&1 &
demo_pid=$!
cleanup() {
  kill "$demo_pid" 2>/dev/null
  wait "$demo_pid" 2>/dev/null
  [[ -n ${cleanup_dir:-} ]] && rm -rf "$cleanup_dir"
}
trap cleanup EXIT
for _ in $(seq 1 300); do
  [[ -S $sock ]] && break
  sleep 0.1
done
if [[ ! -S $sock ]]; then
  echo "cqd_top_test: the demo never created $sock" >&2
  cat "$dir/demo.out" >&2
  exit 1
fi
out=$("$top" "$sock" --interval 0.3 --count 2)
rc=$?
echo "$out"
# The same runtime over its TCP endpoint (HOST:PORT), the values spelled --flag=VALUE.
tcp_out=$("$top" "127.0.0.1:$port" --interval=0.3 --count=1)
tcp_rc=$?
echo "$tcp_out"
if (( tcp_rc != 0 )) || ! grep -Eq '^CONSUMER +DELIV/s' <<<"$tcp_out"; then
  echo "cqd_top_test: cqd_top over TCP exited with $tcp_rc" >&2
  exit 1
fi
if (( rc != 0 )); then
  echo "cqd_top_test: cqd_top exited with $rc" >&2
  exit 1
fi
fail=0
expect() {
  if ! grep -Eq "$1" <<<"$out"; then
    echo "cqd_top_test: no line matching '$1'" >&2
    fail=1
  fi
}
expect '^POLLER +CPU +COMPL/s +POLLS/s +EMPTY/s +SLEEPS/s +ARMS/s .* PARKS/s +PARKED +ASLEEP$'
expect '^registrations [1-9][0-9]* of [1-9][0-9]*$'
expect '^CQ +SHARD +COMPL/s +EVENTS/s +ACKED/s'
expect '^CONSUMER +DELIV/s .* STALLED/s +STALL_NOW +P50 +P99 +P99\.9 +MAX_EVER$'
expect '^consumer0 +[0-9.]+[kMG]? '
expect '^1 +- +[0-9.]+[kMG]? '  # poller 1 of the demo's 2, not pinned: "-", not -1
frames=$(grep -c '^cqd_top ' <<<"$out")
if (( frames != 2 )); then
  echo "cqd_top_test: $frames frames, expected 2" >&2
  fail=1
fi
# A latency column with a figure (the consumers record it): a duration such as 850ns or 1.2us.
if ! grep -Eq '^consumer[0-9] .*[0-9.]+(ns|us|ms|s) *$' <<<"$out"; then
  echo "cqd_top_test: no consumer row with a latency figure" >&2
  fail=1
fi
# Bad usage is refused.
if "$top" >/dev/null 2>&1; then
  echo "cqd_top_test: cqd_top without a socket succeeded" >&2
  fail=1
fi
if "$top" "$dir/missing.sock" --count 1 >/dev/null 2>&1; then
  echo "cqd_top_test: cqd_top on a missing socket succeeded" >&2
  fail=1
fi
exit $fail
