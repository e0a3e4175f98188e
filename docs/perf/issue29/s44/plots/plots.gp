# SPDX-License-Identifier: BSD-2-Clause
# Drawn by benchmarks/perf_plots.py from kept dispatch.json runs; run in this folder.
set terminal svg size 1400,500 dynamic font 'sans,11'
set termoption noenhanced
set grid
set key outside right top
set logscale x 2
set xrange [0.8:80]
set xtics norotate format '% h' (1, 8, 32, 64)
set xlabel 'poll batch'
set output 'throughput_fast.svg'
set multiplot layout 1,2 title "Delivered completions/s by poll batch, fast cross-core mode (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs after, 5 before (2026-11-27)"
set title '1 QP, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_fast_after_q1_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/mcps_fast_after_q1_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/mcps_fast_after_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/mcps_fast_after_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/mcps_fast_after_q1_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/mcps_fast_after_q1_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/mcps_fast_after_q1_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/mcps_fast_before_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/mcps_fast_before_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
set title '1000 QPs, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_fast_after_q1000_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/mcps_fast_after_q1000_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/mcps_fast_after_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/mcps_fast_after_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/mcps_fast_after_q1000_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/mcps_fast_after_q1000_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/mcps_fast_after_q1000_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/mcps_fast_before_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/mcps_fast_before_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
unset multiplot
set output 'cpu_fast.svg'
set multiplot layout 1,2 title "CPU ns per completion, all threads, fast cross-core mode (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs after, 5 before (2026-11-27)"
set title '1 QP, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_fast_after_q1_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/cpu_ns_per_completion_fast_after_q1_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/cpu_ns_per_completion_fast_after_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/cpu_ns_per_completion_fast_after_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/cpu_ns_per_completion_fast_after_q1_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/cpu_ns_per_completion_fast_after_q1_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/cpu_ns_per_completion_fast_after_q1_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/cpu_ns_per_completion_fast_before_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/cpu_ns_per_completion_fast_before_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
set title '1000 QPs, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_fast_after_q1000_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/cpu_ns_per_completion_fast_after_q1000_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/cpu_ns_per_completion_fast_after_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/cpu_ns_per_completion_fast_after_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/cpu_ns_per_completion_fast_after_q1000_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/cpu_ns_per_completion_fast_after_q1000_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/cpu_ns_per_completion_fast_after_q1000_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/cpu_ns_per_completion_fast_before_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/cpu_ns_per_completion_fast_before_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
unset multiplot
set output 'latency_fast.svg'
set terminal svg size 1200,500 dynamic font 'sans,11'
set termoption noenhanced
set title "Latency percentiles per mode (ns, log scale), fast cross-core mode: median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs after, 5 before (2026-11-27)"
unset logscale x
set logscale y
set xlabel ''
set ylabel 'ns'
set key inside top left
set xrange [-0.5:5.5]
set xtics rotate by -20 format ''
set pointsize 1.5
plot 'data/latency_fast_after.dat' using ($1-0.3):3:4:5:xtic(2) with yerrorbars pt 7 title 'poll->handler p50 (after)', \
     '' using ($1-0.15):6:7:8 with yerrorbars pt 5 title 'poll->handler p99 (after)', \
     '' using ($1):9:10:11 with yerrorbars pt 9 title 'added->handler p50 (after)', \
     '' using ($1+0.15):12:13:14 with yerrorbars pt 11 title 'added->handler p99 (after)', \
     'data/latency_fast_before.dat' using ($1+0.3):3:4:5 with yerrorbars pt 6 title 'poll->handler p50 (before)', \
     '' using ($1+0.4):9:10:11 with yerrorbars pt 8 title 'added->handler p50 (before)'
set terminal svg size 1400,500 dynamic font 'sans,11'
set termoption noenhanced
set grid
set key outside right top
set logscale x 2
set xrange [0.8:80]
set xtics norotate format '% h' (1, 8, 32, 64)
set xlabel 'poll batch'
set output 'throughput_slow.svg'
set multiplot layout 1,2 title "Delivered completions/s by poll batch, slow cross-core mode (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs after, 5 before (2026-11-27)"
set title '1 QP, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_slow_after_q1_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/mcps_slow_after_q1_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/mcps_slow_after_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/mcps_slow_after_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/mcps_slow_after_q1_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/mcps_slow_after_q1_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/mcps_slow_after_q1_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/mcps_slow_before_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/mcps_slow_before_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
set title '1000 QPs, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_slow_after_q1000_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/mcps_slow_after_q1000_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/mcps_slow_after_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/mcps_slow_after_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/mcps_slow_after_q1000_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/mcps_slow_after_q1000_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/mcps_slow_before_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/mcps_slow_before_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
unset multiplot
set output 'cpu_slow.svg'
set multiplot layout 1,2 title "CPU ns per completion, all threads, slow cross-core mode (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs after, 5 before (2026-11-27)"
set title '1 QP, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_slow_after_q1_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/cpu_ns_per_completion_slow_after_q1_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/cpu_ns_per_completion_slow_after_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/cpu_ns_per_completion_slow_after_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/cpu_ns_per_completion_slow_after_q1_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/cpu_ns_per_completion_slow_after_q1_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/cpu_ns_per_completion_slow_after_q1_ceph.dat' using 1:2:3:4 with yerrorlines lc rgb '#d7191c' pt 7 dashtype 1 title 'ceph', \
     'data/cpu_ns_per_completion_slow_before_q1_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/cpu_ns_per_completion_slow_before_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
set title '1000 QPs, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_slow_after_q1000_limit.dat' using 1:2:3:4 with yerrorlines lc rgb '#7b3294' pt 1 dashtype 1 title 'limit', \
     'data/cpu_ns_per_completion_slow_after_q1000_limit2.dat' using 1:2:3:4 with yerrorlines lc rgb '#1b9e77' pt 2 dashtype 1 title 'limit2', \
     'data/cpu_ns_per_completion_slow_after_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 1 title 'cqd', \
     'data/cpu_ns_per_completion_slow_after_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 1 title 'cqd_rtc', \
     'data/cpu_ns_per_completion_slow_after_q1000_mutex.dat' using 1:2:3:4 with yerrorlines lc rgb '#b8a000' pt 5 dashtype 1 title 'mutex', \
     'data/cpu_ns_per_completion_slow_after_q1000_tbb.dat' using 1:2:3:4 with yerrorlines lc rgb '#4d4d4d' pt 6 dashtype 1 title 'tbb', \
     'data/cpu_ns_per_completion_slow_before_q1000_cqd.dat' using 1:2:3:4 with yerrorlines lc rgb '#2b83ba' pt 3 dashtype 2 pointsize 0.8 title 'cqd (before)', \
     'data/cpu_ns_per_completion_slow_before_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines lc rgb '#e66101' pt 4 dashtype 2 pointsize 0.8 title 'cqd_rtc (before)'
unset multiplot
