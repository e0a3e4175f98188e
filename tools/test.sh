#!/usr/bin/env bash
# Full test pass: install deps, run every test, then the stress-tagged tests under TSan.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tools/bootstrap.sh

bazel test //...

# Bazel exits 4 when the tag filter matches no tests; that's fine.
rc=0
bazel test --config=tsan --build_tests_only --test_tag_filters=stress //... || rc=$?
if (( rc == 4 )); then
  echo "test.sh: no 'stress'-tagged tests to run under TSan"
elif (( rc != 0 )); then
  exit "$rc"
fi
