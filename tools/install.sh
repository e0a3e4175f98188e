#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Installs cqd for engines that do not build with Bazel (docs/BUILDING_WITHOUT_BAZEL.md), or
# removes what it installed:
#
#   tools/install.sh [--prefix DIR] [--libdir DIR] [--from DIST_DIR] [--no-manifest]
#   tools/install.sh --uninstall [--prefix DIR] [--libdir DIR]
#   tools/install.sh --help | --version
#
# Builds //:cqd_dist and //:cqd_tbb_dist with `bazel build -c opt` and installs, under PREFIX
# (default /usr/local) and
# LIBDIR (default PREFIX/lib; a relative LIBDIR is taken under PREFIX, e.g. lib/x86_64-linux-gnu
# or lib64):
#   LIBDIR/libcqd.a
#   LIBDIR/libcqd.so.X.Y.Z, with the links libcqd.so.X (the soname; libcqd.so.0.Y while X is 0)
#   and libcqd.so
#   LIBDIR/pkgconfig/cqd.pc                       (pkg-config; also what Meson uses)
#   LIBDIR/cmake/cqd/cqd{Config,ConfigVersion}.cmake  (find_package(cqd): cqd::cqd, cqd::tbb)
#   PREFIX/include/cqd/*.h
#   and the oneTBB layer, from cqd_tbb_dist beside DIST_DIR when there is one:
#   LIBDIR/libcqd_tbb.a, LIBDIR/pkgconfig/cqd-tbb.pc, PREFIX/include/cqd/tbb.h
#   and cqd_top, from tools/cqd_top beside DIST_DIR when it was built:
#   PREFIX/bin/cqd_top, PREFIX/share/man/man1/cqd_top.1
#   PREFIX/share/cqd/install_manifest.txt          (what --uninstall removes; not written with
#                                                   --no-manifest: a package manager's install)
# The version (X.Y.Z) comes from include/cqd/version.h. --from DIST_DIR skips the build and
# installs an already built cqd_dist tree (bazel-bin/cqd_dist, or its runfiles in
# //tests/pkgconfig:pkgconfig_test, which runs this script inside Bazel). DESTDIR, if set, is put
# in front of every installed path (packaging); the files still name PREFIX and LIBDIR.
# --uninstall removes the files the manifest lists, then the folders they were in if that left
# them empty (up to PREFIX). An install over an earlier one removes the earlier one's files first.
# BAZEL names the bazel command, startup options included (default: bazel), e.g.
#   BAZEL="bazel --output_base=/tmp/bazel-x" tools/install.sh --prefix /opt/cqd
set -euo pipefail

usage() {  # usage [CODE]: to stdout and exit 0 for --help; to stderr and exit 2 otherwise
  local text="usage: tools/install.sh [--uninstall] [--prefix DIR] [--libdir DIR] [--from DIST_DIR] [--no-manifest] [--version]"
  if [[ ${1:-2} == 0 ]]; then echo "$text"; exit 0; fi
  echo "$text" >&2
  exit 2
}

prefix=/usr/local
libdir=
from=
uninstall=false
manifest_wanted=true
while (( $# > 0 )); do
  case $1 in
    --prefix) (( $# >= 2 )) || usage; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --libdir) (( $# >= 2 )) || usage; libdir=$2; shift 2 ;;
    --libdir=*) libdir=${1#--libdir=}; shift ;;
    --from) (( $# >= 2 )) || usage; from=$2; shift 2 ;;
    --from=*) from=${1#--from=}; shift ;;
    --uninstall) uninstall=true; shift ;;
    --no-manifest) manifest_wanted=false; shift ;;
    -h|--help) usage 0 ;;
    --version)
      sed -n 's/^#define CQD_VERSION_STRING "\(.*\)"$/install.sh (cqd) \1/p' \
        "$(dirname "${BASH_SOURCE[0]}")/../include/cqd/version.h"
      exit 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage ;;
  esac
