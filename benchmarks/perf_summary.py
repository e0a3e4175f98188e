#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Summarizes kept runs of the dispatch harness as markdown: each figure as the median of the
runs and, in brackets, the lowest and highest run, each cross-core mode of the machine apart.

    python3 benchmarks/perf_summary.py RUN.json...                     # one set of runs
    python3 benchmarks/perf_summary.py --before RUN.json... --after RUN.json...

The small VMs these runs use switch every few minutes between a fast and a slow cross-core mode.
Every throughput, latency and open-loop row of a run from this harness records the cross-core
probe (benchmarks/machine.h) taken before and after it; a row is "fast" when both probes are under
--slow-above (ns per round trip), "slow" when both are at or over it, and "mixed" otherwise: a
mixed row is left out of every figure and counted. A figure that divides two rows of one run (a ratio) is taken only from runs in which
both rows fell in the mode. Runs written before the probe existed form one set, "mode not
recorded". An open-loop row counts only if the saturation row its offered rate came from fell in
its mode too. With --before and --after, prints for each mode the figures of both sets side by
side.
"""
import argparse
import json
import statistics
import sys

IMPLS = ["limit", "limit2", "cqd", "cqd_rtc", "mutex", "tbb", "ceph"]
LATENCY_MODES = ["cqd_busy_poll", "cqd_event", "cqd_rtc_busy_poll", "cqd_rtc_event",
                 "eventfd_pingpong", "spin_handoff"]


def load(paths):
    """[(path, run)] for the JSON files at `paths`; exits with a message (status 1) for a path
    that cannot be read or is not a run's JSON."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                runs.append((path, json.load(f)))
        except OSError as e:
            sys.exit(f"{sys.argv[0]}: {path}: cannot be read ({e.strerror})")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            sys.exit(f"{sys.argv[0]}: {path}: not a run's JSON ({e})")
    return runs


def add_run_arguments(parser):
    """The arguments both tools take: --slow-above, and RUN.json... or --before/--after."""
    parser.add_argument("--slow-above", type=float, default=150.0,
                        help="a probe at or over this many ns per round trip is the slow mode")
    parser.add_argument("--before", nargs="+", help="runs of the code before")
    parser.add_argument("--after", nargs="+", help="runs of the code after")
    parser.add_argument("runs", nargs="*")


def run_sets(parser, args):
    """[("", runs)] for RUN.json..., or [("before", runs), ("after", runs)]; each run a
    (path, run) pair. Calls parser.error unless exactly one of the two forms was given."""
    if bool(args.before) != bool(args.after) or bool(args.runs) == bool(args.before):
        parser.error("give either RUN.json... or both --before and --after")
    if args.runs:
        return [("", load(args.runs))]
    return [("before", load(args.before)), ("after", load(args.after))]


def mode_of(entry, slow_above):
    """'fast', 'slow', 'mixed', or 'unrecorded' for one row of a run."""
    probe = entry.get("xcore_rtt_ns")
    if not probe:
        return "unrecorded"
    slow = [p >= slow_above for p in probe]
    if all(slow):
        return "slow"
    if not any(slow):
        return "fast"
    return "mixed"


class View:
    """The rows of a set of runs that fell in one mode."""

    def __init__(self, runs, mode, slow_above):
        self.runs = runs
        self.mode = mode
        self.slow_above = slow_above

    def keep(self, entry):
        return entry is not None and mode_of(entry, self.slow_above) == self.mode

    def row(self, run, part, impl, batch, qps, cqs=1):
        for r in run["throughput"]:
            if (r["part"], r["impl"], r["batch"], r["qps"], r["cqs"], r["consumers"]) == (
                    part, impl, batch, qps, cqs, 1):
                return r if self.keep(r) else None
        return None

    def lat(self, run, mode):
        for x in run["latency_ns"]:
            if x["mode"] == mode:
                return x if self.keep(x) else None
        return None

    def open_loop(self, run, i):
        """Open-loop row i, if it and the saturation row its offered rate came from (cqd, batch
        32, 1000 QPs, same run) both fell in this mode: a rate measured in one mode and offered
        in the other is not the load the row names."""
        rows = run.get("open_loop", [])
        if len(rows) <= i or not self.keep(rows[i]):
            return None
        return rows[i] if self.row(run, "dispatch", "cqd", 32, 1000) is not None else None

    def rows_in_mode(self):
        count = 0
        for run in self.runs:
            for key in ("throughput", "latency_ns", "open_loop"):
                count += sum(1 for r in run.get(key, []) if self.keep(r))
        return count


