#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""//tests/benchmarks:perf_summary_test: the kept runs' tools sort rows by cross-core mode.

    perf_summary_test.py PERF_SUMMARY.py PERF_PLOTS.py

Made-up runs in which each figure says which mode its row was given: the summary's fast section
may hold fast figures only, the slow section slow ones, a mixed row appears nowhere, a ratio comes
only from a run whose two rows share the mode, and an open-loop row counts only where the
saturation row its offered rate came from shares its mode. The plots' data files hold the same
medians.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

FAST, SLOW, MIXED = [80.0, 90.0], [300.0, 320.0], [80.0, 320.0]
MACHINE = {"cpu_model": "test", "hardware_concurrency": 2, "online": "0-1", "numa_nodes": "0",
           "kernel": "k", "hypervisor_guest": True}


def tput(impl, batch, qps, mcps, probe, part="dispatch", cqs=1):
    return {"part": part, "impl": impl, "batch": batch, "qps": qps, "consumers": 1, "cqs": cqs,
            "active_cqs": 1, "random_order": part == "qps", "mcps": mcps,
            "cpu_ns_per_completion": 1000.0 / mcps, "cpu_cores": 2.0, "xcore_rtt_ns": probe,
            "thread_cpu_ns": {}}


def lat(mode, p50, probe):
    return {"mode": mode, "samples": 100, "xcore_rtt_ns": probe,
            "poll_to_handler": {"p50": p50, "p99": 2 * p50, "p999": 3 * p50, "min": 1, "max": 9},
            "added_to_handler": {"p50": p50 + 1, "p99": 2 * p50, "p999": 3 * p50}}


def run(when, rows, lats, open_loop=()):
    return {"command": "test", "when": when, "machine": MACHINE, "throughput": rows,
            "latency_ns": lats, "open_loop": list(open_loop), "acks": []}


def load_row(load, p50, probe):
    return {"load": load, "offered_mcps": 1.0, "delivered_mcps": 1.0, "total": 1, "delivered": 1,
            "samples": 1, "added_to_handler_ns": {"p50": p50, "p99": p50, "p999": p50, "max": p50},
            "cpu_cores": 1.0, "xcore_rtt_ns": probe}


