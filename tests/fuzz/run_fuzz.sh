#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Fuzzes the runtime for a bounded time: tests/fuzz/run_fuzz.sh [seconds, default 60] [target]
#
# `target` is runtime_fuzz (the default: the public API on the simulated device, seeds in
# tests/fuzz/corpus) or cm_handon_fuzz (the CM hand-on rule, seeds in tests/fuzz/cm_corpus).
# Builds //tests/fuzz:TARGET with --config=fuzz (clang-14, libFuzzer, ASan, UBSan) and runs
# it on a scratch copy of its seeds (the committed seeds stay as they are) for `seconds`
# (-max_total_time). Exits 0 if nothing was found; otherwise prints the finding, keeps the scratch
# directory with the crash-*/timeout-* input in it, and exits 1. Reproduce a finding with
#   $(bazel info --config=fuzz bazel-bin)/tests/fuzz/runtime_fuzz CRASH_FILE
# (or the gcc replay driver: bazel run //tests/fuzz:runtime_fuzz -- $PWD/CRASH_FILE), and read
# it with tests/fuzz/decode_input.py CRASH_FILE.
# Environment: CQD_FUZZ_ARGS adds libFuzzer flags (e.g. -seed=N); CQD_FUZZ_DIR names the scratch
# directory instead of a fresh one under /tmp; CQD_FUZZ_CHAOS=1 builds the runtime with its chaos
# points (a finding's log then names the CQD_CHAOS_SEED that replays its pauses).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

seconds=${1:-60}
target=${2:-runtime_fuzz}
case $target in
  runtime_fuzz) seeds=tests/fuzz/corpus max_len=1203 ;;
  cm_handon_fuzz) seeds=tests/fuzz/cm_corpus max_len=512 ;;
  *) seconds=bad ;;
esac
if ! [[ $seconds =~ ^[0-9]+$ ]] || (( seconds < 1 )); then
  echo "usage: tests/fuzz/run_fuzz.sh [seconds] [runtime_fuzz|cm_handon_fuzz]" >&2
  exit 2
fi

configs=(--config=fuzz)
# CQD_FUZZ_CHAOS=1: the runtime built with its chaos points (runtime/base/chaos.h), in an output
# directory of its own; CQD_CHAOS_SEED then replays a finding's schedule of pauses.
[[ ${CQD_FUZZ_CHAOS:-0} == 1 ]] && configs+=(--copt=-DCQD_CHAOS --platform_suffix=-fuzz-chaos)
echo "run_fuzz: building //tests/fuzz:$target with ${configs[*]}"
bazel build "${configs[@]}" "//tests/fuzz:$target" || exit 1
bin="$(bazel info "${configs[@]}" bazel-bin 2>/dev/null)/tests/fuzz/$target"

work=${CQD_FUZZ_DIR:-$(mktemp -d /tmp/cqd-fuzz.XXXXXX)}
mkdir -p "$work/corpus"
cp "$seeds"/* "$work/corpus/"

echo "run_fuzz: fuzzing for ${seconds}s in $work"
# -timeout: libFuzzer's own per-input limit, above the harness's 10 s watchdog. The outer timeout
# only guards against libFuzzer itself not stopping.
# shellcheck disable=SC2086
(cd "$work" && timeout --kill-after=30 $((seconds + 120)) "$bin" \
  -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 -max_len="$max_len" \
  -print_final_stats=1 -artifact_prefix="$work/" ${CQD_FUZZ_ARGS:-} corpus) >"$work/fuzz.log" 2>&1
rc=$?

execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$')
# -fork=N (e.g. with -ignore_crashes=1 in CQD_FUZZ_ARGS) prints no stat:: lines: its last
# "#N: cov: ..." line counts the inputs run.
[[ -n $execs ]] || execs=$(grep -o '^#[0-9]*:' "$work/fuzz.log" | tail -n 1 | tr -dc '0-9')
findings=$(find "$work" -maxdepth 1 \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \
  -o -name 'leak-*' \) | sort)
if (( rc != 0 )) || [[ -n $findings ]]; then
  grep -v '^#[0-9]' "$work/fuzz.log" | grep -v '^"' | tail -n 60
  echo "run_fuzz: FINDING (libFuzzer exit $rc, ${execs:-?} inputs run); kept $work:"
  for f in $findings; do echo "  $f"; done
  exit 1
fi
grep -E '^(Done|stat::|INFO: fuzzed for)' "$work/fuzz.log"
echo "run_fuzz: no finding in ${seconds}s, ${execs:-?} inputs run"
[[ -n ${CQD_FUZZ_DIR:-} ]] || rm -rf "$work"
exit 0
