// Differential testing (issue 3, docs/testing.md): random ONNX-like graphs with random static shapes (many dims that
// do not divide the mesh), random sharding annotations on random 1-D..3-D meshes, checked as
//   run_spmd(partition(propagate(g, ann))) == run_single(g)   (floats within 1e-5 + 1e-4 |ref|, ints/bools exactly).
// A small library (tests/difftest/) that tests/e2e/differential_test.cc and bench/difftest.cc (gspmd-difftest)
// share: generate (generate*.cc), check (check.cc), reduce (reduce.cc), run many (run.cc).
//
//   RandomCase c = generate_case(seed);        // deterministic in (seed, options)
//   CheckResult r = check_case(c.g, c.ann, c.inputs);
//   if (r.status == CheckResult::kFail) { Repro m = reduce_repro(to_repro(c), r); std::cout << dump(m.g, m.ann); }
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/kernels/kernels.h"
#include "backend/pod/pod.h"
#include "core/autodiff/autodiff.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/shapes/shapes.h"
#include "core/sharding/sharding.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd::difftest {

// ---------------------------------------------------------------------------------------------------------------
// Meshes

/// A mesh of `shape` with axes named x, y, z, w.
DeviceMesh mesh_of(const std::vector<int64_t>& shape);

/// The meshes cases are drawn from (1-D to 3-D, up to 16 devices; an axis of size 1 once).
const std::vector<std::vector<int64_t>>& mesh_shapes();

// ---------------------------------------------------------------------------------------------------------------
// Generated case

struct GenOptions {
  int64_t max_devices = 16;
  int min_nodes = 3;
  int max_nodes = 12;
  int max_float_inputs = 3;
  int64_t max_numel = 2048;  // per value
  /// Stress mode (gspmd-difftest --stress): unreduced annotations also on weights and intermediate values (sum), and
  /// on inputs and weights with random reductions (sum, max, min, prod), instead of only sum on graph inputs.
  bool stress = false;
  /// Also draw ops beyond the list (gspmd-difftest --extra-ops): LogSoftmax, Flatten, Expand, Pad, Tile,
  /// CumSum, ArgMax, ReduceMin/ReduceProd/ReduceL2/ReduceLogSumExp.
  bool extra_ops = false;
};

struct RandomCase {
  uint64_t seed = 0;
  Graph g;
  Annotations ann;
  std::vector<Tensor> inputs;     // one per g.inputs
  std::vector<std::string> tags;  // coverage: op types plus variants ("MatMul:batched", "mesh:2x3", ...)
};

/// A failing (or to-be-reduced) triple.
struct Repro {
  Graph g;
  Annotations ann;
  std::vector<Tensor> inputs;
};

/// The case as a repro (its graph, annotations and inputs).
Repro to_repro(const RandomCase& c);

/// Generates the case of `seed` (deterministic).
RandomCase generate_case(uint64_t seed, const GenOptions& opt = {});

/// The training step of case `c` (docs/training.md): the loss is the sum of its first floating-point output, the
/// weights are its float weights (the generator's "w..." initializers), the annotations are carried over by name and
/// the step's inputs are the case's. nullopt when there is no float output or no weight reaches it, or when an op
/// on the way has no gradient rule (`why` says which). `remat`: the step's rematerialization policy (tag "remat-...").
std::optional<RandomCase> training_case(const RandomCase& c, std::string* why = nullptr,
                                        RematPolicy remat = RematPolicy::kNone);

// ---------------------------------------------------------------------------------------------------------------
// Checking

struct CheckResult {
  enum Status { kPass, kFail, kUnsupported } status = kPass;
  std::string stage;  // "reference", "propagate", "partition", "run_spmd", "compare"
  std::string why;
  int collectives = 0;
  std::vector<std::string> sharded;  // coverage: "sharded:<op>" for nodes touching a tiled/unreduced value,
                                     // "split-spatial:<op>" for Conv/pools whose input is split on H or W
};

/// propagate -> partition -> run_spmd, compared with run_single. UnsupportedError anywhere => kUnsupported.
CheckResult check_case(const Graph& g, const Annotations& user_ann, const std::vector<Tensor>& inputs);

/// A coarse failure signature used to keep reductions on the same bug: the stage plus the message with numbers
/// and quoted names removed.
std::string failure_signature(const CheckResult& r);

// ---------------------------------------------------------------------------------------------------------------
// Dump

/// Readable dump: mesh, inputs, initializers (int constants with their values), nodes, outputs, annotations.
std::string dump(const Graph& g, const Annotations& ann);

/// Coverage keys of a case: its nodes' op types plus the generator's variant tags (for ops that survived pruning).
std::vector<std::string> coverage_keys(const RandomCase& c);

// ---------------------------------------------------------------------------------------------------------------
// Reduction of failing cases

/// Greedy reduction of a failing case keeping its failure signature: fewer outputs, upstream nodes cut into inputs,
/// fewer annotations and axes, smaller meshes. `budget` bounds the number of checks.
Repro reduce_repro(Repro r, const CheckResult& failure, int budget = 400);

// ---------------------------------------------------------------------------------------------------------------
// Running many cases

struct RunSummary {
  int passed = 0, failed = 0, unsupported = 0;
  int with_collectives = 0;  // passing cases whose program has at least one collective
  int64_t collectives = 0;
  std::map<std::string, int> coverage;  // key -> number of cases containing it
  std::vector<uint64_t> failing_seeds;
  std::vector<std::string> reports;  // one per failure (maybe truncated by max_reports)
  double seconds = 0;
};

/// Runs cases seed_base .. seed_base + n - 1. `report` formats each failure (seed, reason, dump, reduced dump).
RunSummary run_cases(uint64_t seed_base, int n, const GenOptions& opt, bool reduce, int max_reports,
                     const std::function<void(uint64_t, const CheckResult&)>& on_case = nullptr);

/// The coverage map as "key=count" items in key order, wrapped at about 110 columns.
std::string coverage_str(const std::map<std::string, int>& cov);

}  // namespace gspmd::difftest
