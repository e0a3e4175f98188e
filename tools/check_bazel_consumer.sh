#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Checks that a Bazel engine can depend on cqd: examples/bazel_engine, a workspace of its own that
# declares cqd with local_repository and calls cqd_dependencies() (bazel/deps.bzl), must build
# against @cqd//:cqd and @cqd//:cqd_tbb, its binary must deliver every completion on the
# simulated device, and its own `bazel test //...` must pass. Offline; runs from any folder. Uses
# its own output base (CQD_ENGINE_OUTPUT_BASE; default: one per checkout under /tmp, kept between
# runs), so it never touches cqd's. Prints one summary line; exits non-zero, saying which step
# failed, if any does. CI runs it (tools/test.sh).
#
#   tools/check_bazel_consumer.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../examples/bazel_engine" || exit 1

checkout=$(cd ../.. && pwd -P)
output_base=${CQD_ENGINE_OUTPUT_BASE:-${TMPDIR:-/tmp}/cqd-bazel-engine-$(printf '%s' "$checkout" | md5sum | cut -c1-12)}
# The server leaves after 10 idle minutes; --symlink_prefix=/ makes no bazel-* links in the tree.
bazel=(bazel --output_base="$output_base" --max_idle_secs=600)
common=(--symlink_prefix=/)
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() {  # fail <step>: says which step failed, with the end of its output
  echo "check_bazel_consumer: FAILED: $1 (in examples/bazel_engine, --output_base=$output_base):" >&2
  grep -E "^ERROR|: error:|^//.* (FAILED|TIMEOUT|NO STATUS)" "$log" | head -20 >&2 || true
  tail -40 "$log" >&2
  exit 1
}

if ! "${bazel[@]}" build "${common[@]}" //... >"$log" 2>&1; then
  fail "bazel build //..."
fi
if ! "${bazel[@]}" run "${common[@]}" //:engine >"$log" 2>&1; then
  fail "bazel run //:engine"
fi
ran=$(grep -m1 '^bazel engine: OK' "$log") || fail "bazel run //:engine printed no OK line"
if ! "${bazel[@]}" test "${common[@]}" --test_output=errors //... >"$log" 2>&1; then
  fail "bazel test //..."
fi
tests=$(grep -cE '^//[^ ]+ .*PASSED' "$log")
(( tests > 0 )) || fail "bazel test //... ran no test"
echo "check_bazel_consumer: an engine workspace builds on @cqd//:cqd and @cqd//:cqd_tbb; ${ran#bazel engine: }; bazel test: $tests passed"
