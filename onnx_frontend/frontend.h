// onnx_frontend: the only module that includes ONNX / protobuf headers (docs/architecture.md, invariant 6).
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

/// The structure of an ONNX value (onnx/IR.md, "Types"): a tensor, a sequence of tensors, or an optional.
struct ValueStructure {
  ValueKind kind = ValueKind::kTensor;
  bool present = true;                   // kOptional: holds an element (false: the empty optional)
  bool of_sequence = false;              // kOptional: the element is a sequence (else a tensor)
  DType elem_dtype = DType::kUndefined;  // the element type (a tensor's own dtype); kUndefined when not declared
  bool operator==(const ValueStructure&) const = default;
};

/// "tensor", "sequence", "optional(tensor)", "optional(sequence)", "empty optional".
std::string structure_str(const ValueStructure& s);

/// A graph input's or output's value as ONNX types it: a tensor, a sequence of tensors, or an optional. What the
/// test data (.pb) and `run --inputs` hold.
struct OnnxValue {
  ValueStructure structure;
  std::vector<Tensor> tensors;  // a tensor or an optional's tensor: one; a sequence (or an optional's): its elements

  /// A plain tensor value.
  static OnnxValue of(Tensor t);
};

/// How one ONNX graph input or output maps onto the loaded Graph (docs/sequences.md): a tensor is one graph input /
/// output; a sequence or optional is flattened into one per element ("x[0]", "x[1]", ...; an optional's tensor
/// "x.value"), none for an empty sequence or optional.
struct FlatValue {
  std::string name;          // the ONNX graph input / output
  ValueStructure structure;  // its structure, as bound at load
  std::vector<int> values;   // the Graph's value ids holding its tensors, in element order
};

/// The hint of a data-dependent dim without an upper bound (Range's length on computed limits): the size it is typed
/// and costed at (docs/shapes.md step 6).
inline constexpr int64_t kUnboundedDimHint = 64;

/// The hint of the first symbol that LoadOptions::keep_symbols keeps; the next ones get the next primes (19, 23,
/// ...): distinct, and split unevenly over any mesh axis, so that a plan chosen at the hints masks its padding.
inline constexpr int64_t kFirstDimHint = 17;

/// The most elements a ConstantOfShape or a Range on constants may ask for (2^40; a 175B-parameter model's largest
/// weight has 6e8): more is refused at load, before ONNX's shape inference allocates per element (docs/loading.md).
inline constexpr int64_t kMaxConstantElements = int64_t{1} << 40;

/// The input of a device file over split dim symbols that gives the symbols' global sizes, int64 [symbols] in the
/// order of Graph::dim_hints (docs/shapes.md): a device cannot read a split dim's global size off its padded shard.
inline constexpr const char* kDimsInput = "gspmd_dims";

