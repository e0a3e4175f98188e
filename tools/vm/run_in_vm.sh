#!/usr/bin/env bash
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
# The kernel comes from tools/vm/fetch_kernel.sh (run by tools/bootstrap.sh).
set -euo pipefail

VM_DIR=${CQD_VM_DIR:-/var/cache/cqd-vm}
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

fail() { echo "run_in_vm: $*" >&2; exit 97; }
kernel=$(ls "$VM_DIR"/root/boot/vmlinuz-* 2>/dev/null | head -1) ||
  true
[[ -n $kernel ]] || fail "no VM kernel in $VM_DIR (run tools/bootstrap.sh)"
kver=${kernel##*/vmlinuz-}
moddir=$VM_DIR/root/lib/modules/$kver
for tool in qemu-system-x86_64 busybox cpio rdma; do
  command -v "$tool" >/dev/null || fail "$tool is missing (run tools/bootstrap.sh)"
done
[[ -x $program ]] || fail "$program is not an executable"

work=$(mktemp -d "${TMPDIR:-/tmp}/cqd-vm.XXXXXX")
trap '[[ -n ${CQD_VM_KEEP:-} ]] || rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,work,modules,etc/libibverbs.d,lib64}

# copy_with_libs FILE [DEST]: FILE and every shared library ldd finds for it, at their own paths.
copy_with_libs() {
  local src=$1 dest=${2:-$1} lib
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$src" "$root$dest"
  while read -r lib; do
    [[ -e $root$lib ]] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done < <(ldd "$src" 2>/dev/null | grep -o '/[^ ]*' | sort -u)
}

cp "$(command -v busybox)" "$root/bin/busybox"
copy_with_libs "$program" /work/program
copy_with_libs "$(command -v rdma)" /sbin/rdma
provider=$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)
copy_with_libs "$provider"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
for f in "${extra[@]}"; do copy_with_libs "$(command -v "$f" || echo "$f")" "/bin/$(basename "$f")"; done

modules="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover
         net_failover virtio_net crc32_generic ib_core ib_uverbs ip6_udp_tunnel udp_tunnel rdma_rxe configfs ib_cm iw_cm rdma_cm rdma_ucm"
for m in $modules; do
  ko=$(find "$moddir" -name "$m.ko*" | head -1)
  [[ -n $ko ]] || fail "kernel module $m not found under $moddir"
  cp "$ko" "$root/modules/"
done

# The program's arguments, one per line, read back by /init without word splitting.
: > "$root/work/args"
for a in "$@"; do printf '%s\n' "$a" >> "$root/work/args"; done

cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(echo $modules); do
  f=\$(ls /modules/\$m.ko* 2>/dev/null | head -1)
  insmod \$f || echo "cqd-vm: insmod \$m failed"
done
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "cqd-vm: rdma link add failed"
cd /work
set --
while IFS= read -r a; do set -- "\$@" "\$a"; done < /work/args
echo "cqd-vm: running \$*"
PATH=/bin:/sbin:/work /work/program "\$@"
rc=\$?
for f in $(for f in "${fetch[@]}"; do printf '%s ' "${f%%:*}"; done); do
  [ -f "\$f" ] || continue
  echo "cqd-vm-file-begin \$f"; base64 "\$f"; echo "cqd-vm-file-end"
done
echo "CQD_VM_EXIT=\$rc"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$work/initrd.gz")

log=$work/console.log
set +e
timeout --foreground "$timeout_s" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -m 1024 \
  -nographic -no-reboot -kernel "$kernel" -initrd "$work/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet" \
  -netdev hubport,id=net0,hubid=0 -device virtio-net-pci,netdev=net0 </dev/null |
  tr -d '\r' | sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g' | tee "$log" |
  sed -u -n '/^cqd-vm: /,$p' | sed -u '/^cqd-vm-file-begin /,/^cqd-vm-file-end/d' |
  grep --line-buffered -v '^CQD_VM_EXIT='
qemu_rc=${PIPESTATUS[0]}
set -e
code=$(grep -o '^CQD_VM_EXIT=[0-9]*' "$log" | tail -1 | cut -d= -f2)
if [[ -z $code ]]; then
  echo "run_in_vm: last console lines:" >&2
  tail -n 30 "$log" >&2
  (( qemu_rc == 124 )) && fail "the VM ran past ${timeout_s}s without reporting an exit code"
  fail "the VM stopped (qemu exit $qemu_rc) without reporting an exit code"
fi
for f in "${fetch[@]}"; do
  guest=${f%%:*}
  host=${f#*:}
  sed -n "\|^cqd-vm-file-begin $guest\$|,/^cqd-vm-file-end/p" "$log" | sed '1d;$d' |
    base64 -d > "$host" 2>/dev/null || echo "run_in_vm: $guest did not come back" >&2
done
exit "$code"
