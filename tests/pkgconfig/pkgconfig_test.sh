#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# An engine that does not build with Bazel: installs the Bazel-built cqd_dist tree with
# tools/install.sh (--from: no bazel inside bazel) under a temporary prefix, then builds
# consumer.cc with plain g++ and pkg-config and runs it.
#
#   pkgconfig_test.sh INSTALL_SH CONSUMER_CC DIST_FILES...
#
# Checks: the installed layout and cqd.pc (real prefix, pkg-config --validate, the version the
# installed cqd/version.h defines, which the consumer also compares with cqd::Version()); that a
# compiler below C++20 stops at the headers' #error, which says what is needed; that
# the public headers do not need moodycamel; that the consumer builds and runs with
#   g++ -std=c++20 consumer.cc $(pkg-config --cflags --libs --static cqd)
# and with the non-static `pkg-config --libs cqd` too, printing "consumer: OK 2000 completions"
# and exiting 0; and that every object in libcqd.a links with cqd.pc's libraries
# (--whole-archive). In a sanitizer build (--config=asan/tsan/ubsan) the consumer is built with
# the same -fsanitize options, as an engine linking that build's libcqd.a would have to be.
set -euo pipefail
export PATH="/usr/bin:/bin:${PATH:-}"
export TMPDIR="${TEST_TMPDIR:?run me with bazel test}"

install_sh=$1 consumer_cc=$2
shift 2
dist= flags_file=
for f in "$@"; do
  case $f in
    */lib/libcqd.a) dist=${f%/lib/libcqd.a} ;;
    *.link_flags) flags_file=$f ;;
  esac
done
[[ -n $dist && -n $flags_file ]] || { echo "FAIL: no cqd_dist tree among: $*"; exit 1; }
read -r -a sanitize <"$flags_file" || true

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_eq() {  # expect_eq WHAT GOT WANT
  if [[ $2 == "$3" ]]; then echo "ok: $1"; else fail "$1: got '$2', want '$3'"; fi
}

# ---- DESTDIR staging: files under DESTDIR, cqd.pc names the prefix only. ----
DESTDIR="$TEST_TMPDIR/stage" "$install_sh" --prefix /opt/cqd --from "$dist" >/dev/null
expect_eq "DESTDIR install: cqd.pc prefix" \
  "$(grep '^prefix=' "$TEST_TMPDIR/stage/opt/cqd/lib/pkgconfig/cqd.pc")" "prefix=/opt/cqd"

# ---- The install the consumer uses (a relative, unclean path: install.sh makes it absolute). ----
prefix="$TEST_TMPDIR/root/usr/local"
(cd "$TEST_TMPDIR" && mkdir -p root && "$OLDPWD/$install_sh" --prefix root/x/../usr/local \
  --from "$OLDPWD/$dist")
for f in lib/libcqd.a lib/pkgconfig/cqd.pc include/cqd/runtime.h include/cqd/sim.h \
         include/cqd/status.h include/cqd/options.h include/cqd/stats.h include/cqd/handler.h; do
  [[ -f $prefix/$f && ! -L $prefix/$f ]] || fail "not installed as a file: $prefix/$f"
done
expect_eq "cqd.pc prefix" "$(grep '^prefix=' "$prefix/lib/pkgconfig/cqd.pc")" "prefix=$prefix"

version=$(sed -n 's/^#define CQD_VERSION_STRING "\(.*\)"$/\1/p' "$prefix/include/cqd/version.h")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "cqd/version.h: no CQD_VERSION_STRING: '$version'"

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
pkg-config --validate cqd || fail "pkg-config --validate cqd"
expect_eq "pkg-config --modversion cqd" "$(pkg-config --modversion cqd)" "$version"
expect_eq "pkg-config --variable=includedir cqd" "$(pkg-config --variable=includedir cqd)" \
  "$prefix/include"
for want in "-I$prefix/include" "-L$prefix/lib" "-lcqd" "-libverbs" "-pthread"; do
  [[ " $(pkg-config --cflags --libs --static cqd) " == *" $want "* ]] ||
    fail "pkg-config --cflags --libs --static cqd lacks $want"
done

# The public headers stand alone: moodycamel is the runtime's business only.
if grep -n 'concurrentqueue\|moodycamel' "$prefix"/include/cqd/*.h; then
  fail "a public header refers to moodycamel concurrentqueue"
fi
# ... and include nothing but cqd's own, the standard library's, libibverbs' and librdmacm's
# headers (the packages cqd.pc may require).
while IFS= read -r line; do
  [[ $line =~ ^#include\ (\"cqd/[a-z_]+\.h\"|\<[a-z_]+\>|\<infiniband/verbs\.h\>|\<rdma/rdma_cma\.h\>)$ ]] ||
    fail "unexpected include in a public header: $line"
done < <(grep -h '^#include' "$prefix"/include/cqd/*.h)

# ---- Below C++20 every public header stops at one clear #error. ----
for h in "$prefix"/include/cqd/*.h; do
  rc=0
  out=$(echo "#include \"cqd/$(basename "$h")\"" |
        g++ -std=c++17 -fsyntax-only -I"$prefix/include" -x c++ - 2>&1) || rc=$?
  [[ $rc != 0 ]] || fail "cqd/$(basename "$h") compiles with -std=c++17"
  expect_eq "cqd/$(basename "$h") with -std=c++17: the first error" \
    "$(grep -m1 -o 'error: .*' <<<"$out")" \
    "error: #error \"cqd needs C++20: compile with -std=c++20 (or -std=gnu++20, or later)\""
done

# ---- Build and run the consumer as an engine would. ----
run_consumer() {  # run_consumer LABEL BINARY
  local out rc=0
  out=$("$2" 2>&1) || rc=$?
  echo "$out"
  expect_eq "$1: exit status" "$rc" 0
  expect_eq "$1: output" "$out" "consumer: OK 2000 completions"
}

# shellcheck disable=SC2046  # pkg-config's output is meant to be split
g++ -std=c++20 -Wall -Wextra -Werror "${sanitize[@]}" "$consumer_cc" \
  $(pkg-config --cflags --libs --static cqd) -o "$TEST_TMPDIR/consumer_static" ||
  fail "g++ ... \$(pkg-config --cflags --libs --static cqd)"
[[ -x $TEST_TMPDIR/consumer_static ]] && run_consumer "--static link" "$TEST_TMPDIR/consumer_static"

# shellcheck disable=SC2046
g++ -std=c++20 -Wall -Wextra -Werror "${sanitize[@]}" "$consumer_cc" \
  $(pkg-config --cflags --libs cqd) -o "$TEST_TMPDIR/consumer" ||
  fail "g++ ... \$(pkg-config --cflags --libs cqd)"
[[ -x $TEST_TMPDIR/consumer ]] && run_consumer "plain link" "$TEST_TMPDIR/consumer"

# Every object of libcqd.a, used or not by this consumer, resolves with what cqd.pc lists.
# shellcheck disable=SC2046
g++ -std=c++20 "${sanitize[@]}" "$consumer_cc" $(pkg-config --cflags cqd) \
  -Wl,--whole-archive "$prefix/lib/libcqd.a" -Wl,--no-whole-archive $(pkg-config --libs cqd) \
  -o "$TEST_TMPDIR/consumer_whole" ||
  fail "libcqd.a linked whole needs libraries cqd.pc does not list"

if (( failures > 0 )); then
  echo "pkgconfig_test: $failures failure(s)"
  exit 1
fi
echo "pkgconfig_test: PASS"
