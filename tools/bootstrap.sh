#!/usr/bin/env bash
# Installs the Debian 12 packages cqd builds against. Idempotent and non-interactive;
# needs root only when something is missing (apt-get is skipped otherwise).
set -euo pipefail

# ---- Required packages: add new ones here. ----
PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3; its deps pull in the system JDK the server runs on
  g++
  libibverbs-dev
  rdma-core
  ibverbs-providers
  libtbb-dev
  libconcurrentqueue-dev
  libgtest-dev
  libgmock-dev           # @gtest//:gmock
  libbenchmark-dev
  # Planned: qemu-system-x86 busybox-static cpio gnuplot
)
# ------------------------------------------------

missing=()
for pkg in "${PACKAGES[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == installed ]] || missing+=("$pkg")
done

if (( ${#missing[@]} == 0 )); then
  echo "bootstrap: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if (( EUID != 0 )); then
  echo "bootstrap: missing packages: ${missing[*]} (re-run as root)" >&2
  exit 1
fi

echo "bootstrap: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
