// core/ir: the graph every module works on (the ONNX graph after loading, and the SPMD program after partitioning).
//
// A Graph is a list of Values (tensors with a static shape) and a list of Nodes in topological order. Node and
// Value attributes follow the ONNX IR (onnx/IR.md): op_type + domain ("" = ai.onnx, "gspmd" = our collectives),
// named attributes, positional inputs where -1 marks an absent optional input.
// Depends only on the standard library (docs/architecture.md, invariant 6).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "core/ir/dim_expr.h"

namespace gspmd {

/// Element types, numbered as onnx.TensorProto.DataType so the frontend converts by value.
enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,  // not supported by the executor; kept so loading reports it by name
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
};

/// Bytes per element (bool = 1). Throws std::invalid_argument for kUndefined and kString.
size_t dtype_size(DType t);
/// True for the floating-point types (float16, bfloat16, float32, float64).
inline bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat64;
}
/// ONNX-style lower-case name ("float32", "int64", ...).
std::string_view dtype_name(DType t);

/// A static tensor shape; every dim >= 0.
using Shape = std::vector<int64_t>;
/// Product of the dims (1 for a scalar), saturated at INT64_MAX (declared dims from a file may overflow: found by
/// the model fuzzer).
int64_t num_elements(const Shape& s);
/// "[8,64,128]".
std::string shape_str(const Shape& s);
/// "float32[2,3]": dtype_name and shape_str together.
std::string type_str(DType t, const Shape& s);

/// static_cast<To>(v), defined for every value: a floating-point `v` that is NaN or outside To's range (undefined
/// behaviour for static_cast; ONNX leaves Cast's result unspecified) gives 0 for NaN, else To's nearest limit. Other
/// values convert as static_cast does.
template <class To, class From>
To saturate_cast(From v) {
  if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    if (std::isnan(v)) return To(0);
    if (v <= static_cast<From>(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (v >= static_cast<From>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
  }
  return static_cast<To>(v);
}

/// IEEE binary16 bits -> float (exact). The one conversion every module uses (kernels, sharding, export).
float half_to_float(uint16_t h);
/// float -> IEEE binary16 bits, round to nearest even; overflow gives infinity, NaN stays NaN.
uint16_t float_to_half(float f);
/// bfloat16 bits -> float (exact).
float bf16_to_float(uint16_t h);
/// float -> bfloat16 bits, round to nearest even; NaN stays NaN.
uint16_t float_to_bf16(float f);

/// A dense row-major tensor owning its bytes. Copying a Tensor copies the data.
struct Tensor {
  DType dtype = DType::kUndefined;
  Shape shape;
  std::vector<std::byte> bytes;  // num_elements(shape) * dtype_size(dtype)

  Tensor() = default;
  /// Zero-filled tensor of that type and shape.
  Tensor(DType t, Shape s);

  int64_t numel() const { return num_elements(shape); }
  size_t nbytes() const { return bytes.size(); }
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes.data());
  }

  /// Scalar/vector helpers for shape-like tensors: reads int32/int64 (or float) elements as int64.
  std::vector<int64_t> as_int64s() const;
  /// Makes a 1-D int64 tensor (or a scalar when `scalar` is true and v has one element).
  static Tensor from_int64s(const std::vector<int64_t>& v, bool scalar = false);
  /// Makes a float32 tensor of `shape` from `v` (sizes must match, else std::invalid_argument).
  static Tensor from_floats(const Shape& shape, const std::vector<float>& v);
  /// A floating-point tensor (float32, float64, float16 or bfloat16) of `shape` with every element `v`, rounded to
  /// nearest even in the 16-bit types. Throws std::invalid_argument for another type.
  static Tensor filled(DType t, const Shape& shape, double v);
};

/// A value's static type: element type and dims (what a shape function computes for each node output).
struct TensorType {
  DType dtype = DType::kUndefined;
  Shape shape;
  bool operator==(const TensorType&) const = default;
};

class Graph;

