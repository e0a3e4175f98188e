#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Puts Debian's stock kernel (the one linux-image-amd64 points at) and its modules under
# $CQD_VM_DIR/root (default /var/cache/cqd-vm), for tools/vm/run_in_vm.sh. Idempotent.
set -euo pipefail
VM_DIR=${CQD_VM_DIR:-/var/cache/cqd-vm}
if ls "$VM_DIR"/root/boot/vmlinuz-* >/dev/null 2>&1; then
  echo "fetch_kernel: $(ls "$VM_DIR"/root/boot/vmlinuz-*) is present"
  exit 0
fi
pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
[[ -n $pkg ]] || { echo "fetch_kernel: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 1; }
mkdir -p "$VM_DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 777 "$tmp"  # apt-get download drops privileges to _apt
(cd "$tmp" && apt-get download "$pkg")
rm -rf "$VM_DIR/root.new"
dpkg -x "$tmp"/"$pkg"_*.deb "$VM_DIR/root.new"
rm -rf "$VM_DIR/root"
mv "$VM_DIR/root.new" "$VM_DIR/root"
echo "fetch_kernel: unpacked $pkg into $VM_DIR/root"
