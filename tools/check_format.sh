#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Checks that every C++ file git tracks (but third_party/) is formatted as .clang-format says,
# with clang-format-14 (tools/bootstrap.sh installs it). Prints the files that are not and exits
# non-zero; `tools/check_format.sh --fix` formats them in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mapfile -t files < <(git ls-files -co --exclude-standard '*.cc' '*.h' | grep -v '^third_party/')
if [[ ${1:-} == --fix ]]; then
  clang-format-14 -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if (( ${#bad[@]} > 0 )); then
  echo "check_format: not formatted (tools/check_format.sh --fix): ${bad[*]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
