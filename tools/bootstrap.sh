#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Installs the Debian 12 packages cqd builds against. Idempotent and non-interactive;
# needs root only when something is missing (apt-get is skipped otherwise).
set -euo pipefail

# ---- Required packages: add new ones here. ----
PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3; its deps pull in the system JDK the server runs on
  g++
  pkg-config             # cqd.pc consumers: //tests/pkgconfig:pkgconfig_test
  cmake                  # ... find_package(cqd) there
  ninja-build            # ... the CMake and Meson builds there
  meson                  # ... dependency('cqd') there
  libibverbs-dev
  librdmacm-dev          # rdma_cm connection setup (the runtime's CM channel, the examples)
  rdmacm-utils           # rping, the interop client the blockd example serves
  rdma-core
  ibverbs-providers
  libtbb-dev
  libconcurrentqueue-dev
  nlohmann-json3-dev     # JSON for the tools and tests (cqd_top, the observability tests)
  libgtest-dev
  libgmock-dev           # @gtest//:gmock
  libbenchmark-dev
  qemu-system-x86        # the VM that runs the rxe tests (tools/vm/run_in_vm.sh)
  busybox-static         # ... its userland
  cpio                   # ... its initramfs
  iproute2               # `ip` and `rdma link add` inside the VM
  kmod
  perftest               # ib_send_lat / ib_send_bw, the rxe baseline for benchmarks/rxe
  gnuplot-nox            # benchmark plots
  clang-14               # the libFuzzer build (--config=fuzz, tests/fuzz/run_fuzz.sh)
  libclang-rt-14-dev     # ... its libFuzzer and sanitizer runtimes
  clang-format-14        # tools/check_format.sh (.clang-format)
  debhelper              # the Debian packages (debian/, tools/build_debs.sh)
  dpkg-dev               # ... dpkg-buildpackage, dpkg-gensymbols
  fakeroot               # ... dpkg-buildpackage without root
  lintian                # ... their check
  doxygen                # the API reference (docs/api/Doxyfile, tools/api_docs.sh)
  man-db                 # tools/test.sh renders the man pages (tools/man)
  prometheus             # promtool: //tools/prometheus:promtool_test (check config/rules, test rules)
)
# ------------------------------------------------

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == installed ]] || missing+=("$pkg")
done

if (( ${#missing[@]} == 0 )); then
  echo "bootstrap: all ${#PACKAGES[@]} packages already installed"
else
  if (( EUID != 0 )); then
    echo "bootstrap: missing packages: ${missing[*]} (re-run as root)" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # The packages are for building and testing: none of their services (prometheus's server) is
  # started (policy-rc.d, as Debian's build chroots do), unless the machine already says otherwise.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
fi

# Debian's kernel for the rxe VM (these machines' own kernel has no RDMA support).
if ! ls "${CQD_VM_DIR:-/var/cache/cqd-vm}"/root/boot/vmlinuz-* >/dev/null 2>&1; then
  [[ -n $(apt-cache depends linux-image-amd64 2>/dev/null) ]] || apt-get update
  "$(dirname "${BASH_SOURCE[0]}")/vm/fetch_kernel.sh"
fi