/// An ONNX attribute value. A graph-valued attribute (the body of If / Loop / Scan) is an immutable Graph, shared by
/// the copies of its node.
///
/// Control flow (ONNX If, Loop, Scan; docs/control-flow.md). A body Graph's `inputs` are its formal inputs in ONNX
/// order (Loop: iteration number, condition, carried values; Scan: state values, then one slice per scan input; If:
/// none), its `outputs` its outputs in ONNX order. A body reads nothing from an enclosing scope: every value that a
/// body (or a body nested in it) reads from outside is *captured* at load: it becomes an extra input of the
/// control-flow node, appended after the node's ONNX inputs, and an extra input of every body of that node (same
/// name, same order, after the formal inputs); the node's int attribute `gspmd_captures` is their number. A
/// control-flow node is therefore a pure function of its inputs: propagation, partitioning, cost and the executor
/// treat it like any node (it has no factor rule: it is computed replicated). Export turns captures back into
/// outer-scope references.
using AttrValue = std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>,
                               std::vector<std::string>, Tensor, std::shared_ptr<const Graph>>;

/// An operator instance. Inputs/outputs are value ids in the owning Graph; -1 = absent optional input.
struct Node {
  std::string name;
  std::string op_type;
  std::string domain;  // "" (ai.onnx) or "gspmd"
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::map<std::string, AttrValue> attrs;

  bool has(const std::string& a) const { return attrs.count(a) != 0; }
  /// Typed attribute getters; return `def` when absent, throw SpecError naming the node when mistyped.
  int64_t i(const std::string& a, int64_t def = 0) const;
  float f(const std::string& a, float def = 0.f) const;
  std::string s(const std::string& a, const std::string& def = "") const;
  std::vector<int64_t> ints(const std::string& a, const std::vector<int64_t>& def = {}) const;
  std::vector<float> floats(const std::string& a, const std::vector<float>& def = {}) const;
  const Tensor* t(const std::string& a) const;  // nullptr when absent
  const Graph* g(const std::string& a) const;   // a body; nullptr when absent
  /// True for a node with graph-valued attributes (If, Loop, Scan).
  bool has_body() const;
  /// Number of trailing inputs that are captured outer-scope values (attribute `gspmd_captures`, 0 when absent).
  int captures() const { return static_cast<int>(i("gspmd_captures", 0)); }
};

/// What an ONNX value holds (onnx/IR.md, "Types"): a tensor, a sequence of tensors, or an optional (empty, or holding
/// a tensor or a sequence).
enum class ValueKind : uint8_t { kTensor, kSequence, kOptional };

/// A value's shape, and for a small integer tensor its elements, as expressions over the model's dim symbols
/// (docs/shapes.md, "Symbolic dims"): what a model loaded with its symbols kept (LoadOptions::keep_symbols) knows of
/// the values that depend on them. Value::shape (and Value::data for a constant) hold the same at the symbols' hints.
struct SymbolicValue {
  std::vector<DimExpr> dims;                  // one per dim of Value::shape
  std::optional<std::vector<DimExpr>> elems;  // row-major elements of a tensor whose values are expressions (Shape's
                                              // result and integer arithmetic on it); nullopt: not expressions
  bool operator==(const SymbolicValue&) const = default;
  /// True when a dim or an element reads a symbol.
  bool has_symbols() const;
};

/// An edge of the graph: a tensor. Sequence and optional values exist only while the loader lowers them: it flattens
/// each into its element tensors (docs/sequences.md), so every Graph that load_model returns holds tensors only.
struct Value {
  std::string name;
  ValueKind kind = ValueKind::kTensor;  // kSequence / kOptional: dtype is the element type, shape is empty
  DType dtype = DType::kUndefined;
  Shape shape;
  int producer = -1;                   // node id, -1 for graph inputs and initializers
  bool is_initializer = false;         // a weight or constant known before the run
  std::shared_ptr<const Tensor> data;  // initializer data; may be null for initializers when loaded shapes-only
  /// Its dims (and elements) over the dim symbols, when they read one (null: static, the usual case). `shape` and
  /// `data` are their values at the symbols' hints.
  std::shared_ptr<const SymbolicValue> sym;

