#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# The full test pass (README's test command, what CI runs): installs what is missing, checks the
# formatting (tools/check_format.sh), the licence tags (tools/check_spdx.sh), the man pages
# (tools/man, rendered with man -l), the layering
# (tools/check_layers.sh), the runtime's file sizes (tools/check_sizes.sh) and Clang's
# thread-safety analysis (tools/check_tsa.sh: the tree built with -Wthread-safety -Werror) and that
# a Bazel engine builds on cqd (tools/check_bazel_consumer.sh: examples/bazel_engine), runs
# every test, then every test but the rxe ones again under ThreadSanitizer, under AddressSanitizer
# (with UBSan; and the reactor engine across two VMs on rxe) and under the chaos build (seeded
# pauses at the runtime's synchronization points), then
# fuzzes the runtime for about a minute (CQD_FUZZ_SECONDS) and the CM hand-on rule for half that,
# both with the chaos points on, builds the API reference (tools/api_docs.sh: a Doxygen warning
# fails) and the Debian packages (tools/build_debs.sh: lintian, the symbols file, engines built
# against the unpacked packages), and prints one summary line counting GoogleTest cases: "cqd
# tests: N passed, M failed, K skipped" (a case is skipped only where a sanitizer cannot run it,
# e.g. under an address-space limit). A check, fuzz run or test target that fails without a
# failed case of its own (a shell test, a sanitizer report after the last case, a timeout)
# counts as one failure. The exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/bootstrap.sh || exit 1

passed=0
failed=0
skipped=0
status=0

# Adds up the GoogleTest cases in the test.xml files under $1; sets failed_xmls to how many of
# those files counted a failure.
count_cases() {
  local xml tests failures errors skips
  failed_xmls=0
  while IFS= read -r xml; do
    skips=$(grep -c 'result="skipped"' "$xml")
    tests=$(grep -o -m1 '<testsuites[^>]*tests="[0-9]*"' "$xml" | grep -o 'tests="[0-9]*"' | tr -dc 0-9)
    failures=$(grep -o -m1 '<testsuites[^>]*failures="[0-9]*"' "$xml" | grep -o 'failures="[0-9]*"' | tr -dc 0-9)
    errors=$(grep -o -m1 '<testsuites[^>]*errors="[0-9]*"' "$xml" | grep -o 'errors="[0-9]*"' | tr -dc 0-9)
    passed=$((passed + ${tests:-0} - ${failures:-0} - ${errors:-0} - ${skips:-0}))
    (( ${failures:-0} + ${errors:-0} > 0 )) && failed_xmls=$((failed_xmls + 1))
    skipped=$((skipped + ${skips:-0}))
    failed=$((failed + ${failures:-0} + ${errors:-0}))
  done < <(find -L "$1" -name test.xml 2>/dev/null)
}

run() {  # run <label> <options...> -- <targets...>
  local label=$1 options=() logs rc out failed_targets
  shift
  while [[ $1 != -- ]]; do options+=("$1"); shift; done
  shift
  echo "== $label: bazel test ${options[*]} $*"
  logs=$(bazel info "${options[@]}" bazel-testlogs 2>/dev/null | tail -1)
  rm -rf "$logs"  # count this run's results only
  out=$(mktemp)
  bazel test "${options[@]}" "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  count_cases "$logs"
  # A target can fail with no failed case in its test.xml (a shell test, a sanitizer report after
  # the last case, a crash, a timeout): each such target counts as one failure.
  failed_targets=$(grep -cE '^//[^ ]+ +(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FAILED TO BUILD)' "$out")
  rm -f "$out"
  if (( failed_targets > failed_xmls )); then
    failed=$((failed + failed_targets - failed_xmls))
  fi
  if (( rc != 0 )); then
    echo "== $label: FAILED (bazel exit $rc, $failed_targets targets failed)"
    status=1
    (( failed_targets == 0 )) && failed=$((failed + 1))  # a build failure: nothing ran
  fi
}

# Formatting first (a second): every C++ file as .clang-format says.
echo "== format: tools/check_format.sh"
if ! tools/check_format.sh; then
  echo "== format: FAILED"
  status=1
  failed=$((failed + 1))
fi

# The licence: LICENSE at the root and an SPDX tag on every source file.
echo "== licence: tools/check_spdx.sh"
if ! tools/check_spdx.sh; then
  echo "== licence: FAILED"
  status=1
  failed=$((failed + 1))
fi

