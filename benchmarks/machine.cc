// SPDX-License-Identifier: BSD-2-Clause
#include "benchmarks/machine.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/utsname.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace cqd::bench {
namespace {

std::string ReadLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

}  // namespace

std::map<std::string, uint64_t> ThreadCpu() {
  std::map<std::string, uint64_t> out;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string base = std::string("/proc/self/task/") + e->d_name;
    std::string name = ReadLine(base + "/comm");
    std::istringstream schedstat(ReadLine(base + "/schedstat"));
    uint64_t ns = 0;
    if (name.empty() || !(schedstat >> ns)) continue;  // the thread exited meanwhile
    out[name] += ns;
  }
  closedir(dir);
  return out;
}

uint64_t ProcessCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

std::map<std::string, uint64_t> CpuDelta(const std::map<std::string, uint64_t>& before,
                                         const std::map<std::string, uint64_t>& after) {
  std::map<std::string, uint64_t> out;
  for (const auto& [name, ns] : after) {
    auto it = before.find(name);
    const uint64_t start = it == before.end() ? 0 : it->second;
    if (ns > start) out[name] = ns - start;
  }
  return out;
}

void NameThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

std::string TopologyJson() {
  std::ostringstream o;
  utsname u{};
  uname(&u);
  std::string model = "unknown", flags;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && model == "unknown")
      model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = line;
  }
  const bool guest = flags.find(" hypervisor") != std::string::npos;
  o << "{\"cpu_model\": " << Quote(model) << ", \"kernel\": " << Quote(u.release)
    << ", \"hypervisor_guest\": " << (guest ? "true" : "false")
    << ", \"hardware_concurrency\": " << std::thread::hardware_concurrency()
    << ", \"online\": " << Quote(ReadLine("/sys/devices/system/cpu/online"))
    << ", \"numa_nodes\": " << Quote(ReadLine("/sys/devices/system/node/online"))
    << ", \"cpus\": [";
  const unsigned n = std::thread::hardware_concurrency();
  for (unsigned cpu = 0; cpu < n; ++cpu) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
    o << (cpu ? ", " : "") << "{\"cpu\": " << cpu
      << ", \"core\": " << Quote(ReadLine(base + "/topology/core_id"))
      << ", \"package\": " << Quote(ReadLine(base + "/topology/physical_package_id"))
      << ", \"smt_siblings\": " << Quote(ReadLine(base + "/topology/thread_siblings_list"))
      << ", \"governor\": " << Quote(ReadLine(base + "/cpufreq/scaling_governor")) << "}";
  }
  o << "], \"caches\": [";
  for (int index = 0;; ++index) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    const std::string size = ReadLine(base + "/size");
    if (size.empty()) break;
    o << (index ? ", " : "") << "{\"level\": " << Quote(ReadLine(base + "/level"))
      << ", \"type\": " << Quote(ReadLine(base + "/type")) << ", \"size\": " << Quote(size)
      << ", \"shared_with\": " << Quote(ReadLine(base + "/shared_cpu_list")) << "}";
  }
  o << "]}";
  return o.str();
}

double CrossCoreRoundTripNs() {
  // One CPU: no cross-core mode to tell, and two spinning threads on it would take turns per
  // scheduler slice.
  if (std::thread::hardware_concurrency() < 2) return 0;
  constexpr uint64_t kBlocks = 5, kTrips = 400;
  // The ball: the CPU 0 thread writes odd numbers, the CPU 1 thread answers with the next even
  // one. Aligned so that it shares its line with nothing.
  struct alignas(64) Ball {
    std::atomic<uint64_t> value{0};
  };
  Ball ball;
  const auto pin = [](unsigned cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  };
  cpu_set_t saved;
  pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved);
  constexpr uint64_t kLast = 2 * (kBlocks + 1) * kTrips;  // one warm-up block first
  std::thread answerer([&] {
    pin(1);
    for (uint64_t want = 1; want < kLast; want += 2) {
      while (ball.value.load(std::memory_order_acquire) != want) {
      }
      ball.value.store(want + 1, std::memory_order_release);
    }
  });
  pin(0);
  std::vector<double> blocks;
  uint64_t next = 1;
  for (uint64_t b = 0; b <= kBlocks; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < kTrips; ++i, next += 2) {
      ball.value.store(next, std::memory_order_release);
      while (ball.value.load(std::memory_order_acquire) != next + 1) {
      }
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - t0;
    if (b > 0) blocks.push_back(took.count() / kTrips);  // block 0 waits for the thread's start
  }
  answerer.join();
  pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
  std::sort(blocks.begin(), blocks.end());
  return blocks[blocks.size() / 2];
}

}  // namespace cqd::bench
