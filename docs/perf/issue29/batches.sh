#!/bin/bash
# SPDX-License-Identifier: BSD-2-Clause
# The handoff at every poll batch, before and after, as single rows side by side: ROUNDS rounds of
# cqd at poll batch 1, 8, 32 and 64 with 1000 QPs and with 1 QP, and the mutex pipeline at batch
# 32, alternating which binary goes first, each line with the cross-core probe taken before and
# after it (the "xcore B/A ns" at its end: both under 150 is the fast mode, both at or over it
# the slow one). The binaries are docs/perf/issue29/run.sh's (/tmp/cqd-issue29-dispatch-*).
# Usage: docs/perf/issue29/batches.sh ROUNDS > FILE (on a quiet machine).
set -euo pipefail
rounds=${1:?usage: batches.sh ROUNDS}
exec "$(dirname "${BASH_SOURCE[0]}")/rows.sh" "$rounds" --in-order \
  cqd:1:1000:1 cqd:8:1000:1 cqd:32:1000:1 cqd:64:1000:1 cqd:1:1:1 cqd:8:1:1 cqd:32:1:1 \
  cqd:64:1:1 mutex:32:1000:1
