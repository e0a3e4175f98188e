#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Checks that the build enforces the runtime's layers (docs/DESIGN.md section 2): every
# //tests/layers:*_includes_* target (a file that includes a header of a layer above the one its
# target depends on) must fail to build for that include, and //tests/layers:each_layer_builds
# must build, and so must //tests/layers:tbb_layer_builds. The optional oneTBB layer (runtime/tbb)
# depends on //:cqd, whose deps carry every layer's headers, so there the build cannot refuse an
# include: its quoted includes must name cqd/ or runtime/tbb/ headers, or base's lock headers
# (runtime/base/mutex.h, thread_annotations.h: inline, so nothing of base is linked twice). Exits non-zero, naming the
# target or the include, if any of this is not so.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! bazel build //tests/layers:each_layer_builds //tests/layers:tbb_layer_builds >"$log" 2>&1; then
  echo "check_layers: //tests/layers:each_layer_builds or :tbb_layer_builds does not build:" >&2
  tail -20 "$log" >&2
  exit 1
fi
for cc in tests/layers/*_includes_*.cc; do
  target=$(basename "$cc" .cc)
  if bazel build "//tests/layers:$target" >"$log" 2>&1; then
    echo "check_layers: //tests/layers:$target built: an include ran back up a layer" >&2
    status=1
  elif ! grep -qE "No such file or directory|undeclared inclusion" "$log"; then
    echo "check_layers: //tests/layers:$target failed for another reason:" >&2
    tail -20 "$log" >&2
    status=1
  fi
done
if bad=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' runtime/tbb/*.cc runtime/tbb/*.h \
    include/cqd/tbb.h | grep -vE '#[[:space:]]*include[[:space:]]*"(cqd/|runtime/tbb/|runtime/base/(mutex|thread_annotations)\.h")'); then
  echo "check_layers: runtime/tbb may include only cqd/, runtime/tbb/ and base's lock headers:" >&2
  echo "$bad" >&2
  status=1
fi
(( status == 0 )) && echo "check_layers: every include up a layer fails to build"
exit $status
