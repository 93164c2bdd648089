// cli: the environment variables that tune how `run` executes on this host (docs/cli.md, "Environment variables").
// They are speed knobs only (ExecutorOptions in backend/pod/pod.h): the library reads no environment variable, and
// this is the one place the CLI reads the executor's.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/pod/pod.h"

namespace gspmd::cli {

/// ExecutorOptions from the environment, defaults where a variable is unset or empty:
/// - GSPMD_DEVICE_THREADS=K: ExecutorOptions::device_threads = max(K, 1) (concurrent devices; default: as many as
///   OpenMP threads);
/// - GSPMD_FUSION=0: ExecutorOptions::fuse = false (matmul epilogue fusion off; any other value keeps it on);
/// - GSPMD_STACK=0: ExecutorOptions::stack = false (stacked products of devices sharing weights off).
inline ExecutorOptions executor_options_from_env() {
  ExecutorOptions o;
  auto get = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (const std::string t = get("GSPMD_DEVICE_THREADS"); !t.empty())
    o.device_threads = std::max(1, std::atoi(t.c_str()));
  if (get("GSPMD_FUSION") == "0") o.fuse = false;
  if (get("GSPMD_STACK") == "0") o.stack = false;
  return o;
}

}  // namespace gspmd::cli
