// core/rules: gradient rules (reverse-mode differentiation), one per op type, registered in the same op-family file
// as the op's factor rule (core/rules/<family>.cc), so an op's sharding and its derivative stay in one place
// (docs/training.md). A rule writes the op's vector-Jacobian product in standard ONNX ops through a GradContext, so
// the backward pass is an ordinary Graph: the shape functions, factor rules, partitioner, kernels, cost model and
// exporter handle it unchanged. The driver that walks the graph backwards is core/autodiff/autodiff.h.
//
// Conventions follow onnxruntime-training's gradient builders and torch.autograd: the gradient of a value has the
// value's dtype and shape; an integer or bool input has no gradient; an output that does not reach the loss has no
// incoming gradient (dy(k) < 0).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// What a gradient rule sees and emits. Value ids are ids of the graph being built (the forward graph's values keep
/// their ids, so x(i) and y(k) are the forward node's operands and results: saved activations, or their recomputed
/// copies under --remat).
/// Implemented by the autodiff driver (core/autodiff/autodiff.cc).
class GradContext {
 public:
  virtual ~GradContext() = default;

  /// The forward node being differentiated.
  virtual const Node& node() const = 0;
  /// The graph being built (forward values and the backward values emitted so far).
  virtual const Graph& graph() const = 0;
  /// The value `id` (forward or emitted), by copy: emitting appends to the graph's values, which would leave a
  /// reference dangling.
  Value value(int id) const { return graph().values.at(static_cast<size_t>(id)); }
  /// The forward node's input i (a value id; -1 for an absent optional input) and output k, as the rule reads them:
  /// the saved activation, or under rematerialization its recomputed copy (emitted on first use).
  int x(size_t i) { return i < node().inputs.size() ? activation(node().inputs[i]) : -1; }
  int y(size_t k) { return activation(node().outputs.at(k)); }
  /// The forward value `v` (or -1) as the backward pass reads it: `v` itself when it is saved; otherwise (--remat) a
  /// copy recomputed from saved values by copies of its producers, emitted once and reused.
  virtual int activation(int v) = 0;
  /// The ai.onnx opset the graph is at: emit ops in that opset's form (e.g. ReduceSum's axes are an attribute
  /// before 13; the helpers below choose).
  int64_t opset() const { return graph().opset; }

  /// The gradient of the loss w.r.t. output k (same dtype and shape), or -1 when output k does not reach the loss.
  virtual int dy(size_t k) = 0;
  /// True when input i is present, floating point, and on a path from a trainable weight: only then does the rule
  /// need to call set_dx(i, ...). (Rules may skip the work for inputs where this is false.)
  virtual bool wants(size_t i) const = 0;
  /// Gives input i the gradient `grad` (a value of exactly input i's dtype and shape; the driver checks and throws
  /// InternalError naming the op otherwise). Calling it twice for one input (x used twice by the op) adds.
  virtual void set_dx(size_t i, int grad) = 0;

  /// Appends node `op` of `domain` ("" = ai.onnx) with `inputs` (value ids; -1 = absent optional) and `attrs`, with
  /// `num_outputs` outputs typed by the executor's shape functions; returns the output ids. Throws
  /// InternalError when the shape function rejects the node (a bug in the rule).
  virtual std::vector<int> emit_in(const std::string& domain, const std::string& op, const std::vector<int>& inputs,
                                   const std::map<std::string, AttrValue>& attrs, size_t num_outputs) = 0;
  /// emit_in for an ai.onnx op.
  std::vector<int> emit(const std::string& op, const std::vector<int>& inputs,
                        const std::map<std::string, AttrValue>& attrs = {}, size_t num_outputs = 1) {
    return emit_in("", op, inputs, attrs, num_outputs);
  }
  /// emit with one output; returns its id.
  int op(const std::string& op, const std::vector<int>& inputs, const std::map<std::string, AttrValue>& attrs = {}) {
    return emit(op, inputs, attrs, 1).at(0);
  }
  /// A constant (an initializer with data) holding `t`.
  virtual int constant(const Tensor& t) = 0;

