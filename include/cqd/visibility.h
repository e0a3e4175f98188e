// SPDX-License-Identifier: BSD-2-Clause
/// \file
/// cqd/visibility.h: what libcqd.so keeps to itself.
///
/// CQD_PRIVATE marks a declaration in a public header that only the library calls (a private
/// constructor taking an internal type, a thread body): libcqd.so does not export it, so the
/// shared library's ABI names no internal type. An engine never calls these; the mark changes
/// nothing for it, or for the static library.
#ifndef CQD_VISIBILITY_H_
#define CQD_VISIBILITY_H_

#include "cqd/version.h"

#if defined(__GNUC__) || defined(__clang__)
#define CQD_PRIVATE __attribute__((visibility("hidden")))
#else
#define CQD_PRIVATE
#endif

#endif  // CQD_VISIBILITY_H_