struct LoadOptions {
  /// --dim NAME=VALUE: symbolic input dims to bind, and upper bounds of data-dependent dims (`nonzero_0`: typed,
  /// costed and checked at VALUE instead of the op's bound; Graph::RuntimeDim::given). A name that is neither is an
  /// InputError.
  std::map<std::string, int64_t> dims;
  /// Keep the symbolic dims that neither `dims` nor the given inputs bind (docs/shapes.md, "Symbolic dims"), instead
  /// of the error that asks for --dim: each gets a hint (distinct primes from 17 up, in order of first appearance
  /// among the inputs: kFirstDimHint), every value's shape is typed at the hints, and values that depend on a symbol
  /// carry their dims (and a shape tensor its elements) as expressions (Value::sym, core/shapes/symbolic.h). Nodes
  /// whose outputs depend on a symbol fold only when their values are such expressions. Graph::dim_hints lists the
  /// symbols, Graph::dim_guards what the model assumes of them.
  bool keep_symbols = false;
  /// partition --hint NAME=VALUE: the hint of kept symbol NAME (keep_symbols) in place of the next prime: the size
  /// partitioning decides and costs at, and that the report's numbers are for, without specialising the files to it
  /// (images at 224 rows, where the primes' 17 rows would gather every deep layer's halo). A name that is not a kept
  /// symbol (unknown, or bound by `dims` or the inputs) is an InputError.
  std::map<std::string, int64_t> hints;
  /// The outputs of NonZero, Compress, TopK with a computed k, Unique and NonMaxSuppression on values known only at
  /// run time get a data-dependent dim symbol each (Graph::runtime_dims, docs/shapes.md step 6) instead of staying
  /// untyped (false: such a node is the one-line "has a data-dependent shape" error, as for other ops).
  bool data_dependent_dims = true;
  /// Shapes of the input tensors the model will run on (`run --inputs`), by graph input name: their dims bind the
  /// symbolic dims of those inputs (a --dim that says otherwise is an InputError), so --dim is needed only without
  /// inputs.
  std::map<std::string, Shape> input_shapes;
  /// `run --inputs DIR`: DIR/input_<i>.pb in graph-input order (initializers excluded), read like input_shapes for the
  /// inputs with a dim that has no size (the other files are not read here).
  std::string inputs_dir;
  bool load_data = true;         // false: initializer shapes only (simulate); external data not read
  ConstantEvaluator evaluator;   // folds every node whose inputs are all constants; required
  ShapeFunction shape_function;  // the executor's shape functions; empty: ONNX shape inference alone
  /// A disagreement between the shape function and ONNX shape inference is an InputError (tests); otherwise the shape
  /// function's answer is used (it is what the executor computes) and the disagreement is noted in the LoadReport.
  bool strict_shapes = false;
  /// Graph inputs to freeze: each named graph input becomes an initializer holding this tensor (its dtype and shape
  /// replace the declared ones), so that shapes depending on its value (Reshape's shape, Expand's shape, TopK's K)
  /// become static and its consumers may fold. A name that is not a graph input is an InputError.
  std::map<std::string, Tensor> frozen_inputs;
  /// The values that the sequence and optional graph inputs will run with, by name: their structure (length, element
  /// dtypes and shapes, presence) is static in the loaded graph (docs/sequences.md); only that is read here, not the
  /// data. `inputs_dir` supplies the ones not given here.
  std::map<std::string, OnnxValue> structured_inputs;
  /// Initializers that are variables, not constants (`--training`'s trainable weights): no node that reads one is
  /// folded, so the weight and every computation on it stay in the graph (a folded wpe(arange(T)) would cut the
  /// position table's gradient). Empty: every initializer is a constant.
  std::function<bool(const Value&)> variable;
};

/// What loading did to the graph besides converting it, for `explain` (docs/loading.md).
struct LoadReport {
  struct Folded {
    std::string node, op_type;         // the folded node
    std::vector<std::string> outputs;  // its outputs, now initializers
    int64_t bytes = 0;                 // their total size in bytes
  };
  std::vector<Folded> folded;           // nodes evaluated once at load, in graph order
  std::vector<std::string> not_folded;  // constant nodes left to run: "node 'e' (Expand): 256.0 MiB of outputs ..."
  std::vector<std::string> rewrites;    // "node 'd' (Dropout): not training, an Identity", dropped unused outputs,
                                        // "node 'c' (If): condition is constant true, then_branch inlined"
  std::vector<std::string> shape_disagreements;  // "value 'v' (node 'n' (Op)): shape function float32[2,3], ONNX
                                                 // inference float32[2,4]"
  /// The model carries ONNX's multi-device sharding annotations (an annotated model: read_annotated_model).
  bool sharding_annotations = false;
  /// The model's signature over the loaded graph: one entry per ONNX graph input (initializers and frozen inputs
  /// excluded) and per output, in order. Sequences and optionals are flattened (FlatValue).
  std::vector<FlatValue> inputs, outputs;
};

