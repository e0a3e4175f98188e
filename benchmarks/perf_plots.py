#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Draws the kept runs of the dispatch harness with gnuplot (tools/bootstrap.sh installs
gnuplot-nox): one command, from the JSON alone.

    python3 benchmarks/perf_plots.py --out docs/perf/plots docs/perf/run*/dispatch.json

Writes into --out:
  throughput.svg   M completions/s by poll batch, every pipeline, 1 QP and 1000 QPs
  cpu.svg          CPU ns per completion (all threads) by poll batch, the same pipelines
  latency.svg      poll -> handler and added -> handler p50 / p99 per latency mode
  data/*.dat       the numbers each curve and bar is drawn from (median, lowest, highest run)
  plots.gp         the gnuplot script that drew them from data/
Every point is the median of the runs given, its error bar their lowest and highest, as in
benchmarks/perf_summary.py.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

IMPLS = ["limit", "limit2", "cqd", "cqd_rtc", "mutex", "tbb", "ceph"]
BATCHES = [1, 8, 32, 64]
LATENCY_MODES = ["spin_handoff", "cqd_busy_poll", "cqd_rtc_busy_poll", "eventfd_pingpong",
                 "cqd_event", "cqd_rtc_event"]


def dispatch_row(run, impl, batch, qps):
    for r in run["throughput"]:
        if (r["part"], r["impl"], r["batch"], r["qps"], r["consumers"], r["cqs"],
                r["random_order"]) == ("dispatch", impl, batch, qps, 1, 1, False):
            return r
    return None


def spread(values):
    """(median, lowest, highest) of the values present, or None."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def write_dat(path, header, rows):
    with open(path, "w") as f:
        f.write("# " + header + "\n")
        for row in rows:
            f.write(" ".join(str(v) for v in row) + "\n")


def curves(runs, data_dir, metric):
    """Writes one .dat per (qps, impl) for `metric`; returns the names written."""
    written = {}
    for qps in (1, 1000):
        for impl in IMPLS:
            rows = []
            for batch in BATCHES:
                values = [(dispatch_row(run, impl, batch, qps) or {}).get(metric) for run in runs]
                s = spread(values)
                if s is not None:
                    rows.append((batch,) + tuple(round(v, 3) for v in s))
            if rows:
                name = f"{metric}_q{qps}_{impl}.dat"
                write_dat(os.path.join(data_dir, name), f"batch median low high ({metric})", rows)
                written.setdefault(qps, []).append((impl, name))
    return written


def latencies(runs, data_dir):
    rows = []
    for index, mode in enumerate(LATENCY_MODES):
        cells = [index, mode]
        present = False
        for key in ("poll_to_handler", "added_to_handler"):
            for pct in ("p50", "p99"):
                values = []
                for run in runs:
                    for lat in run["latency_ns"]:
                        if lat["mode"] == mode and key in lat:
                            values.append(lat[key].get(pct))
                s = spread(values)
                present |= s is not None
                cells.extend(round(v, 1) for v in (s or (float("nan"),) * 3))
        if present:
            rows.append(cells)
    name = "latency.dat"
    write_dat(os.path.join(data_dir, name),
              "index mode poll_p50(med low high) poll_p99(...) added_p50(...) added_p99(...)",
              rows)
    return name


def panel_plot(written, qps, ylabel, logy):
    lines = [f"set title '{qps} QP{'s' if qps > 1 else ''}, 1 consumer'",
             f"set ylabel '{ylabel}'",
             "set logscale y" if logy else "unset logscale y"]
    parts = []
    for impl, name in written.get(qps, []):
        parts.append(f"'data/{name}' using 1:2:3:4 with yerrorlines title '{impl}'")
    lines.append("plot " + ", \\\n     ".join(parts))
    return lines


def script(tput, cpu, lat_name, machine, when):
    subtitle = f"{machine} ({when})".replace("'", "")
    gp = [
        "# Drawn by benchmarks/perf_plots.py from the kept dispatch.json runs; run in this folder.",
        "set terminal svg size 1200,500 dynamic font 'sans,11'",
        "set termoption noenhanced",
        "set grid",
        "set key top left",
        "set logscale x 2",
        "set xtics (1, 8, 32, 64)",
        "set xlabel 'poll batch'",
        "set output 'throughput.svg'",
        f"set multiplot layout 1,2 title \"Delivered completions/s by poll batch (log scale): "
        f"median of the runs, bars lowest-highest\\n{subtitle}\"",
    ]
    for qps in (1, 1000):
        gp += panel_plot(tput, qps, "M completions/s", logy=True)
    gp += ["unset multiplot", "set output 'cpu.svg'",
           f"set multiplot layout 1,2 title \"CPU ns per completion, all threads (log scale): "
           f"median of the runs, bars lowest-highest\\n{subtitle}\""]
    for qps in (1, 1000):
        gp += panel_plot(cpu, qps, "CPU ns per completion", logy=True)
    gp += [
        "unset multiplot",
        "set output 'latency.svg'",
        "set terminal svg size 1000,500 dynamic font 'sans,11'",
        "set termoption noenhanced",
        f"set title \"Latency percentiles per mode (ns, log scale): median of the runs, bars "
        f"lowest-highest\\n{subtitle}\"",
        "unset logscale x",
        "set logscale y",
        "set xlabel ''",
        "set ylabel 'ns'",
        "set key top left",
        "set xrange [-0.5:5.5]",
        "set xtics rotate by -20 format ''",
        "set pointsize 1.5",
        f"plot 'data/{lat_name}' using ($1-0.3):3:4:5:xtic(2) with yerrorbars pt 7 "
        "title 'poll->handler p50', \\",
        "     '' using ($1-0.1):6:7:8 with yerrorbars pt 5 title 'poll->handler p99', \\",
        "     '' using ($1+0.1):9:10:11 with yerrorbars pt 9 title 'added->handler p50', \\",
        "     '' using ($1+0.3):12:13:14 with yerrorbars pt 11 title 'added->handler p99'",
    ]
    return "\n".join(gp) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("runs", nargs="+")
    args = parser.parse_args()
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    data_dir = os.path.join(args.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    tput = curves(runs, data_dir, "mcps")
    cpu = curves(runs, data_dir, "cpu_ns_per_completion")
    lat_name = latencies(runs, data_dir)
    m = runs[0]["machine"]
    machine = f"{m['cpu_model']}, {m['hardware_concurrency']} CPUs, {len(runs)} runs"
    when = ", ".join(sorted(r["when"][:10] for r in runs)[:1])
    with open(os.path.join(args.out, "plots.gp"), "w") as f:
        f.write(script(tput, cpu, lat_name, machine, when))
    result = subprocess.run(["gnuplot", "plots.gp"], cwd=args.out)
    if result.returncode != 0:
        sys.exit("perf_plots: gnuplot failed")
    for name in ("throughput.svg", "cpu.svg", "latency.svg"):
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
