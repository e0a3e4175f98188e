#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Builds the API reference of cqd's public headers with Doxygen (docs/api/Doxyfile):
#
#   tools/api_docs.sh [OUT_DIR]          (default: ${TMPDIR:-/tmp}/cqd-api)
#
# writes OUT_DIR/html/index.html. Every public class, function, field and option must be
# documented: any Doxygen warning fails the build (exit 1, the warnings printed).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/cqd-api}
command -v doxygen >/dev/null || { echo "api_docs: doxygen is missing (tools/bootstrap.sh)" >&2; exit 1; }
mkdir -p "$out"
cd "$repo"
warnings=$out/warnings.txt
if ! (cat docs/api/Doxyfile; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $warnings") |
     doxygen - >/dev/null || [[ -s $warnings ]]; then
  cat "$warnings" >&2
  echo "api_docs: doxygen failed or warned ($(wc -l <"$warnings") lines above)" >&2
  exit 1
fi
echo "api_docs: $out/html/index.html ($(ls "$out/html" | wc -l) files, no warning)"