def spread(values, fmt="{:.1f}", counted=False):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    text = fmt.format(med)
    if len(values) > 1:
        text = (fmt + " [" + fmt + "-" + fmt + "]").format(med, min(values), max(values))
    return text + (f" ({len(values)})" if counted else "")


def safe(fn, run):
    try:
        return fn(run)
    except (TypeError, ZeroDivisionError, KeyError):
        return None


def ratio_rows(v):
    """(label, per-run function) for the ratios the issue sets goals on."""
    def mcps(r, part, impl, batch, qps, cqs=1):
        return v.row(r, part, impl, batch, qps, cqs)["mcps"]

    def cpu(r, impl, batch, qps):
        return v.row(r, "dispatch", impl, batch, qps)["cpu_ns_per_completion"]

    def lat(r, mode, key="poll_to_handler", pct="p50"):
        return v.lat(r, mode)[key][pct]

    rows = [("cqd / limit2, batch 32, 1000 QPs (>= 0.5)",
             lambda r: mcps(r, "dispatch", "cqd", 32, 1000) / mcps(r, "dispatch", "limit2", 32, 1000))]
    for alt in ("mutex", "tbb", "ceph"):
        rows.append((f"cqd / {alt}, batch 32, 1000 QPs" + (" (>= 1.5)" if alt == "mutex" else ""),
                     lambda r, a=alt: mcps(r, "dispatch", "cqd", 32, 1000) /
                     mcps(r, "dispatch", a, 32, 1000)))
    rows += [
        ("cqd CPU ns / mutex CPU ns, batch 32, 1000 QPs (<= 1)",
         lambda r: cpu(r, "cqd", 32, 1000) / cpu(r, "mutex", 32, 1000)),
        ("cqd_rtc / limit, batch 32, 1000 QPs (>= 0.6)",
         lambda r: mcps(r, "dispatch", "cqd_rtc", 32, 1000) / mcps(r, "dispatch", "limit", 32, 1000)),
        ("cqd_rtc / limit, batch 32, 1 QP (>= 0.5)",
         lambda r: mcps(r, "dispatch", "cqd_rtc", 32, 1) / mcps(r, "dispatch", "limit", 32, 1)),
        ("1000 CQs (10 active) / 10 CQs",
         lambda r: mcps(r, "cqs", "cqd", 32, 1000, 1000) / mcps(r, "cqs", "cqd", 32, 1000, 10)),
        ("cqd: 100000 QPs / 1000 QPs, random order (>= the limit's)",
         lambda r: mcps(r, "qps", "cqd", 32, 100000) / mcps(r, "qps", "cqd", 32, 1000)),
        ("limit: 100000 QPs / 1000 QPs, random order",
         lambda r: mcps(r, "qps", "limit", 32, 100000) / mcps(r, "qps", "limit", 32, 1000)),
        ("busy poll->handler p50 / spin floor p50 (<= 2)",
         lambda r: lat(r, "cqd_busy_poll") / lat(r, "spin_handoff")),
        ("busy poll->handler p99 / spin floor p99",
         lambda r: lat(r, "cqd_busy_poll", pct="p99") / lat(r, "spin_handoff", pct="p99")),
        ("event mode added->handler p50 / eventfd wake p50",
         lambda r: lat(r, "cqd_event", "added_to_handler") / lat(r, "eventfd_pingpong")),
        ("run-to-completion event mode added->handler p50 / eventfd wake p50",
         lambda r: lat(r, "cqd_rtc_event", "added_to_handler") / lat(r, "eventfd_pingpong")),
    ]
    return rows


