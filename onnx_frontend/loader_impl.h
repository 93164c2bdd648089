// onnx_frontend (private to the loader): the Loader behind load_model (frontend.h): an ONNX file to a core Graph with
// static shapes. loader.cc drives it (parse, prepare, sort, infer, fold); loader_checks.cc holds the checks of hostile
// or malformed input, loader_dims.cc the binding of symbolic dims (--dim, --inputs, hints), loader_convert.cc the
// conversion of nodes, attributes and bodies to the IR.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "onnx_frontend/fold.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/gspmd_schemas.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd::loader_internal {

using frontend::dir_of;
using frontend::is_external;
using frontend::tensor_from_proto;
using frontend::tensor_to_proto;

// Constants at most this large stay in the ModelProto for ONNX shape inference (its data propagation reads them);
// larger ones are handed to it as typed graph inputs (shape inference only needs their type).
constexpr size_t kInlineForInference = 64 << 10;

// Node names: kept when non-empty and unique, else "<OpType>_<index>" (made unique with a suffix).
inline std::vector<std::string> unique_node_names(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes) {
  std::unordered_set<std::string> given, used;
  for (const auto& n : nodes)
    if (!n.name().empty()) given.insert(n.name());
  std::vector<std::string> out;
  for (int ni = 0; ni < nodes.size(); ++ni) {
    std::string name = nodes[ni].name();
    if (name.empty() || used.count(name)) {
      std::string base = fmt::format("{}_{}", nodes[ni].op_type(), ni);
      name = base;
      for (int k = 1; used.count(name) || given.count(name); ++k) name = fmt::format("{}_{}", base, k);
    }
    used.insert(name);
    out.push_back(std::move(name));
  }
  return out;
}

struct Loader {
  const std::string& path;
  const LoadOptions& opts;
  std::string base_dir;
  onnx::ModelProto m;
  frontend::ExternalDataFiles external{base_dir};  // external data locations, each resolved once
  int64_t opset = -1;
  std::vector<std::string> input_names;  // real graph inputs, in order
  std::vector<Value> consts;             // initializers and Constant outputs, in order
  std::unordered_map<std::string, size_t> const_index;
  std::unordered_map<std::string, std::string> non_tensor;      // values typed map (or another non-tensor type but a
                                                                // sequence or optional) by inference
  DimBindings hints;                                            // opts.keep_symbols: the kept symbols' hints
  std::map<std::string, std::vector<DimExpr>> symbolic_inputs;  // and the inputs' dims that read them
  std::set<std::string> input_dim_names = {};      // the dim_params of the graph inputs, before bind_dims binds them
  std::unordered_set<std::string> verified_nodes;  // verify_nodes: what a node's schema check reads, once checked

  Loader(const std::string& model_path, const LoadOptions& options)
      : path(model_path), opts(options), base_dir(frontend::dir_of(model_path)) {}

  [[noreturn]] void fail(const std::string& why) const { throw InputError(fmt::format("{}: {}", path, why)); }

  // The name the loaded graph gives node `ni` of the main graph (unique_node_names), for an error message: O(nodes),
  // so the checks ask for it only when they fail.
  std::string node_label(int ni) const { return unique_node_names(m.graph().node())[static_cast<size_t>(ni)]; }

  void parse();

  // No model-local function calls itself, directly or through others (onnx 1.12's shape inference expands calls
  // without end: a stack overflow). Kahn's algorithm on the call graph, without recursion (a hostile model may chain
  // many functions).
  void check_function_calls() const;

  // The ai.onnx operators whose inputs, outputs or attributes changed in opsets 18 .. 23 (ONNX's Changelog), and
  // those added there: a newer model's node of these is not checked against onnx 1.12's schema.
  static bool changed_after_onnx_1_12(const std::string& op);

  // Every name of graph `g` (bodies included) is UTF-8, as ONNX's IR asks: names reach the JSON the tool writes
  // (shardings.json, reports, traces), which cannot hold other bytes (a value named "h\xff" was an internal error when
  // `partition` wrote shardings.json).
  void check_utf8_names(const onnx::GraphProto& g) const;

