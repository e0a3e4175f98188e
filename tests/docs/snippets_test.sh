#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# //tests/docs:snippets_test: the documents' C++ blocks are real code.
#
#   snippets_test.sh SOURCE.cc... -- DOC.md... -- PUBLIC_HEADERS...
#
# Every ```cpp (or ```c++) block of each DOC must follow a line "<!-- snippet NAME -->" and equal
# the region "// [snippet NAME]" ... "// [end NAME]" of one of the SOURCEs, less the region's
# common indentation; every region must be shown by some document. Then each SOURCE must compile
# with g++ and with clang++ (-std=c++20 -Wall -Wextra -Werror) against the public headers, as an
# engine's build would. Exit code: 0 iff all of it holds.
set -uo pipefail
sources=()
while [[ $1 != -- ]]; do sources+=("$1"); shift; done
shift
docs=()
while [[ $1 != -- ]]; do docs+=("$1"); shift; done
shift
include=
for h in "$@"; do [[ $h == */cqd/runtime.h ]] && include=$(dirname "$(dirname "$h")"); done
[[ -n $include ]] || { echo "FAIL: no cqd/runtime.h among the headers"; exit 1; }
work=${TEST_TMPDIR:-$(mktemp -d)}
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# region NAME: the region's lines, less their common indentation.
region() {
  awk -v name="$1" '
    $0 ~ "^[ \t]*// \\[snippet " name "\\]$" { inside = 1; next }
    $0 ~ "^[ \t]*// \\[end " name "\\]$" { inside = 0 }
    inside { lines[n++] = $0 }
    END {
      indent = 1000
      for (i = 0; i < n; i++) {
        if (lines[i] ~ /^[ \t]*$/) continue
        match(lines[i], /^ */)
        if (RLENGTH < indent) indent = RLENGTH
      }
      for (i = 0; i < n; i++) print (lines[i] ~ /^[ \t]*$/) ? "" : substr(lines[i], indent + 1)
    }' "${sources[@]}"
}

shown=()
for doc in "${docs[@]}"; do
  # Writes each block to $work/<NAME>.doc and lists "NAME LINE", or "- LINE" for an unmarked one.
  while read -r name line; do
    if [[ $name == - ]]; then
      fail "$(basename "$doc"):$line: a C++ block without a <!-- snippet NAME --> line before it"
      continue
    fi
    shown+=("$name")
    want=$(region "$name")
    if [[ -z $want ]]; then
      fail "$(basename "$doc"):$line: no region '$name' in ${sources[*]##*/}"
    elif ! diff <(echo "$want") "$work/$name.doc" >"$work/$name.diff"; then
      fail "$(basename "$doc"):$line: block '$name' differs from its source's region:"
      cat "$work/$name.diff"
    else
      echo "ok: $(basename "$doc"):$line: '$name' is its source's region"
    fi
  done < <(awk -v out="$work" '
    /^```(cpp|c\+\+)$/ {
      name = "-"
      if (prev ~ /^<!-- snippet [a-z0-9-]+ -->$/) { split(prev, w, " "); name = w[3] }
      print name, NR; inside = 1; file = out "/" name ".doc"; printf "" > file; prev = $0; next
    }
    inside && /^```$/ { inside = 0; close(file) }
    inside { print $0 > file }
    { prev = $0 }' "$doc")
done
while read -r name; do
  [[ " ${shown[*]} " == *" $name "* ]] || fail "region '$name' is shown by no document"
done < <(sed -n 's|^[ \t]*// \[snippet \([a-z0-9-]*\)\]$|\1|p' "${sources[@]}")

for source in "${sources[@]}"; do
  for cxx in g++ clang++-14; do
    if "$cxx" -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$include" "$source" \
         >"$work/$cxx.log" 2>&1; then
      echo "ok: $cxx -std=c++20 -Wall -Wextra -Werror compiles $(basename "$source")"
    else
      cat "$work/$cxx.log"
      fail "$cxx does not compile $(basename "$source") warning-free"
    fi
  done
done
if (( failures > 0 )); then
  echo "snippets_test: $failures failure(s)"
  exit 1
fi
echo "snippets_test: PASS"
