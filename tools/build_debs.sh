#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Builds cqd's Debian packages from this tree, offline, and checks them as a packager would:
#
#   tools/build_debs.sh [OUT_DIR]        (default: ${TMPDIR:-/tmp}/cqd-debs)
#
# OUT_DIR is removed first (rm -rf) and made again: give it a folder of its own.
# 1. Copies the tree (tracked files and untracked ones git does not ignore) to OUT_DIR/cqd-VERSION
#    and runs `dpkg-buildpackage -us -uc -b` there (debian/rules: Bazel, offline, Debian's
#    flags). The .debs land in OUT_DIR: libcqd0.1, libcqd-dev, cqd-tools and their -dbgsym.
#    The symbols file (debian/libcqd0.1.symbols) is checked during the build: an ABI change
#    fails it.
# 2. lintian on the result: no error or warning, with no tag overridden.
# 3. Unpacks every package into a scratch root (dpkg -x; nothing is installed on this machine)
#    and builds engines against that root as an engine's build would: pkg-config (cqd and
#    cqd-tbb), CMake (cqd::cqd, cqd::tbb) and Meson; each runs on the simulated device and must
#    deliver every completion. cqd_top from the root answers --version.
# Exit code: 0 iff all of it passed. Needs the packages tools/bootstrap.sh installs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/cqd-debs}
version=$(sed -n 's/^#define CQD_VERSION_STRING "\(.*\)"$/\1/p' "$repo/include/cqd/version.h")
say() { echo "build_debs: $*"; }

rm -rf "$out"
src=$out/cqd-$version
mkdir -p "$src"
(cd "$repo" && git ls-files -z -co --exclude-standard --deduplicate) |
  while IFS= read -r -d '' f; do [[ -e $repo/$f ]] && printf '%s\0' "$f"; done |
  (cd "$repo" && xargs -0 cp --parents -t "$src")
say "building the packages in $src"
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  say "dpkg-buildpackage failed (the whole log: $out/build.log)"
  exit 1
}
ls -1 "$out"/*.deb
for want in libcqd0.1 libcqd0.1-dbgsym libcqd-dev cqd-tools cqd-tools-dbgsym; do
  compgen -G "$out/${want}_${version}_*.deb" >/dev/null || { say "no $want package"; exit 1; }
done

say "lintian"
lintian --fail-on error,warning --info "$out"/*.changes

say "unpacking into a scratch root and building engines against it"
root=$out/root
for deb in "$out"/*.deb; do dpkg -x "$deb" "$root"; done
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=$root/usr/lib/$multiarch
consumer=$repo/tests/pkgconfig/consumer.cc
work=$out/engines
mkdir -p "$work"
failures=0
run() {  # run LABEL BINARY: the engine delivers every completion
  local got
  got=$(LD_LIBRARY_PATH=$libdir "$2" 2>&1) || true
  if [[ $got == "consumer: OK 2000 completions" ]]; then
    say "ok: $1"
  else
    say "FAIL: $1: $got"
    failures=$((failures + 1))
  fi
}
export PKG_CONFIG_PATH=$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
# shellcheck disable=SC2046  # pkg-config's output is meant to be split
g++ -std=c++20 -Wall -Wextra -Werror "$consumer" $(pkg-config --cflags --libs cqd) \
  -o "$work/pkgconfig" && run "pkg-config cqd (libcqd.so.0.1)" "$work/pkgconfig"
# shellcheck disable=SC2046
g++ -std=c++20 -Wall -Wextra -Werror -DCQD_CONSUMER_TBB "$consumer" \
  $(pkg-config --cflags --libs cqd-tbb) -o "$work/pkgconfig_tbb" &&
  run "pkg-config cqd-tbb (libcqd_tbb.a)" "$work/pkgconfig_tbb"

mkdir -p "$work/cmake_src"
cp "$consumer" "$work/cmake_src/consumer.cc"
cat >"$work/cmake_src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(engine CXX)
find_package(cqd 0.1 REQUIRED)
add_executable(engine consumer.cc)
target_link_libraries(engine PRIVATE cqd::cqd)
add_executable(engine_tbb consumer.cc)
target_compile_definitions(engine_tbb PRIVATE CQD_CONSUMER_TBB)
target_link_libraries(engine_tbb PRIVATE cqd::tbb)
CMAKE
cmake -S "$work/cmake_src" -B "$work/cmake" -G Ninja -DCMAKE_PREFIX_PATH="$root/usr" \
  >"$work/cmake.log" 2>&1 && cmake --build "$work/cmake" >>"$work/cmake.log" 2>&1 &&
  run "CMake cqd::cqd" "$work/cmake/engine" && run "CMake cqd::tbb" "$work/cmake/engine_tbb" ||
  { cat "$work/cmake.log"; failures=$((failures + 1)); }

mkdir -p "$work/meson_src"
cp "$consumer" "$work/meson_src/consumer.cc"
cat >"$work/meson_src/meson.build" <<'MESON'
project('engine', 'cpp', default_options: ['cpp_std=c++20'])
executable('engine', 'consumer.cc', dependencies: dependency('cqd'))
MESON
meson setup "$work/meson" "$work/meson_src" >"$work/meson.log" 2>&1 &&
  ninja -C "$work/meson" >>"$work/meson.log" 2>&1 && run "Meson dependency('cqd')" "$work/meson/engine" ||
  { cat "$work/meson.log"; failures=$((failures + 1)); }

if [[ $("$root/usr/bin/cqd_top" --version) == "cqd_top (cqd) $version" ]]; then
  say "ok: cqd_top --version"
else
  say "FAIL: cqd_top --version"
  failures=$((failures + 1))
fi
man -l "$root/usr/share/man/man1/cqd_top.1.gz" >/dev/null 2>&1 || { say "FAIL: man page"; failures=$((failures + 1)); }

if (( failures > 0 )); then
  say "$failures check(s) failed"
  exit 1
fi
say "PASS: the packages in $out build, pass lintian and link engines from a scratch root"
