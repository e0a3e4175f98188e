#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Builds cqd's Debian packages from this tree, offline, and checks them as a packager would:
#
#   tools/build_debs.sh [OUT_DIR]        (default: ${TMPDIR:-/tmp}/cqd-debs)
#
# OUT_DIR is removed first (rm -rf) and made again: give it a folder of its own.
# 1. Copies the tree (tracked files and untracked ones git does not ignore) to OUT_DIR/cqd-VERSION,
#    makes the upstream tarball from it (cqd_VERSION.orig.tar.xz: the copy without debian/) and
#    builds the source package there (`dpkg-buildpackage -S -us -uc -d`: .dsc, .debian.tar.xz),
#    then the binary packages (`dpkg-buildpackage -us -uc -b`: debian/rules runs Bazel, offline,
#    with Debian's flags). The .debs land in OUT_DIR: libcqd0.1, libcqd-dev, libcqd-tbb-dev,
#    libcqd-doc, cqd-tools and the -dbgsym packages. The symbols file (debian/libcqd0.1.symbols)
#    is checked during the build: an ABI change fails it.
# 2. lintian --pedantic on the binary packages and on the source package: no error or warning,
#    with no tag overridden.
# 3. Unpacks every package into a scratch root (dpkg -x; nothing is installed on this machine)
#    and runs the autopkgtest (debian/tests/build-engines) against that root, from the source
#    package unpacked with dpkg-source -x, as autopkgtest would (AUTOPKGTEST_TMP set, and
#    CQD_TEST_ROOT naming the root): pkg-config, CMake (COMPONENTS tbb) and Meson engines and
#    libcqd-doc's example, each run on the simulated device; cqd_demo read by cqd_top; the man
#    pages. Where promtool is installed, the Prometheus files cqd-tools ships are checked too.
# Exit code: 0 iff all of it passed. Needs the packages tools/bootstrap.sh installs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-${TMPDIR:-/tmp}/cqd-debs}
version=$(sed -n 's/^#define CQD_VERSION_STRING "\(.*\)"$/\1/p' "$repo/include/cqd/version.h")
deb_version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -SVersion)
[[ ${deb_version%-*} == "$version" ]] ||
  { echo "build_debs: debian/changelog's $deb_version is not of cqd/version.h's $version"; exit 1; }
say() { echo "build_debs: $*"; }

rm -rf "$out"
src=$out/cqd-$version
mkdir -p "$src"
(cd "$repo" && git ls-files -z -co --exclude-standard --deduplicate) |
  while IFS= read -r -d '' f; do [[ -e $repo/$f ]] && printf '%s\0' "$f"; done |
  (cd "$repo" && xargs -0 cp --parents -t "$src")
tar -C "$out" --exclude="cqd-$version/debian" --sort=name --owner=0 --group=0 --numeric-owner \
  -cJf "$out/cqd_$version.orig.tar.xz" "cqd-$version"
say "building the source package in $src"
(cd "$src" && dpkg-buildpackage -S -us -uc -d) >"$out/source.log" 2>&1 || {
  tail -40 "$out/source.log"
  say "dpkg-buildpackage -S failed (the whole log: $out/source.log)"
  exit 1
}
say "building the packages in $src"
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1 || {
  tail -40 "$out/build.log"
  say "dpkg-buildpackage failed (the whole log: $out/build.log)"
  exit 1
}
ls -1 "$out"/*.deb "$out"/*.dsc
for want in libcqd0.1 libcqd0.1-dbgsym libcqd-dev libcqd-tbb-dev libcqd-doc cqd-tools \
            cqd-tools-dbgsym; do
  compgen -G "$out/${want}_${deb_version}_*.deb" >/dev/null || { say "no $want package"; exit 1; }
done

say "lintian --pedantic: the binary packages, then the source package"
lintian --pedantic --fail-on error,warning --info "$out"/*_"$(dpkg --print-architecture)".changes
lintian --pedantic --fail-on error,warning --info "$out/cqd_$deb_version.dsc"

say "unpacking into a scratch root and running the autopkgtest against it"
root=$out/root
for deb in "$out"/*.deb; do dpkg -x "$deb" "$root"; done
dpkg-source -x "$out/cqd_$deb_version.dsc" "$out/autopkgtest-src" >/dev/null
mkdir -p "$out/autopkgtest-tmp"
failures=0
(cd "$out/autopkgtest-src" &&
  AUTOPKGTEST_TMP=$out/autopkgtest-tmp CQD_TEST_ROOT=$root debian/tests/build-engines) ||
  failures=$((failures + 1))

if command -v promtool >/dev/null; then
  prom=$root/usr/share/cqd/prometheus
  if promtool check config "$prom/prometheus.yml" && promtool check rules "$prom/cqd.rules.yml" &&
     promtool test rules "$prom/cqd.rules.test.yml"; then
    say "ok: promtool on /usr/share/cqd/prometheus"
  else
    say "FAIL: promtool on /usr/share/cqd/prometheus"
    failures=$((failures + 1))
  fi
else
  say "promtool is not installed: the Prometheus files are not checked here (tools/bootstrap.sh)"
fi

if (( failures > 0 )); then
  say "$failures check(s) failed"
  exit 1
fi
say "PASS: the packages in $out build, pass lintian and the autopkgtest in a scratch root"
