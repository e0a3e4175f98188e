// SPDX-License-Identifier: BSD-2-Clause
#include "runtime/core/placement.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <sstream>

namespace cqd::internal {
namespace {

// Returns the whole file, or nullopt if it cannot be read.
std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

// Parses a whole non-negative decimal number below CPU_SETSIZE.
std::optional<int> ParseCpu(std::string_view s) {
  int value = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0 || value >= CPU_SETSIZE) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::optional<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> cpus;
  text = Trim(text);
  while (!text.empty()) {
    const size_t comma = text.find(',');
    std::string_view range = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // "0-3,"
    const size_t dash = range.find('-');
    std::optional<int> first = ParseCpu(range.substr(0, dash));
    std::optional<int> last =
        dash == std::string_view::npos ? first : ParseCpu(range.substr(dash + 1));
    if (!first || !last || *last < *first) return std::nullopt;
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

int DeviceNumaNode(const std::string& sysfs_root, const std::string& device) {
  if (device.empty() || device.find('/') != std::string::npos) return -1;
  std::optional<std::string> text =
      ReadFile(sysfs_root + "/class/infiniband/" + device + "/device/numa_node");
  if (!text) return -1;
  std::string_view s = Trim(*text);
  int node = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), node);
  if (ec != std::errc() || end != s.data() + s.size() || node < 0) return -1;
  return node;
}

std::vector<int> NodeCpus(const std::string& sysfs_root, int node) {
  if (node < 0) return {};
  std::optional<std::string> text =
      ReadFile(sysfs_root + "/devices/system/node/node" + std::to_string(node) + "/cpulist");
  if (!text) return {};
  std::optional<std::vector<int>> cpus = ParseCpuList(*text);
  return cpus ? *cpus : std::vector<int>();
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return {};
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> LocalCpus(const std::vector<int>& node_cpus, const std::vector<int>& allowed) {
  std::vector<int> a = node_cpus, b = allowed, local;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(local));
  local.erase(std::unique(local.begin(), local.end()), local.end());
  if (local.size() == b.size()) return {};  // every allowed CPU is local: nothing to gain
  return local;
}

Result<int> ChooseCompVector(int requested, int vectors, bool spread, uint32_t& next) {
  if (vectors < 1) vectors = 1;  // a device reporting none still takes vector 0
  if (requested >= 0 && requested < vectors) return requested;
  if (requested != -1) {
    return InvalidArgument("comp_vector " + std::to_string(requested) + " is not in 0.." +
                           std::to_string(vectors - 1) + " (or -1 for the runtime's choice)");
  }
  if (!spread) return 0;
  return static_cast<int>(next++ % static_cast<uint32_t>(vectors));
}

bool ConfineThread(pthread_t thread, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
  }
  return CPU_COUNT(&set) > 0 && pthread_setaffinity_np(thread, sizeof(set), &set) == 0;
}

Placement::Placement(const RuntimeOptions& options, std::string sysfs_root,
                     std::optional<std::vector<int>> allowed)
    : enabled_(options.auto_placement),
      poller_cpus_(options.poller_cpus),
      sysfs_root_(std::move(sysfs_root)),
      allowed_(std::move(allowed)),
      poller_placed_(options.pollers, false),
      consumer_placed_(options.consumers.size(), false) {
  for (const ConsumerOptions& c : options.consumers) {
    consumer_cpus_.push_back(c.kind == ConsumerKind::kOwnedThread ? c.cpu : -1);
  }
}

void Placement::OnDeviceAdded(uint32_t id, const std::string& name, bool verbs, int comp_vectors,
                              const Threads& threads) {
  Device device;
  device.name = name;
  device.comp_vectors = std::max(comp_vectors, 1);
  device.numa_node = verbs ? DeviceNumaNode(sysfs_root_, name) : -1;
  MutexLock lock(mu_);
  devices_[id] = device;
  if (!enabled_ || placed_ || device.numa_node < 0) return;
  placed_ = true;  // the first device with a node decides, whatever it decides
  std::vector<int> cpus =
      LocalCpus(NodeCpus(sysfs_root_, device.numa_node), allowed_ ? *allowed_ : AllowedCpus());
  if (cpus.empty()) return;
  bool any = false;
  for (size_t i = 0; i < threads.pollers.size() && i < poller_placed_.size(); ++i) {
    if (!poller_cpus_.empty() || threads.pollers[i] == 0) continue;  // explicit CPUs win
    poller_placed_[i] = ConfineThread(threads.pollers[i], cpus);
    any |= poller_placed_[i];
  }
  for (size_t i = 0; i < threads.consumers.size() && i < consumer_placed_.size(); ++i) {
    if (consumer_cpus_[i] != -1 || threads.consumers[i] == 0) continue;
    consumer_placed_[i] = ConfineThread(threads.consumers[i], cpus);
    any |= consumer_placed_[i];
  }
  if (any) {
    node_ = device.numa_node;
    cpus_ = std::move(cpus);
  }
}

Result<int> Placement::CompVector(uint32_t id, int requested) {
  MutexLock lock(mu_);
  auto it = devices_.find(id);
  if (it == devices_.end()) return NotFound("no device " + std::to_string(id));
  Device& device = it->second;
  Result<int> vector =
      ChooseCompVector(requested, device.comp_vectors, enabled_, device.next_vector);
  if (!vector.ok()) {
    return InvalidArgument(vector.status().message() + ": device " + device.name + " has " +
                           std::to_string(device.comp_vectors) + " completion vector(s)");
  }
  return vector;
}

void Placement::FillStats(Stats& stats) const {
  MutexLock lock(mu_);
  for (size_t i = 0; i < stats.pollers.size() && i < poller_placed_.size(); ++i) {
    stats.pollers[i].numa_node = poller_placed_[i] ? node_ : -1;
  }
  for (size_t i = 0; i < stats.consumers.size() && i < consumer_placed_.size(); ++i) {
    stats.consumers[i].cpu = consumer_cpus_[i];
    stats.consumers[i].numa_node = consumer_placed_[i] ? node_ : -1;
  }
  stats.placement_cpus = FormatCpuList(cpus_);
  stats.devices.clear();
  for (const auto& [id, device] : devices_) {
    DeviceStats d;
    d.id = id;
    d.name = device.name;
    d.numa_node = device.numa_node;
    d.comp_vectors = device.comp_vectors;
    stats.devices.push_back(std::move(d));
  }
}

}  // namespace cqd::internal