  // True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF).
  static bool is_utf8(std::string_view s);

  // The largest value a model may hold, in bytes (docs/loading.md): 1 PiB, far past any model or pod (a 2048-expert
  // MoE's weights are 2^40 bytes), and small enough that the cost model's sums of such sizes do not overflow int64.
  static constexpr int64_t kMaxValueBytes = int64_t{1} << 50;

  // The newest ai.onnx opset read (ONNX 1.18's); opsets past the installed onnx's own are read with its newest
  // schemas (docs/loading.md).
  static constexpr int64_t kNewestOpset = 23;

  // Every ai.onnx node against its operator schema at `schema_opset` (onnx's checker: arity, attribute types,
  // unknown attributes), bodies included. A node of another domain is left to the executor (exit 3 if unknown).
  // `newer`: the model's opset is past the installed onnx's, whose newest schemas are used for the operators that
  // did not change since (changed_after_onnx_1_12); an operator it does not know is left to the executor.
  void verify_nodes(const onnx::GraphProto& g, int64_t schema_opset, bool newer);

  // Reads a constant's data: always when load_data, else only small tensors whose data is at hand.
  std::shared_ptr<const Tensor> read_const(const onnx::TensorProto& t, const std::string& what);

  void add_const(Value v) {
    if (const_index.count(v.name)) fail(fmt::format("value '{}' is defined twice", v.name));
    const_index.emplace(v.name, consts.size());
    consts.push_back(std::move(v));
  }

  static void set_type(onnx::ValueInfoProto* vi, const std::string& name, DType dt, const Shape& s);

  // Puts a constant into the proto for shape inference: inline when small and known, else as a typed graph input.
  void expose_const(const Value& v, std::unordered_set<std::string>& graph_input_names);

  Value initializer_value(const onnx::TensorProto& t);

  // A Constant node's output as a constant value (data read as read_const does).
  Value constant_value(const onnx::NodeProto& n);

  void prepare();

  // Absent optional outputs followed by present ones (LSTM's Y = "" with Y_h) get a name, so that shape inference
  // types them like any other value.
  // The values node `n` reads: its inputs and, recursively, its bodies' (outer-scope reads included).
  static void names_read(const onnx::NodeProto& n, std::vector<std::string>& out);

  // ONNX asks for topologically sorted nodes, but some exporters write them unsorted (IS-Net's fp16 model casts its
  // input at node 643 of 734) and ONNX Runtime accepts that: sort them, stably, when they are not. A cycle or a value
  // nobody produces is left to convert() to report.
  void sort_nodes();

  void name_absent_outputs();

  // opts, with the sequence and optional inputs that opts.structured_inputs lacks read from opts.inputs_dir
  // (DIR/input_<i>.pb, when present); a copy in `storage` only when there are such inputs.
  const LoadOptions& with_structured_inputs(LoadOptions& storage) const;

  // The shapes of the given input tensors: opts.input_shapes, and DIR/input_<i>.pb of opts.inputs_dir for the graph
  // inputs that have a dim without a size (only those files are read: the rest are not needed to bind anything).
  std::map<std::string, Shape> given_shapes() const;

  // Symbolic dims -> sizes: from the given input tensors (given_shapes()), else from --dim (opts.dims).
  std::map<std::string, int64_t> bound_dims(const std::map<std::string, Shape>& given_shapes) const;

  // The dim_params of a graph input's type (a tensor, or a sequence's or optional's elements).
  static void collect_dim_params(const onnx::TypeProto& t, std::set<std::string>& out);

  // Every --dim names a symbolic dim of the model's inputs or, once the graph is typed, a data-dependent dim (whose
  // bound it gives): a misspelt one would bind nothing, silently. Checked on the typed graph `g`.
  void check_dim_names(const Graph& g) const;

  // Every --hint names a symbol that loading keeps (a misspelt one would change nothing, silently).
  void check_hint_names() const;

  // opts.keep_symbols: input `name`'s dim i (of `rank`) is the symbol `sym`, with its --hint or else the next hint
  // (kFirstDimHint's sequence of primes) when it is new.
  void keep_symbol(const std::string& name, int i, int rank, const std::string& sym);

