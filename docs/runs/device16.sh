#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# Run on a lent 16-CPU machine from a folder holding dispatch, soak, soak_chaos, runtime_fuzz (the
# binaries soak16.sh and fuzz14.sh name), corpus/, soak16.sh, fuzz14.sh and the Debian libraries
# they link with ld-linux-x86-64.so.2. Usage: OUT=DIR device16.sh
# One lent-machine call: scaling at head, then ten soaks beside two busy loops, then 14 fuzz workers.
D=$(cd "$(dirname "$0")" && pwd)
L="$D/ld-linux-x86-64.so.2 --library-path $D"
date -u; nproc; grep -m1 "model name" /proc/cpuinfo
t0=$(date +%s)
$L $D/dispatch --seconds=0.3 --scaling=3 > $OUT/scaling.txt 2>&1
echo "scaling exit $? after $(( $(date +%s) - t0 )) s"; grep -c "^round" $OUT/scaling.txt
SEED_BASE=300 bash $D/soak16.sh 170 > $OUT/verdicts.txt 2>&1
echo "soak16 exit $? after $(( $(date +%s) - t0 )) s"; cat $OUT/verdicts.txt
bash $D/fuzz14.sh 110 > $OUT/fuzz.txt 2>&1
echo "fuzz14 exit $? after $(( $(date +%s) - t0 )) s"
grep -E "^(stat::number_of_executed_units|worker)" $OUT/fuzz.txt | awk '/units/ {s+=$2} /worker/ {print} END {print "total inputs", s}'
ls $OUT