# The man pages (tools/man: cqd(7), cqd::Runtime(3), cqd_top(1), ...): each renders, and groff
# has no warning about it.
echo "== man pages: man --warnings -l tools/man/*"
for page in tools/man/*.[1-9]; do
  if ! out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null) || [[ -n $out ]]; then
    echo "== man pages: FAILED: $page: $out"
    status=1
    failed=$((failed + 1))
  fi
done

# The layers: an include that runs back up a layer must fail to build (a few small builds).
echo "== layers: tools/check_layers.sh"
if ! tools/check_layers.sh; then
  echo "== layers: FAILED"
  status=1
  failed=$((failed + 1))
fi

# The size of a file: no runtime .cc over 400 lines (split by concern instead).
echo "== sizes: tools/check_sizes.sh"
if ! tools/check_sizes.sh; then
  echo "== sizes: FAILED"
  status=1
  failed=$((failed + 1))
fi

# Clang's thread-safety analysis: the whole tree under -Wthread-safety -Werror, and a guarded field
# read without its lock must fail it.
echo "== thread safety: tools/check_tsa.sh"
if ! tools/check_tsa.sh; then
  echo "== thread safety: FAILED"
  status=1
  failed=$((failed + 1))
fi

# A Bazel engine in a workspace of its own (examples/bazel_engine): @cqd//:cqd and @cqd//:cqd_tbb
# through cqd_dependencies(), built, run and tested with its own output base.
echo "== Bazel consumer: tools/check_bazel_consumer.sh"
if ! tools/check_bazel_consumer.sh; then
  echo "== Bazel consumer: FAILED"
  status=1
  failed=$((failed + 1))
fi

run "all tests" -- //...
run "tests under TSan" --config=tsan --build_tests_only --test_tag_filters=-rxe -- //...
run "tests under ASan" --config=asan --build_tests_only --test_tag_filters=-rxe -- //...
# One engine on rxe under ASan too (the runtime's ASan build is made already): the reactor server
# across two VMs, where connections come and go on engine-driven shards. A purge that read past
# the slot pool crashed it only under load, and ASan showed where at once.
run "the reactor engine across two VMs under ASan" --config=asan -- //tests:reactor_two_hosts_test
# The chaos build (runtime/base/chaos.h): every synchronization point takes seeded pauses, so that
# races a busy machine shows come out on a quiet one; the soak, the fuzz corpus and every
# concurrency test run under it. The seed is printed in each test's log.
run "tests under the chaos build" --config=chaos --build_tests_only --test_tag_filters=-rxe,-packaging \
  --test_env=CQD_CHAOS_SEED="${CQD_CHAOS_SEED:-$RANDOM}" -- //...

# A bounded libFuzzer run of the runtime (tests/fuzz: clang-14, ASan, UBSan; about 60 s plus the
# build), with the chaos points on. A finding fails the suite; the input is kept under /tmp (the
# script says where).
export CQD_FUZZ_CHAOS=1
echo "== fuzz: CQD_FUZZ_CHAOS=1 tests/fuzz/run_fuzz.sh ${CQD_FUZZ_SECONDS:-60}"
if ! tests/fuzz/run_fuzz.sh "${CQD_FUZZ_SECONDS:-60}"; then
  echo "== fuzz: FAILED"
  status=1
  failed=$((failed + 1))
fi
# The CM hand-on rule (runtime/core/cm_router.h) on the runtime's pollers and consumers, half as long.
cm_seconds=$(( (${CQD_FUZZ_SECONDS:-60} + 1) / 2 ))
echo "== fuzz: tests/fuzz/run_fuzz.sh $cm_seconds cm_handon_fuzz"
if ! tests/fuzz/run_fuzz.sh "$cm_seconds" cm_handon_fuzz; then
  echo "== fuzz: FAILED"
  status=1
  failed=$((failed + 1))
fi

# The API reference: Doxygen over the public headers, where a warning (anything undocumented) fails.
echo "== API reference: tools/api_docs.sh"
if ! tools/api_docs.sh "$(mktemp -d)"; then
  echo "== API reference: FAILED"
  status=1
  failed=$((failed + 1))
fi

# The Debian packages: built from a copy of the tree with dpkg-buildpackage (offline), checked
# against the symbols file and by lintian, unpacked into a scratch root, and CMake, Meson and
# pkg-config engines built against that root and run.
echo "== Debian packages: tools/build_debs.sh"
if ! tools/build_debs.sh "$(mktemp -d)/debs"; then
  echo "== Debian packages: FAILED"
  status=1
  failed=$((failed + 1))
fi

echo "cqd tests: $passed passed, $failed failed, $skipped skipped"
exit $status
