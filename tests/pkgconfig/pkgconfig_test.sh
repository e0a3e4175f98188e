#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# An engine that does not build with Bazel: installs the Bazel-built cqd_dist tree with
# tools/install.sh (--from: no bazel inside bazel) under a temporary prefix, then builds
# consumer.cc against it and runs it. One part per test target (tests/pkgconfig/BUILD), so that
# each stays well within its size on a busy machine:
#
#   pkgconfig_test.sh PART INSTALL_SH CONSUMER_CC DIST_FILES...
#
# install  install.sh's command line and DESTDIR; the installed layout and cqd.pc (real prefix,
#          pkg-config --validate, the version the installed cqd/version.h defines); that the
#          public headers include only what cqd.pc's modules provide (cqd/tbb.h: oneTBB too) and
#          do not need moodycamel; that libcqd.a defines no sanitizer hook; that a compiler below
#          C++20 stops at the headers' #error, which says what is needed; cqd_top and its man
#          page; libcqd.so's soname, links and exports (the public API only); install.sh's
#          --libdir and --uninstall
# shared   the consumer linked with $(pkg-config --cflags --libs cqd) (libcqd.so), run; every
#          object in libcqd.a links with cqd.pc's libraries (--whole-archive)
# static   the consumer linked with -l:libcqd.a $(pkg-config --libs --static cqd), run
# cmake    find_package(cqd) with cqd::cqd (shared, and static with CQD_LINK_STATIC), run; the
#          next MAJOR refused; an unknown component refused when required
# tbb      the oneTBB layer: cqd-tbb.pc and cqd::tbb, run; find_package(cqd COMPONENTS tbb)
#          defines cqd::tbb, and fails, saying why, without the layer's files or without oneTBB
# meson    dependency('cqd') through cqd.pc, run
#
# Each engine prints "consumer: OK 2000 completions" and exits 0. In a sanitizer build
# (--config=asan/tsan/ubsan) the consumer is built with the same -fsanitize options, as an engine
# linking that build's libcqd.a would have to be.
set -euo pipefail
export PATH="/usr/bin:/bin:${PATH:-}"
export TMPDIR="${TEST_TMPDIR:?run me with bazel test}"

part=$1 install_sh=$2 consumer_cc=$3
shift 3
case $part in
  install|shared|static|cmake|tbb|meson) ;;
  *) echo "FAIL: unknown part '$part'"; exit 1 ;;
esac
dist= flags_file=
for f in "$@"; do
  case $f in
    */lib/libcqd.a) dist=${f%/lib/libcqd.a} ;;
    *.link_flags) flags_file=$f ;;
  esac
done
[[ -n $dist && -n $flags_file ]] || { echo "FAIL: no cqd_dist tree among: $*"; exit 1; }
read -r -a sanitize <"$flags_file" || true
if [[ " ${sanitize[*]} " == *thread* ]]; then
  # libcqd.a carries no sanitizer hooks (checked below), so a TSan engine names cqd's one
  # suppression itself, as docs/BUILDING_WITHOUT_BAZEL.md says.
  echo "race:moodycamel::ConcurrentQueue*ExplicitProducer::enqueue_bulk" >"$TEST_TMPDIR/tsan.supp"
  echo "called_from_lib:libtbb.so.12" >>"$TEST_TMPDIR/tsan.supp"  # uninstrumented oneTBB
  export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}suppressions=$TEST_TMPDIR/tsan.supp"
fi

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_eq() {  # expect_eq WHAT GOT WANT
  if [[ $2 == "$3" ]]; then echo "ok: $1"; else fail "$1: got '$2', want '$3'"; fi
}

# ---- The install every part uses (a relative, unclean path: install.sh makes it absolute). ----
prefix="$TEST_TMPDIR/root/usr/local"
(cd "$TEST_TMPDIR" && mkdir -p root && "$OLDPWD/$install_sh" --prefix root/x/../usr/local \
  --from "$OLDPWD/$dist")
