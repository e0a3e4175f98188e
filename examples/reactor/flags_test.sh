#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# reactor_server's command line, checked before any RDMA device is needed (as flags_test.sh does
# for the other examples): --help exits 0, and each malformed flag is an error naming it, exit 2.
#
#   flags_test.sh REACTOR_SERVER
set -uo pipefail
program=$1
failures=0
expect() {  # expect RC PATTERN ARGS...: exit status RC and PATTERN (ERE) in the output
  local rc=$1 pattern=$2 got out
  shift 2
  out=$("$program" "$@" 2>&1)
  got=$?
  if [[ $got != "$rc" ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: reactor_server $*: exit status $got (want $rc), output: $out"
    failures=$((failures + 1))
  else
    echo "ok: reactor_server $* -> $rc"
  fi
}
expect 0 "^usage: reactor_server" --help
expect 0 "--threads=N" -h
expect 2 "^reactor_server: unknown flag --pollers" --pollers=2
expect 2 "^reactor_server: --threads=0: expected a whole number from 1 to 256" --threads=0
expect 2 "^reactor_server: --threads=2x: expected a whole number" --threads=2x
expect 2 "^reactor_server: --budget=0: expected a whole number from 1 to 65536" --budget=0
expect 2 "^reactor_server: --idle-spin-us=-1: expected a whole number from 0" --idle-spin-us=-1
expect 2 "^reactor_server: --port=70000: expected a whole number from 1 to 65535" --port=70000
expect 2 "^reactor_server: --no-pin is a switch and takes no value" --no-pin=1
expect 2 "^reactor_server: --exit-after needs a value" --exit-after
expect 2 "^reactor_server: unexpected argument \"stray\"" stray
(( failures == 0 )) && echo "flags_test: PASS" || echo "flags_test: $failures failure(s)"
(( failures == 0 ))
