#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Files small enough to hold in one's head: no .cc under runtime/ over 400 lines. Prints the
# ones that are and exits non-zero.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

limit=400
bad=()
while IFS= read -r file; do
  lines=$(wc -l < "$file")
  (( lines > limit )) && bad+=("$file ($lines lines)")
done < <(find runtime -name '*.cc' | sort)
if (( ${#bad[@]} > 0 )); then
  echo "check_sizes: over $limit lines: ${bad[*]}" >&2
  exit 1
fi
echo "check_sizes: every runtime .cc within $limit lines"
