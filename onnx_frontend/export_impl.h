// onnx_frontend (private to the exporter): the Exporter behind export_device (frontend.h): the SPMD program
// specialised for one device as a standalone ONNX model (docs/collectives.md). export.cc writes the model (nodes,
// attributes, bodies) and drives the export; export_symbolic.cc computes the device's sizes over the dim symbols
// (docs/shapes.md); export_ort.cc lowers the collectives to ONNX Runtime's (--collectives ort).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/partition/reshard.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/gspmd_schemas.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd::export_internal {

/// The domain of ONNX Runtime's contrib ops, its collectives among them (docs/collectives.md, "ONNX Runtime").
constexpr const char* kOrtDomain = "com.microsoft";

template <class T>
T clamp_to(double v) {
  if (std::isnan(v)) return T{};
  if (v <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

// A tensor of `shape` (usually a scalar) of dtype `t` filled with `v` (saturated for integer types).
Tensor filled(DType t, const Shape& shape, double v);

// A value's type; a dim over the dim symbols is its expression as a dim_param (docs/shapes.md).
void set_value_info(onnx::ValueInfoProto* vi, const Value& v);

// `captured`: for a graph attribute, the outer names of the node's captured inputs (ir.h).
void set_attr(onnx::AttributeProto* a, const std::string& name, const AttrValue& v,
              const std::vector<std::string>& captured = {});

// Writes node `n` whose values are named by `name`: its captured inputs (ir.h) are dropped, as its bodies read them
// from the enclosing scope again.
void write_node(const Node& n, onnx::NodeProto* pn, const std::vector<std::string>& name);

std::vector<std::string> value_names(const Graph& g);

// A body as a GraphProto: formal inputs, constants as initializers, nodes; its captured inputs named `captured`.
void write_body(const Graph& b, onnx::GraphProto* gp, const std::vector<std::string>& captured);

struct Exporter {
  const SpmdProgram& p;
  const Graph& G;  // the program
  const Graph& global;
  int64_t device;
  int64_t opset;
  ExportOptions options;
  onnx::ModelProto m;
  onnx::GraphProto* pg = nullptr;
  std::unordered_set<std::string> names;  // value and node names in use
  std::set<std::string> domains;
  std::vector<std::string> value_names_;  // G's value names by id

  std::string fresh(const std::string& hint);

  std::string add_const(const std::string& hint, const Tensor& t);

  onnx::NodeProto* add_node(const std::string& name, const std::string& op, std::vector<std::string> ins,
                            std::vector<std::string> outs);

  // ---- values over the dim symbols (docs/shapes.md, "Device files") ----
  // A constant whose elements are expressions over the dim symbols is computed from the symbols' sizes, which the
  // device reads off its inputs' shapes: `Gather(Shape(input), [d])` of an input whose dim d is the symbol.
  std::map<std::string, std::string> sym_source_;  // symbol -> the [1] int64 value holding its size
  std::map<std::string, std::string> expr_value_;  // expression text -> the [1] int64 value computing it

  std::string symbol_size(const std::string& sym);
  std::string dims_input_;  // the gspmd_dims input's name, once a symbol needs it
  // Data-dependent symbols (Graph::runtime_dims): the output and dim where the node that computes each put it, once
  // that node is written; and the constants that read them, written right after the last of those nodes.
  std::map<std::string, std::pair<int, size_t>> runtime_at_ = {};
  std::vector<int> pending_constants_ = {};

  // A [1] int64 value holding dim d of value `v`: Gather(Shape(v), [d]).
  std::string dim_of(const Value& v, size_t d, const std::string& sym);

  // After node `n` is written: the data-dependent symbols its outputs compute, and the pending constants that can
  // now be computed from them.
  void after_node(const Node& n);

  std::string binary(const char* op, const std::string& a, const std::string& b);
  std::string int_const(int64_t c) { return add_const("dims/c", Tensor::from_int64s({c})); }
  // floor(e / d) for any sign of e: (e - mod(e, d)) / d, ONNX's integer Mod taking the divisor's sign.
  std::string floor_div_of(const std::string& e, int64_t d);

  // A [1] int64 value computing `e` from the symbols' sizes.
  std::string expr_value(const DimExpr& e);

  // Value `v` (a constant whose elements are expressions) computed into its own name.
  void emit_symbolic_constant(const Value& v);

  // A value made by the exporter between two of its nodes (gets a value_info entry), of type t[s], or with `like`'s
  // dims over the symbols (all but those where s differs from like's shape, which are s's).
  std::string add_temp(const std::string& hint, DType t, const Shape& s, const Value* like = nullptr);

  void emit_slice(const std::string& node, const std::string& x, const std::string& y, int64_t axis, int64_t start,
                  int64_t end);

  void emit_pad(const std::string& node, const std::string& x, const std::string& y, DType dt, size_t rank,
                int64_t axis, int64_t pad_begin, int64_t pad_end, double value);

  // y = a tensor of y's shape filled with `value`.
  void emit_fill(const std::string& node, const Value& y, double value);

  /// `axes` (an attribute of `n`) checked against the mesh.
  const std::vector<int>& checked(const Node& n, const std::vector<int>& axes);

  int64_t norm_axis(const Node& n, int64_t axis, size_t rank);

  /// Writes the standard ONNX that computes the per-device op `n` (ShardSlice, MaskPad, PartitionOffset) on this
  /// device.
  // The id of program node `n` (a reference into G.nodes).
  int node_index(const Node& n) const { return static_cast<int>(&n - G.nodes.data()); }
  // x's dim `axis` over the symbols.
  static DimExpr dim_of(const Value& x, int64_t axis) {
    return x.sym ? x.sym->dims[static_cast<size_t>(axis)] : DimExpr(x.shape[static_cast<size_t>(axis)]);
  }
  // True when per-device op `ni` on x's `axis` involves the dim symbols (its input dim there, or an attribute).
  bool symbolic_window(const Value& x, int64_t axis, int ni) const {
    return !dim_of(x, axis).is_constant() || has_symbolic_attrs(ni);
  }
  // True when an attribute of program node `ni` is an expression over the symbols (SpmdProgram::sym_attrs).
  bool has_symbolic_attrs(int ni) const;

  void specialise(const Node& n, GspmdOp op);

  /// window() over the dim symbols: the same, its bounds computed on the device from the symbols' sizes (a Slice of
  /// the kept elements, then a Pad to `len`).
  void window_symbolic(const Node& n, const Value& x, const Value& y, int64_t axis, const DimExpr& lo,
                       const DimExpr& len, const DimExpr& keep_lo, const DimExpr& keep_hi, double value);

  /// y[i] = x[lo + i] along `axis` for lo + i inside [keep_lo, keep_hi), `value` elsewhere (len elements): Identity,
  /// a Slice, a Slice + Pad, or a fill, whichever is the device's case. Both ShardSlice and MaskPad become this.
  void window(const Node& n, const Value& x, const Value& y, int64_t axis, int64_t lo, int64_t len, int64_t keep_lo,
              int64_t keep_hi, double value);

  // ---- --collectives ort: ONNX Runtime's com.microsoft collectives (docs/collectives.md, "ONNX Runtime") ----
  // They run over all ranks of one world communicator (rank r = device r) and have no group, reduction or split-axis
  // attribute: AllReduce sums float tensors, AllGather concatenates along `axis` (group_size = all devices), AllToAll
  // exchanges the N contiguous chunks of its input. Other collectives are lowered onto them and standard ONNX ops;
  // every device's lowering of one collective is the same sequence of com.microsoft calls, so the ranks stay matched.

  bool ort_used = false;

  [[noreturn]] void ort_refuse(const Node& n, const std::string& why) const {
    throw InputError(fmt::format("--collectives ort: node '{}' ({}): {}", n.name, n.op_type, why));
  }

  /// The type ORT's AllGather and AllToAll carry a `t` tensor as: their type constraint is float16, float, double,
  /// int64 and bool; bfloat16 travels as float and narrower integers as int64 (both exact); kUndefined otherwise.
  static DType ort_wire_type(DType t);

  onnx::NodeProto* add_ms_node(const std::string& node, const std::string& op, const std::string& x,
                               const std::string& y);

  // The lowering's shapes are dims over the symbols (a static dim is a constant expression): its temps declare them
  // as dim_params and its Reshape targets are computed from the run's sizes (expr_value), so that a device file over
  // the symbols stays one (docs/shapes.md).
  using Dims = std::vector<DimExpr>;
  static Dims dims_of_value(const Value& v) { return v.sym ? v.sym->dims : Dims(v.shape.begin(), v.shape.end()); }

  /// A temp of type t with the dims `d`.
  std::string add_dims_temp(const std::string& hint, DType t, const Dims& d);

  /// The int64 [rank] shape operand holding `d`: a constant, or the dims computed from the run's sizes.
  std::string shape_operand(const Node& n, const Dims& d);

  /// `x` (of type `from`) as type `to`: x itself or a Cast to a temp of dims `d`, or to `out` when given.
  std::string cast(const Node& n, const std::string& x, DType from, DType to, const Dims& d,
                   const std::string& out = "");

  /// `x` reshaped to the dims `to` (a temp, or `out`).
  std::string reshape(const Node& n, const std::string& x, DType t, const Dims& to, const std::string& out = "");

  /// `x` of dims `d` transposed by `perm` (a temp).
  std::string transpose(const Node& n, const std::string& x, DType t, const Dims& d, const std::vector<int64_t>& perm);

  /// [members.size(), ...x] of type `wire`: the x of the devices `members` (global ids, in order), gathered from all
  /// devices: x as [1, ...x], com.microsoft.AllGather along axis 0, then a Gather of the members' rows (none when
  /// the members are all devices in order).
  std::string gather_rows(const Node& n, const Value& x, DType wire, const std::vector<int64_t>& members);

  /// The reduction of `rows` ([n, ...d], type `wire`) over axis 0, into a temp of dims `d` (or `out`).
  std::string reduce_rows(const Node& n, const std::string& rows, DType wire, const Dims& d, ReductionKind r,
                          const std::string& out = "");

  /// `rows` ([count, ...d]: count members' tensors in order) concatenated along `axis` of `d` into `out`: the leading
  /// axis moved in front of `axis` (Transpose), then merged with it (Reshape).
  void merge_rows(const Node& n, const std::string& rows, int64_t count, DType wire, const Dims& d, int64_t axis,
                  const std::string& out);

  /// Writes collective `n` as ONNX Runtime's com.microsoft collectives and standard ops (ExportOptions). Over the dim
  /// symbols every shape is dims over them; the axes a collective splits (reduce-scatter, all-to-all) are static, as
  /// the reshard planner never splits a symbolic dim by a collective (ReshardPlanner::plan's ragged dims).
  /// One member's part of static dim `axis` of dims `d` split over `members` devices (what a reduce-scatter or an
  /// all-to-all splits); InternalError for a symbolic dim.
  int64_t ort_part(const Node& n, const Dims& d, int64_t axis, int64_t members) const;
  /// lower_ort's all-to-all and collective-permute: `x` (dims `X`) exchanged among `members` (this device at `tile`),
  /// in the wire type, into `out`.
  void ort_all_to_all(const Node& n, const CollectiveAttrs& a, const Value& x, const Dims& X, DType wire,
                      const std::vector<int64_t>& members, int64_t tile, bool in_order, const std::string& out);
  void ort_permute(const Node& n, const CollectiveAttrs& a, const std::vector<int>& axes, const Value& x, const Dims& X,
                   DType wire, const std::vector<int64_t>& members, int64_t tile, const std::string& out);
  void lower_ort(const Node& n);

  /// The partitioner writes the ops it adds (Slice, Unsqueeze, ReduceSum, ...) in their newest form, operands such as
  /// `axes` as constant inputs; a model at an older opset takes them as attributes. Rewrites `pn` (node `n`) into the
  /// form of this model's opset so that the file is valid ONNX (docs/collectives.md).
  void opset_form(const Node& n, onnx::NodeProto* pn);

  void copy_node(const Node& n);

  void run(const std::string& path);
  /// run's phases: the model's metadata (device, mesh, fingerprint, dim hints and guards, coordinates); the graph's
  /// inputs and outputs (returned: their value ids); the initializers (this device's shards of the params); the nodes
  /// (specialised, lowered to ORT's collectives, or copied); the opset imports; validation and the atomic write.
  void write_metadata();
  std::unordered_set<int> write_interface();
  void write_initializers();
  void write_nodes(const std::unordered_set<int>& io);
  void write_opsets();
  void save(const std::string& path);
};

}  // namespace gspmd::export_internal