  /// Bytes of the declared shape and dtype: num_elements(shape) * dtype_size(dtype) (dtype_size's
  /// std::invalid_argument for a dtype without a fixed size).
  int64_t nbytes() const { return num_elements(shape) * static_cast<int64_t>(dtype_size(dtype)); }
};

class Graph;

/// True when `e` reads a data-dependent symbol of `g` (Graph::runtime_dims): a size only a run knows.
bool reads_runtime_dim(const Graph& g, const DimExpr& e);

/// Per dim of value `v` of `g`: 1 when the dim reads a data-dependent symbol (reads_runtime_dim). Empty when none
/// does (a static value, or a graph without data-dependent symbols).
std::vector<char> runtime_dims_of(const Graph& g, int v);

/// Value v's global shape in one run: its declared shape, with each data-dependent dim (runtime_dims_of; never
/// split) as in `local`, the shape a device computed for it.
Shape run_shape(const Graph& g, int v, const Shape& local);

/// The dim symbols of `g` that its inputs' sizes give (Graph::dim_hints less Graph::runtime_dims), in dim_hints'
/// order: the order of a device file's gspmd_dims input (docs/shapes.md).
std::vector<std::string> input_dim_symbols(const Graph& g);

/// A computation graph with static shapes. Nodes are kept in topological order (verify() checks).
class Graph {
 public:
  std::string name;
  int64_t opset = 17;  // ai.onnx opset the graph was imported at
  std::vector<Value> values;
  std::vector<Node> nodes;
  std::vector<int> inputs;   // graph inputs, initializers excluded, in ONNX order
  std::vector<int> outputs;  // graph outputs, in ONNX order
  /// The dim symbols that values' SymbolicValues read, each with its hint: the size that Value::shape and
  /// Value::data assume for it (docs/shapes.md). Empty for a static graph.
  DimBindings dim_hints;
  /// Equalities of dim expressions that the model's ops need and that hold at the hints (SymbolicResult,
  /// core/shapes/symbolic.h): the model runs only for dims that satisfy them.
  std::vector<std::pair<DimExpr, DimExpr>> dim_guards;
  /// The data-dependent dim symbols (torch's unbacked symbols; docs/shapes.md step 6), a subset of dim_hints' keys:
  /// each is a dim of a node's outputs that only a run knows (NonZero's count of non-zeros), typed at its upper bound
  /// (its hint). Such a dim is never split; the executor binds it from the tensor the node computes.
  struct RuntimeDim {
    std::string node;    // the node whose outputs it sizes
    std::string what;    // what it counts: "the non-zeros of 'mask'"
    int64_t bound = 0;   // its upper bound, its hint; -1: none (Range's length), typed at another hint
    bool given = false;  // the bound is the user's (`--dim NAME=V`), not the op's spec
  };
  std::map<std::string, RuntimeDim, std::less<>> runtime_dims;

  /// Adds a value; its name must be unique (std::invalid_argument otherwise). Returns its id.
  int add_value(Value v);
  /// Adds a value named after `hint`, made unique with a numeric suffix if needed.
  int add_value_unique(const std::string& hint, DType t, const Shape& s);
  /// Adds a node at the end (caller keeps topological order) and sets its outputs' producer. Returns its id.
  int add_node(Node n);
  /// Renames value v, keeping the name index; throws std::invalid_argument when another value has `name`.
  void rename(int v, const std::string& name);
  /// Reserves room for `values` values (and their names in the index) and `nodes` nodes, for a builder that knows
  /// about how many it will add.
  void reserve(size_t values, size_t nodes);
  /// Value id by name, or -1.
  int find(std::string_view name) const;
  /// Value id by name; throws std::out_of_range("unknown value 'x'") when missing.
  int at(std::string_view name) const;
  /// consumers()[v] = ids of nodes that read value v (a node reading v twice is listed once). O(edges).
  std::vector<std::vector<int>> consumers() const;
  /// Checks ids in range, unique names, one producer per value, topological order, outputs produced.
  /// Throws InternalError naming the first problem (the loader reports it as an InputError).
  void verify() const;
  /// Drops nodes whose outputs reach no graph output, and values nothing uses; renumbers ids. A node that computes
  /// a data-dependent symbol (runtime_dims) a kept value reads is kept. Changes nothing (ids and index kept) when
  /// everything is used.
  void prune();
  /// Rebuilds the name index after values were edited in place.
  void reindex();

