// backend/mpi (private to the module): MPI's error codes and counts as the module's exceptions.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <string>

#include <fmt/format.h>

#include "core/ir/ir.h"

namespace gspmd::mpi {

/// Throws InternalError "<what>: <MPI's error string>" unless `rc` is MPI_SUCCESS.
inline void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, s, &len);
  throw InternalError(fmt::format("{}: {}", what, std::string(s, static_cast<size_t>(len))));
}

/// `n` elements as MPI's int count; throws UnsupportedError naming `what` past INT_MAX.
inline int count_of(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    throw UnsupportedError(fmt::format("{}: {} elements exceed MPI's int count limit", what, n));
  return static_cast<int>(n);
}

}  // namespace gspmd::mpi