  void bind_dims();

  // Every value a node reads is defined before it: a graph input, an initializer, an earlier node's output, and in a
  // body also its own inputs and the enclosing graphs' values defined before its node. Checked before ONNX's shape
  // inference, which crashed (SIGSEGV in onnx 1.12) on nodes that read undefined values (found by the model fuzzer);
  // the messages are convert()'s.
  void check_reads_defined() const;

  // check_reads_defined for body `b` of top-level node `ni`, which sees the values `defined` before it.
  void check_body_reads(const onnx::GraphProto& b, std::unordered_set<std::string> defined, int ni) const;

  // The convolutions and pools whose operands' ranks are known before shape inference (graph inputs, initializers,
  // value_info) have the ranks the ONNX spec gives: X [N, C, D1, ...] (rank >= 3), W of X's rank, and spatial
  // attributes of rank - 2 entries (pads: twice that), and positive strides, dilations and kernel sizes. Checked
  // before ONNX's shape inference, whose convolution and pool functions crashed (onnx 1.12: SIGSEGV on a rank-2 X,
  // SIGFPE on a stride of 0; found by the model fuzzers).
  void check_conv_pool_ranks() const;

  // A ConstantOfShape or a Range on constants may not ask for more than kMaxConstantElements elements: ONNX's shape
  // inference (onnx 1.12) makes the length of such a 1-D tensor the rank of an Expand or Reshape that reads it as its
  // shape and allocates one dim per element (out of memory at 7e16, found by the model fuzzer); and a
  // SplitToSequence's scalar split on a constant must be positive (onnx 1.12 divides by it). Checked before it.
  void check_constant_sizes() const;

  void infer();

  // The bodies of one node's GRAPH attributes, and the outer-scope names they read (see convert_attrs).
  struct Bodies {
    std::vector<std::shared_ptr<Graph>> graphs;
    std::vector<std::string> captures;
  };

  AttrValue convert_attr(const onnx::NodeProto& n, const std::string& node_name, const onnx::AttributeProto& a,
                         Bodies& bodies);

  using TypeMap = std::unordered_map<std::string, const onnx::TypeProto*>;

  static TypeMap type_map(const onnx::GraphProto& pg);

  // A value typed as `types` says. Without a static tensor type it has no shape and goes to `unknown`; without
  // `unknown` (in a body) its dtype is kUndefined too.
  Value typed_value(const std::string& name, const TypeMap& types, std::unordered_set<std::string>* unknown);

  static Value untyped(const std::string& name) {
    Value v;
    v.name = name;
    return v;
  }

  // Node `n`'s attributes from `pn`. The outer-scope values its bodies read (resolved by `resolve`) are appended to
  // its inputs, and to every body's inputs, in first-use order; `gspmd_captures` counts them (ir.h).
  void convert_attrs(const onnx::NodeProto& pn, Node& n, const std::function<int(const std::string&)>& resolve);

  // The Node of proto node `pn`, named `name`, without outputs and attributes: op type, domain ("" for ai.onnx), inputs
  // by `resolve` (-1 for an absent optional input).
  static Node node_of(const onnx::NodeProto& pn, const std::string& name,
                      const std::function<int(const std::string&)>& resolve);

  // Absent optional outputs in the middle get a name; trailing ones are dropped.
  static std::vector<std::string> output_names(const onnx::NodeProto& pn, const std::string& node_name, const Graph& g);

  // A body (GRAPH attribute) -> Graph: formal inputs typed from the proto where it says, initializers and Constant
  // nodes as constants, other values typed from ONNX inference's value_info where static, else kUndefined (fold.cc
  // types the rest).
  // Names it reads but does not define are appended to `captures` (no repeats) and become values of the body that
  // are not inputs yet (convert_attrs makes them its trailing inputs).
  std::shared_ptr<Graph> convert_body(const onnx::GraphProto& pg, std::vector<std::string>& captures);

  // Proto (after inference) -> Graph. Values whose type is not a static tensor type are listed in `unknown`.
  Graph convert(std::unordered_set<std::string>& unknown);
};

}  // namespace gspmd::loader_internal
