// SPDX-License-Identifier: BSD-2-Clause
#include "cqd/version.h"

#include <string_view>

namespace cqd {

#define CQD_STRINGIZE_(x) #x
#define CQD_STRINGIZE(x) CQD_STRINGIZE_(x)
// The string is written out for tools that read the header (cqd.pc, install.sh): it must say
// what the numbers say.
static_assert(std::string_view(CQD_VERSION_STRING) ==
                  CQD_STRINGIZE(CQD_VERSION_MAJOR) "." CQD_STRINGIZE(
                      CQD_VERSION_MINOR) "." CQD_STRINGIZE(CQD_VERSION_PATCH),
              "CQD_VERSION_STRING disagrees with CQD_VERSION_MAJOR/MINOR/PATCH");

VersionInfo Version() noexcept {
  return {CQD_VERSION_MAJOR, CQD_VERSION_MINOR, CQD_VERSION_PATCH, CQD_VERSION_STRING};
}

}  // namespace cqd
