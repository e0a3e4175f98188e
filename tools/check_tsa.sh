#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Clang's thread-safety analysis over the whole tree (runtime/base/thread_annotations.h):
# `bazel build --config=tsa //...` (clang-14, -Wthread-safety -Werror) must pass, and so must
# //tests/tsa:guarded_access, while //tests/tsa:unguarded_access (a guarded field read without
# its lock) must fail with the analysis' error, so that a pass means the analysis ran. Exits
# non-zero, saying which, if any of this is not so.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! bazel build --config=tsa //... //tests/tsa:guarded_access >"$log" 2>&1; then
  echo "check_tsa: the tree does not build under --config=tsa:" >&2
  grep -E "error:" "$log" | head -40 >&2 || tail -20 "$log" >&2
  exit 1
fi
if bazel build --config=tsa //tests/tsa:unguarded_access >"$log" 2>&1; then
  echo "check_tsa: //tests/tsa:unguarded_access built: the analysis is not running" >&2
  exit 1
fi
if ! grep -q "requires holding mutex 'mu_'" "$log"; then
  echo "check_tsa: //tests/tsa:unguarded_access failed for another reason:" >&2
  tail -20 "$log" >&2
  exit 1
fi
echo "check_tsa: the tree passes the thread-safety analysis; an unguarded access fails it"
