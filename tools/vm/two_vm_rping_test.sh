#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# //tools/vm:two_vm_rping_test: Debian's unmodified rping (rdmacm-utils) between two rxe VMs
# (run_two_vms.sh): a persistent rping server in one VM (rping_server.sh), 3 verifying rping
# clients side by side in the other (rping_clients.sh), 10 pings of 100 bytes each.
# Passes (exit 0) iff run_two_vms.sh exits 0 (every client exited 0 with pings 0..9 verified,
# the server saw 3 clients come and go) and the consoles show it: 3 "client N: ok, 10 pings
# verified" lines and 30 "server ping data" lines. Never passes by skipping: no rping or no VM
# is a failure. CQD_VM_TIMEOUT (default 600 s) bounds the VMs.
set -euo pipefail
dir=$(dirname "${BASH_SOURCE[0]}")
clients=3 count=10 size=100
rping=$(command -v rping) || { echo "FAIL: rping is missing (tools/bootstrap.sh installs rdmacm-utils)"; exit 1; }
export TMPDIR=${TEST_TMPDIR:-${TMPDIR:-/tmp}}
out=$TMPDIR/two_vm_rping.out
start=$SECONDS
set +e
"$dir/run_two_vms.sh" --timeout "${CQD_VM_TIMEOUT:-600}" --with "$rping" \
  "$dir/rping_server.sh" "$clients" "$size" -- "$dir/rping_clients.sh" "$clients" "$count" "$size" |
  tee "$out"
rc=${PIPESTATUS[0]}
set -e
echo "two_vm_rping_test: run_two_vms.sh exited $rc after $((SECONDS - start)) s"
ok=$(grep -c "^\[client\] client [0-9]*: ok, $count pings verified\$" "$out" || true)
served=$(grep -c '^\[server\] server ping data: rdma-ping-' "$out" || true)
fail=0
(( rc == 0 )) || { echo "FAIL: run_two_vms.sh exited $rc"; fail=1; }
(( ok == clients )) || { echo "FAIL: $ok of $clients clients verified their $count pings"; fail=1; }
(( served == clients * count )) || { echo "FAIL: the server echoed $served pings, want $((clients * count))"; fail=1; }
(( fail == 0 )) && echo "PASS: $clients rping clients, $count verified pings each, across two VMs"
exit $fail
