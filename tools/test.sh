#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# The full test pass (README's test command, what CI runs): installs what is missing, checks the
# formatting (tools/check_format.sh), the licence tags (tools/check_spdx.sh) and the layering
# (tools/check_layers.sh), runs every test,
# then every test but the rxe ones again under ThreadSanitizer and under AddressSanitizer (with
# UBSan), then fuzzes the runtime for about a minute (CQD_FUZZ_SECONDS) and the CM hand-on rule
# for half that, and prints one summary line counting GoogleTest cases: "cqd tests: N passed, M
# failed, K skipped" (a case is skipped only where a sanitizer cannot run it, e.g. under an
# address-space limit). The exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/bootstrap.sh || exit 1

passed=0
failed=0
skipped=0
status=0

# Adds up the GoogleTest cases in the test.xml files under $1.
count_cases() {
  local xml tests failures errors skips
  while IFS= read -r xml; do
    skips=$(grep -c 'result="skipped"' "$xml")
    tests=$(grep -o -m1 '<testsuites[^>]*tests="[0-9]*"' "$xml" | grep -o 'tests="[0-9]*"' | tr -dc 0-9)
    failures=$(grep -o -m1 '<testsuites[^>]*failures="[0-9]*"' "$xml" | grep -o 'failures="[0-9]*"' | tr -dc 0-9)
    errors=$(grep -o -m1 '<testsuites[^>]*errors="[0-9]*"' "$xml" | grep -o 'errors="[0-9]*"' | tr -dc 0-9)
    passed=$((passed + ${tests:-0} - ${failures:-0} - ${errors:-0} - ${skips:-0}))
    skipped=$((skipped + ${skips:-0}))
    failed=$((failed + ${failures:-0} + ${errors:-0}))
  done < <(find -L "$1" -name test.xml 2>/dev/null)
}

run() {  # run <label> <options...> -- <targets...>
  local label=$1 options=() logs rc
  shift
  while [[ $1 != -- ]]; do options+=("$1"); shift; done
  shift
  echo "== $label: bazel test ${options[*]} $*"
  logs=$(bazel info "${options[@]}" bazel-testlogs 2>/dev/null | tail -1)
  rm -rf "$logs"  # count this run's results only
  bazel test "${options[@]}" "$@"
  rc=$?
  count_cases "$logs"
  if (( rc != 0 )); then
    echo "== $label: FAILED (bazel exit $rc)"
    status=1
  fi
}

# Formatting first (a second): every C++ file as .clang-format says.
echo "== format: tools/check_format.sh"
if ! tools/check_format.sh; then
  echo "== format: FAILED"
  status=1
fi

# The licence: LICENSE at the root and an SPDX tag on every source file.
echo "== licence: tools/check_spdx.sh"
if ! tools/check_spdx.sh; then
  echo "== licence: FAILED"
  status=1
fi

# The layers: an include that runs back up a layer must fail to build (a few small builds).
echo "== layers: tools/check_layers.sh"
if ! tools/check_layers.sh; then
  echo "== layers: FAILED"
  status=1
fi

run "all tests" -- //...
run "tests under TSan" --config=tsan --build_tests_only --test_tag_filters=-rxe -- //...
run "tests under ASan" --config=asan --build_tests_only --test_tag_filters=-rxe -- //...

# A bounded libFuzzer run of the runtime (tests/fuzz: clang-14, ASan, UBSan; about 60 s plus the
# build). A finding fails the suite; the input is kept under /tmp (the script says where).
echo "== fuzz: tests/fuzz/run_fuzz.sh ${CQD_FUZZ_SECONDS:-60}"
if ! tests/fuzz/run_fuzz.sh "${CQD_FUZZ_SECONDS:-60}"; then
  echo "== fuzz: FAILED"
  status=1
fi
# The CM hand-on rule (runtime/core/cm_router.h) on the runtime's pollers and consumers, half as long.
cm_seconds=$(( (${CQD_FUZZ_SECONDS:-60} + 1) / 2 ))
echo "== fuzz: tests/fuzz/run_fuzz.sh $cm_seconds cm_handon_fuzz"
if ! tests/fuzz/run_fuzz.sh "$cm_seconds" cm_handon_fuzz; then
  echo "== fuzz: FAILED"
  status=1
fi

echo "cqd tests: $passed passed, $failed failed, $skipped skipped"
exit $status