def write(dir_, name, data):
    path = os.path.join(dir_, name)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def section(text, title):
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def main():
    summary, plots = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp()
    # Run 1: cqd and mutex fast (cqd/mutex = 1.11); cqd_rtc slow; limit mixed.
    # Run 2: cqd and mutex slow (cqd/mutex = 0.25); cqd_rtc fast; limit slow.
    # Run 3: cqd fast, mutex slow: their ratio belongs to no mode. Its open loop at 10 % ran in the
    # fast mode (as did its saturation row, cqd): counted; run 2's ran fast too, but its rate came
    # from a slow saturation row: left out.
    r1 = run("2026-01-01T00:00:01Z",
             [tput("cqd", 32, 1000, 111.0, FAST), tput("mutex", 32, 1000, 100.0, FAST),
              tput("cqd_rtc", 32, 1000, 33.0, SLOW), tput("limit", 32, 1000, 999.0, MIXED)],
             [lat("cqd_busy_poll", 401, FAST), lat("spin_handoff", 201, FAST)])
    r2 = run("2026-01-01T00:00:02Z",
             [tput("cqd", 32, 1000, 25.0, SLOW), tput("mutex", 32, 1000, 100.0, SLOW),
              tput("cqd_rtc", 32, 1000, 77.0, FAST), tput("limit", 32, 1000, 55.0, SLOW)],
             [lat("cqd_busy_poll", 903, SLOW), lat("spin_handoff", 301, SLOW)],
             [load_row(0.1, 7771, FAST)])
    r3 = run("2026-01-01T00:00:03Z",
             [tput("cqd", 32, 1000, 113.0, FAST), tput("mutex", 32, 1000, 13.0, SLOW)], [],
             [load_row(0.1, 6661, FAST)])
    paths = [write(work, f"r{i}.json", r) for i, r in enumerate((r1, r2, r3), 1)]

    text = subprocess.run([sys.executable, summary, *paths], check=True, capture_output=True,
                          text=True).stdout
    fast, slow = section(text, "## Fast mode"), section(text, "## Slow mode")
    check("999.0" not in text, "a mixed row's figure was printed")
    check("mixed 1" in text, "the mixed row was not counted")
    for figure in ("111.0", "113.0", "77.0", "401", "201"):
        check(figure in fast, f"fast figure {figure} missing from the fast section")
        check(figure not in slow, f"fast figure {figure} in the slow section")
    for figure in ("25.0", "33.0", "55.0", "903", "301"):
        check(figure in slow, f"slow figure {figure} missing from the slow section")
        check(figure not in fast, f"slow figure {figure} in the fast section")
    fast_ratio = re.search(r"\| cqd / mutex, batch 32, 1000 QPs \(>= 1.5\) \| ([^|]*)\|", fast)
    slow_ratio = re.search(r"\| cqd / mutex, batch 32, 1000 QPs \(>= 1.5\) \| ([^|]*)\|", slow)
    check(fast_ratio and fast_ratio.group(1).strip() == "1.11 (1)",
          f"fast cqd/mutex should come from run 1 alone: {fast_ratio and fast_ratio.group(1)}")
    check(slow_ratio and slow_ratio.group(1).strip() == "0.25 (1)",
          f"slow cqd/mutex should come from run 2 alone: {slow_ratio and slow_ratio.group(1)}")
    check("6661" in fast, "an open-loop row in its saturation's mode is missing")
    check("7771" not in text, "an open-loop row offered a rate from the other mode was printed")
    busy = re.search(r"\| busy poll->handler p50 / spin floor p50 \(<= 2\) \| ([^|]*)\|", slow)
    check(busy and busy.group(1).strip() == "3.00 (1)", "slow latency ratio")

    # Before and after: each side's figures in their own column.
    text = subprocess.run([sys.executable, summary, "--before", paths[1], "--after", paths[0]],
                          check=True, capture_output=True, text=True).stdout
    row = re.search(r"\| cqd_rtc, batch 32, 1000 QPs: M/s \| ([^|]*)\| ([^|]*)\| ([^|]*)\|",
                    section(text, "## Slow mode"))
    check(row and [c.strip() for c in row.groups()] == ["-", "33.0 (1)", "-"],
          f"slow cqd_rtc before/after: {row and row.groups()}")
    row = re.search(r"\| cqd, batch 32, 1000 QPs: M/s \| ([^|]*)\| ([^|]*)\| ([^|]*)\|",
                    section(text, "## Fast mode"))
    check(row and [c.strip() for c in row.groups()] == ["-", "111.0 (1)", "-"],
          f"fast cqd before/after: {row and row.groups()}")

    # A run file that is not there, or not a run: a message and status 1, not a traceback.
    bad = os.path.join(work, "bad.json")
    with open(bad, "w") as f:
        f.write("not json")
    for path, words in ((os.path.join(work, "absent.json"), "cannot be read"),
                        (bad, "not a run's JSON")):
        done = subprocess.run([sys.executable, summary, path], capture_output=True, text=True)
        check(done.returncode == 1, f"{path}: status {done.returncode}")
        check(words in done.stderr and "Traceback" not in done.stderr, f"{path}: {done.stderr}")

    # The plots: one set per mode, their data the medians of the rows in that mode.
    if shutil.which("gnuplot"):
        out = os.path.join(work, "plots")
        subprocess.run([sys.executable, plots, "--out", out, *paths], check=True,
                       capture_output=True)
        with open(os.path.join(out, "data", "mcps_fast_after_q1000_cqd.dat")) as f:
            check(f.read().splitlines()[1] == "32 112.0 111.0 113.0", "fast cqd curve")
        with open(os.path.join(out, "data", "mcps_slow_after_q1000_cqd.dat")) as f:
            check(f.read().splitlines()[1] == "32 25.0 25.0 25.0", "slow cqd curve")
        with open(os.path.join(out, "plots.gp")) as f:  # kept plots pass tools/check_spdx.sh
            check("SPDX-License-Identifier: BSD-2-Clause" in f.readline(), "plots.gp's SPDX tag")
        for name in ("throughput_fast.svg", "throughput_slow.svg", "latency_slow.svg"):
            check(os.path.getsize(os.path.join(out, name)) > 0, name)
    else:
        print("gnuplot not installed: the plots part did not run")
    print("PASS")


if __name__ == "__main__":
    main()
