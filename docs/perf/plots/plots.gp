# SPDX-License-Identifier: BSD-2-Clause
# Drawn by benchmarks/perf_plots.py from the kept dispatch.json runs; run in this folder.
set terminal svg size 1200,500 dynamic font 'sans,11'
set termoption noenhanced
set grid
set key top left
set logscale x 2
set xtics (1, 8, 32, 64)
set xlabel 'poll batch'
set output 'throughput.svg'
set multiplot layout 1,2 title "Delivered completions/s by poll batch (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs (2026-11-24)"
set title '1 QP, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_q1_limit.dat' using 1:2:3:4 with yerrorlines title 'limit', \
     'data/mcps_q1_limit2.dat' using 1:2:3:4 with yerrorlines title 'limit2', \
     'data/mcps_q1_cqd.dat' using 1:2:3:4 with yerrorlines title 'cqd', \
     'data/mcps_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines title 'cqd_rtc', \
     'data/mcps_q1_mutex.dat' using 1:2:3:4 with yerrorlines title 'mutex', \
     'data/mcps_q1_tbb.dat' using 1:2:3:4 with yerrorlines title 'tbb', \
     'data/mcps_q1_ceph.dat' using 1:2:3:4 with yerrorlines title 'ceph'
set title '1000 QPs, 1 consumer'
set ylabel 'M completions/s'
set logscale y
plot 'data/mcps_q1000_limit.dat' using 1:2:3:4 with yerrorlines title 'limit', \
     'data/mcps_q1000_limit2.dat' using 1:2:3:4 with yerrorlines title 'limit2', \
     'data/mcps_q1000_cqd.dat' using 1:2:3:4 with yerrorlines title 'cqd', \
     'data/mcps_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines title 'cqd_rtc', \
     'data/mcps_q1000_mutex.dat' using 1:2:3:4 with yerrorlines title 'mutex', \
     'data/mcps_q1000_tbb.dat' using 1:2:3:4 with yerrorlines title 'tbb', \
     'data/mcps_q1000_ceph.dat' using 1:2:3:4 with yerrorlines title 'ceph'
unset multiplot
set output 'cpu.svg'
set multiplot layout 1,2 title "CPU ns per completion, all threads (log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs (2026-11-24)"
set title '1 QP, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_q1_limit.dat' using 1:2:3:4 with yerrorlines title 'limit', \
     'data/cpu_ns_per_completion_q1_limit2.dat' using 1:2:3:4 with yerrorlines title 'limit2', \
     'data/cpu_ns_per_completion_q1_cqd.dat' using 1:2:3:4 with yerrorlines title 'cqd', \
     'data/cpu_ns_per_completion_q1_cqd_rtc.dat' using 1:2:3:4 with yerrorlines title 'cqd_rtc', \
     'data/cpu_ns_per_completion_q1_mutex.dat' using 1:2:3:4 with yerrorlines title 'mutex', \
     'data/cpu_ns_per_completion_q1_tbb.dat' using 1:2:3:4 with yerrorlines title 'tbb', \
     'data/cpu_ns_per_completion_q1_ceph.dat' using 1:2:3:4 with yerrorlines title 'ceph'
set title '1000 QPs, 1 consumer'
set ylabel 'CPU ns per completion'
set logscale y
plot 'data/cpu_ns_per_completion_q1000_limit.dat' using 1:2:3:4 with yerrorlines title 'limit', \
     'data/cpu_ns_per_completion_q1000_limit2.dat' using 1:2:3:4 with yerrorlines title 'limit2', \
     'data/cpu_ns_per_completion_q1000_cqd.dat' using 1:2:3:4 with yerrorlines title 'cqd', \
     'data/cpu_ns_per_completion_q1000_cqd_rtc.dat' using 1:2:3:4 with yerrorlines title 'cqd_rtc', \
     'data/cpu_ns_per_completion_q1000_mutex.dat' using 1:2:3:4 with yerrorlines title 'mutex', \
     'data/cpu_ns_per_completion_q1000_tbb.dat' using 1:2:3:4 with yerrorlines title 'tbb', \
     'data/cpu_ns_per_completion_q1000_ceph.dat' using 1:2:3:4 with yerrorlines title 'ceph'
unset multiplot
set output 'latency.svg'
set terminal svg size 1000,500 dynamic font 'sans,11'
set termoption noenhanced
set title "Latency percentiles per mode (ns, log scale): median of the runs, bars lowest-highest\nAMD EPYC, 2 CPUs, 5 runs (2026-11-24)"
unset logscale x
set logscale y
set xlabel ''
set ylabel 'ns'
set key top left
set xrange [-0.5:5.5]
set xtics rotate by -20 format ''
set pointsize 1.5
plot 'data/latency.dat' using ($1-0.3):3:4:5:xtic(2) with yerrorbars pt 7 title 'poll->handler p50', \
     '' using ($1-0.1):6:7:8 with yerrorbars pt 5 title 'poll->handler p99', \
     '' using ($1+0.1):9:10:11 with yerrorbars pt 9 title 'added->handler p50', \
     '' using ($1+0.3):12:13:14 with yerrorbars pt 11 title 'added->handler p99'