 private:
  struct NameHash {  // lets find() look up a string_view without building a std::string
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int, NameHash, std::equal_to<>> index_;
  std::unordered_map<std::string, int> next_suffix_;  // add_value_unique: the last suffix given per hint
};

/// Types one node's outputs from its input types (nullptr = absent) and the values of its constant inputs (nullptr =
/// not constant): core's infer_types (core/shapes/shapes.h) with the backend's run_kernel as its evaluator, injected
/// by the CLI (cli/wiring.h) into the loader and the training-step builder (core/autodiff). Throws DataDependentError
/// when an output shape depends on a non-constant input's values, UnsupportedError for an op it does not know.
using ShapeFunction =
    std::function<std::vector<TensorType>(const Node& node, const std::vector<const TensorType*>& types,
                                          const std::vector<const Tensor*>& values, int64_t opset)>;

/// `text` for a one-line error message: as it is up to `max` characters, else its first max - 3 and "..." (user
/// text can be megabytes long).
std::string cut_text(std::string_view text, size_t max = 60);

/// `text` as one line for an error message: its first non-empty line, and " (and N more)" when N more non-empty
/// lines follow (onnx's shape inference lists every node it could not type, one per line).
std::string first_line(std::string_view text);

/// Error for unusable input (bad model, bad sharding file, unknown names): the CLI prints
/// "error: <what>: <why>" and exits 2.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A dim expression past DimExpr::kMaxTerms terms (a Concat of 91 per-class detection counts): the loader gives such
/// a dim a fresh data-dependent symbol instead (docs/shapes.md step 6); anywhere else it is an InputError.
struct DimExprTooLarge : InputError {
  using InputError::InputError;
};

/// An output shape that depends on input *values* that are not known when the model is loaded (NonZero, Unique,
/// NonMaxSuppression, TopK with a computed K, a Reshape whose shape is computed from data). The message says which
/// input's values are needed ("output 0 depends on the values of input 1 'k'"); the loader turns it into a one-line
/// InputError naming the value, its node and what would bind it.
struct DataDependentError : std::runtime_error {
  DataDependentError(const std::string& what, int input_index = -1) : std::runtime_error(what), input(input_index) {}
  int input;  // the node input whose values are needed (-1: not one input)
};

/// A node that breaks its operator's spec (the ONNX operator spec): shapes that cannot broadcast, a missing required
/// input, a mistyped attribute, an index out of range. Shape functions, attribute readers and kernels throw it with
/// the node named ("node 'n' (Add): ..."); whoever called them decides what it means: the loader reports it as an
/// InputError naming the model, the executor as an InternalError (the partitioner built a bad program) unless the
/// kernel checked values that came from the input (then the kernel throws InputError itself; docs/errors.md).
struct SpecError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Error for a valid model using an operator the executor cannot run (CLI exit 3).
struct UnsupportedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A bug of gspmd-onnx, never of its input: a broken invariant between its own passes (a program value without a
/// sharding, a shape function and its kernel disagreeing, an impossible collective). The CLI prints
/// "error: internal error: <what>" and exits 4 (docs/errors.md). Input that can cause an error must get an InputError
/// or an UnsupportedError instead.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

/// True for an error the input can cause and `cli/main.cc` reports as such (exit 2 or 3): InputError,
/// UnsupportedError, std::bad_alloc and std::length_error (sizes past this machine). Code that adds a node's name to
/// the errors it catches passes these through unchanged and reports anything else as an InternalError.
bool is_input_caused(const std::exception& e);

}  // namespace gspmd
