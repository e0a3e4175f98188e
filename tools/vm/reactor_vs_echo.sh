#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# CPU per echo and latency of reactor_server (examples/reactor: one reactor thread per core, each
# driving its own engine-driven shard) against echo_server (two runtime-owned pollers; its
# consumer engine-driven by default, a runtime-owned thread with --owned) under the same load of
# unmodified echo_clients, in one boot of two rxe VMs (run_two_vms.sh --relay; the servers take
# turns on the same port).
#
#   tools/vm/reactor_vs_echo.sh [--reps N] [--out FILE] [--from-log LOG]
#
# Builds the three programs with -c opt (no bazel-* symlinks are touched), then runs, N times
# (default 2), echo_server, echo_server --owned ("echo_owned"), reactor_server --threads=2
# ("reactor") and the same with
# --idle-spin-us=0 ("reactor_nospin": it tries to sleep as soon as a pass finds nothing), one
# after the other, each through three phases:
#   idle  5 s with no connection (what the server burns doing nothing);
#   load  4 echo_client processes at once, 16 connections each, window 8, 200 x (1 + i % 3)
#         requests per connection (24800 echoes);
#   rtt   1 connection, window 1, 500 requests (round trips one at a time).
# The server's CPU time is utime + stime of /proc/PID/stat (every thread of the process, in
# 10 ms ticks), sampled when the client side says a phase begins and when it ended
# (tools/vm/reactor_vs_echo_server.sh); "echoes" are the replies the clients verified; latency
# is echo_client --latency's (post of a request to verification of its reply).
# Writes the table and the raw lines to FILE (default: stdout), with the command at the top.
# --from-log LOG: no run; the table of a run whose output (run_two_vms.sh's) was kept in LOG.
# Exit code: run_two_vms.sh's (0: every server and client exited 0).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
command_line="tools/vm/reactor_vs_echo.sh $*"
reps=2
out=
from_log=
while (( $# > 0 )); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --from-log) from_log=$2; shift 2 ;;
    *) sed -n '8p' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2; exit 2 ;;
  esac
done

# The tree the programs are built from, taken before anything runs (and before FILE, which is
# tracked, is written).
stamp="$(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes')"

run() {
  local targets=(//examples:echo_server //examples:reactor_server //examples:echo_client) bin
  local servers=() client load phases
  bazel build -c opt --symlink_prefix=/ "${targets[@]}" >&2
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
  for ((r = 0; r < reps; r++)); do
    servers+=("echo_server" "echo_owned=echo_server --owned" "reactor=reactor_server --threads=2"
      "reactor_nospin=reactor_server --threads=2 --idle-spin-us=0")
  done
  client="echo_client --server=@SERVER"
  load="$client --connections=16 --requests=200 --window=8 --rounds=1 --latency"
  phases=(
    "idle=sleep 5"
    "load=$load;$load;$load;$load"
    "rtt=$client --connections=1 --window=1 --requests=500 --rounds=1 --latency"
  )
  tools/vm/run_two_vms.sh --timeout 1800 --relay '^cqd-relay: ' \
    --with "$bin/examples/echo_server" --with "$bin/examples/reactor_server" \
    --with "$bin/examples/echo_client" \
    tools/vm/reactor_vs_echo_server.sh "${servers[@]}" -- \
    tools/vm/reactor_vs_echo_clients.sh "${#servers[@]}" "${phases[@]}"
}

if [[ -n $from_log ]]; then
  log=$from_log
  rc=$(sed -n 's/^run_two_vms: .* result \([0-9]*\) .*/\1/p' "$log" | tail -1)
else
  log=$(mktemp "${TMPDIR:-/tmp}/reactor_vs_echo.XXXXXX")
  trap 'rm -f "$log"' EXIT
  set +e
  run 2>&1 | tee "$log" >&2
  rc=${PIPESTATUS[0]}
  set -e
fi

report() {
  echo "# $command_line"
  echo "# $stamp, run_two_vms.sh exit $rc"
  cat <<'NOTE'
#
# Soft-RoCE (rxe) inside two emulated VMs (qemu TCG, no KVM: every instruction is emulated), 2
# vCPUs each, joined only by a qemu socket netdev on 127.0.0.1; the host has 2 cores for both
# VMs. Absolute numbers are those of this emulation (tens to hundreds of times a real NIC's);
# only the ratios between the two servers, measured in the same boot, mean anything, and rxe
# does its packet work in the kernel of whichever thread posts or takes the softirq, so part of
# the CPU counted is rxe's and part of it may be charged to whichever process was interrupted.
#
# echo_server: 2 runtime-owned poller threads + 1 engine-driven consumer (its main thread's epoll
# loop), its defaults. echo_owned: echo_server --owned, the same pollers + 1 runtime-owned
# consumer thread running the handlers (the main thread only ticks). reactor_server --threads=2:
# 2 reactor threads, each the poller of its own engine-driven shard, handlers run to completion
# inside PollShard.
# cpu_ms: the server process's utime+stime (/proc/PID/stat, 10 ms ticks) over the phase.
# cpu_us/echo: cpu_ms / echoes. idle: cpu_ms per second instead (ms/s; the seconds between the
# server's two samples, the client's 5 s plus the relay's turns). wall_s: the client's.
# latency (us): echo_client --latency, request posted -> reply verified; load: mean over all
# requests of the 4 clients, p50 the median of the clients' p50s, p99 the highest client p99.
# "load" latency includes window queueing (8 outstanding per connection, 64 connections).
NOTE
  echo
  awk '
    function kv(line, key,   m) {
      if (match(line, " " key "=[^ ]*")) return substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 2)
      return ""
    }
    /^\[server\] compare: / {
      id = kv($0, "server") SUBSEP kv($0, "phase")
      cpu[id] = kv($0, "cpu_ticks") * 1000 / kv($0, "hz"); echoes[id] = kv($0, "verified")
      swall_s[id] = kv($0, "server_wall_cs") / 100
      if (!(id in seen)) { seen[id] = 1; order[++n] = id }
    }
    /^\[client\] compare: .* wall_cs=/ {
      id = kv($0, "server") SUBSEP kv($0, "phase"); wall[id] = kv($0, "wall_cs") / 100
      failed[id] = kv($0, "failed")
      if (!(id in seen)) { seen[id] = 1; order[++n] = id }
    }
    /^\[client\] compare: .* latency_us / {
      id = kv($0, "server") SUBSEP kv($0, "phase"); s = kv($0, "samples")
      lsum[id] += s * kv($0, "mean"); lcount[id] += s
      p50s[id] = p50s[id] " " kv($0, "p50")
      p = kv($0, "p99") + 0; if (p > p99[id]) p99[id] = p
    }
    function median(list,   a, k, i, j, t) {
      k = split(list, a, " ")
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
      return k == 0 ? 0 : a[int((k + 1) / 2)]
    }
    END {
      printf "%-22s %-5s %7s %7s %9s %9s %11s %9s %9s %9s %6s\n", "run:server", "phase", "echoes", "wall_s", "echoes/s", "cpu_ms", "cpu_us/echo", "lat_mean", "lat_p50", "lat_p99", "failed"
      for (i = 1; i <= n; i++) {
        id = order[i]; split(id, part, SUBSEP)
        e = echoes[id] + 0; w = wall[id] + 0
        if (part[2] == "idle") per = (swall_s[id] > 0) ? sprintf("%.1f ms/s", cpu[id] / swall_s[id]) : "-"
        else per = (e > 0) ? sprintf("%.1f", cpu[id] * 1000 / e) : "-"
        mean = (lcount[id] > 0) ? sprintf("%.1f", lsum[id] / lcount[id]) : "-"
        rate = (w > 0 && e > 0) ? sprintf("%.0f", e / w) : "-"
        p50 = (lcount[id] > 0) ? median(p50s[id]) : "-"
        p99s = (lcount[id] > 0) ? sprintf("%.1f", p99[id]) : "-"
        printf "%-22s %-5s %7d %7.2f %9s %9.0f %11s %9s %9s %9s %6s\n", part[1], part[2], e, w, rate, cpu[id], per, mean, p50, p99s, failed[id]
        name = part[1]; sub(/^[0-9]+:/, "", name); key = name SUBSEP part[2]
        if (!(key in scount)) sorder[++sn] = key
        scount[key]++; scpu[key] += cpu[id]; secho[key] += e; swall[key] += swall_s[id]
        if (lcount[id] > 0) { slat[key] += lsum[id] / lcount[id]; slatn[key]++ }
      }
      printf "\nover the runs of each server (cpu summed, echoes summed; latency: mean of the runs'"'"' means)\n"
      printf "%-22s %-5s %5s %11s %9s\n", "server", "phase", "runs", "cpu_us/echo", "lat_mean"
      for (i = 1; i <= sn; i++) {
        key = sorder[i]; split(key, part, SUBSEP)
        if (part[2] == "idle") per = sprintf("%.1f ms/s", (swall[key] > 0) ? scpu[key] / swall[key] : 0)
        else per = (secho[key] > 0) ? sprintf("%.1f", scpu[key] * 1000 / secho[key]) : "-"
        lat = (slatn[key] > 0) ? sprintf("%.1f", slat[key] / slatn[key]) : "-"
        printf "%-22s %-5s %5d %11s %9s\n", part[1], part[2], scount[key], per, lat
      }
    }' "$log"
  echo
  echo "# raw: the compare lines and the servers' own summaries"
  grep -E '^\[(server|client)\] (compare: |server [0-9]+: (echo_server|reactor_server): |server [0-9]+: stats: |reactor_vs_echo)' "$log" || true
}
if [[ -n $out ]]; then
  mkdir -p "$(dirname "$out")"
  report > "$out"
  cat "$out"
else
  report
fi
exit "$rc"
