// SPDX-License-Identifier: BSD-2-Clause
#include "cqd/version.h"

namespace cqd {

VersionInfo Version() noexcept {
  return {CQD_VERSION_MAJOR, CQD_VERSION_MINOR, CQD_VERSION_PATCH, CQD_VERSION_STRING};
}

}  // namespace cqd