/// The tensors to run the loaded graph `g` with (one per g.inputs, in order) from `values`, one per
/// `report.inputs` entry. Throws InputError("input 'x': ...") when a value's structure, element count or dtype is not
/// what the graph was loaded for.
std::vector<Tensor> flatten_inputs(const Graph& g, const LoadReport& report, std::vector<OnnxValue> values);

/// The model's outputs as ONNX types them (one per `report.outputs` entry) from the loaded graph's `outputs` (one per
/// g.outputs, moved from).
std::vector<OnnxValue> unflatten_outputs(const Graph& g, const LoadReport& report, std::vector<Tensor> outputs);

/// What a model file holds, read without shape inference or folding (for test runners and tooling).
struct ModelInfo {
  int64_t opset = 0;                  // the ai.onnx opset import (1 for IR 1-2 models without opset_import)
  std::vector<std::string> op_types;  // op_type of every top-level graph node, in file order ("domain:Op" outside
                                      // ai.onnx); Constant nodes included
  std::vector<std::string> inputs;    // graph input names, initializers excluded, in order
  std::vector<std::vector<std::string>> input_dim_params;  // per input, per dim: its symbolic name ("" when the
                                                           // dim has a value or no name; empty for non-tensors)
  std::vector<std::vector<int64_t>> input_shapes;          // per input, per dim: its size (-1 when symbolic or unknown;
                                                           // empty for non-tensors and inputs without a shape)
  std::vector<DType> input_dtypes;      // per input: its (element) type (kUndefined when not declared)
  std::vector<ValueKind> input_kinds;   // per input: tensor, sequence or optional
  std::vector<std::string> outputs;     // graph output names, in order
  std::vector<DType> output_dtypes;     // per output: its element type (as input_dtypes)
  std::vector<ValueKind> output_kinds;  // per output: tensor, sequence or optional
  std::map<std::string, std::string>
      metadata;  // the model's metadata_props (key -> value); a device model from
                 // export_device has gspmd.device, gspmd.mesh_shape, ... (collectives.md)
};

/// Reads `path`'s graph summary. Throws InputError("model.onnx: ...") for a missing, truncated or malformed file.
ModelInfo read_model_info(const std::string& path);

/// Loads `path` (+ external data next to it) into a Graph where every value has a static type (docs/loading.md):
/// binds symbolic dims, runs ONNX shape inference, simplifies for inference (simplify_for_inference: Dropout as
/// Identity, unused outputs dropped), then one topological pass folds every node whose inputs are all constant
/// (Shape of a static value included) and types the rest with opts.shape_function, cross-checked against ONNX's
/// inference; dead nodes are pruned. IR-3 models listing initializers among graph inputs are accepted.
/// Control flow (If, Loop, Scan; docs/control-flow.md): bodies become graph attributes whose outer-scope reads are
/// captured as explicit node inputs (ir.h); bodies are typed by the same pass; an If on a constant condition is
/// replaced by its taken branch.
/// Throws InputError("model.onnx: <problem>") for a missing, truncated or malformed file, an unbound symbolic
/// dim ("input 'ids' dim 0 'batch' is symbolic: bind it with --dim batch=N"), a dim that the input
/// tensors and --dim give differently, or a value whose shape stays unknown; that error names the value, its node and
/// why: "value 'idx' (output of node 'nz' (NonZero)) has a data-dependent shape: ...".
/// `report` (optional) receives what was folded and rewritten.
Graph load_model(const std::string& path, const LoadOptions& opts, LoadReport* report = nullptr);

/// What one entry of a sharding file's `rules` matched (read_sharding_file, `inspect --shardings`).
struct RuleMatches {
  std::string key;             // "rules[3]"
  std::string pattern;         // its "match" regex
  std::vector<int> annotated;  // values it annotates (not claimed by `tensors` or an earlier rule), graph order
  std::vector<std::pair<int, std::string>> failed;  // values it matches but cannot annotate, and the error
};

