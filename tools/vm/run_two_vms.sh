#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Runs a server program in one throwaway rxe VM and a client program in another, the two VMs
# wired only to each other, and reports the outcome as an exit code.
#
#   tools/vm/run_two_vms.sh [--timeout S] [--with FILE]... [--ready REGEX]
#                           [--kill-client-on REGEX] [--fetch-server GUEST:HOST]...
#                           [--fetch-client GUEST:HOST]... [--logs DIR] [--relay REGEX]
#                           SERVER_PROG [ARGS...] -- CLIENT_PROG [ARGS...]
#
# Both VMs boot at once (qemu TCG, the initramfs and /init of vm_lib.sh, which also loads the
# rdma_cm modules, so librdmacm works). Each has rxe0 on its own eth0; the two NICs are joined by
# a qemu socket netdev on 127.0.0.1 (the server's qemu listens on a free port, the client's
# connects) and by nothing else: no route leaves this machine. server eth0 = 10.0.3.1/24,
# client eth0 = 10.0.3.2/24; both programs get CQD_SERVER_ADDR, CQD_CLIENT_ADDR, CQD_SELF_ADDR
# and CQD_VM_ROLE (server|client) in their environment. Programs (a path, or a name on PATH)
# may be busybox sh scripts; --with files (and their libraries) are on PATH in both VMs.
#
# Order: the client program starts only once the server program has printed a line matching
# --ready (ERE, default '^cqd-ready') and the client VM has booted (its /init waits for a "go"
# line on its console, which the runner writes to the client qemu's stdin).
# The client side is done when the client VM reports its exit code, when the runner kills it
# (--kill-client-on), or when its qemu dies. The runner then writes one line to the server
# program's stdin (its console, echo off): "cqd-client-done CODE", CODE being the client's exit
# code, 137 if killed, 97 if it reported none. A server may read that line as its end
# condition, or have its own (e.g. "served N clients") and never read stdin.
# --kill-client-on REGEX: when the client program prints a matching line (ERE), the client qemu
# gets SIGKILL (a host losing power mid-traffic); the server runs on. The runner polls the
# consoles every 0.5 s, so the client may run on for that long after the line.
# --relay REGEX: each line either program prints that matches REGEX (ERE) is written, once and in
# order, to the other VM's console (its program's stdin; the client's only once it was started),
# within about 0.5 s: for programs that take turns (tools/vm/reactor_vs_echo.sh).
#
# Exit code: with --kill-client-on, once the kill happened, the server's; otherwise the server's
# if non-zero, else the client's. 97 if a VM that had to report a code did not (boot failure,
# crash, --timeout, default 900 s, which kills both). 2: bad usage.
# Output: both consoles, from /init's first line on, prefixed "[server] " / "[client] ", on
# stdout; the runner's own lines ("run_two_vms: ...") on stderr. The full console logs
# (server.log, client.log) go to --logs DIR (default $TEST_UNDECLARED_OUTPUTS_DIR); without
# one, a failed run keeps them in its work dir and says where. Files: --fetch-server/--fetch-client
# as run_in_vm.sh's --fetch (guest paths relative to /work). Both qemus die on every exit path.
set -euo pipefail

timeout_s=900
ready_re='^cqd-ready'
kill_re=
relay_re=
logs=${TEST_UNDECLARED_OUTPUTS_DIR:-}
extra=()
fetch_server=()
fetch_client=()
usage() { sed -n '6,9p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2; }
while (( $# > 0 )); do
  case $1 in
    --timeout) timeout_s=$2; shift 2 ;;
    --with) extra+=("$2"); shift 2 ;;
    --ready) ready_re=$2; shift 2 ;;
    --kill-client-on) kill_re=$2; shift 2 ;;
    --fetch-server) fetch_server+=("$2"); shift 2 ;;
    --fetch-client) fetch_client+=("$2"); shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    --relay) relay_re=$2; shift 2 ;;
    -*) echo "run_two_vms: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
