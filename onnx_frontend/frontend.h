// onnx_frontend: the only module that includes ONNX / protobuf headers (ARCHITECTURE.md invariant 6).
// Loads ONNX models into core::Graph (static shapes), reads the sharding sidecar, writes per-device ONNX and
// test-data .pb files.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// Evaluates one node on constant inputs (the backend's run_kernel, injected by the CLI so the frontend does
/// not depend on the backend).
using ConstantEvaluator =
    std::function<std::vector<Tensor>(const Node& node, const std::vector<const Tensor*>& inputs, int64_t opset)>;

struct LoadOptions {
  std::map<std::string, int64_t> dims;  // --dim NAME=VALUE: symbolic input dims to bind
  bool load_data = true;                // false: initializer shapes only (simulate); external data not read
  ConstantEvaluator evaluator;          // used to fold shape sub-graphs; required
  /// Graph inputs to freeze: each named graph input becomes an initializer holding this tensor (its dtype and shape
  /// replace the declared ones), so that shapes depending on its value (Reshape's shape, Expand's shape, TopK's K)
  /// become static and its consumers may fold. A name that is not a graph input is an InputError.
  std::map<std::string, Tensor> frozen_inputs;
};

/// What a model file holds, read without shape inference or folding (for test runners and tooling).
struct ModelInfo {
  int64_t opset = 0;                    // the ai.onnx opset import (1 for IR 1-2 models without opset_import)
  std::vector<std::string> op_types;    // op_type of every top-level graph node, in file order ("domain:Op" outside
                                        // ai.onnx); Constant nodes included
  std::vector<std::string> inputs;      // graph input names, initializers excluded, in order
  std::vector<std::vector<std::string>> input_dim_params;  // per input, per dim: its symbolic name ("" when the
                                                           // dim has a value or no name; empty for non-tensors)
  std::vector<std::vector<int64_t>> input_shapes;  // per input, per dim: its size (-1 when symbolic or unknown;
                                                   // empty for non-tensors and inputs without a shape)
  std::vector<DType> input_dtypes;      // per input: its element type (kUndefined for non-tensors, unknown types)
  std::vector<std::string> outputs;     // graph output names, in order
  std::vector<DType> output_dtypes;     // per output: its element type (as input_dtypes)
  std::map<std::string, std::string> metadata;  // the model's metadata_props (key -> value); a device model from
                                                // export_device has gspmd.device, gspmd.mesh_shape, ... (collectives.md)
};

/// Reads `path`'s graph summary. Throws InputError("model.onnx: ...") for a missing, truncated or malformed file.
ModelInfo read_model_info(const std::string& path);

/// Loads `path` (+ external data next to it): binds symbolic dims, runs ONNX shape inference (with data
/// propagation), folds every node whose inputs are all constant (Shape of a static value included) into an
/// initializer, prunes dead nodes, and converts to a Graph where every value has a static shape.
/// IR-3 models listing initializers among graph inputs are accepted (those inputs become initializers).
/// Throws InputError("model.onnx: <problem>") for a missing, truncated or malformed file, an unbound symbolic
/// dim ("input 'ids' dim 0 'batch' is symbolic: bind it with --dim batch=N"), or a value whose shape stays unknown.
Graph load_model(const std::string& path, const LoadOptions& opts);

/// Reads the sharding sidecar (SHARDING_FILE.md, version 1; minimal form + `unreduced`/`priority` objects +
/// `rules`). `cli_mesh` is the --mesh value (nullptr if absent): it gives the shape when the file has no mesh
/// and overrides sizes otherwise (same axis count required).
/// Throws InputError with one line naming the file, the key and the problem, e.g.
///   gpt.sharding.json: tensors."h.0.mlp.fc_in.weight": spec has 3 entries but the tensor has rank 2
/// Covers malformed JSON, unknown value names, unknown axes, an axis used twice, wrong rank, mesh mismatch.
Annotations read_sharding_file(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh);

/// Writes the plan as a sharding file (every value, PartitionSpec form; unreduced values in the object form),
/// readable back with read_sharding_file.
void write_sharding_file(const std::string& path, const Graph& g, const DeviceMesh& mesh,
                         const std::vector<TensorSharding>& shardings);

/// Writes device `device`'s program as a standalone ONNX model: local shapes, that device's slices of the
/// weights (from `global`'s initializers, sliced with shard_tensor), gspmd ops specialised for the device
/// (ShardSlice -> Slice/Pad, MaskPad -> Slice+Pad, PartitionOffset -> Constant) and collectives in domain
/// `gspmd` v1 with replica_groups / group_size (docs/collectives.md). Throws std::runtime_error on I/O failure.
void export_device(const SpmdProgram& p, const Graph& global, int64_t device, const std::string& path);

/// Reads one serialized onnx.TensorProto (.pb, ONNX backend test-data layout). Throws InputError naming the file.
Tensor read_tensor_pb(const std::string& path);
/// Writes one serialized onnx.TensorProto named `name`.
void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name = "");

}  // namespace gspmd
