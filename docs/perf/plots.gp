set terminal pngcairo size 1200,500 font ',10'
set output 'throughput.png'
set multiplot layout 1,2 title 'Delivered completions/s vs poll batch (1 poller)'
set logscale x 2
set xlabel 'poll batch'
set ylabel 'M completions/s'
set key top left
set grid
set title '1 QP, 1 consumer'
plot 'tput_limit_q1_c1.dat' with linespoints title 'limit', 'tput_cqd_q1_c1.dat' with linespoints title 'cqd', 'tput_mutex_q1_c1.dat' with linespoints title 'mutex', 'tput_tbb_q1_c1.dat' with linespoints title 'tbb', 'tput_ceph_q1_c1.dat' with linespoints title 'ceph'
set title '1000 QPs, 1 consumer'
plot 'tput_limit_q1000_c1.dat' with linespoints title 'limit', 'tput_cqd_q1000_c1.dat' with linespoints title 'cqd', 'tput_mutex_q1000_c1.dat' with linespoints title 'mutex', 'tput_tbb_q1000_c1.dat' with linespoints title 'tbb', 'tput_ceph_q1000_c1.dat' with linespoints title 'ceph'
unset multiplot
set terminal pngcairo size 800,500 font ',10'
set output 'latency_cdf.png'
set title 'Latency CDF: poll -> handler entry (eventfd: write -> reader wakes)'
set logscale x 10
set xlabel 'ns'
set ylabel 'fraction'
set key bottom right
set yrange [0:1]
plot 'lat_cqd_busy_poll.dat' with lines lw 2 title 'cqd busy-poll', 'lat_cqd_event.dat' with lines lw 2 title 'cqd event mode', 'lat_eventfd_pingpong.dat' with lines lw 2 title 'eventfd wake (event floor)', 'lat_spin_handoff.dat' with lines lw 2 title 'spin handoff (busy floor)'
