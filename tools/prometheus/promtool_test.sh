#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-2-Clause
# //tools/prometheus:promtool_test: the sample Prometheus configuration and cqd's alerting rules
# are valid, and each rule fires on its unit tests' synthetic series when it should and not
# before (promtool's own checks; no server, no network).
#
#   promtool_test.sh PROMETHEUS_YML RULES_YML RULES_TEST_YML
set -euo pipefail
config=$1 rules=$2 tests=$3
command -v promtool >/dev/null ||
  { echo "promtool_test: promtool is missing (tools/bootstrap.sh installs Debian's prometheus)"; exit 1; }
[[ $(dirname "$config") == "$(dirname "$rules")" && $(dirname "$rules") == "$(dirname "$tests")" ]] ||
  { echo "promtool_test: the three files must lie in one folder (they name each other)"; exit 1; }
promtool check config "$config"
promtool check rules "$rules"
promtool test rules "$tests"
echo "promtool_test: PASS"
