#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Installs cqd for engines that do not build with Bazel (docs/BUILDING_WITHOUT_BAZEL.md):
#
#   tools/install.sh [--prefix DIR] [--from DIST_DIR]
#
# Builds //:cqd_dist with `bazel build -c opt` and installs, under DIR (default /usr/local):
#   DIR/lib/libcqd.a  DIR/lib/pkgconfig/cqd.pc (prefix=DIR)  DIR/include/cqd/*.h
# --from DIST_DIR skips the build and installs an already built cqd_dist tree (bazel-bin/cqd_dist,
# or its runfiles in //tests/pkgconfig:pkgconfig_test, which runs this script inside Bazel).
# DESTDIR, if set, is put in front of every installed path (packaging); cqd.pc still says DIR.
# BAZEL names the bazel command, startup options included (default: bazel), e.g.
#   BAZEL="bazel --output_base=/tmp/bazel-x" tools/install.sh --prefix /opt/cqd
set -euo pipefail

usage() {
  echo "usage: tools/install.sh [--prefix DIR] [--from DIST_DIR]" >&2
  exit 2
}

prefix=/usr/local
from=
while (( $# > 0 )); do
  case $1 in
    --prefix) (( $# >= 2 )) || usage; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --from) (( $# >= 2 )) || usage; from=$2; shift 2 ;;
    --from=*) from=${1#--from=}; shift ;;
    -h|--help) usage ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
done
[[ -n $prefix ]] || usage
prefix=$(realpath -m -- "$prefix")  # cqd.pc needs an absolute, clean prefix

if [[ -z $from ]]; then
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  read -r -a bazel <<<"${BAZEL:-bazel}"
  "${bazel[@]}" build -c opt //:cqd_dist
  from="$("${bazel[@]}" info -c opt bazel-bin)/cqd_dist"
fi

for f in lib/libcqd.a lib/pkgconfig/cqd.pc include/cqd/runtime.h; do
  if [[ ! -f $from/$f ]]; then
    echo "install.sh: $from is not a cqd_dist tree (no $f)" >&2
    exit 1
  fi
done

dest=${DESTDIR:-}$prefix
install -d "$dest/lib/pkgconfig" "$dest/include/cqd"
install -m 644 "$from/lib/libcqd.a" "$dest/lib/libcqd.a"
# The built cqd.pc is relocatable (prefix=${pcfiledir}/../..); an installed one names its prefix.
sed "s|^prefix=.*|prefix=$prefix|" "$from/lib/pkgconfig/cqd.pc" >"$dest/lib/pkgconfig/cqd.pc.tmp"
chmod 644 "$dest/lib/pkgconfig/cqd.pc.tmp"
mv "$dest/lib/pkgconfig/cqd.pc.tmp" "$dest/lib/pkgconfig/cqd.pc"
install -m 644 "$from"/include/cqd/*.h "$dest/include/cqd/"

echo "install.sh: installed cqd $(sed -n 's/^Version: //p' "$dest/lib/pkgconfig/cqd.pc") under $dest"
echo "install.sh: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs cqd"
