// The gradient-rule registry and GradContext's helpers (core/rules/gradient.h).
#include "core/rules/gradient.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace gspmd {
namespace {

using Key = std::pair<std::string, std::string>;

std::map<Key, GradRule>& raw_registry() {
  static std::map<Key, GradRule> m;
  return m;
}

std::map<Key, SavedOutputs>& saved_outputs_registry() {
  static std::map<Key, SavedOutputs> m;
  return m;
}

std::map<Key, GradRule>& registry() {
  static const bool init = [] {
    rules_internal::register_elementwise_gradients();
    rules_internal::register_matmul_gradients();
    rules_internal::register_einsum_gradients();
    rules_internal::register_shape_gradients();
    rules_internal::register_reduce_norm_gradients();
    rules_internal::register_gather_gradients();
    rules_internal::register_conv_pool_gradients();
    rules_internal::register_index_gradients();
    rules_internal::register_misc_gradients();
    rules_internal::register_pipeline_gradients();
    return true;
  }();
  (void)init;
  return raw_registry();
}

std::string domain_key(const std::string& domain) { return domain == "ai.onnx" ? std::string() : domain; }

}  // namespace

void register_gradient(const std::string& domain, const std::string& op_type, GradRule rule) {
  registry()[{domain_key(domain), op_type}] = std::move(rule);
}

const GradRule* find_gradient(const std::string& domain, const std::string& op_type) {
  auto& r = registry();
  auto it = r.find({domain_key(domain), op_type});
  return it == r.end() ? nullptr : &it->second;
}

const SavedOutputs* find_saved_outputs(const std::string& domain, const std::string& op_type) {
  (void)registry();  // the builtin registrations
  auto& r = saved_outputs_registry();
  auto it = r.find({domain_key(domain), op_type});
  return it == r.end() ? nullptr : &it->second;
}

void rules_internal::add_builtin_gradient(const std::string& op_type, GradRule rule, const std::string& domain) {
  raw_registry()[{domain_key(domain), op_type}] = std::move(rule);
}

void rules_internal::add_builtin_saved_outputs(const std::string& op_type, SavedOutputs saved) {
  saved_outputs_registry()[{std::string(), op_type}] = std::move(saved);
}

// ---- GradContext helpers ----

int GradContext::scalar(double v, DType t) {
  Tensor s(t, {});
  switch (t) {
    case DType::kFloat32: *s.data<float>() = static_cast<float>(v); break;
    case DType::kFloat64: *s.data<double>() = v; break;
    case DType::kFloat16: *s.data<uint16_t>() = float_to_half(static_cast<float>(v)); break;
    case DType::kBFloat16: *s.data<uint16_t>() = float_to_bf16(static_cast<float>(v)); break;
    case DType::kInt64: *s.data<int64_t>() = static_cast<int64_t>(v); break;
    default: throw InternalError("GradContext::scalar: unsupported dtype " + std::string(dtype_name(t)));
  }
  return constant(s);
}

int GradContext::ints(const std::vector<int64_t>& v) { return constant(Tensor::from_int64s(v)); }

int GradContext::reshape(int v, Shape shape) {
  if (value(v).shape == shape) return v;
  return op("Reshape", {v, ints(shape)});
}

int GradContext::transpose(int v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t k = 0; k < perm.size(); ++k) identity = identity && perm[k] == static_cast<int64_t>(k);
  if (identity) return v;
  return op("Transpose", {v}, {{"perm", perm}});
}

int GradContext::reduce_sum(int v, const std::vector<int64_t>& axes, bool keepdims) {
  if (axes.empty()) return v;
  if (opset() >= 13) return op("ReduceSum", {v, ints(axes)}, {{"keepdims", int64_t{keepdims}}});
  return op("ReduceSum", {v}, {{"axes", axes}, {"keepdims", int64_t{keepdims}}});
}

int GradContext::reduce_mean(int v, const std::vector<int64_t>& axes, bool keepdims) {
  if (opset() >= 18) return op("ReduceMean", {v, ints(axes)}, {{"keepdims", int64_t{keepdims}}});
  return op("ReduceMean", {v}, {{"axes", axes}, {"keepdims", int64_t{keepdims}}});
}

int GradContext::slice(int v, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                       const std::vector<int64_t>& axes) {
  if (opset() >= 10) return op("Slice", {v, ints(starts), ints(ends), ints(axes)});
  return op("Slice", {v}, {{"starts", starts}, {"ends", ends}, {"axes", axes}});
}

int GradContext::pad(int v, const std::vector<int64_t>& pads, double fill) {
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return v;
  if (opset() >= 11) return op("Pad", {v, ints(pads), scalar(fill, value(v).dtype)});
  // The attribute is a float: clamp to its range (a float64 tensor padded with float's lowest still never wins a max).
  const double lo = std::numeric_limits<float>::lowest(), hi = std::numeric_limits<float>::max();
  return op("Pad", {v}, {{"pads", pads}, {"value", static_cast<float>(std::clamp(fill, lo, hi))}});
}

int GradContext::sum_to(int v, Shape shape) {
  const Shape from = value(v).shape;
  if (from == shape) return v;
  const size_t lead = from.size() - std::min(from.size(), shape.size());
  std::vector<int64_t> axes;
  for (size_t d = 0; d < from.size(); ++d)
    if (d < lead || (shape[d - lead] == 1 && from[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  // One node when the sum alone makes `shape`: only added leading dims (dropped), or only stretched ones (kept as 1).
  if (axes.back() < static_cast<int64_t>(lead)) return reduce_sum(v, axes, false);
  if (lead == 0) return reduce_sum(v, axes, true);
  return reshape(reduce_sum(v, axes, true), shape);
}

int GradContext::expand(int v, Shape shape) {
  if (value(v).shape == shape) return v;
  return op("Expand", {v, ints(shape)});
}

int GradContext::dy_or_zeros(size_t k) {
  const int g = dy(k);
  if (g >= 0) return g;
  const Value out = value(y(k));
  return expand(scalar(0.0, out.dtype), out.shape);
}

int GradContext::cast(int v, DType t) {
  if (value(v).dtype == t) return v;
  return op("Cast", {v}, {{"to", static_cast<int64_t>(t)}});
}

int GradContext::one_hot(int indices, int64_t depth, int64_t axis, DType t) {
  const int onoff = cast(constant(Tensor::from_floats({2}, {0.f, 1.f})), t);
  return op("OneHot", {indices, scalar(static_cast<double>(depth), DType::kInt64), onoff}, {{"axis", axis}});
}

}  // namespace gspmd
