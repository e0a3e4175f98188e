#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-2-Clause
"""Draws kept runs of the dispatch harness with gnuplot (tools/bootstrap.sh installs
gnuplot-nox), each cross-core mode of the machine apart: one command, from the JSON alone.

    python3 benchmarks/perf_plots.py --out DIR RUN.json...
    python3 benchmarks/perf_plots.py --out DIR --before RUN.json... --after RUN.json...

Rows are sorted into modes as benchmarks/perf_summary.py does (--slow-above, mixed rows left out).
Writes into --out, for each MODE with rows (fast, slow, or unrecorded for runs from before the
probe):
  throughput_MODE.svg  M completions/s by poll batch, every pipeline of the (after) runs, and with
                       --before the before runs' cqd and cqd_rtc, 1 QP and 1000 QPs
  cpu_MODE.svg         CPU ns per completion (all threads) by poll batch, the same curves
  latency_MODE.svg     poll -> handler and added -> handler p50 / p99 per latency mode, and with
                       --before the before runs' p50s
  data/*.dat           the numbers each curve and bar is drawn from (median, lowest, highest run)
  plots.gp             the gnuplot script that drew them from data/
Every point is the median of the runs whose row fell in the mode, its error bar their lowest and
highest.
"""
import argparse
import os
import statistics
import subprocess
import sys

from perf_summary import View, add_run_arguments, modes_present, run_sets

IMPLS = ["limit", "limit2", "cqd", "cqd_rtc", "mutex", "tbb", "ceph"]
BEFORE_IMPLS = ["cqd", "cqd_rtc"]
BATCHES = [1, 8, 32, 64]
LATENCY_MODES = ["spin_handoff", "cqd_busy_poll", "cqd_rtc_busy_poll", "eventfd_pingpong",
                 "cqd_event", "cqd_rtc_event"]
NAN3 = (float("nan"),) * 3
# One colour and point type per pipeline, the same in every plot and mode.
STYLE = {"limit": ("#7b3294", 1), "limit2": ("#1b9e77", 2), "cqd": ("#2b83ba", 3),
         "cqd_rtc": ("#e66101", 4), "mutex": ("#b8a000", 5), "tbb": ("#4d4d4d", 6),
         "ceph": ("#d7191c", 7)}


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


def curves(view, data_dir, metric, impls, tag):
    """Writes one .dat per (qps, impl) for `metric`; returns {qps: [(title, name)]}."""
    written = {}
    for qps in (1, 1000):
        for impl in impls:
            rows = []
            for batch in BATCHES:
                s = spread([(view.row(run, "dispatch", impl, batch, qps) or {}).get(metric)
                            for run in view.runs])
                if s is not None:
                    rows.append((batch,) + tuple(round(v, 3) for v in s))
            if rows:
                name = f"{metric}_{view.mode}_{tag}_q{qps}_{impl}.dat"
                write_dat(os.path.join(data_dir, name), f"batch median low high ({metric})", rows)
                title = impl if tag == "after" else f"{impl} (before)"
                written.setdefault(qps, []).append((title, name, tag, impl))
    return written


def latencies(view, data_dir, tag):
    rows = []  # every mode, NaN where no row fell in this cross-core mode: one x place each
    present = False
    for index, mode in enumerate(LATENCY_MODES):
        cells = [index, mode]
        for key in ("poll_to_handler", "added_to_handler"):
            for pct in ("p50", "p99"):
                s = spread([(view.lat(run, mode) or {}).get(key, {}).get(pct)
                            for run in view.runs])
                present |= s is not None
                cells.extend(round(v, 1) for v in (s or NAN3))
        rows.append(cells)
    name = f"latency_{view.mode}_{tag}.dat"
    write_dat(os.path.join(data_dir, name),
              "index mode poll_p50(med low high) poll_p99(...) added_p50(...) added_p99(...)",
              rows)
    return name if present else None


def panel_plot(written, qps, ylabel):
    lines = [f"set title '{qps} QP{'s' if qps > 1 else ''}, 1 consumer'",
             f"set ylabel '{ylabel}'", "set logscale y"]
    parts = []
    for title, name, tag, impl in written.get(qps, []):
        colour, point = STYLE[impl]
        style = f"lc rgb '{colour}' pt {point} " + (
            "dashtype 2 pointsize 0.8" if tag == "before" else "dashtype 1")
        parts.append(f"'data/{name}' using 1:2:3:4 with yerrorlines {style} title '{title}'")
    if not parts:  # no row of this panel fell in the mode
        return lines + ["set label 1 'no rows in this mode' at graph 0.5, 0.5 center",
                        "set yrange [1:10]", "plot 1/0 notitle", "unset label 1",
                        "set autoscale y"]
    lines.append("plot " + ", \\\n     ".join(parts))
    return lines


