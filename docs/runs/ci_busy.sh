#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# The README's test command on a busy machine (issue 48): a fresh clone of /work/main's main, then
# `CI=true bash .ci/run` in it while two busy loops (`while :; do :; done`) run beside it, on the
# 2-vCPU test machine; prints a header and a footer with the commit, the exit code and the time.
#   docs/runs/ci_busy.sh > docs/runs/ci_busy_COMMIT.txt 2>&1
# (The kept log is cut to its headers, the summary of each step and the end, see INDEX.md.)
set -u
rm -rf /tmp/ci-clone
git clone -q /work/main /tmp/ci-clone
cd /tmp/ci-clone || exit 1
commit=$(git rev-parse HEAD)
( while :; do :; done ) & h1=$!
( while :; do :; done ) & h2=$!
echo "=== start $(date -u +%FT%TZ) commit $commit; busy loops pids $h1 $h2; nproc $(nproc)"
start=$(date +%s)
CI=true bash .ci/run
rc=$?
end=$(date +%s)
kill $h1 $h2
echo "=== end $(date -u +%FT%TZ) commit $commit exit $rc elapsed $((end - start)) s beside two busy loops"
exit $rc
