// The loader tests' helpers (tests/frontend/loader_*_test.cc): models written here, loaded.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include <sys/stat.h>

#include "backend/pod/pod.h"
#include "tests/frontend/frontend_test_util.h"
#include "tests/frontend/onnx_headers.h"

namespace gspmd {

using test::expect_input_error;
using test::frontend_data;
using test::load_opts;
using test::TempDir;

inline int count_op(const Graph& g, const std::string& op) {
  return static_cast<int>(
      std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; }));
}

inline const Node& node_named(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes)
    if (n.name == name) return n;
  throw std::runtime_error("no node " + name);
}

inline void expect_all_static(const Graph& g) {
  for (const Value& v : g.values) {
    EXPECT_NE(v.dtype, DType::kUndefined) << v.name;
    for (int64_t d : v.shape) EXPECT_GE(d, 0) << v.name;
  }
  EXPECT_NO_THROW(g.verify());
}

}  // namespace gspmd
