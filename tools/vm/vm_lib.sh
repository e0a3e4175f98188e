# SPDX-License-Identifier: BSD-2-Clause
# Shared by run_in_vm.sh and run_two_vms.sh; sourced, not run. Builds the initramfs of a
# throwaway rxe VM, gives the qemu command line that boots it, and reads its console back.
#
# Callers set vm_name (message prefix) and call vm_check once, then vm_build_initrd per VM.
# vm_build_initrd reads these variables (defaults in brackets):
#   vm_modules   kernel modules /init loads, in order [$VM_MODULES]
#   vm_extra     array: files copied with their libraries onto PATH (/bin) [none]
#   vm_fetch     array: GUEST:HOST files printed base64 on the console after the run [none]
#   vm_addr      eth0's address [10.0.2.15/24]
#   vm_pre_run   guest shell lines /init runs after rxe0 is up, before the program [none]
# CQD_VM_SMP sets the VM's vCPUs (default 2).
# Console protocol (what /init prints): "cqd-vm: ..." lines, then the program's output,
# then each fetched file between "cqd-vm-file-begin GUEST" and "cqd-vm-file-end", then
# "CQD_VM_EXIT=<code>"; then the VM powers off.

VM_DIR=${CQD_VM_DIR:-/var/cache/cqd-vm}
# verbs on rxe
VM_MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover
         net_failover virtio_net crc32_generic ib_core ib_uverbs ip6_udp_tunnel udp_tunnel rdma_rxe"
# librdmacm (/dev/infiniband/rdma_cm) on top of VM_MODULES
VM_CM_MODULES="configfs ib_cm iw_cm rdma_cm rdma_ucm"

vm_fail() { echo "${vm_name:-vm}: $*" >&2; exit 97; }

# vm_check: sets vm_kernel and vm_moddir; fails (97) if the kernel or a host tool is missing.
vm_check() {
  vm_kernel=$(ls "$VM_DIR"/root/boot/vmlinuz-* 2>/dev/null | head -1) || true
  [[ -n $vm_kernel ]] || vm_fail "no VM kernel in $VM_DIR (run tools/bootstrap.sh)"
  vm_moddir=$VM_DIR/root/lib/modules/${vm_kernel##*/vmlinuz-}
  local tool
  for tool in qemu-system-x86_64 busybox cpio rdma; do
    command -v "$tool" >/dev/null || vm_fail "$tool is missing (run tools/bootstrap.sh)"
  done
}

# vm_build_initrd OUT PROGRAM [ARGS...]: writes the gzipped initramfs OUT (see the header).
vm_build_initrd() {
  local out=$1 program=$2 root f m ko
  shift 2
  [[ -x $program ]] || vm_fail "$program is not an executable"
  root=$(mktemp -d "${out%.gz}.root.XXXXXX")
  mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,work,modules,etc/libibverbs.d,lib64}

  # copy_with_libs FILE [DEST]: FILE and every shared library ldd finds for it, at their paths.
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
  copy_with_libs "$(ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so | head -1)"
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
  # glibc dlopens libgcc_s (ldd does not list it) to unwind threads in pthread_exit/_cancel.
  copy_with_libs /lib/x86_64-linux-gnu/libgcc_s.so.1
  for f in ${vm_extra[@]+"${vm_extra[@]}"}; do
    copy_with_libs "$(command -v "$f" || echo "$f")" "/bin/$(basename "$f")"
  done

  local modules=${vm_modules:-$VM_MODULES}
  for m in $modules; do
    ko=$(find "$vm_moddir" -name "$m.ko*" | head -1)
    [[ -n $ko ]] || vm_fail "kernel module $m not found under $vm_moddir"
    cp "$ko" "$root/modules/"
  done

  # The program's arguments, one per line, read back by /init without word splitting.
  : > "$root/work/args"
  for f in "$@"; do printf '%s\n' "$f" >> "$root/work/args"; done

  cat > "$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s
echo  # the firmware's last line may lack its newline; /init's lines start lines of their own
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(echo $modules); do
  f=\$(ls /modules/\$m.ko* 2>/dev/null | head -1)
  insmod \$f || echo "cqd-vm: insmod \$m failed"
done
ip link set lo up
ip link set eth0 up && ip addr add ${vm_addr:-10.0.2.15/24} dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "cqd-vm: rdma link add failed"
${vm_pre_run:-}
cd /work
set --
while IFS= read -r a; do set -- "\$@" "\$a"; done < /work/args
echo "cqd-vm: running \$*"
PATH=/bin:/sbin:/work /work/program "\$@"
rc=\$?
for f in $(for f in ${vm_fetch[@]+"${vm_fetch[@]}"}; do printf '%s ' "${f%%:*}"; done); do
  [ -f "\$f" ] || continue
  echo "cqd-vm-file-begin \$f"; base64 "\$f"; echo "cqd-vm-file-end"
done
echo "CQD_VM_EXIT=\$rc"
poweroff -f
INIT
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$out")
  rm -rf "$root"
}

# vm_qemu_args INITRD: sets the array vm_qemu to the qemu command line, less its network.
# no_timer_check: the guest kernel otherwise checks at boot that timer interrupts arrive within a
# short delay loop, and under TCG on a host whose CPUs are busy they may not: it then panics
# ("IO-APIC + timer doesn't work!", seen in the test command's run beside two busy loops).
vm_qemu_args() {
  vm_qemu=(qemu-system-x86_64 -accel tcg -cpu max -smp "${CQD_VM_SMP:-2}" -m 1024
           -nographic -no-reboot -kernel "$vm_kernel" -initrd "$1"
           -append "console=ttyS0 panic=-1 quiet no_timer_check")
}

# Console filters: vm_clean strips CRs and terminal escapes (raw console in, log out; line by
# line, so that the log is live);
# vm_show keeps what a reader wants from the log: /init's lines and the program's output.
# (No sed '$' address: it makes sed hold each line back until the next one arrives.)
vm_clean() { sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc//g'; }
vm_show() {
  sed -u '0,/^cqd-vm: /{/^cqd-vm: /!d}' | sed -u '/^cqd-vm-file-begin /,/^cqd-vm-file-end/d' |
    grep --line-buffered -v '^CQD_VM_EXIT='
}

# vm_exit_code LOG: prints the program's exit code from a console log, or nothing.
vm_exit_code() { { grep -o '^CQD_VM_EXIT=[0-9]*' "$1" || true; } | tail -1 | cut -d= -f2; }

# vm_fetch_files LOG GUEST:HOST...: decodes the fetched files from a console log.
vm_fetch_files() {
  local log=$1 f guest host
  shift
  for f in "$@"; do
    guest=${f%%:*}
    host=${f#*:}
    sed -n "\|^cqd-vm-file-begin $guest\$|,/^cqd-vm-file-end/p" "$log" | sed '1d;$d' |
      base64 -d > "$host" 2>/dev/null || echo "$vm_name: $guest did not come back" >&2
  done
}