/// Reads the sharding sidecar (docs/sharding-file.md, version 1): the mesh (with an optional device order,
/// `"devices"`), and per tensor or rule a PartitionSpec (list or `{"spec": ...}` object with `unreduced`/`priority`),
/// XLA HLO sharding text (`{"hlo": "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"}`, sharding_from_hlo) or
/// OneFlow nd-SBP (`{"sbp": ["S(0)", "B"]}`, sharding_from_sbp). `cli_mesh` is the --mesh value (nullptr if absent):
/// it gives the shape when the file has no mesh and overrides sizes otherwise (same axis count required; a file's
/// `devices` must then list as many devices as --mesh has).
/// Throws InputError with one line naming the file, the key and the problem, e.g.
///   gpt.sharding.json: tensors."h.0.mlp.fc_in.weight": spec has 3 entries but the tensor has rank 2
/// Covers malformed JSON, unknown value names, unknown axes, an axis used twice, wrong rank, mesh mismatch, a device
/// order that is not a permutation, and HLO / SBP text that is malformed or that the mesh cannot express.
/// `rules` (optional; `inspect --shardings`): receives what each entry of `rules` matched, and a rule's sharding that
/// does not fit a value it matches (a rank mismatch) is recorded there and that value skipped, instead of the error.
Annotations read_sharding_file(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh,
                               std::vector<RuleMatches>* rules = nullptr);

/// The values that the sharding sidecar at `path` names in `tensors` or matches with a `rules` regex, as a predicate
/// for LoadOptions::variable: an annotated initializer is not folded away at load (a folded Transpose of a weight
/// would leave no value of that name to annotate). Empty when the file cannot be read or names nothing (then
/// read_sharding_file reports any problem). Cost: one read of the file; the predicate is O(log names + rules).
std::function<bool(const Value&)> sharding_file_names(const std::string& path);

/// The notation write_sharding_file writes each value's sharding in (docs/sharding-file.md, "Writing"):
/// a PartitionSpec, XLA HLO sharding text or OneFlow nd-SBP.
enum class ShardingNotation { kSpec, kHlo, kSbp };

/// Writes the plan as a sharding file: the user's mesh (with its device order) and every value's sharding in
/// `notation` (spec: the list, or the object form with `unreduced` for partial values; hlo: `{"hlo": TEXT}` with
/// `reduction` for non-sum partial values; sbp: `{"sbp": [...]}`). A sharding the notation cannot express exactly
/// (SBP has no sub-axes and orders the axes of a dim by mesh axis; HLO drops axes of size 1) is written as a spec.
/// The file reads back with read_sharding_file to the same shardings. Written atomically.
void write_sharding_file(const std::string& path, const Graph& g, const DeviceMesh& mesh,
                         const std::vector<TensorSharding>& shardings,
                         ShardingNotation notation = ShardingNotation::kSpec);

/// Writes the model at `model_path` (the unpartitioned ONNX file `g` was loaded from) to `out_path` with every
/// value's sharding attached as ONNX's multi-device annotations (onnx >= 1.18, IR version 11; docs/sharding-file.md,
/// "Annotated models"): one DeviceConfigurationProto "gspmd" with mesh.num_devices() devices in
/// ModelProto.configuration (field 26), and on every top-level node a NodeDeviceConfigurationProto "gspmd" with one
/// ShardingSpecProto per input and output that `g` has (`shardings`, one per value of `g`, over `mesh`): each split
/// dim one ShardedDimProto, each shard its device or a negative key of index_to_device_group_map listing the
/// devices that replicate it. The messages travel as unknown fields with upstream's numbers (onnx 1.12 has none of
/// them), so onnx 1.12 readers load the file and keep them. Metadata gspmd.mesh_shape / gspmd.mesh_axes name the
/// mesh, gspmd.unreduced the unreduced values (JSON {"value": {"axes": [...], "reduction": "sum"}}; ONNX's specs
/// have no partial state). Relative external-data locations are rewritten for out_path's directory. The file is
/// written atomically. Throws InputError for an unreadable model or a path that cannot be written, UnsupportedError
/// past protobuf's 2 GiB.
void write_annotated_model(const std::string& model_path, const Graph& g, const DeviceMesh& mesh,
                           const std::vector<TensorSharding>& shardings, const std::string& out_path);