done
[[ -n $prefix ]] || usage
prefix=$(realpath -m -- "$prefix")  # cqd.pc needs an absolute, clean prefix
[[ -n $libdir ]] || libdir=lib
[[ $libdir == /* ]] || libdir=$prefix/$libdir
libdir=$(realpath -m -- "$libdir")
root=${DESTDIR:-}
manifest=$prefix/share/cqd/install_manifest.txt

# Removes the files the manifest lists, the manifest, and then each folder they were in that is
# left empty, up to (not including) the prefix, and every folder the install made ("dir PATH"
# lines: a --libdir outside the prefix) that is left empty.
remove_installed() {
  local line dir
  local -a dirs=() made=()
  while IFS= read -r line; do
    if [[ $line == "dir /"* ]]; then
      made+=("${line#dir }")
      continue
    fi
    [[ $line == /* ]] || continue
    rm -f -- "$root$line"
    dirs+=("$(dirname "$line")")
  done <"$root$manifest"
  rm -f -- "$root$manifest"
  dirs+=("$(dirname "$manifest")")
  for dir in "${dirs[@]}"; do
    while [[ $dir == "$prefix"/* ]] && rmdir -- "$root$dir" 2>/dev/null; do
      dir=$(dirname "$dir")
    done
  done
  for dir in "${made[@]}"; do  # deepest first: the install listed them so
    rmdir -- "$root$dir" 2>/dev/null || true
  done
}

if $uninstall; then
  if [[ ! -f $root$manifest ]]; then
    echo "install.sh: no cqd installed under $root$prefix (no $root$manifest)" >&2
    exit 1
  fi
  remove_installed
  echo "install.sh: removed cqd from $root$prefix"
  exit 0
fi

if [[ -z $from ]]; then
  cd "$(dirname "${BASH_SOURCE[0]}")/.."
  read -r -a bazel <<<"${BAZEL:-bazel}"
  "${bazel[@]}" build -c opt //:cqd_dist //:cqd_tbb_dist //tools:cqd_top
  from="$("${bazel[@]}" info -c opt bazel-bin)/cqd_dist"
fi

for f in lib/libcqd.a lib/pkgconfig/cqd.pc include/cqd/runtime.h include/cqd/version.h \
         cmake/cqdConfig.cmake.in cmake/cqdConfigVersion.cmake.in; do
  if [[ ! -f $from/$f ]]; then
    echo "install.sh: $from is not a cqd_dist tree (no $f)" >&2
    exit 1
  fi
done
define() { sed -n "s/^#define $1 \\(.*\\)\$/\\1/p" "$from/include/cqd/version.h" | tr -d '"'; }
major=$(define CQD_VERSION_MAJOR) minor=$(define CQD_VERSION_MINOR)
soversion=$major  # the soname's: libcqd.so.MAJOR, or libcqd.so.0.MINOR while MAJOR is 0
[[ $major == 0 ]] && soversion=0.$minor
version=$(define CQD_VERSION_STRING)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "install.sh: bad version '$version'" >&2; exit 1; }

# A cqd installed here before goes first: what this one does not ship (a shared library, from a
# sanitizer build) must not stay behind, where find_package would still pick it.
[[ -f $root$manifest ]] && remove_installed

installed=()
made_dirs=()
note_dirs() {  # note_dirs DEST: the folders outside the prefix that DEST's install will make
  local dir
  dir=$(dirname "$1")
  while [[ $dir != / && ! -d $root$dir ]]; do
    # Those in the prefix go as they always did (up to the prefix); these are the others.
    if [[ $dir != "$prefix" && $dir != "$prefix"/* && " ${made_dirs[*]} " != *" $dir "* ]]; then
      made_dirs+=("$dir")
    fi
    dir=$(dirname "$dir")
  done
}
put() {  # put MODE SOURCE DEST: copies a file (its target, for a link), replacing DEST atomically
  note_dirs "$3"
  install -D -m "$1" "$2" "$root$3.tmp"
  mv -f "$root$3.tmp" "$root$3"
  installed+=("$3")
}
fill() {  # fill TEMPLATE DEST SED_SCRIPT...: a template with its @NAMES@ replaced
  local template=$1 dest=$2
  shift 2
  note_dirs "$dest"
  mkdir -p "$(dirname "$root$dest")"
  sed "$@" "$template" >"$root$dest.tmp"
  chmod 644 "$root$dest.tmp"
  mv -f "$root$dest.tmp" "$root$dest"
  installed+=("$dest")
}

put 644 "$from/lib/libcqd.a" "$libdir/libcqd.a"
if [[ -f $from/shared/libcqd.so ]]; then  # none in sanitizer builds
  put 755 "$from/shared/libcqd.so" "$libdir/libcqd.so.$version"
  ln -sfn "libcqd.so.$version" "$root$libdir/libcqd.so.$soversion"
  ln -sfn "libcqd.so.$soversion" "$root$libdir/libcqd.so"
  installed+=("$libdir/libcqd.so.$soversion" "$libdir/libcqd.so")
fi
# The built cqd.pc is relocatable (prefix=${pcfiledir}/../..); an installed one names its prefix
# and libdir.
fill "$from/lib/pkgconfig/cqd.pc" "$libdir/pkgconfig/cqd.pc" \
  -e "s|^prefix=.*|prefix=$prefix|" -e "s|^libdir=.*|libdir=$libdir|"
cmake_dir=$libdir/cmake/cqd
fill "$from/cmake/cqdConfig.cmake.in" "$cmake_dir/cqdConfig.cmake" \
  -e "s|@LIBDIR_FROM_CONFIG@|$(realpath -m --relative-to="$cmake_dir" "$libdir")|" \
  -e "s|@INCLUDEDIR_FROM_CONFIG@|$(realpath -m --relative-to="$cmake_dir" "$prefix/include")|" \
  -e "s|@VERSION@|$version|g" -e "s|@SOVERSION@|$soversion|g"
fill "$from/cmake/cqdConfigVersion.cmake.in" "$cmake_dir/cqdConfigVersion.cmake" \
  -e "s|@VERSION@|$version|g" -e "s|@VERSION_MAJOR@|$major|g" -e "s|@VERSION_MINOR@|$minor|g"
for header in "$from"/include/cqd/*.h; do
  put 644 "$header" "$prefix/include/cqd/$(basename "$header")"
done
# The oneTBB layer: its own static library and .pc, and cqd/tbb.h (cqd::tbb in the CMake package
# appears where libcqd_tbb.a is).
tbb_from=$(dirname "$from")/cqd_tbb_dist
if [[ -f $tbb_from/lib/libcqd_tbb.a ]]; then
  put 644 "$tbb_from/lib/libcqd_tbb.a" "$libdir/libcqd_tbb.a"
  fill "$tbb_from/lib/pkgconfig/cqd-tbb.pc" "$libdir/pkgconfig/cqd-tbb.pc" \
    -e "s|^prefix=.*|prefix=$prefix|" -e "s|^libdir=.*|libdir=$libdir|"
  put 644 "$tbb_from/include/cqd/tbb.h" "$prefix/include/cqd/tbb.h"
fi
# cqd_top and its man page.
top=$(dirname "$from")/tools/cqd_top
if [[ -f $top ]]; then
  put 755 "$top" "$prefix/bin/cqd_top"
  man_page=$(dirname "${BASH_SOURCE[0]}")/man/cqd_top.1
  [[ -f $man_page ]] && put 644 "$man_page" "$prefix/share/man/man1/cqd_top.1"
fi
if $manifest_wanted; then
  note_dirs "$manifest"
  mkdir -p "$(dirname "$root$manifest")"
  {
    printf '%s\n' "${installed[@]}"
    # The folders made, deepest first: those outside the prefix go at --uninstall too.
    for dir in "${made_dirs[@]}"; do printf 'dir %s\n' "$dir"; done |
      awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
  } >"$root$manifest"
fi

echo "install.sh: installed cqd $version under $root$prefix (libraries in $root$libdir)"
echo "install.sh: PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs cqd"
echo "install.sh: CMake: find_package(cqd) with CMAKE_PREFIX_PATH=$prefix"
