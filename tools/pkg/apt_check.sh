#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Installs cqd's Debian packages with apt into a scratch Debian 12 root, as a user would, and
# checks what the packages promise (issue 48), then purges them:
#
#   tools/pkg/apt_check.sh DEBS_DIR [ROOT]     (ROOT default: ${TMPDIR:-/tmp}/cqd-apt-root)
#
# DEBS_DIR holds the .debs tools/build_debs.sh made. Needs root (chroot), debootstrap, and the
# Debian mirror (deb.debian.org): debootstrap makes a minimal bookworm root, and apt in it fetches
# what the packages depend on. Not part of tools/test.sh (it needs the network); its log is kept
# in docs/runs. In the root:
#   1. apt-get install ./libcqd-dev ./libcqd-tbb-dev ./libcqd-doc ./cqd-tools (./libcqd0.1 with
#      them), nothing else asked for but man-db (to read the man pages): the dependencies come in;
#   2. pkg-config --cflags --libs cqd-tbb resolves; find_package(cqd COMPONENTS tbb) configures,
#      find_package(cqd COMPONENTS nosuch) fails;
#   3. man 7 cqd and man cqd_top open;
#   4. the autopkgtest (debian/tests/build-engines) runs against the installed packages: the
#      pkg-config, CMake and Meson engines and libcqd-doc's example build and run, cqd_top reads
#      cqd_demo's stats socket; and the installed cqd_demo serves /metrics over TCP, which
#      cqd_top reads too;
#   5. apt-get purge of the five packages and autoremove leave no file of cqd in /usr or /etc.
# Exit code: 0 iff all of it passed.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
debs=$(cd "${1:?usage: apt_check.sh DEBS_DIR [ROOT]}" && pwd)
root=${2:-${TMPDIR:-/tmp}/cqd-apt-root}
say() { echo "apt_check: $*"; }
in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 bash -euo pipefail -c "$1"; }
cleanup() {
  for m in proc dev/pts dev sys; do umount "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT
if [[ ! -x $root/usr/bin/apt-get ]]; then
  say "debootstrap --variant=minbase bookworm $root"
  rm -rf "$root"
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian > "$root.debootstrap.log" 2>&1 ||
    { tail -20 "$root.debootstrap.log"; exit 1; }
fi
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t sysfs sysfs "$root/sys"
rm -rf "$root/tmp/debs" "$root/tmp/src"
mkdir -p "$root/tmp/debs" "$root/tmp/src"
cp "$debs"/libcqd0.1_*.deb "$debs"/libcqd-dev_*.deb "$debs"/libcqd-tbb-dev_*.deb \
  "$debs"/libcqd-doc_*.deb "$debs"/cqd-tools_*.deb "$root/tmp/debs/"
mkdir -p "$root/tmp/src/debian" "$root/tmp/src/tests/pkgconfig"
cp -r "$repo/debian/tests" "$root/tmp/src/debian/"
cp "$repo/tests/pkgconfig/consumer.cc" "$root/tmp/src/tests/pkgconfig/"
before=$(in_root 'dpkg-query -W -f="\${Package}\n" | sort')

say "1. apt-get install the packages (and man-db)"
in_root 'apt-get update -q > /dev/null
  apt-get install -y -q --no-install-recommends /tmp/debs/*.deb man-db 2>&1 | tail -3
  dpkg-query -W -f="\${Package} \${Version}\n" libcqd0.1 libcqd-dev libcqd-tbb-dev libcqd-doc cqd-tools'
say "   pulled in: $(in_root 'dpkg-query -W -f="\${Package}\n" | sort' | comm -13 <(echo "$before") - |
  grep -E "^(libibverbs-dev|librdmacm-dev|libtbb-dev|libconcurrentqueue-dev|ibverbs-providers)$" | tr '\n' ' ')"

say "2. pkg-config and CMake components"
in_root 'apt-get install -y -q --no-install-recommends cmake g++ make pkg-config meson ninja-build > /dev/null
  echo "   pkg-config --cflags --libs cqd-tbb: $(pkg-config --cflags --libs cqd-tbb)"
  mkdir -p /tmp/cm/ok /tmp/cm/nosuch
  printf "cmake_minimum_required(VERSION 3.16)\nproject(p CXX)\nfind_package(cqd 0.1 REQUIRED COMPONENTS tbb)\nmessage(STATUS \"cqd::tbb: \${cqd_tbb_FOUND}\")\n" > /tmp/cm/ok/CMakeLists.txt
  printf "cmake_minimum_required(VERSION 3.16)\nproject(p CXX)\nfind_package(cqd 0.1 REQUIRED COMPONENTS nosuch)\n" > /tmp/cm/nosuch/CMakeLists.txt
  cmake -S /tmp/cm/ok -B /tmp/cm/ok/b > /tmp/cm/ok.log 2>&1 && echo "   find_package(cqd COMPONENTS tbb): configured"
  if cmake -S /tmp/cm/nosuch -B /tmp/cm/nosuch/b > /tmp/cm/nosuch.log 2>&1; then
    echo "   find_package(cqd COMPONENTS nosuch) configured: FAIL"; exit 1
  fi
  echo "   find_package(cqd COMPONENTS nosuch): failed, saying: $(grep -m1 -i nosuch /tmp/cm/nosuch.log | sed "s/^ *//")"'

say "3. man pages"
in_root 'for page in "7 cqd" "1 cqd_top" "1 cqd_demo" "3 cqd::Runtime"; do
    man -P cat $page > /tmp/man.txt 2>/dev/null && [[ -s /tmp/man.txt ]] || { echo "   man $page: FAIL"; exit 1; }
    echo "   man $page: $(head -1 /tmp/man.txt | tr -s " ")"
  done'

say "4. the autopkgtest against the installed packages"
in_root 'cd /tmp/src && mkdir -p /tmp/autopkgtest && AUTOPKGTEST_TMP=/tmp/autopkgtest bash debian/tests/build-engines 2>&1 | tail -15'

say "4b. the installed cqd_demo serves /metrics over TCP; cqd_top reads it there"
in_root 'cqd_demo --seconds=20 --stats-tcp=127.0.0.1:19464 > /tmp/demo.log 2>&1 &
  demo=$!
  for _ in $(seq 100); do
    exec 3<>/dev/tcp/127.0.0.1/19464 2>/dev/null && break
    sleep 0.1
  done
  printf "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n" >&3
  metrics=$(cat <&3)
  exec 3<&-
  echo "   GET /metrics: $(echo "$metrics" | head -1 | tr -d "\r"); $(echo "$metrics" | grep -c "^cqd_") samples; $(echo "$metrics" | grep -m1 "^cqd_build_info")"
  echo "$metrics" | grep -q "^cqd_device_failed" || { echo "   no cqd_device_failed: FAIL"; exit 1; }
  top=$(cqd_top 127.0.0.1:19464 --count=1 2>&1) || { echo "   cqd_top: FAIL: $top"; exit 1; }
  echo "   cqd_top 127.0.0.1:19464 --count=1: $(echo "$top" | wc -l) lines, first: $(echo "$top" | head -1)"
  kill $demo; wait $demo || true'

say "5. apt-get purge"
in_root 'apt-get purge -y -q libcqd0.1 libcqd-dev libcqd-tbb-dev libcqd-doc cqd-tools > /dev/null
  apt-get autoremove -y -q --purge > /dev/null
  left=$(find /usr /etc -iname "*cqd*" 2>/dev/null | grep -v "^/usr/share/man/man[0-9]/.*\.gz$" || true)
  left_man=$(find /usr/share/man -iname "*cqd*" 2>/dev/null || true)
  if [[ -n $left$left_man ]]; then echo "   left behind: $left $left_man"; exit 1; fi
  echo "   no file of cqd left in /usr or /etc; packages installed: $(dpkg-query -W -f="\${Package}\n" | grep -c cqd || true) of cqd"'
say "all checks passed"
