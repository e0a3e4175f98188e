#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Run as OUT=DIR big16_s41.sh from a folder holding dispatch (4b7d4d0) and its libraries with ld-linux-x86-64.so.2.
# Second lent-machine call (stop 41): 10^5 QPs against 1000, after the fence list's fix.
D=$(cd "$(dirname "$0")" && pwd)
L="$D/ld-linux-x86-64.so.2 --library-path $D"
echo "# $(date -u +%FT%TZ) $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in 1 2 3 4; do
  for row in limit:32:1000:1 cqd_rtc:32:1000:1 cqd:32:1000:1 limit:32:100000:1 cqd_rtc:32:100000:1 cqd:32:100000:1 mutex:32:1000:1; do
    echo "round $r $(timeout 25 $L $D/dispatch --random-order --seconds=0.4 --only=$row 2>&1 | grep 'M completions' | tail -1)"
  done
done
