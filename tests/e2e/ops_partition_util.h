// The e2e tests of partitioning one operator (ops_partition_*_test.cc): hand-built one-node (or few-node) graphs, many
// input shardings (each dim unsplit or split over each mesh axis, or over both axes of a 2-D mesh, including dims
// that do not divide the mesh) on meshes {2}, {2x2}, {2x3}, {3}: propagate() -> partition() -> run_spmd() must
// equal run_single() (floats within 1e-5 + 1e-4|ref|, ints and bools exactly).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/pod/pod.h"
#include "core/ir/shift_op.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd::ops_partition {

// ---------------------------------------------------------------------------------------------------------------
// Meshes and shardings

using testing::mesh_of;

const std::vector<DeviceMesh>& all_meshes();

/// Every sharding of a rank-r tensor where each dim is unsplit, split over one mesh axis, or (2-D meshes) over both
/// axes in either order; each axis used at most once.
std::vector<TensorSharding> all_shardings(int rank, const DeviceMesh& mesh);

TensorSharding spec(int rank, std::vector<std::vector<int>> dims);

// ---------------------------------------------------------------------------------------------------------------
// Test cases: a graph, how to generate its inputs, which values get enumerated shardings

enum class Gen { kUniform, kPositive, kNonZero, kSmallSet, kBool, kIds, kIdsSigned };

struct InputGen {
  Gen kind = Gen::kUniform;
  int64_t hi = 0;  // ids: [0, hi) (kIdsSigned: [-hi, hi))
};

struct Case {
  std::string name;
  Graph g;
  std::map<int, InputGen> gens;  // per graph input value id
  std::vector<int> shardable;    // values whose shardings are enumerated (inputs and some weights)
  std::vector<int> out_ann;      // values that sometimes get an annotation too (outputs)
  int cap = 60;                  // max annotation sets per mesh
};

/// Small builder for hand-made graphs.
struct Builder {
  Case c;
  std::mt19937 rng;

  explicit Builder(std::string name, int64_t opset = 17, uint32_t seed = 7) : rng(seed) {
    c.name = std::move(name);
    c.g.name = c.name;
    c.g.opset = opset;
  }
  int value(const std::string& name, DType t, Shape s) { return c.g.add_value(testing::V(name, t, std::move(s))); }
  int in(const std::string& name, DType t, Shape s, InputGen gen = {}, bool shard = true) {
    int v = value(name, t, std::move(s));
    c.g.inputs.push_back(v);
    c.gens[v] = gen;
    if (shard) c.shardable.push_back(v);
    return v;
  }
  int fin(const std::string& name, Shape s, InputGen gen = {}, bool shard = true) {
    return in(name, DType::kFloat32, std::move(s), gen, shard);
  }
  int init(const std::string& name, Tensor t, bool shard = false) {
    Value v;
    v.name = name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.is_initializer = true;
    v.data = std::make_shared<Tensor>(std::move(t));
    int id = c.g.add_value(std::move(v));
    if (shard) c.shardable.push_back(id);
    return id;
  }
  int weight(const std::string& name, Shape s, bool shard = true, float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> d(static_cast<size_t>(num_elements(s)));
    for (float& x : d) x = u(rng);
    return init(name, Tensor::from_floats(s, d), shard);
  }
  int ints(const std::string& name, std::vector<int64_t> v) { return init(name, Tensor::from_int64s(v)); }
  int scalar(const std::string& name, float x) { return init(name, Tensor::from_floats({}, {x})); }
  std::vector<int> op(const std::string& type, std::vector<int> inputs,
                      std::vector<std::tuple<std::string, DType, Shape>> outs,
                      std::map<std::string, AttrValue> attrs = {}) {
    Node n;
    n.name = type + "_" + std::to_string(c.g.nodes.size());
    n.op_type = type;
    n.inputs = std::move(inputs);
    n.attrs = std::move(attrs);
    for (auto& [nm, t, s] : outs) n.outputs.push_back(value(nm, t, s));
    c.g.add_node(n);
    return n.outputs;
  }
  int op1(const std::string& type, std::vector<int> inputs, const std::string& out, DType t, Shape s,
          std::map<std::string, AttrValue> attrs = {}) {
    return op(type, std::move(inputs), {{out, t, std::move(s)}}, std::move(attrs))[0];
  }
  int opf(const std::string& type, std::vector<int> inputs, const std::string& out, Shape s,
          std::map<std::string, AttrValue> attrs = {}) {
    return op1(type, std::move(inputs), out, DType::kFloat32, std::move(s), std::move(attrs));
  }
  void out(int v, bool annotate = false) {
    c.g.outputs.push_back(v);
    if (annotate) c.out_ann.push_back(v);
  }
  Case done(int cap = 60) {
    c.g.verify();
    c.cap = cap;
    return std::move(c);
  }
};

Tensor make_input(const Value& v, const InputGen& gen, std::mt19937& rng);

std::string value_desc(const Graph& g, int v);

struct Outcome {
  int cases = 0;
  std::vector<std::string> failures;
};

/// One annotation set: propagate, partition, run, compare. Returns "" or what went wrong.
std::string run_one(const Case& c, const Annotations& ann, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor>& ref, SpmdProgram* keep = nullptr);

std::string describe(const Case& c, const Annotations& ann);

/// Runs a case over every mesh and many annotation sets.
Outcome run_case(const Case& c, const std::vector<DeviceMesh>& meshes = all_meshes());

/// Runs every case, prints a coverage line and reports failures (all of them, one line each).
void run_all(const std::string& family, const std::vector<Case>& cases,
             const std::vector<DeviceMesh>& meshes = all_meshes());

constexpr DType F32 = DType::kFloat32;
constexpr DType I64 = DType::kInt64;
constexpr DType BOOL = DType::kBool;

std::map<std::string, int> count_kinds(const SpmdProgram& p);

std::string collectives_str(const SpmdProgram& p);

/// Runs one case with the given annotations (value name -> sharding) and expects exact results.
SpmdProgram expect_exact(const Case& c, const DeviceMesh& mesh, std::vector<std::pair<std::string, TensorSharding>> a,
                         std::vector<Tensor> inputs = {});

}  // namespace gspmd::ops_partition