/// Reads an annotated model's shardings (write_annotated_model's, or another tool's ONNX multi-device annotations)
/// into Annotations over `g`, the graph loaded from the same model: every sharding spec of the configuration (the
/// model's only one, or "gspmd") on a value `g` has (values folded at load are skipped), decoded against the mesh of
/// the gspmd.mesh_shape / gspmd.mesh_axes metadata, or --mesh (`cli_mesh`) without them; --mesh must have the
/// metadata's shape. Each annotation's source is "FILE: node 'n': sharding_spec 'x'". Throws InputError("FILE: ...")
/// for a file without annotations, a configuration whose device count is not the mesh's, a spec whose device
/// assignment is not the mesh's tiling of some sharding, two nodes that annotate one value differently, ...
/// (docs/sharding-file.md lists the messages).
Annotations read_annotated_model(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh);

/// How export_device writes the program's collectives (`partition --collectives`, docs/collectives.md).
enum class CollectiveFormat {
  kGspmd,  // domain `gspmd` v1 nodes with replica_groups / group_size / source_target_pairs (the default)
  kOrt,    // ONNX Runtime's com.microsoft AllReduce / AllGather / AllToAll, other collectives lowered onto them
};

/// export_device's choices.
struct ExportOptions {
  CollectiveFormat collectives = CollectiveFormat::kGspmd;
};

/// Writes device `device`'s program as a standalone ONNX model: local shapes, that device's slices of the
/// weights (from `global`'s initializers, sliced with shard_tensor), gspmd ops specialised for the device
/// (ShardSlice -> Slice/Pad, MaskPad -> Slice+Pad, PartitionOffset -> Constant) and collectives in domain
/// `gspmd` v1 with replica_groups / group_size, or as ONNX Runtime's com.microsoft collectives
/// (options.collectives; docs/collectives.md). Donated params (ProgramBinding::donated: a training step's weights and
/// optimizer state) are also graph inputs, after the data inputs, with their slices as default initializers; their
/// updated values are among the outputs (docs/training.md, "Export"). The model is validated before it is written
/// (onnx's checker and strict shape inference with the gspmd schemas, gspmd_schemas.h). Throws InputError on
/// I/O failure, UnsupportedError for a device model past protobuf's 2 GiB, InternalError when the model fails
/// validation (a bug), InputError("--collectives ort: node 'n' (Op):
/// ...") for a collective ONNX Runtime cannot carry (a uint64 or string tensor, a bool reduction).
void export_device(const SpmdProgram& p, const Graph& global, int64_t device, const std::string& path,
                   const ExportOptions& options = {});

/// Reads one serialized onnx.TensorProto (.pb, ONNX backend test-data layout). Throws InputError naming the file.
Tensor read_tensor_pb(const std::string& path);
/// Writes one serialized onnx.TensorProto named `name`.
void write_tensor_pb(const std::string& path, const Tensor& t, const std::string& name = "");
/// Reads one serialized value of `kind` (.pb, ONNX backend test-data layout): an onnx.TensorProto, SequenceProto
/// (tensor elements) or OptionalProto (a tensor or a sequence of tensors). The bytes do not say which message they
/// hold: the model's declared type does (ModelInfo::input_kinds). Throws InputError naming the file.
OnnxValue read_value_pb(const std::string& path, ValueKind kind);
/// Writes `v` as one serialized TensorProto, SequenceProto or OptionalProto named `name`.
void write_value_pb(const std::string& path, const OnnxValue& v, const std::string& name = "");

}  // namespace gspmd
