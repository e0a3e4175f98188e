#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Runs a program on rxe (soft-RoCE) inside a throwaway VM and reports its output and exit code.
#
#   tools/vm/run_in_vm.sh [--timeout SECONDS] [--with FILE]... [--fetch GUEST:HOST]...
#                         PROGRAM [ARGS...]
#
# These machines' kernel has no RDMA support, so the program runs under Debian's own kernel in
# qemu (TCG; a nested KVM guest hangs here). The VM's NIC sits alone on a qemu hub: rxe talks to
# itself through it, and nothing the VM sends can leave it. The initramfs holds busybox, PROGRAM and every shared
# library it needs, the rxe provider, the `rdma` tool and the kernel modules; /init loads
# rdma_rxe, creates rxe0 on eth0 (10.0.2.15, GID index 1 is the IPv4-mapped one), runs PROGRAM
# in /work and prints its exit code on the serial console. Extra programs (--with) are copied
# with their libraries and put on PATH; files PROGRAM writes (--fetch, guest path relative to
# /work) come back to HOST. Exit code: PROGRAM's, or 97 if the VM did not report one.
# The kernel comes from tools/vm/fetch_kernel.sh (run by tools/bootstrap.sh); the initramfs, /init
# and the console handling are in vm_lib.sh (shared with run_two_vms.sh).
set -euo pipefail

timeout_s=600
extra=()
fetch=()
while (( $# > 0 )); do
  case $1 in
    --timeout) timeout_s=$2; shift 2 ;;
    --with) extra+=("$2"); shift 2 ;;
    --fetch) fetch+=("$2"); shift 2 ;;
    --) shift; break ;;
    -*) echo "run_in_vm: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
(( $# >= 1 )) || { echo "usage: run_in_vm.sh [--timeout S] [--with FILE]... PROGRAM [ARGS...]" >&2; exit 2; }
program=$(readlink -f "$1")
shift

vm_name=run_in_vm
lib=$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh
[[ -f $lib ]] || lib=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/vm_lib.sh
source "$lib"
vm_check
vm_modules="$VM_MODULES $VM_CM_MODULES"  # rdma_cm too: //tests:rxe_cm_test

work=$(mktemp -d "${TMPDIR:-/tmp}/cqd-vm.XXXXXX")
trap '[[ -n ${CQD_VM_KEEP:-} ]] || rm -rf "$work"' EXIT
vm_extra=(${extra[@]+"${extra[@]}"})
vm_fetch=(${fetch[@]+"${fetch[@]}"})
vm_build_initrd "$work/initrd.gz" "$program" "$@"
vm_qemu_args "$work/initrd.gz"

log=$work/console.log
set +e
timeout --foreground "$timeout_s" "${vm_qemu[@]}" \
  -netdev hubport,id=net0,hubid=0 -device virtio-net-pci,netdev=net0 </dev/null |
  vm_clean | tee "$log" | vm_show
qemu_rc=${PIPESTATUS[0]}
set -e
code=$(vm_exit_code "$log")
if [[ -z $code ]]; then
  echo "run_in_vm: last console lines:" >&2
  tail -n 30 "$log" >&2
  (( qemu_rc == 124 )) && vm_fail "the VM ran past ${timeout_s}s without reporting an exit code"
  vm_fail "the VM stopped (qemu exit $qemu_rc) without reporting an exit code"
fi
vm_fetch_files "$log" ${fetch[@]+"${fetch[@]}"}
exit "$code"
