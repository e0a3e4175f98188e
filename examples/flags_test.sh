#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# The example programs' command lines, checked before any RDMA device is needed: --help prints
# the usage and exits 0, --version the cqd version; an unknown flag, a malformed or out-of-range number, a switch given a
# value, a flag without its value and a stray argument each print an error that names it and
# exit 2; a client without --server says it needs one.
#
#   flags_test.sh ECHO_SERVER ECHO_CLIENT BLOCKD_SERVER BLOCKD_CLIENT
set -uo pipefail
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

expect() {  # expect RC PATTERN PROGRAM ARGS...: exit status RC and PATTERN (ERE) in the output
  local rc=$1 pattern=$2 got out
  shift 2
  out=$("$@" 2>&1)
  got=$?
  local name
  name=$(basename "$1")
  shift
  if [[ $got != "$rc" ]]; then
    fail "$name $*: exit status $got, want $rc; output: $out"
  elif ! grep -Eq -- "$pattern" <<<"$out"; then
    fail "$name $*: output lacks /$pattern/: $out"
  else
    echo "ok: $name $* -> $rc"
  fi
}

for program in "$@"; do
  name=$(basename "$program")
  expect 0 "^usage: $name" "$program" --help
  expect 0 "--port=PORT" "$program" -h
  expect 0 "^$name \(cqd\) [0-9]+\.[0-9]+\.[0-9]+$" "$program" --version
  expect 2 "^$name: unknown flag --bogus \\(see $name --help\\)" "$program" --bogus
  expect 2 "^$name: --port=abc: expected a whole number from 1 to 65535" "$program" --port=abc
  expect 2 "^$name: --port=0: expected a whole number from 1 to 65535" "$program" --port=0
  expect 2 "^$name: --port=70000: expected a whole number" "$program" --port=70000
  expect 2 "^$name: --port=\+80: expected a whole number" "$program" --port=+80
  expect 2 "^$name: --port= 80: expected a whole number" "$program" "--port= 80"
  expect 2 "^$name: --pollers=2x: expected a whole number from 1 to 256" "$program" --pollers=2x
  expect 2 "^$name: --port needs a value: --port=PORT" "$program" --port
  expect 2 "^$name: unexpected argument \"stray\"" "$program" stray
  expect 2 "^$name: unexpected argument \"-p\"" "$program" -p
  case $name in
    *_client)
      expect 1 "^$name: --server=HOST is required" "$program"
      expect 2 "^$name: --window=0: expected a whole number" "$program" --window=0 ;;
    echo_server)
      expect 2 "^$name: --latency is a switch and takes no value" "$program" --latency=yes ;;
  esac
done

if (( failures > 0 )); then
  echo "flags_test: $failures failure(s)"
  exit 1
fi
echo "flags_test: PASS"
