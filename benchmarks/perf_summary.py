#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Summarizes kept runs of the dispatch harness as markdown: each figure as the median of the
runs and, in brackets, the lowest and highest run.

    python3 benchmarks/perf_summary.py docs/perf/run*/dispatch.json > docs/perf/summary.md
"""
import json
import statistics
import sys


def load(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append((path, json.load(f)))
    return runs


def row(run, part, impl, batch, qps, cqs=1):
    for r in run["throughput"]:
        if (r["part"], r["impl"], r["batch"], r["qps"], r["cqs"], r["consumers"]) == (
                part, impl, batch, qps, cqs, 1):
            return r
    return None


def spread(values, fmt="{:.1f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return (fmt + " [" + fmt + "-" + fmt + "]").format(med, min(values), max(values))


def main(paths):
    runs = [r for _, r in load(paths)]
    out = []
    out.append("Runs: " + ", ".join(f"`{p}` ({r['when']})" for p, r in load(paths)))
    m = runs[0]["machine"]
    out.append(f"\nMachine: {m['cpu_model']}, {m['hardware_concurrency']} CPUs (online "
               f"{m['online']}, NUMA nodes {m['numa_nodes'] or '-'}), kernel {m['kernel']}, "
               f"guest: {m['hypervisor_guest']}.")
    out.append("\nFigures: median of the runs [lowest-highest]; each run's figure is itself the "
               "median of three windows.")
    impls = ["limit", "limit2", "cqd", "cqd_rtc", "mutex", "tbb", "ceph"]
    for metric, title, fmt in (("mcps", "M completions/s delivered", "{:.1f}"),
                               ("cpu_ns_per_completion", "CPU ns per completion, all threads",
                                "{:.1f}")):
        out.append(f"\n### {title} (1 consumer)\n")
        out.append("| QPs | batch | " + " | ".join(impls) + " |")
        out.append("| --- | ---: |" + " ---: |" * len(impls))
        for qps in (1, 1000):
            for batch in (1, 8, 32, 64):
                if row(runs[0], "dispatch", "cqd", batch, qps) is None:
                    continue
                cells = []
                for impl in impls:
                    vals = [(row(r, "dispatch", impl, batch, qps) or {}).get(metric) for r in runs]
                    cells.append(spread(vals, fmt))
                out.append(f"| {qps} | {batch} | " + " | ".join(cells) + " |")

    def ratio(fn):
        vals = []
        for r in runs:
            try:
                vals.append(fn(r))
            except (TypeError, ZeroDivisionError):
                pass
        return spread(vals, "{:.2f}")

    def mcps(r, part, impl, batch, qps, cqs=1):
        return row(r, part, impl, batch, qps, cqs)["mcps"]

    def lat(r, mode):
        return next(x for x in r["latency_ns"] if x["mode"] == mode)

    out.append("\n### Ratios (goals from the issue in brackets)\n")
    out.append("| measure | ratio |")
    out.append("| --- | ---: |")
    def cpu(r, impl, batch, qps):
        return row(r, "dispatch", impl, batch, qps)["cpu_ns_per_completion"]

    out.append("| cqd / limit2, batch 32, 1000 QPs (>= 0.5) | " + ratio(
        lambda r: mcps(r, "dispatch", "cqd", 32, 1000) / mcps(r, "dispatch", "limit2", 32, 1000)) + " |")
    for alt in ("mutex", "tbb", "ceph"):
        out.append(f"| cqd / {alt}, batch 32, 1000 QPs (mutex: >= 1.5) | " + ratio(
            lambda r, a=alt: mcps(r, "dispatch", "cqd", 32, 1000) / mcps(r, "dispatch", a, 32, 1000)) + " |")
    out.append("| cqd CPU ns / mutex CPU ns, batch 32, 1000 QPs (<= 1) | " + ratio(
        lambda r: cpu(r, "cqd", 32, 1000) / cpu(r, "mutex", 32, 1000)) + " |")
    out.append("| cqd_rtc / limit, batch 32, 1000 QPs (>= 0.6) | " + ratio(
        lambda r: mcps(r, "dispatch", "cqd_rtc", 32, 1000) / mcps(r, "dispatch", "limit", 32, 1000)) + " |")
    out.append("| cqd_rtc / limit, batch 32, 1 QP (>= 0.5) | " + ratio(
        lambda r: mcps(r, "dispatch", "cqd_rtc", 32, 1) / mcps(r, "dispatch", "limit", 32, 1)) + " |")
    out.append("| 1000 CQs (10 active) / 10 CQs (>= 0.8) | " + ratio(
        lambda r: mcps(r, "cqs", "cqd", 32, 1000, 1000) / mcps(r, "cqs", "cqd", 32, 1000, 10)) + " |")
    out.append("| 100000 QPs / 1000 QPs, random order (>= 0.8) | " + ratio(
        lambda r: mcps(r, "qps", "cqd", 32, 100000) / mcps(r, "qps", "cqd", 32, 1000)) + " |")
    out.append("| limit: 100000 QPs / 1000 QPs, random order | " + ratio(
        lambda r: mcps(r, "qps", "limit", 32, 100000) / mcps(r, "qps", "limit", 32, 1000)) + " |")
    out.append("| busy poll->handler p50 / spin floor p50 (<= 2) | " + ratio(
        lambda r: lat(r, "cqd_busy_poll")["poll_to_handler"]["p50"] / lat(r, "spin_handoff")["poll_to_handler"]["p50"]) + " |")
    out.append("| busy poll->handler p99 / spin floor p99 (<= 3) | " + ratio(
        lambda r: lat(r, "cqd_busy_poll")["poll_to_handler"]["p99"] / lat(r, "spin_handoff")["poll_to_handler"]["p99"]) + " |")
    out.append("| event mode added->handler p50 / eventfd wake p50 (<= 1.5) | " + ratio(
        lambda r: lat(r, "cqd_event")["added_to_handler"]["p50"] / lat(r, "eventfd_pingpong")["poll_to_handler"]["p50"]) + " |")
    out.append("| run-to-completion event mode added->handler p50 / eventfd wake p50 | " + ratio(
        lambda r: lat(r, "cqd_rtc_event")["added_to_handler"]["p50"] / lat(r, "eventfd_pingpong")["poll_to_handler"]["p50"]) + " |")

    out.append("\n### Latency, ns (poll -> handler entry | completion added -> handler entry)\n")
    out.append("| mode | p50 | p99 | p99.9 | added p50 | added p99 | added p99.9 | idle CPU % |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("cqd_busy_poll", "cqd_event", "cqd_rtc_busy_poll", "cqd_rtc_event",
                 "eventfd_pingpong", "spin_handoff"):
        def get(r, a, b):
            return lat(r, mode)[a][b]
        cells = [spread([get(r, "poll_to_handler", k) for r in runs], "{:.0f}") for k in ("p50", "p99", "p999")]
        cells += [spread([get(r, "added_to_handler", k) for r in runs], "{:.0f}") for k in ("p50", "p99", "p999")]
        idle = [lat(r, mode).get("idle_cpu_percent") for r in runs]
        cells.append(spread(idle, "{:.3f}") if any(v is not None for v in idle) else "-")
        out.append(f"| {mode} | " + " | ".join(cells) + " |")

    out.append("\n### Many CQs, many QPs (cqd, batch 32): M completions/s and CPU ns each\n")
    out.append("| case | M/s | CPU ns |")
    out.append("| --- | ---: | ---: |")
    for label, args in (("10 CQs, all active, 1000 QPs", ("cqs", "cqd", 32, 1000, 10)),
                        ("1000 CQs, 10 active, 1000 QPs", ("cqs", "cqd", 32, 1000, 1000)),
                        ("1000 QPs, random order", ("qps", "cqd", 32, 1000)),
                        ("100000 QPs, random order", ("qps", "cqd", 32, 100000)),
                        ("limit, 1000 QPs, random order", ("qps", "limit", 32, 1000)),
                        ("limit, 100000 QPs, random order", ("qps", "limit", 32, 100000))):
        vals = [row(r, *args) for r in runs]
        out.append(f"| {label} | " + spread([v and v["mcps"] for v in vals]) + " | " +
                   spread([v and v["cpu_ns_per_completion"] for v in vals]) + " |")
    out.append("\n### Open loop, default options: completion added -> handler entry\n")
    out.append("Arrivals on schedule (a paced replay, 1000 QPs, one CQ) at a fraction of the "
               "cqd saturation measured in the same run (batch 32, 1000 QPs).\n")
    out.append("| load | offered M/s | delivered M/s | p50 ns | p99 ns | p99.9 ns | CPU cores |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, fraction in enumerate((0.1, 0.5, 0.9)):
        vals = [r["open_loop"][i] for r in runs if len(r.get("open_loop", [])) > i]
        if not vals:
            continue
        cells = [spread([v["offered_mcps"] for v in vals], "{:.2f}"),
                 spread([v["delivered_mcps"] for v in vals], "{:.2f}")]
        cells += [spread([v["added_to_handler_ns"][k] for v in vals], "{:.0f}")
                  for k in ("p50", "p99", "p999")]
        cells.append(spread([v["cpu_cores"] for v in vals], "{:.2f}"))
        out.append(f"| {fraction * 100:.0f} % | " + " | ".join(cells) + " |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