server_cmd=()
while (( $# > 0 )) && [[ $1 != -- ]]; do server_cmd+=("$1"); shift; done
(( $# > 0 )) && shift
client_cmd=("$@")
(( ${#server_cmd[@]} > 0 && ${#client_cmd[@]} > 0 )) || usage

vm_name=run_two_vms
lib=$(dirname "${BASH_SOURCE[0]}")/vm_lib.sh
[[ -f $lib ]] || lib=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/vm_lib.sh
source "$lib"
vm_check
command -v ss >/dev/null || vm_fail "ss is missing (iproute2; run tools/bootstrap.sh)"
say() { echo "run_two_vms: [${SECONDS}s] $*" >&2; }

declare -A addr=([server]=10.0.3.1 [client]=10.0.3.2) mac=([server]=52:54:00:c0:03:01 [client]=52:54:00:c0:03:02)
declare -A pidf qrc log in_fd
work=$(mktemp -d "${TMPDIR:-/tmp}/cqd-two-vms.XXXXXX")
for role in server client; do
  pidf[$role]=$work/$role.pid qrc[$role]=$work/$role.qrc log[$role]=$work/$role.log
done
alive() { [[ -s ${pidf[$1]} && ! -e ${qrc[$1]} ]]; }
kill_vm() { if alive "$1"; then kill -KILL "$(cat "${pidf[$1]}")" 2>/dev/null || true; fi; }
result=97
cleanup() {
  kill_vm server; kill_vm client
  wait 2>/dev/null || true
  if [[ -n $logs ]]; then
    mkdir -p "$logs" && cp "$work"/*.log "$logs"/ 2>/dev/null || true
  elif (( result != 0 )); then
    echo "run_two_vms: consoles kept in $work/{server,client}.log" >&2
    rm -f "$work"/*.gz "$work"/*.in
    return
  fi
  [[ -n ${CQD_VM_KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 97' INT TERM

# ---- the two initramfs ----
# prog PATH_OR_NAME: the program's absolute path (a bare name is looked up on PATH).
prog() { if [[ $1 == */* ]]; then readlink -f "$1"; else readlink -f "$(command -v "$1" || echo "$1")"; fi; }
vm_modules="$VM_MODULES $VM_CM_MODULES"
vm_extra=(${extra[@]+"${extra[@]}"})
for role in server client; do
  vm_addr=${addr[$role]}/24
  vm_pre_run="export CQD_VM_ROLE=$role CQD_SELF_ADDR=${addr[$role]}
export CQD_SERVER_ADDR=${addr[server]} CQD_CLIENT_ADDR=${addr[client]}
stty -echo 2>/dev/null"
  if [[ $role == client ]]; then
    vm_fetch=(${fetch_client[@]+"${fetch_client[@]}"})
    vm_pre_run+=$'\necho "cqd-vm: waiting for go"; read -r go'
    vm_build_initrd "$work/client.gz" "$(prog "${client_cmd[0]}")" "${client_cmd[@]:1}"
  else
    vm_fetch=(${fetch_server[@]+"${fetch_server[@]}"})
    vm_build_initrd "$work/server.gz" "$(prog "${server_cmd[0]}")" "${server_cmd[@]:1}"
  fi
done

# start_vm ROLE NETDEV: boots ROLE's VM in the background; its stdin is the FIFO $work/ROLE.in.
start_vm() {
  local role=$1 fd
  rm -f "${pidf[$role]}" "${qrc[$role]}"
  [[ -p $work/$role.in ]] || mkfifo "$work/$role.in"
  exec {fd}<>"$work/$role.in"
  in_fd[$role]=$fd
  vm_qemu_args "$work/$role.gz"
  (
    set +e
    bash -c 'echo $$ > "$1"; shift; exec "$@"' _ "${pidf[$role]}" "${vm_qemu[@]}" \
      -netdev "$2" -device "virtio-net-pci,netdev=net0,mac=${mac[$role]},romfile=" \
      <&"$fd" 2>"$work/$role.qemu.err" |
      vm_clean | tee "${log[$role]}" | vm_show | sed -u "s/^/[$role] /"
    echo "${PIPESTATUS[0]}" > "${qrc[$role]}"
  ) 2>/dev/null &
}
# to_vm ROLE LINE: writes LINE to ROLE's console (the guest program's stdin).
to_vm() { printf '%s\n' "$2" >&"${in_fd[$1]}"; }
# has ROLE REGEX: the program (the console after /init's "running" line) printed a match.
has() { grep -Eq -- "$2" <(sed '0,/^cqd-vm: running/d' "${log[$1]}" 2>/dev/null); }
in_log() { grep -q -- "$2" "${log[$1]}" 2>/dev/null; }
# relay FROM TO: writes FROM's program lines matching --relay that are new since the last call
# to TO's console (complete lines only).
declare -A relayed=([server]=0 [client]=0)
relay() {
  local lines=() k n
  mapfile -t lines < <(sed '0,/^cqd-vm: running/d' "${log[$1]}" 2>/dev/null)
  n=${#lines[@]}
  [[ -s ${log[$1]} && $(tail -c1 "${log[$1]}" | od -An -c) == *'\n'* ]] || n=$((n > 0 ? n - 1 : 0))
  for ((k = relayed[$1]; k < n; k++)); do
    [[ ${lines[k]} =~ $relay_re ]] && to_vm "$2" "${lines[k]}"
  done
  (( n > relayed[$1] )) && relayed[$1]=$n
  return 0
}

# ---- boot: the server's qemu listens on a free 127.0.0.1 port, then the client's connects ----
port=
for try in 1 2 3 4 5; do
  p=$(( 20000 + RANDOM % 40000 ))
  [[ -z $(ss -Htan "( sport = :$p or dport = :$p )") ]] || continue
  start_vm server "socket,id=net0,listen=127.0.0.1:$p"
  for _ in $(seq 100); do
    [[ -n $(ss -Hltn "sport = :$p") ]] && { port=$p; break; }
    [[ -e ${qrc[server]} ]] && break
    sleep 0.1
  done
  [[ -n $port ]] && break
  kill_vm server; wait
done
[[ -n $port ]] || { cat "$work/server.qemu.err" >&2; vm_fail "the server's qemu did not listen on 127.0.0.1"; }
start_vm client "socket,id=net0,connect=127.0.0.1:$port"
say "VMs booting (link: 127.0.0.1:$port)"

# ---- watch both consoles ----
deadline=$(( SECONDS + timeout_s ))
go_sent= client_rc= server_rc= killed= done_sent=
while :; do
  server_rc=$(vm_exit_code "${log[server]}" 2>/dev/null)
  [[ -n $client_rc ]] || client_rc=$(vm_exit_code "${log[client]}" 2>/dev/null)
  if [[ -z $go_sent ]] && has server "$ready_re" && in_log client '^cqd-vm: waiting for go'; then
    to_vm client go; go_sent=1
    say "server ready; client program started"
  fi
  if [[ -n $relay_re ]]; then
    relay client server
    [[ -z $go_sent || -n $client_rc ]] || relay server client
  fi
  if [[ -n $go_sent && -n $kill_re && -z $killed && -z $client_rc ]] && has client "$kill_re"; then
    kill_vm client; killed=1 client_rc=137
    say "client printed /$kill_re/: client VM killed (SIGKILL)"
  fi
  if [[ -z $client_rc && -e ${qrc[client]} ]]; then
    # The client's qemu ended without a code; the log may only now show one.
    client_rc=$(vm_exit_code "${log[client]}")
    if [[ -z $client_rc ]]; then
      client_rc=97
      say "client VM stopped (qemu exit $(cat "${qrc[client]}")) without an exit code"
      tail -n 20 "${log[client]}" "$work/client.qemu.err" >&2 || true
      [[ -n $go_sent ]] || { result=97; exit 97; }
    fi
  fi
  if [[ -n $client_rc && -z $done_sent ]]; then
    to_vm server "cqd-client-done $client_rc"; done_sent=1
    say "client side done ($client_rc); told the server"
  fi
  [[ -n $server_rc ]] && break
  if [[ -e ${qrc[server]} ]]; then
    server_rc=$(vm_exit_code "${log[server]}")
    [[ -n $server_rc ]] && break
    say "server VM stopped (qemu exit $(cat "${qrc[server]}")) without an exit code"
    tail -n 20 "${log[server]}" "$work/server.qemu.err" >&2 || true
    result=97; exit 97
  fi
  if (( SECONDS >= deadline )); then
    say "timeout (${timeout_s}s); killing both VMs"
    for role in server client; do
      echo "run_two_vms: last $role console lines:" >&2; tail -n 15 "${log[$role]}" >&2 || true
    done
    result=97; exit 97
  fi
  sleep 0.5
done
say "server exited $server_rc"

# ---- the server reported; settle the client's side ----
if [[ $server_rc == 0 && -z $killed ]]; then
  if [[ -z $go_sent ]]; then
    say "server exited 0 before the client program started"
    result=97; exit 97
  fi
  while [[ -z $client_rc ]] && alive client && (( SECONDS < deadline )); do
    sleep 0.5; client_rc=$(vm_exit_code "${log[client]}")
  done
  [[ -n $client_rc ]] || { say "the client VM reported no exit code"; client_rc=97; }
  result=$client_rc
else
  result=$server_rc
fi
kill_vm client
wait || true
vm_fetch_files "${log[server]}" ${fetch_server[@]+"${fetch_server[@]}"}
[[ -n $killed ]] || vm_fetch_files "${log[client]}" ${fetch_client[@]+"${fetch_client[@]}"}
say "result $result (server $server_rc, client ${client_rc:-none})"
exit "$result"
