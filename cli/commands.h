// cli: the gspmd-onnx commands (contract: docs/cli.md). main.cc parses flags with CLI11 and calls these.
#pragma once

#include <string>
#include <vector>

#include <optional>

#include "core/auto/auto.h"
#include "core/cost/cost.h"
#include "core/ir/ir.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"

namespace gspmd::cli {

/// Flags shared by partition, run, simulate and explain.
struct CommonOptions {
  std::string model;                // MODEL path
  std::string mesh;                 // --mesh "4x4"
  std::string shardings;            // --shardings FILE ("" = MODEL's sibling <stem>.sharding.json if present)
  std::vector<std::string> dims;    // --dim NAME=VALUE
  std::string target = "tpu-v3";    // --target
  bool overlap = false;             // --overlap: collectives overlap independent compute in the simulated step
  bool auto_search = false;         // --auto: search shardings for what the sharding file leaves open (core/auto)
  std::string memory_limit;         // --memory-limit BYTES for --auto ("" = the target's HBM)
};

/// The loaded model and everything derived from it, in pipeline order.
struct Pipeline {
  Graph graph;
  Annotations annotations;
  std::string sharding_file;  // the file actually read ("" if none)
  ShardingPlan plan;
  SpmdProgram program;
  std::optional<AutoResult> auto_result;  // --auto: the search's choices, cost and baselines
};

/// Loads MODEL, reads the sharding file, (with --auto) searches the open shardings, propagates and partitions.
/// Throws InputError for bad input (including --memory-limit that is not a positive number of bytes, and --auto
/// when no plan fits in memory).
Pipeline build_pipeline(const CommonOptions& o, bool load_data = true);
/// --memory-limit text -> bytes: a positive decimal number ("8589934592", "8e9"); "" -> 0 (the target's HBM).
/// Throws InputError("--memory-limit: 'x' is not a positive number of bytes").
int64_t parse_memory_limit(const std::string& text);

struct PartitionOptions {
  CommonOptions common;
  std::string out_dir;  // -o DIR
};
int cmd_partition(const PartitionOptions& o);

struct RunOptions {
  CommonOptions common;
  std::string inputs_dir;   // --inputs DIR
  std::string outputs_dir;  // --outputs DIR
  bool check = false;       // --check
  double rtol = 1e-4, atol = 1e-5;
  std::string report;       // --report FILE
  std::string trace;        // --trace FILE
  uint64_t seed = 0;        // --seed
};
int cmd_run(const RunOptions& o);

struct SimulateOptions {
  CommonOptions common;
  std::string report;  // --report FILE
  std::string trace;   // --trace FILE
};
/// Propagates, partitions and costs without reading initializer data or running (weights' external data files may
/// be absent); prints and writes the run report without host and check, with the static peak memory per device.
int cmd_simulate(const SimulateOptions& o);

struct ExplainOptions {
  CommonOptions common;
  std::string value;  // --value NAME ("" = all)
};
int cmd_explain(const ExplainOptions& o);

/// Box picture of a 1-D or 2-D value's shards on the mesh (device ids per shard), "" for other ranks or more than
/// 16 shards per dim. Like jax.debug.visualize_array_sharding.
std::string sharding_picture(const Shape& shape, const TensorSharding& s, const DeviceMesh& mesh);

}  // namespace gspmd::cli
