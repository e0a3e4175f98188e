// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/version.h: the version of cqd, as the headers know it (macros) and as the library linked
/// in knows it (Version()), and the language level the headers need.
///
/// This file is the one place the version is defined: cqd.pc's Version and tools/install.sh read
/// it from here. The version follows semantic versioning; while MAJOR is 0, a MINOR step may
/// change the API.
///
/// Every public header includes this one, so that a compiler below C++20 stops at its `#%error`
/// rather than at the first std::span.
///
/// Thread safety: Version() may be called from any thread, at any time.
#ifndef CQD_VERSION_H_
#define CQD_VERSION_H_

// Below C++20: C++17 and earlier (GCC 10's -std=c++20 still says 201709L, so compare with 17).
#if !defined(__cplusplus) || __cplusplus <= 201703L
#error "cqd needs C++20: compile with -std=c++20 (or -std=gnu++20, or later)"
#endif

/// The major version of the headers.
#define CQD_VERSION_MAJOR 0
/// The minor version of the headers.
#define CQD_VERSION_MINOR 1
/// The patch version of the headers.
#define CQD_VERSION_PATCH 0
/// The headers' version as "MAJOR.MINOR.PATCH".
#define CQD_VERSION_STRING "0.1.0"
/// MAJOR * 10000 + MINOR * 100 + PATCH: `#if CQD_VERSION_NUMBER >= 100` means 0.1.0 or later.
#define CQD_VERSION_NUMBER (CQD_VERSION_MAJOR * 10000 + CQD_VERSION_MINOR * 100 + CQD_VERSION_PATCH)

namespace cqd {

/// A version: what Version() returns.
struct VersionInfo {
  int major{};              ///< MAJOR
  int minor{};              ///< MINOR
  int patch{};              ///< PATCH
  const char* string = "";  ///< "MAJOR.MINOR.PATCH", static storage
};

/// Returns the version of the cqd library linked into the process (the CQD_VERSION_* macros are
/// those of the headers compiled against; they differ when headers and library come from
/// different installs).
VersionInfo Version() noexcept;

}  // namespace cqd

#endif  // CQD_VERSION_H_
