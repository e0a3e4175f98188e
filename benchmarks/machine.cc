// SPDX-License-Identifier: BSD-2-Clause
#include "benchmarks/machine.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/utsname.h>

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

}  // namespace cqd::bench
