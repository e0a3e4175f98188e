#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# A short soak (//tools:soak_short_test): 2*10^5 completions at 5*10^4/s (about 4 s) with every
# fault kind (error completions, registration churn where half the QPs leave by a drained
# TeardownQp and the rest by Unregister, spurious events, EINTR/EAGAIN storms, QP and port
# events, an engine-driven consumer that stops draining for 400 ms every second, long enough to
# fill its queue and its 512-item spills so that the pollers stall on its CQs). Then a second,
# shorter run in the shape that once lost and duplicated completions: tiny queues and spills, every
# churn a drained teardown with a 20 ms deadline (so that many end undrained while a paused
# consumer holds their CQs back and their QP is destroyed at once, its qp_num going to the next
# QP), faults and split CQs. Fails on any finding of the tool. SOAK_SEED=N repeats a run's random
# choices (timing still varies). The first run spells its flags with underscores, the second
# with dashes: both name the same flags.
set -uo pipefail
soak=$1
"$soak" --version | grep -Eq '^soak \(cqd\) [0-9]+\.[0-9]+\.[0-9]+$' ||
  { echo "soak_short_test: soak --version failed" >&2; exit 1; }
"$soak" --completions=200000 --rate=50000 --qps=48 --cqs=4 --depth=256 --queue_capacity=1024 \
  --spill_capacity=512 --qp_wrs=512 --churn_ms=2 --teardown_permille=500 --fault_ms=2 \
  --pause_every=1 --pause_ms=400 --error_permille=20 --drain_timeout=60 \
  --seed="${SOAK_SEED:-$RANDOM}"
rc=$?
if (( rc != 0 )); then
  echo "soak_short_test: soak exited with $rc" >&2
  exit 1
fi
"$soak" --completions=200000 --rate=50000 --qps=48 --cqs=4 --depth=256 --queue-capacity=4 \
  --spill-capacity=2 --qp-wrs=64 --churn-ms=2 --teardown-permille=1000 --teardown-timeout-ms=20 \
  --fault_ms=5 --pause_every=1 --pause_ms=300 --split_every=2 --error_permille=200 \
  --drain_timeout=60 --seed="${SOAK_SEED:-$RANDOM}"
rc=$?
if (( rc != 0 )); then
  echo "soak_short_test: the undrained-teardown soak exited with $rc" >&2
  exit 1
fi
# The same tight shape with shard 1 engine-driven: a reactor thread of the tool polls it and
# sleeps in epoll on its shard fd, and consumer 0 runs to completion on it. Incarnation tags of 2
# bits wrap every four QPs, so the tool's books must keep two incarnations of one qp_num apart
# when their tags come round again (with 15 bits they wrapped only in long runs, and a 20-minute
# edge soak once reported completions lost that were the tool's own misattribution).
"$soak" --completions=200000 --rate=50000 --qps=48 --cqs=4 --depth=256 --queue-capacity=4 \
  --spill-capacity=2 --qp-wrs=64 --churn-ms=2 --teardown-permille=1000 --teardown-timeout-ms=20 \
  --fault_ms=5 --pause_every=1 --pause_ms=300 --split_every=2 --error_permille=200 \
  --drain_timeout=60 --engine_shard=1 --tag_bits=2 --seed="${SOAK_SEED:-$RANDOM}"
rc=$?
if (( rc != 0 )); then
  echo "soak_short_test: the engine-driven shard soak exited with $rc" >&2
  exit 1
fi
# Consumers 1 and 2 hosted in a oneTBB arena (cqd::ArenaConsumers) instead of the tool's engine
# threads, with shard 1 engine-driven too.
"$soak" --completions=200000 --rate=50000 --qps=48 --cqs=4 --depth=256 --queue-capacity=4 \
  --spill-capacity=2 --qp-wrs=64 --churn-ms=2 --teardown-permille=1000 --teardown-timeout-ms=20 \
  --fault_ms=5 --split_every=2 --error_permille=200 --drain_timeout=60 --engine_shard=1 --arena=1 \
  --seed="${SOAK_SEED:-$RANDOM}"
rc=$?
if (( rc != 0 )); then
  echo "soak_short_test: the arena soak exited with $rc" >&2
  exit 1
fi
