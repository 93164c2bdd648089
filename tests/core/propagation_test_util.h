// The propagation tests' helpers (tests/core/propagation_*_test.cc): graphs built here, annotated, propagated.
#pragma once

#include "core/propagation/propagation.h"

#include <memory>

#include <gtest/gtest.h>

#include "tests/test_util/graph_builder.h"

namespace gspmd {

// Builds small graphs by hand and propagates over a {data=2, model=2} mesh.
using Ints = std::vector<int64_t>;

struct Model : testing::GraphBuilder {
  Annotations ann{DeviceMesh{{2, 2}, {"data", "model"}}, {}};

  int op(const std::string& type, std::vector<int> in, const std::string& out, Shape shape,
         std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.name = type + "_" + out;
    n.op_type = type;
    n.inputs = std::move(in);
    Value v;
    v.name = out;
    v.dtype = DType::kFloat32;
    v.shape = std::move(shape);
    n.outputs = {g.add_value(std::move(v))};
    n.attrs = std::move(attrs);
    g.add_node(std::move(n));
    return g.at(out);
  }
  // spec: one entry per dim, "" = null; "a,b" = several axes.
  void annotate(int v, std::vector<std::string> spec, int priority = 0) {
    Annotation a;
    a.sharding = parse(spec);
    a.priority = priority;
    a.source = "test";
    ann.by_value[v] = a;
  }
  TensorSharding parse(const std::vector<std::string>& spec) {
    TensorSharding s = TensorSharding::replicated(static_cast<int>(spec.size()));
    for (size_t d = 0; d < spec.size(); ++d) {
      std::string e = spec[d];
      size_t pos = 0;
      while (!e.empty() && pos <= e.size()) {
        size_t c = e.find(',', pos);
        std::string name = e.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
        s.dims[d].push_back(ann.mesh.axis_index(name));
        if (c == std::string::npos) break;
        pos = c + 1;
      }
    }
    return s;
  }
  ShardingPlan run() {
    g.verify();
    return propagate(g, ann);
  }
  std::string spec(const ShardingPlan& p, int v) { return p.shardings.at(v).to_partition_spec(ann.mesh); }
};

}  // namespace gspmd
