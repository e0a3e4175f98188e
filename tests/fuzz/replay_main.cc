// SPDX-License-Identifier: BSD-2-Clause
// A main for runtime_fuzz.cc outside libFuzzer (gcc builds, sanitizer configs, CI): runs
// LLVMFuzzerTestOneInput once on each file named on the command line, or on each file of each
// directory named there. Prints one line per input; exits non-zero if there were no inputs (a
// finding aborts the process).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void Collect(const std::string& path, std::vector<std::string>& files) {
  struct stat sb;
  if (stat(path.c_str(), &sb) != 0) {
    fprintf(stderr, "replay: cannot stat %s\n", path.c_str());
    return;
  }
  if (!S_ISDIR(sb.st_mode)) {
    files.push_back(path);
    return;
  }
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') names.push_back(path + "/" + e->d_name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) Collect(n, files);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) Collect(argv[i], files);
  if (files.empty()) {
    fprintf(stderr, "usage: %s FILE_OR_DIR...  (no inputs found)\n", argv[0]);
    return 2;
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(data.data(), data.size());
    printf("replay: %s (%zu bytes) ok\n", f.c_str(), data.size());
  }
  printf("replay: %zu inputs ok\n", files.size());
  return 0;
}