def tables(v):
    """The full tables of one set of runs in one mode."""
    runs = v.runs
    out = []
    for metric, title in (("mcps", "M completions/s delivered"),
                          ("cpu_ns_per_completion", "CPU ns per completion, all threads")):
        out.append(f"\n#### {title} (1 consumer)\n")
        out.append("| QPs | batch | " + " | ".join(IMPLS) + " |")
        out.append("| --- | ---: |" + " ---: |" * len(IMPLS))
        for qps in (1, 1000):
            for batch in (1, 8, 32, 64):
                cells = [spread([(v.row(r, "dispatch", impl, batch, qps) or {}).get(metric)
                                 for r in runs], counted=True) for impl in IMPLS]
                if all(c == "-" for c in cells):
                    continue
                out.append(f"| {qps} | {batch} | " + " | ".join(cells) + " |")

    out.append("\n#### Ratios within a run (the issue's goals in brackets)\n")
    out.append("| measure | ratio |")
    out.append("| --- | ---: |")
    for label, fn in ratio_rows(v):
        out.append(f"| {label} | " + spread([safe(fn, r) for r in runs], "{:.2f}", True) + " |")

    out.append("\n#### Latency, ns (poll -> handler entry | completion added -> handler entry)\n")
    out.append("| mode | p50 | p99 | p99.9 | added p50 | added p99 | added p99.9 | idle CPU % |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in LATENCY_MODES:
        got = [v.lat(r, mode) for r in runs]
        got = [g for g in got if g is not None]
        if not got:
            continue
        cells = [spread([g["poll_to_handler"][k] for g in got], "{:.0f}", k == "p50")
                 for k in ("p50", "p99", "p999")]
        cells += [spread([g["added_to_handler"][k] for g in got], "{:.0f}")
                  for k in ("p50", "p99", "p999")]
        idle = [g.get("idle_cpu_percent") for g in got]
        cells.append(spread(idle, "{:.3f}") if any(x is not None for x in idle) else "-")
        out.append(f"| {mode} | " + " | ".join(cells) + " |")

    out.append("\n#### Many CQs, many QPs (cqd, batch 32): M completions/s and CPU ns each\n")
    out.append("| case | M/s | CPU ns |")
    out.append("| --- | ---: | ---: |")
    for label, args in (("10 CQs, all active, 1000 QPs", ("cqs", "cqd", 32, 1000, 10)),
                        ("1000 CQs, 10 active, 1000 QPs", ("cqs", "cqd", 32, 1000, 1000)),
                        ("1000 QPs, random order", ("qps", "cqd", 32, 1000)),
                        ("100000 QPs, random order", ("qps", "cqd", 32, 100000)),
                        ("limit, 1000 QPs, random order", ("qps", "limit", 32, 1000)),
                        ("limit, 100000 QPs, random order", ("qps", "limit", 32, 100000))):
        vals = [v.row(r, *args) for r in runs]
        out.append(f"| {label} | " + spread([x and x["mcps"] for x in vals], counted=True) +
                   " | " + spread([x and x["cpu_ns_per_completion"] for x in vals]) + " |")

    out.append("\n#### Open loop, default options: completion added -> handler entry\n")
    out.append("Arrivals on schedule (a paced replay, 1000 QPs, one CQ) at a fraction of the "
               "cqd saturation measured in the same run (batch 32, 1000 QPs).\n")
    out.append("| load | offered M/s | delivered M/s | p50 ns | p99 ns | p99.9 ns | CPU cores |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, fraction in enumerate((0.1, 0.5, 0.9)):
        vals = [x for x in (v.open_loop(r, i) for r in runs) if x is not None]
        if not vals:
            continue
        cells = [spread([x["offered_mcps"] for x in vals], "{:.2f}", True),
                 spread([x["delivered_mcps"] for x in vals], "{:.2f}")]
        cells += [spread([x["added_to_handler_ns"][k] for x in vals], "{:.0f}")
                  for k in ("p50", "p99", "p999")]
        cells.append(spread([x["cpu_cores"] for x in vals], "{:.2f}"))
        out.append(f"| {fraction * 100:.0f} % | " + " | ".join(cells) + " |")
    return out


def side_by_side(before, after):
    """The figures of two sets in one mode, with after / before of the medians."""
    out = ["| figure | before | after | after / before |", "| --- | ---: | ---: | ---: |"]

    def line(label, fn_before, fn_after, fmt="{:.1f}"):
        b = [safe(fn_before, r) for r in before.runs]
        a = [safe(fn_after, r) for r in after.runs]
        bs, as_ = [x for x in b if x is not None], [x for x in a if x is not None]
        change = "-"
        if bs and as_ and statistics.median(bs):
            change = "{:.2f}".format(statistics.median(as_) / statistics.median(bs))
        out.append(f"| {label} | {spread(b, fmt, True)} | {spread(a, fmt, True)} | {change} |")

    def both(get, label, fmt="{:.1f}"):  # get(view, run)
        line(label, lambda r: get(before, r), lambda r: get(after, r), fmt)

    for qps in (1000, 1):
        qp_words = f"{qps} QP{'s' if qps > 1 else ''}"
        for impl in ("cqd", "cqd_rtc", "mutex", "limit", "limit2"):
            both(lambda v, r, i=impl, q=qps: v.row(r, "dispatch", i, 32, q)["mcps"],
                 f"{impl}, batch 32, {qp_words}: M/s")
            if impl in ("cqd", "cqd_rtc"):
                both(lambda v, r, i=impl, q=qps:
                     v.row(r, "dispatch", i, 32, q)["cpu_ns_per_completion"],
                     f"{impl}, batch 32, {qp_words}: CPU ns each")
    for impl in ("cqd", "limit"):
        both(lambda v, r, i=impl: v.row(r, "qps", i, 32, 100000)["mcps"],
             f"{impl}, 100000 QPs, random order: M/s")
    both(lambda v, r: v.row(r, "cqs", "cqd", 32, 1000, 1000)["mcps"],
         "cqd, 1000 CQs (10 active): M/s")
    for mode in LATENCY_MODES:
        key = "added_to_handler" if mode.endswith("event") else "poll_to_handler"
        word = "added" if key == "added_to_handler" else "poll"
        both(lambda v, r, m=mode, k=key: v.lat(r, m)[k]["p50"],
             f"{mode}: {word}->handler p50, ns", "{:.0f}")
    for (label, fn_before), (_, fn_after) in zip(ratio_rows(before), ratio_rows(after)):
        line(label, fn_before, fn_after, "{:.2f}")
    return out


def header(runs, slow_above):
    out = ["Runs: " + ", ".join(f"`{p}` ({r['when']})" for p, r in runs)]
    m = runs[0][1]["machine"]
    out.append(f"\nMachine: {m['cpu_model']}, {m['hardware_concurrency']} CPUs (online "
               f"{m['online']}, NUMA nodes {m['numa_nodes'] or '-'}), kernel {m['kernel']}, "
               f"guest: {m['hypervisor_guest']}.")
    return out


def modes_present(runs, slow_above):
    seen = {}
    for _, run in runs:
        for key in ("throughput", "latency_ns", "open_loop"):
            for r in run.get(key, []):
                mode = mode_of(r, slow_above)
                seen[mode] = seen.get(mode, 0) + 1
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    args = parser.parse_args()
    sets = run_sets(parser, args)
    out = []
    for name, runs in sets:
        if name:
            out.append(f"\n## The runs {name}\n")
        out += header(runs, args.slow_above)
        seen = modes_present(runs, args.slow_above)
        out.append("\nRows by mode (cross-core probe before and after each row, slow at "
                   f">= {args.slow_above:.0f} ns per round trip): " +
                   ", ".join(f"{k} {n}" for k, n in sorted(seen.items())) + ".")
    out.append("\nFigures: median of the runs [lowest-highest] (how many runs); each run's "
               "figure is itself the median of three windows. Mixed rows are left out.")
    modes = [m for m in ("fast", "slow", "unrecorded")
             if any(modes_present(runs, args.slow_above).get(m) for _, runs in sets)]
    for mode in modes:
        title = {"fast": "Fast mode", "slow": "Slow mode",
                 "unrecorded": "Mode not recorded (runs from before the probe)"}[mode]
        out.append(f"\n## {title}\n")
        views = [View([r for _, r in runs], mode, args.slow_above) for _, runs in sets]
        if len(views) == 2:
            out.append("### Before and after\n")
            out += side_by_side(*views)
        for (name, _), v in zip(sets, views):
            if v.rows_in_mode() == 0:
                continue
            out.append(f"\n### {(name + ': ') if name else ''}all figures")
            out += tables(v)
    print("\n".join(out))


if __name__ == "__main__":
    main()
