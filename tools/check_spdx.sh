#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Checks that every source file git tracks (C++, shell, Python, gnuplot, Bazel, CMake, linker
# scripts, CI and config files) names cqd's licence in an SPDX tag within its first three lines,
# and that the licence text is at the root (LICENSE). Prints each file that lacks it; exits 1 if any does. CI runs it
# (tools/test.sh).
#
#   tools/check_spdx.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly tag="SPDX-License-Identifier: BSD-2-Clause"
status=0
if ! grep -q "BSD 2-Clause License" LICENSE 2>/dev/null; then
  echo "check_spdx: LICENSE is missing or is not the BSD 2-Clause licence"
  status=1
fi
count=0
while IFS= read -r -d '' file; do
  count=$((count + 1))
  if ! head -n 3 -- "$file" | grep -qF "$tag"; then
    echo "check_spdx: no '$tag' in the first 3 lines of $file"
    status=1
  fi
done < <(git ls-files -z -- '*.cc' '*.h' '*.sh' '*.py' '*.bzl' '*.gp' 'BUILD' '*/BUILD' \
  '*.BUILD' '*.cmake.in' '*.map' 'WORKSPACE' '*/WORKSPACE' '.ci/run' '.bazelrc' '.clang-format' \
  '.gitignore')
(( status == 0 )) && echo "check_spdx: $count files tagged"
exit $status