def script_for_mode(mode, tput, cpu, lat_after, lat_before, subtitle):
    words = {"fast": "fast cross-core mode", "slow": "slow cross-core mode",
             "unrecorded": "mode not recorded"}[mode]
    gp = [
        "set terminal svg size 1400,500 dynamic font 'sans,11'",
        "set termoption noenhanced",
        "set grid",
        "set key outside right top",
        "set logscale x 2",
        "set xrange [0.8:80]",
        "set xtics norotate format '% h' (1, 8, 32, 64)",
        "set xlabel 'poll batch'",
        f"set output 'throughput_{mode}.svg'",
        f"set multiplot layout 1,2 title \"Delivered completions/s by poll batch, {words} (log "
        f"scale): median of the runs, bars lowest-highest\\n{subtitle}\"",
    ]
    for qps in (1, 1000):
        gp += panel_plot(tput, qps, "M completions/s")
    gp += ["unset multiplot", f"set output 'cpu_{mode}.svg'",
           f"set multiplot layout 1,2 title \"CPU ns per completion, all threads, {words} (log "
           f"scale): median of the runs, bars lowest-highest\\n{subtitle}\""]
    for qps in (1, 1000):
        gp += panel_plot(cpu, qps, "CPU ns per completion")
    gp += ["unset multiplot"]
    if lat_after is None:
        return gp
    gp += [
        f"set output 'latency_{mode}.svg'",
        "set terminal svg size 1200,500 dynamic font 'sans,11'",
        "set termoption noenhanced",
        f"set title \"Latency percentiles per mode (ns, log scale), {words}: median of the "
        f"runs, bars lowest-highest\\n{subtitle}\"",
        "unset logscale x",
        "set logscale y",
        "set xlabel ''",
        "set ylabel 'ns'",
        "set key inside top left",
        "set xrange [-0.5:5.5]",
        "set xtics rotate by -20 format ''",
        "set pointsize 1.5",
    ]
    after = "" if lat_before is None else " (after)"
    parts = [
        f"'data/{lat_after}' using ($1-0.3):3:4:5:xtic(2) with yerrorbars pt 7 "
        f"title 'poll->handler p50{after}'",
        f"'' using ($1-0.15):6:7:8 with yerrorbars pt 5 title 'poll->handler p99{after}'",
        f"'' using ($1):9:10:11 with yerrorbars pt 9 title 'added->handler p50{after}'",
        f"'' using ($1+0.15):12:13:14 with yerrorbars pt 11 title 'added->handler p99{after}'",
    ]
    if lat_before is not None:
        parts += [
            f"'data/{lat_before}' using ($1+0.3):3:4:5 with yerrorbars pt 6 "
            "title 'poll->handler p50 (before)'",
            "'' using ($1+0.4):9:10:11 with yerrorbars pt 8 title 'added->handler p50 (before)'",
        ]
    gp.append("plot " + ", \\\n     ".join(parts))
    return gp


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    add_run_arguments(parser)
    args = parser.parse_args()
    sets = dict(run_sets(parser, args))
    after = sets.get("after", sets.get(""))
    before = sets.get("before", [])
    data_dir = os.path.join(args.out, "data")
    os.makedirs(data_dir, exist_ok=True)
    m = after[0][1]["machine"]
    when = sorted(r["when"][:10] for _, r in after + before)[0]
    subtitle = (f"{m['cpu_model']}, {m['hardware_concurrency']} CPUs, {len(after)} runs"
                + (f" after, {len(before)} before" if before else "") + f" ({when})")
    subtitle = subtitle.replace("'", "")
    seen = modes_present(after + before, args.slow_above)
    gp = ["# SPDX-License-Identifier: BSD-2-Clause",
          "# Drawn by benchmarks/perf_plots.py from kept dispatch.json runs; run in this folder."]
    drawn = []
    for mode in ("fast", "slow", "unrecorded"):
        if not seen.get(mode):
            continue
        va = View([r for _, r in after], mode, args.slow_above)
        vb = View([r for _, r in before], mode, args.slow_above)
        tput = curves(va, data_dir, "mcps", IMPLS, "after")
        cpu = curves(va, data_dir, "cpu_ns_per_completion", IMPLS, "after")
        if before:
            for qps, lines in curves(vb, data_dir, "mcps", BEFORE_IMPLS, "before").items():
                tput.setdefault(qps, []).extend(lines)
            for qps, lines in curves(vb, data_dir, "cpu_ns_per_completion", BEFORE_IMPLS,
                                     "before").items():
                cpu.setdefault(qps, []).extend(lines)
        if not tput:
            continue
        lat_after = latencies(va, data_dir, "after")
        lat_before = latencies(vb, data_dir, "before") if before else None
        gp += script_for_mode(mode, tput, cpu, lat_after, lat_before, subtitle)
        drawn += [f"throughput_{mode}.svg", f"cpu_{mode}.svg"]
        if lat_after is not None:
            drawn.append(f"latency_{mode}.svg")
    with open(os.path.join(args.out, "plots.gp"), "w") as f:
        f.write("\n".join(gp) + "\n")
    result = subprocess.run(["gnuplot", "plots.gp"], cwd=args.out)
    if result.returncode != 0:
        sys.exit("perf_plots: gnuplot failed")
    for name in drawn:
        print(os.path.join(args.out, name))


if __name__ == "__main__":
    main()