  // ---- helpers built on emit (core/autodiff/autodiff.cc) ----
  /// A scalar constant of dtype `t` (float types and int64) holding `v`.
  int scalar(double v, DType t);
  /// A 1-D int64 constant.
  int ints(const std::vector<int64_t>& v);
  /// Reshape of `v` to `shape`.
  int reshape(int v, Shape shape);
  /// Transpose of `v` by `perm`.
  int transpose(int v, const std::vector<int64_t>& perm);
  /// ReduceSum of `v` over `axes` (non-negative), in the opset's form.
  int reduce_sum(int v, const std::vector<int64_t>& axes, bool keepdims);
  /// ReduceMean of `v` over `axes` (non-negative, at least one), in the opset's form (axes an attribute before 18).
  int reduce_mean(int v, const std::vector<int64_t>& axes, bool keepdims);
  /// Slice of `v` along `axes` to [starts, ends) (step 1), in the opset's form (attributes before opset 10).
  int slice(int v, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
            const std::vector<int64_t>& axes);
  /// Constant-mode Pad of `v` by `pads` (ONNX order: all begins, then all ends) with `fill`, in the opset's form
  /// (attributes before opset 11, where the value is a float clamped to float's range). `v` itself when no pad.
  int pad(int v, const std::vector<int64_t>& pads, double fill = 0.0);
  /// Unbroadcast: `v` (a gradient of a broadcast result) summed over the dims that numpy broadcasting added or
  /// stretched to reach v's shape from `shape`, then reshaped to `shape`. Returns v when the shapes are equal.
  int sum_to(int v, Shape shape);
  /// Expand of `v` to `shape` (numpy broadcasting).
  int expand(int v, Shape shape);
  /// The gradient of output k, or a zero tensor of its dtype and shape when it has none.
  int dy_or_zeros(size_t k);
  /// Cast of `v` to `t` (v itself when it already has that dtype).
  int cast(int v, DType t);
  /// OneHot of the integer `indices` over `depth` classes, inserted at `axis`, with 0 and 1 of dtype `t` (ONNX
  /// OneHot): the dense form of a gather's or a label's gradient.
  int one_hot(int indices, int64_t depth, int64_t axis, DType t);
};

/// One op type's gradient rule: sets the gradients of the inputs that wants(), from the outputs' dy.
using GradRule = std::function<void(GradContext&)>;

/// How many outputs an op's gradient rule wants its forward node to compute, given the node: more than a loaded model
/// may ask for when the op has optional outputs that the backward pass reads (LayerNormalization's Mean and
/// InvStdDev, which torch's layer_norm saves for its backward too). The step builder adds the missing outputs, typed
/// by the shape function, before the reverse pass, so they are saved (or recomputed under --remat) like any
/// activation. Returning the node's own count (or fewer) adds nothing.
using SavedOutputs = std::function<size_t(const Graph&, const Node&)>;

/// Registers (or replaces) the gradient rule of (domain, op_type); called by the family files.
void register_gradient(const std::string& domain, const std::string& op_type, GradRule rule);
/// The rule of (domain, op_type), or nullptr. Registers the builtin rules on first use.
const GradRule* find_gradient(const std::string& domain, const std::string& op_type);
/// The SavedOutputs of (domain, op_type), or nullptr (the rule reads only what the model computes).
const SavedOutputs* find_saved_outputs(const std::string& domain, const std::string& op_type);

/// The family files' gradient registrations (each beside its factor rules). Not for use outside core/rules.
namespace rules_internal {
void add_builtin_gradient(const std::string& op_type, GradRule rule,
                          const std::string& domain = "");  // without triggering registration ("" = ai.onnx)
void add_builtin_saved_outputs(const std::string& op_type, SavedOutputs saved);  // likewise
void register_elementwise_gradients();                                           // elementwise.cc
void register_matmul_gradients();       // matmul.cc (MatMul, Gemm), einsum.cc adds Einsum
void register_einsum_gradients();       // einsum.cc
void register_shape_gradients();        // shape_ops.cc
void register_reduce_norm_gradients();  // reduce_norm.cc
void register_gather_gradients();       // gather.cc
void register_conv_pool_gradients();    // conv_pool.cc
void register_index_gradients();        // index_ops.cc
void register_misc_gradients();         // misc_ops.cc
void register_pipeline_gradients();     // pipeline.cc
}  // namespace rules_internal

}  // namespace gspmd
