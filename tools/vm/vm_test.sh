#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# Bazel test wrapper: runs a GoogleTest binary on real verbs.
#
#   vm_test.sh BINARY [ARGS...]
#
# By default BINARY runs on rxe in a throwaway VM (run_in_vm.sh), and its GoogleTest XML comes
# back as this test's result file. With CQD_RDMA_HOST=1 (bazel test --config=rdma_host) it runs
# directly on this host's RDMA device ($CQD_RDMA_DEVICE, default rxe0). If the VM cannot boot the
# test fails with run_in_vm's message; it never passes by skipping.
set -euo pipefail
binary=$1
shift
if [[ ${CQD_RDMA_HOST:-} == 1 ]]; then
  exec "$binary" "$@"
fi
runner=${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/tools/vm/run_in_vm.sh
[[ -x $runner ]] || runner=$(dirname "${BASH_SOURCE[0]}")/run_in_vm.sh
fetch=()
if [[ -n ${XML_OUTPUT_FILE:-} ]]; then
  fetch=(--fetch "/work/test.xml:$XML_OUTPUT_FILE")
  set -- "$@" --gtest_output=xml:/work/test.xml
fi
export TMPDIR=${TEST_TMPDIR:-${TMPDIR:-/tmp}}
exec "$runner" --timeout "${CQD_VM_TIMEOUT:-840}" "${fetch[@]}" "$binary" "$@"