version=$(sed -n 's/^#define CQD_VERSION_STRING "\(.*\)"$/\1/p' "$prefix/include/cqd/version.h")
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "cqd/version.h: no CQD_VERSION_STRING: '$version'"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
major=$(sed -n 's/^#define CQD_VERSION_MAJOR \([0-9]*\)$/\1/p' "$prefix/include/cqd/version.h")
minor=$(sed -n 's/^#define CQD_VERSION_MINOR \([0-9]*\)$/\1/p' "$prefix/include/cqd/version.h")
soversion=$major  # while MAJOR is 0 a MINOR step may change the ABI: the soname says 0.MINOR
[[ $major == 0 ]] && soversion=0.$minor
have_shared=false
(( ${#sanitize[@]} == 0 )) && have_shared=true  # sanitizer builds make no shared library
export HOME=$TEST_TMPDIR

run_consumer() {  # run_consumer LABEL BINARY
  local out rc=0
  out=$(LD_LIBRARY_PATH="$prefix/lib" "$2" 2>&1) || rc=$?
  echo "$out"
  expect_eq "$1: exit status" "$rc" 0
  expect_eq "$1: output" "$out" "consumer: OK 2000 completions"
}
needs_shared() {  # needs_shared LABEL BINARY WANT(true|false): whether it loads libcqd.so
  local got=false
  readelf -d "$2" | grep -qF "[libcqd.so.$soversion]" && got=true
  expect_eq "$1: needs libcqd.so.$soversion" "$got" "$3"
}

# CMake: the consumer's project (cmake_src), built and run by cmake_build.
cmake_setup() {
  export CXXFLAGS="${sanitize[*]}" LDFLAGS="${sanitize[*]}"
  mkdir -p "$TEST_TMPDIR/cmake_src"
  cp "$consumer_cc" "$TEST_TMPDIR/cmake_src/consumer.cc"
  cat >"$TEST_TMPDIR/cmake_src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(consumer CXX)
find_package(cqd ${version%.*} REQUIRED)
if(NOT cqd_VERSION STREQUAL "$version")
  message(FATAL_ERROR "cqd_VERSION is \${cqd_VERSION}")
endif()
add_executable(consumer consumer.cc)
target_link_libraries(consumer PRIVATE cqd::cqd)
CMAKE
}
cmake_build() {  # cmake_build LABEL WANT_SHARED CMAKE_ARGS...
  local label=$1 want=$2 dir="$TEST_TMPDIR/cmake_$1"
  shift 2
  if cmake -S "$TEST_TMPDIR/cmake_src" -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" "$@" \
       >"$dir.log" 2>&1 && cmake --build "$dir" >>"$dir.log" 2>&1; then
    run_consumer "cmake $label" "$dir/consumer"
    needs_shared "cmake $label" "$dir/consumer" "$want"
  else
    cat "$dir.log"
    fail "cmake $label: configure or build failed"
  fi
}

# find_package(cqd ARGS) in a project of its own, configured only (one build folder for every
# probe, so the compiler is looked at once): probe LABEL WANT TEXT CQD_DIR ARGS [NO_TBB].
# WANT: found, not-found (cqd_FOUND false, configure succeeds) or error (configure fails). TEXT
# ("-": none) must appear in CMake's output, its whitespace squeezed (CMake wraps messages).
# NO_TBB=ON: as if oneTBB's CMake package were not installed. Leaves the output in PROBE_OUT.
probe() {
  local label=$1 want=$2 text=$3 dir=$4 args=$5 no_tbb=${6:-OFF} rc=0 got
  mkdir -p "$TEST_TMPDIR/probe_src"
  cat >"$TEST_TMPDIR/probe_src/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(probe CXX)
if(PROBE_NO_TBB)
  set(CMAKE_DISABLE_FIND_PACKAGE_TBB TRUE)
endif()
find_package(cqd ${PROBE_ARGS})
if(cqd_FOUND)
  message(STATUS "probe: found")
else()
  message(STATUS "probe: not-found")
endif()
if(TARGET cqd::tbb)
  message(STATUS "probe: cqd::tbb")
endif()
CMAKE
  PROBE_OUT=$(cmake -S "$TEST_TMPDIR/probe_src" -B "$TEST_TMPDIR/probe_build" -Dcqd_DIR="$dir" \
                "-DPROBE_ARGS=$args" -DPROBE_NO_TBB="$no_tbb" 2>&1) || rc=$?
  got=error
  if (( rc == 0 )); then
    got=$(grep -o 'probe: [a-z-]*found' <<<"$PROBE_OUT" | head -1)
    got=${got#probe: }
  fi
  if [[ $got != "$want" ]]; then
    echo "$PROBE_OUT"
    fail "$label: $got, want $want"
  elif [[ $text != - && $(tr -s ' \n' '  ' <<<"$PROBE_OUT") != *"$text"* ]]; then
    echo "$PROBE_OUT"
    fail "$label: CMake does not say '$text'"
  else
    echo "ok: $label: $want"
  fi
}

# ==== install ====
part_install() {
  # ---- The command line: --help to stdout with status 0; an unknown argument, status 2. ----
  rc=0
  help=$("$install_sh" --help 2>/dev/null) || rc=$?
  expect_eq "install.sh --help exit status" "$rc" 0
  [[ $help == "usage: tools/install.sh "* ]] || fail "install.sh --help printed '$help'"
  rc=0
  "$install_sh" --bogus >/dev/null 2>&1 || rc=$?
  expect_eq "install.sh --bogus exit status" "$rc" 2

  # ---- DESTDIR staging: files under DESTDIR, cqd.pc names the prefix only. ----
  DESTDIR="$TEST_TMPDIR/stage" "$install_sh" --prefix /opt/cqd --from "$dist" >/dev/null
  expect_eq "DESTDIR install: cqd.pc prefix" \
    "$(grep '^prefix=' "$TEST_TMPDIR/stage/opt/cqd/lib/pkgconfig/cqd.pc")" "prefix=/opt/cqd"

  # ---- The installed layout and cqd.pc. ----
  for f in lib/libcqd.a lib/pkgconfig/cqd.pc include/cqd/runtime.h include/cqd/sim.h \
           include/cqd/status.h include/cqd/options.h include/cqd/stats.h include/cqd/handler.h; do
    [[ -f $prefix/$f && ! -L $prefix/$f ]] || fail "not installed as a file: $prefix/$f"
  done
  expect_eq "cqd.pc prefix" "$(grep '^prefix=' "$prefix/lib/pkgconfig/cqd.pc")" "prefix=$prefix"

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
  # headers (the packages cqd.pc may require); cqd/tbb.h (cqd-tbb.pc) oneTBB's too.
  while IFS= read -r line; do
    [[ $line =~ ^#include\ (\"cqd/[a-z_]+\.h\"|\<[a-z_]+\>|\<infiniband/verbs\.h\>|\<rdma/rdma_cma\.h\>)$ ]] ||
      fail "unexpected include in a public header: $line"
  done < <(grep -h '^#include' $(ls "$prefix"/include/cqd/*.h | grep -v '/tbb\.h$'))
  while IFS= read -r line; do
    [[ $line =~ ^#include\ (\"cqd/[a-z_]+\.h\"|\<[a-z_]+\>|\<oneapi/tbb/[a-z_]+\.h\>)$ ]] ||
      fail "unexpected include in cqd/tbb.h: $line"
  done < <(grep -h '^#include' "$prefix/include/cqd/tbb.h")

  # ---- No sanitizer hooks in the library: they would collide with an engine's own. ----
  if hooks=$(nm -A "$prefix/lib/libcqd.a" 2>/dev/null | grep -E ' [TDRBVW] __(tsan|asan|lsan|ubsan|msan)_default'); then
    fail "libcqd.a defines sanitizer hooks: $hooks"
  fi

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

  # ---- cqd_top and its man page. ----
  if [[ $("$prefix/bin/cqd_top" --version 2>&1) == "cqd_top (cqd) $version" ]]; then
    echo "ok: bin/cqd_top --version"
  else
    fail "bin/cqd_top is not installed, or --version says otherwise"
  fi
  [[ -f $prefix/share/man/man1/cqd_top.1 ]] || fail "share/man/man1/cqd_top.1 is not installed"

  # ---- The shared library: soname, links, and only the public API exported. ----
  if [[ $have_shared == true ]]; then
    so=$prefix/lib/libcqd.so.$version
    [[ -f $so && ! -L $so ]] || fail "not installed as a file: $so"
    expect_eq "libcqd.so.$soversion" "$(readlink "$prefix/lib/libcqd.so.$soversion")" \
      "libcqd.so.$version"
    expect_eq "libcqd.so" "$(readlink "$prefix/lib/libcqd.so")" "libcqd.so.$soversion"
    expect_eq "libcqd.so's soname" \
      "$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')" "libcqd.so.$soversion"
    # Exported: functions and classes of namespace cqd whose names start with an upper-case letter
    # (the public API), their type info and vtables. Not cqd::internal, cqd::sim_internal,
    # cqd::backend, moodycamel, the standard library's instantiations or any sanitizer hook.
    exported=$(nm -D --defined-only -C "$so" | cut -d' ' -f3- | sed 's/@@CQD_0$//')
    outside=$(grep -v -E '^(cqd::[A-Z]|(typeinfo|typeinfo name|vtable) for cqd::[A-Z]|(non-)?virtual thunk to cqd::[A-Z]|CQD_0$)' <<<"$exported" || true)
    [[ -z $outside ]] || fail "libcqd.so exports symbols outside the public API: $(head -5 <<<"$outside")"
    if grep -E '^cqd::Result<|__(tsan|asan|lsan|ubsan)_default' <<<"$exported"; then
      fail "libcqd.so exports Result instantiations or sanitizer hooks"
    fi
    # No exported name mentions an internal type (a private constructor taking one, a helper), and
    # none is a template instantiation of the standard library's whose return type is a cqd type
    # ("cqd::Status& std::...": inline functions stay inside, -fvisibility-inlines-hidden).
    if internal=$(grep -E '(internal|sim_internal|backend)::|^[^(]* std::' <<<"$exported"); then
      fail "libcqd.so exports names of internals: $(head -5 <<<"$internal")"
    fi
    for want in 'cqd::Runtime::Create(' 'cqd::Version()' 'cqd::DieOnFailedResult(' \
                'cqd::SimDevice::Create(' 'cqd::StatusCodeName('; do
      grep -qF "$want" <<<"$exported" || fail "libcqd.so does not export $want"
    done
    echo "ok: libcqd.so exports $(wc -l <<<"$exported") symbols, all public API"
  fi

  # ---- --libdir (multiarch), then --uninstall leaves nothing behind. ----
  other="$TEST_TMPDIR/other"
  "$install_sh" --prefix "$other" --libdir lib/x86_64-linux-gnu --from "$dist" >/dev/null
  expect_eq "--libdir: cqd.pc libdir" \
    "$(PKG_CONFIG_PATH=$other/lib/x86_64-linux-gnu/pkgconfig pkg-config --variable=libdir cqd)" \
    "$other/lib/x86_64-linux-gnu"
  [[ -f $other/lib/x86_64-linux-gnu/libcqd.a && -f $other/lib/x86_64-linux-gnu/cmake/cqd/cqdConfig.cmake ]] ||
    fail "--libdir: libcqd.a or the CMake config not under lib/x86_64-linux-gnu"
  [[ ! -e $other/lib/libcqd.a ]] || fail "--libdir: libcqd.a also under lib/"
  "$install_sh" --uninstall --prefix "$other" --libdir lib/x86_64-linux-gnu >/dev/null ||
    fail "--uninstall failed"
  left=$(find "$other" \( -type f -o -type l \) | head -5)
  expect_eq "--uninstall: files left" "$left" ""
  expect_eq "--uninstall: folders left" "$(find "$other" -mindepth 1 | head -5)" ""
  # A --libdir outside the prefix: --uninstall takes away the folders the install made there too.
  elsewhere="$TEST_TMPDIR/elsewhere"
  "$install_sh" --prefix "$other" --libdir "$elsewhere/lib64" --from "$dist" >/dev/null
  [[ -f $elsewhere/lib64/libcqd.a ]] || fail "--libdir outside the prefix: no libcqd.a there"
  "$install_sh" --uninstall --prefix "$other" --libdir "$elsewhere/lib64" >/dev/null ||
    fail "--uninstall with --libdir outside the prefix failed"
  expect_eq "--uninstall, --libdir outside the prefix: left there" \
    "$(find "$elsewhere" 2>/dev/null | head -5)" ""
  expect_eq "--uninstall, --libdir outside the prefix: left in the prefix" \
    "$(find "$other" -mindepth 1 | head -5)" ""
  # An install over an earlier one leaves nothing of it behind: a tree without a shared library
  # (as a sanitizer build's) installed over one with it takes the shared library away too.
  if [[ $have_shared == true ]]; then
    "$install_sh" --prefix "$other" --from "$dist" >/dev/null
    no_shared="$TEST_TMPDIR/dist_no_shared"
    cp -rL "$dist" "$no_shared"
    rm -rf "$no_shared/shared"
    "$install_sh" --prefix "$other" --from "$no_shared" >/dev/null
    expect_eq "reinstall without a shared library: libcqd.so* left" \
      "$(find "$other/lib" -name 'libcqd.so*' | head -3)" ""
    [[ -f $other/lib/libcqd.a ]] || fail "reinstall: no libcqd.a"
    "$install_sh" --uninstall --prefix "$other" >/dev/null || fail "--uninstall after reinstall"
  fi
  if "$install_sh" --uninstall --prefix "$other" >/dev/null 2>&1; then
    fail "--uninstall of nothing succeeded"
  else
    echo "ok: --uninstall of nothing is refused"
  fi
}

# ==== shared ====
part_shared() {
  # Plain -lcqd: the shared library where there is one.
  # shellcheck disable=SC2046
  g++ -std=c++20 -Wall -Wextra -Werror "${sanitize[@]}" "$consumer_cc" \
    $(pkg-config --cflags --libs cqd) -o "$TEST_TMPDIR/consumer" ||
    fail "g++ ... \$(pkg-config --cflags --libs cqd)"
  if [[ -x $TEST_TMPDIR/consumer ]]; then
    run_consumer "plain link" "$TEST_TMPDIR/consumer"
    needs_shared "plain link" "$TEST_TMPDIR/consumer" "$have_shared"
  fi

  # Every object of libcqd.a, used or not by this consumer, resolves with what cqd.pc lists.
  libs=$(pkg-config --libs cqd)
  # shellcheck disable=SC2046,SC2086
  g++ -std=c++20 "${sanitize[@]}" "$consumer_cc" $(pkg-config --cflags cqd) \
    -Wl,--whole-archive "$prefix/lib/libcqd.a" -Wl,--no-whole-archive ${libs/-lcqd/} \
    -o "$TEST_TMPDIR/consumer_whole" ||
    fail "libcqd.a linked whole needs libraries cqd.pc does not list"
}

# ==== static ====
part_static() {
  # Static: the archive named explicitly, with what `pkg-config --static` lists beside it.
  static_libs=$(pkg-config --libs --static cqd)
  static_libs=${static_libs/-lcqd/-l:libcqd.a}
  # shellcheck disable=SC2086  # pkg-config's output is meant to be split
  g++ -std=c++20 -Wall -Wextra -Werror "${sanitize[@]}" "$consumer_cc" \
    $(pkg-config --cflags cqd) $static_libs -o "$TEST_TMPDIR/consumer_static" ||
    fail "g++ ... -l:libcqd.a \$(pkg-config --libs --static cqd)"
  if [[ -x $TEST_TMPDIR/consumer_static ]]; then
    run_consumer "static link" "$TEST_TMPDIR/consumer_static"
    needs_shared "static link" "$TEST_TMPDIR/consumer_static" false
  fi
}

# ==== cmake ====
part_cmake() {
  cmake_setup
  cmake_build default "$have_shared"
  cmake_build static false -DCQD_LINK_STATIC=ON
  # A request for the next MAJOR is refused.
  mkdir -p "$TEST_TMPDIR/cmake_too_new"
  sed "s/find_package(cqd [0-9.]*/find_package(cqd $((major + 1)).0/" \
    "$TEST_TMPDIR/cmake_src/CMakeLists.txt" >"$TEST_TMPDIR/cmake_too_new/CMakeLists.txt"
  cp "$consumer_cc" "$TEST_TMPDIR/cmake_too_new/consumer.cc"
  if cmake -S "$TEST_TMPDIR/cmake_too_new" -B "$TEST_TMPDIR/cmake_too_new/build" -G Ninja \
       -DCMAKE_PREFIX_PATH="$prefix" >"$TEST_TMPDIR/cmake_too_new.log" 2>&1; then
    fail "find_package(cqd $((major + 1)).0) accepted cqd $version"
  else
    echo "ok: find_package(cqd $((major + 1)).0) refused"
  fi

  # Components: one cqd does not have fails a request that requires it, and only such a request.
  cqd_dir=$prefix/lib/cmake/cqd
  probe "find_package(cqd $major.$minor REQUIRED COMPONENTS nosuch)" error \
    "unknown component 'nosuch'" "$cqd_dir" "$major.$minor;REQUIRED;COMPONENTS;nosuch"
  probe "find_package(cqd COMPONENTS nosuch)" not-found "unknown component 'nosuch'" "$cqd_dir" \
    "COMPONENTS;nosuch"
  probe "find_package(cqd OPTIONAL_COMPONENTS nosuch)" found - "$cqd_dir" "OPTIONAL_COMPONENTS;nosuch"
}

# ==== tbb ====
part_tbb() {
  # The oneTBB layer: cqd-tbb.pc (libcqd_tbb.a, requiring cqd and tbb), an arena draining the
  # consumer.
  # shellcheck disable=SC2046
  g++ -std=c++20 -Wall -Wextra -Werror -DCQD_CONSUMER_TBB "${sanitize[@]}" "$consumer_cc" \
    $(pkg-config --cflags --libs cqd-tbb) -o "$TEST_TMPDIR/consumer_tbb" ||
    fail "g++ -DCQD_CONSUMER_TBB ... \$(pkg-config --cflags --libs cqd-tbb)"
  [[ -x $TEST_TMPDIR/consumer_tbb ]] && run_consumer "oneTBB layer (pkg-config)" "$TEST_TMPDIR/consumer_tbb"

  cmake_setup
  # cqd::tbb: the oneTBB layer with cqd::cqd and TBB::tbb.
  sed -i 's/target_link_libraries(consumer PRIVATE cqd::cqd)/if(CQD_TBB)\n  target_compile_definitions(consumer PRIVATE CQD_CONSUMER_TBB)\n  target_link_libraries(consumer PRIVATE cqd::tbb)\nelse()\n  target_link_libraries(consumer PRIVATE cqd::cqd)\nendif()/' \
    "$TEST_TMPDIR/cmake_src/CMakeLists.txt"
  cmake_build tbb "$have_shared" -DCQD_TBB=ON
  # The tbb component: asked for, it defines cqd::tbb or fails saying what is missing.
  cqd_dir=$prefix/lib/cmake/cqd
  probe "find_package(cqd $major.$minor REQUIRED COMPONENTS tbb)" found - "$cqd_dir" \
    "$major.$minor;REQUIRED;COMPONENTS;tbb"
  [[ $PROBE_OUT == *"probe: cqd::tbb"* ]] || fail "find_package(cqd COMPONENTS tbb): no cqd::tbb"
  probe "find_package(cqd REQUIRED COMPONENTS tbb) without oneTBB's package" error \
    "oneTBB's CMake package (TBB::tbb) was not found" "$cqd_dir" "REQUIRED;COMPONENTS;tbb" ON
  probe "find_package(cqd) without oneTBB's package" found - "$cqd_dir" "" ON
  [[ $PROBE_OUT != *"probe: cqd::tbb"* ]] || fail "find_package(cqd) without oneTBB: cqd::tbb defined"
  # ... and without the layer's files (Debian: libcqd-tbb-dev not installed).
  "$install_sh" --prefix "$TEST_TMPDIR/no_tbb" --from "$dist" >/dev/null
  rm "$TEST_TMPDIR/no_tbb/lib/libcqd_tbb.a" "$TEST_TMPDIR/no_tbb/include/cqd/tbb.h"
  probe "find_package(cqd COMPONENTS tbb) without libcqd_tbb.a" not-found \
    "component tbb: the oneTBB layer is not installed" "$TEST_TMPDIR/no_tbb/lib/cmake/cqd" \
    "COMPONENTS;tbb"
  probe "find_package(cqd REQUIRED COMPONENTS tbb) without libcqd_tbb.a" error "libcqd-tbb-dev" \
    "$TEST_TMPDIR/no_tbb/lib/cmake/cqd" "REQUIRED;COMPONENTS;tbb"
}

# ==== meson ====
part_meson() {  # dependency('cqd') through cqd.pc
  export CXXFLAGS="${sanitize[*]}" LDFLAGS="${sanitize[*]}"
  mkdir -p "$TEST_TMPDIR/meson_src"
  cp "$consumer_cc" "$TEST_TMPDIR/meson_src/consumer.cc"
  cat >"$TEST_TMPDIR/meson_src/meson.build" <<MESON
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
cqd = dependency('cqd', version: '>=$version')
executable('consumer', 'consumer.cc', dependencies: cqd)
MESON
  if meson setup "$TEST_TMPDIR/meson_build" "$TEST_TMPDIR/meson_src" >"$TEST_TMPDIR/meson.log" 2>&1 &&
     ninja -C "$TEST_TMPDIR/meson_build" >>"$TEST_TMPDIR/meson.log" 2>&1; then
    run_consumer "meson" "$TEST_TMPDIR/meson_build/consumer"
    needs_shared "meson" "$TEST_TMPDIR/meson_build/consumer" "$have_shared"
  else
    cat "$TEST_TMPDIR/meson.log"
    fail "meson: setup or build failed"
  fi
}

"part_$part"

if (( failures > 0 )); then
  echo "pkgconfig_test ($part): $failures failure(s)"
  exit 1
fi
echo "pkgconfig_test ($part): PASS"
