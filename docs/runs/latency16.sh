#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Seven rounds of dispatch --latency-only on a lent machine, from a folder holding dispatch and its
# libraries with ld-linux-x86-64.so.2. Usage: OUT=DIR latency16.sh (writes DIR/latency_16cpu.txt)
D=$(cd "$(dirname "$0")" && pwd)
L="$D/ld-linux-x86-64.so.2 --library-path $D"
{ echo "# for r in 1..7: dispatch --latency-only (busy-poll poll->handler rows and the spin floor), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(date -u +%FT%TZ)"
for r in 1 2 3 4 5 6 7; do echo "== round $r"; timeout 60 $L $D/dispatch --latency-only 2>&1 | grep -E "p50"; done; } > $OUT/latency_16cpu.txt
cat $OUT/latency_16cpu.txt
