#include "cli/report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "core/sharding/padding.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace {

// Elements pass when |a - b| <= atol + rtol |b| (+ slack[i] when given); `what` names what is compared.
template <class T>
void compare_typed(const Tensor& a, const Tensor& b, double rtol, double atol, const std::string& name,
                   std::string_view against, CheckResult& r, const std::vector<double>* slack = nullptr,
                   std::string_view what = "output") {
  const T* x = a.data<T>();
  const T* y = b.data<T>();
  double scale = 0, max_err = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (std::isfinite(static_cast<double>(y[i]))) scale = std::max(scale, std::fabs(static_cast<double>(y[i])));
  for (int64_t i = 0; i < a.numel(); ++i) {
    double xv = static_cast<double>(x[i]), yv = static_cast<double>(y[i]);
    double err = std::fabs(xv - yv);
    bool both_nan = std::isnan(xv) && std::isnan(yv);
    bool same_inf = std::isinf(xv) && xv == yv;
    if (both_nan || same_inf) continue;
    if (std::isnan(err)) err = INFINITY;
    max_err = std::max(max_err, err);
    if (!(err <= atol + rtol * std::fabs(yv) + (slack ? (*slack)[static_cast<size_t>(i)] : 0)) && r.passed) {
      r.passed = false;
      r.worst = fmt::format("{} '{}' element {}: {} vs {} {}", what, name, i, xv, against, yv);
    }
  }
  r.max_abs_error = std::max(r.max_abs_error, max_err);
  r.max_rel_error = std::max(r.max_rel_error, max_err / std::max(scale, atol));
}

std::string human_bytes(double b) {
  if (b >= 1 << 30) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (b >= 1 << 20) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{:.0f} B", b);
}

std::string human_time(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}

nlohmann::json cost_json(const AutoPlanCost& c, const DeviceMesh& mesh) {
  nlohmann::json j = {{"name", c.name}, {"valid", c.valid}};
  if (!c.same_as.empty()) j["same_as"] = c.same_as;
  if (!c.valid) {
    j["error"] = c.error;
    return j;
  }
  j["step_time_s"] = c.step_time_s;
  j["compute_time_s"] = c.compute_time_s;
  j["communication_time_s"] = c.communication_time_s;
  j["peak_memory_bytes"] = c.peak_memory_bytes;
  j["fits"] = c.fits;
  j["estimated"] = c.estimated;
  j["remat"] = remat_name(c.step.remat);
  j["shard_update"] = c.step.update_axis >= 0 ? nlohmann::json(mesh.axes[c.step.update_axis]) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json auto_json(const AutoResult& a, const Graph& g, const DeviceMesh& mesh) {
  nlohmann::json choices = nlohmann::json::array();
  for (const AutoChoice& c : a.choices) {
    std::vector<std::string> names;
    for (int v : c.values) names.push_back(g.values[v].name);
    choices.push_back(
        {{"group", c.group},
         {"values", names},
         {"spec", c.annotated ? nlohmann::json::parse(c.sharding.to_partition_spec(mesh)) : nlohmann::json(nullptr)},
         {"free", !c.annotated}});
  }
  nlohmann::json baselines = nlohmann::json::array();
  for (const AutoPlanCost& b : a.baselines) baselines.push_back(cost_json(b, mesh));
  return {{"search_time_s", a.search_time_s},
          {"evaluations", a.evaluations},
          {"variables", a.variables},
          {"groups", a.groups},
          {"sweeps", a.sweeps},
          {"starts", a.starts},
          {"budget_exhausted", a.budget_exhausted},
          {"layer_blocks", a.layer_blocks},
          {"memory_limit_bytes", a.memory_limit_bytes},
          {"chosen", cost_json(a.chosen, mesh)},
          {"baselines", baselines},
          {"choices", choices}};
}

/// The unit of a float type's rounding, relative: 2^-8 (bfloat16), 2^-11 (float16), 2^-24, 2^-53; 0 otherwise.
double rounding_unit(DType t) {
  switch (t) {
    case DType::kBFloat16: return 0x1p-8;
    case DType::kFloat16: return 0x1p-11;
    case DType::kFloat32: return 0x1p-24;
    case DType::kFloat64: return 0x1p-53;
    default: return 0;
  }
}

/// The 16-bit rule of compare_tensor: 4 units of the type's rounding for bfloat16 and float16; 0 otherwise.
double half_tolerance(DType t) { return t == DType::kBFloat16 || t == DType::kFloat16 ? 4 * rounding_unit(t) : 0; }

/// True for a weight updated by Adam or Adafactor, which divide its gradient by its size (their state's names,
/// core/autodiff/autodiff.h); momentum and SGD are linear in the gradient.
bool adaptive(const TrainingStep::Weight& w) {
  return !w.state.empty() && (w.state[0].ends_with(".adam_m") || w.state[0].find(".adafactor_") != std::string::npos);
}

/// The largest finite magnitude among `v`.
double largest_magnitude(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

/// |x - y| / |y| over all elements (Euclidean norms; |y| at least 1e-30).
double normwise_error(const std::vector<double>& x, const std::vector<double>& y) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff += (x[i] - y[i]) * (x[i] - y[i]);
    norm += y[i] * y[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

/// A floating-point tensor's elements as doubles (16-bit exactly); empty for other dtypes.
std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  switch (t.dtype) {
    case DType::kFloat32: std::copy_n(t.data<float>(), v.size(), v.begin()); break;
    case DType::kFloat64: std::copy_n(t.data<double>(), v.size(), v.begin()); break;
    case DType::kFloat16:
      for (size_t i = 0; i < v.size(); ++i) v[i] = half_to_float(t.data<uint16_t>()[i]);
      break;
    case DType::kBFloat16:
      for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(t.data<uint16_t>()[i]);
      break;
    default: v.clear();
  }
  return v;
}

}  // namespace

DType compute_precision(const Graph& g) {
  DType low = DType::kUndefined;
  for (const Value& v : g.values)
    if (v.dtype == DType::kBFloat16 || (v.dtype == DType::kFloat16 && low != DType::kBFloat16)) low = v.dtype;
  return low;
}

Tensor widen_half(const Tensor& t) {
  Tensor f(DType::kFloat32, t.shape);
  const uint16_t* src = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    f.data<float>()[i] = t.dtype == DType::kFloat16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
  return f;
}

void compare_tensor(const Tensor& a, const Tensor& b, double rtol, double atol, const std::string& name,
                    std::string_view against, CheckResult& r) {
  if (a.shape != b.shape || a.dtype != b.dtype) {
    if (r.passed)
      r.worst = fmt::format("output '{}': {} {} vs {} {} {}", name, dtype_name(a.dtype), shape_str(a.shape), against,
                            dtype_name(b.dtype), shape_str(b.shape));
    r.passed = false;
    r.max_abs_error = r.max_rel_error = INFINITY;
    return;
  }
  switch (a.dtype) {
    case DType::kFloat32: compare_typed<float>(a, b, rtol, atol, name, against, r); break;
    case DType::kFloat64: compare_typed<double>(a, b, rtol, atol, name, against, r); break;
    case DType::kFloat16:
    case DType::kBFloat16: {
      // 16-bit floats compare in float32 within 4 units of the type's rounding (bfloat16: 2^-8, float16: 2^-11),
      // relative to each element and to the output's largest magnitude: partitioned sums round their partial
      // results, which the unpartitioned run never does, and cancellation can leave a small sum of large parts.
      const double tol = half_tolerance(a.dtype);
      const Tensor wa = widen_half(a), wb = widen_half(b);
      const double scale = largest_magnitude(as_doubles(b));
      compare_typed<float>(wa, wb, std::max(rtol, tol), std::max(atol, tol * scale), name, against, r);
      break;
    }
    case DType::kInt64: compare_typed<int64_t>(a, b, 0, 0, name, against, r); break;
    case DType::kInt32: compare_typed<int32_t>(a, b, 0, 0, name, against, r); break;
    case DType::kBool:
    case DType::kUInt8: compare_typed<uint8_t>(a, b, 0, 0, name, against, r); break;
    default:
      if (a.bytes != b.bytes) {
        if (r.passed) r.worst = fmt::format("output '{}' differs", name);
        r.passed = false;
      }
  }
}

std::vector<std::string> nonfinite_warnings(const Graph& g, const std::vector<Tensor>& outputs) {
  std::vector<std::string> out;
  for (size_t o = 0; o < outputs.size() && o < g.outputs.size(); ++o) {
    const Tensor& t = outputs[o];
    int64_t nan = 0, inf = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double x = 0;
      switch (t.dtype) {
        case DType::kFloat32: x = t.data<float>()[i]; break;
        case DType::kFloat64: x = t.data<double>()[i]; break;
        case DType::kFloat16: x = half_to_float(t.data<uint16_t>()[i]); break;
        case DType::kBFloat16: x = bf16_to_float(t.data<uint16_t>()[i]); break;
        default: i = t.numel(); continue;
      }
      nan += std::isnan(x);
      inf += std::isinf(x);
    }
    if (nan + inf > 0)
      out.push_back(fmt::format("output '{}' holds {} NaN and {} infinite values of {}",
                                g.values[static_cast<size_t>(g.outputs[o])].name, nan, inf, t.numel()));
  }
  return out;
}

namespace {

/// compare_outputs' amplified elements (see there): per adaptive weight whose updated value fails, the elements
/// whose gradient the reference state shows within the tolerance of 0. Returns the patched outputs (those elements
/// set to the reference's) by output index, and records each weight in r.amplified.
std::map<size_t, Tensor> amplified_elements(const std::unordered_map<std::string, size_t>& at,
                                            const std::vector<const Tensor*>& got,
                                            const std::vector<const Tensor*>& want, const std::vector<double>& rtol,
                                            const std::vector<double>& atol,
                                            const std::vector<std::vector<double>>& slack, const TrainingStep& step,
                                            CheckResult& r) {
  struct Adaptive {
    const TrainingStep::Weight* w;
    size_t updated;
    std::vector<size_t> state;  // output indices of state_updated
    bool adam;
  };
  std::vector<Adaptive> weights;
  double largest[2] = {0, 0};  // the step's largest |m| (Adam) and sqrt(accumulator) (Adafactor)
  for (const TrainingStep::Weight& w : step.weights) {
    if (!adaptive(w) || !at.count(w.updated)) continue;
    const bool adam = w.state[0].ends_with(".adam_m");
    Adaptive a{&w, at.at(w.updated), {}, adam};
    for (const std::string& s : w.state_updated)
      if (at.count(s)) a.state.push_back(at.at(s));
    if (a.state.size() != w.state_updated.size()) continue;
    for (size_t k = 0; k < (adam ? 1 : a.state.size()); ++k)
      for (double x : as_doubles(*want[a.state[k]]))
        if (std::isfinite(x)) largest[!adam] = std::max(largest[!adam], adam ? std::fabs(x) : std::sqrt(x));
    weights.push_back(std::move(a));
  }
  std::map<size_t, Tensor> patched;
  for (const Adaptive& a : weights) {
    const Tensor &x = *got[a.updated], &y = *want[a.updated];
    if (x.shape != y.shape || x.dtype != y.dtype) continue;
    const double rt = rtol[a.updated], at = atol[a.updated], limit = rt * largest[!a.adam];
    const std::vector<double> xs = as_doubles(x), ys = as_doubles(y);
    const std::vector<double>& extra = slack[a.updated];
    const auto fails = [&](size_t i) {
      return !(std::fabs(xs[i] - ys[i]) <= at + rt * std::fabs(ys[i]) + (extra.empty() ? 0 : extra[i]));
    };
    size_t first = 0;
    while (first < xs.size() && !fails(first)) ++first;
    if (first == xs.size()) continue;
    std::vector<std::vector<double>> ref, mine;
    for (size_t s : a.state) {
      ref.push_back(as_doubles(*want[s]));
      mine.push_back(as_doubles(*got[s]));
    }
    // Adafactor's factored accumulators: element i of [..., n, m] reads row i / m and column (i / (n m)) m + i % m.
    const Shape& shape = y.shape;
    const int64_t m = shape.empty() ? 1 : shape.back(), n = shape.size() < 2 ? 1 : shape[shape.size() - 2];
    auto gradient_is_noise = [&](size_t i) {
      if (a.adam) return ref[0][i] * mine[0][i] < 0 || std::fabs(ref[0][i]) <= limit;
      if (ref.size() == 1) return std::sqrt(ref[0][i]) <= limit;
      const size_t row = i / static_cast<size_t>(m);
      const size_t col = i / static_cast<size_t>(n * m) * static_cast<size_t>(m) + i % static_cast<size_t>(m);
      return std::sqrt(ref[0][row]) <= limit || std::sqrt(ref[1][col]) <= limit;
    };
    Tensor fixed = x;
    CheckResult::Amplified e{a.w->name, 0, static_cast<int64_t>(xs.size()), 0};
    bool all = true;
    for (size_t i = first; i < xs.size() && all; ++i) {
      if (!fails(i)) continue;
      if (!gradient_is_noise(i)) all = false;
      ++e.elements;
      e.max_abs_error = std::max(e.max_abs_error, std::fabs(xs[i] - ys[i]));
      std::memcpy(fixed.bytes.data() + i * dtype_size(y.dtype), y.bytes.data() + i * dtype_size(y.dtype),
                  dtype_size(y.dtype));
    }
    if (!all) continue;  // compared as usual: the failure is reported
    patched.emplace(a.updated, std::move(fixed));
    r.amplified.push_back(std::move(e));
  }
  return patched;
}

}  // namespace

CheckResult compare_outputs(const Graph& g, const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                            double rtol, double atol, const TrainingStep* step, const std::vector<Tensor>* inputs,
                            const std::vector<Tensor>* float32_run) {
  CheckResult r;
  // A model that computes in 16 bits carries their rounding into every float output, float32 ones included (a
  // mixed-precision step's optimizer state): all are compared within 4 units of that rounding, as compare_tensor
  // compares 16-bit outputs.
  const DType low = compute_precision(g);
  r.tolerance = fmt::format("rtol {:g}, atol {:g}", rtol, atol);
  if (low != DType::kUndefined)  // (a 16-bit output implies a 16-bit value of the graph)
    r.tolerance += fmt::format(
        "; the model computes in {}: within 4 units of 2^-{} ({:g}) of each element and of the output's largest "
        "magnitude",
        dtype_name(low), low == DType::kBFloat16 ? 8 : 11, half_tolerance(low));
  const bool anchored = low != DType::kUndefined && float32_run && float32_run->size() == want.size() && step;
  if (low != DType::kUndefined && step)
    r.tolerance += anchored ? "; a trained weight's step and optimizer state normwise, within that or twice the "
                              "reference's distance from a float32 run"
                            : "; a trained weight's step and optimizer state normwise";
  std::vector<const Tensor*> gp(want.size()), wp(want.size());
  std::vector<double> rt(want.size(), rtol), at(want.size(), atol), tol(want.size(), 0);
  std::vector<std::vector<double>> slack(want.size());
  for (size_t o = 0; o < want.size(); ++o) {
    gp[o] = &got[o];
    wp[o] = &want[o];
    tol[o] = std::max(half_tolerance(want[o].dtype), is_floating(want[o].dtype) ? half_tolerance(low) : 0);
    rt[o] = std::max(rtol, tol[o]);
    at[o] = std::max(atol, tol[o] * largest_magnitude(as_doubles(want[o])));
  }
  // A trained weight's updated value is compared by its step, w - <w>.updated: the step is what the runs compute
  // from the same w, and its size, not the weight's, sets the tolerance; an element may also differ by one unit of
  // the weight's type, to which w - step rounds.
  std::map<size_t, std::pair<Tensor, Tensor>> steps;
  std::vector<char> normwise(want.size(), 0);       // a 16-bit model's step or state: compared as a whole (below)
  std::vector<double> anchor_rtol(want.size(), 0);  // twice the reference's normwise distance from float32's
  std::unordered_map<std::string, size_t> out_at;   // output name -> index
  for (size_t o = 0; step && o < want.size(); ++o) out_at.emplace(g.values[static_cast<size_t>(g.outputs[o])].name, o);
  if (step && inputs) {
    for (const TrainingStep::Weight& w : step->weights) {
      const auto it = out_at.find(w.updated);
      const int v = g.find(w.name);
      if (it == out_at.end() || v < 0) continue;
      const size_t o = it->second;
      const Tensor* before = g.values[static_cast<size_t>(v)].data.get();
      for (size_t k = 0; k < g.inputs.size() && k < inputs->size(); ++k)
        if (g.inputs[k] == v) before = &(*inputs)[k];
      if (!before || before->shape != want[o].shape || got[o].shape != want[o].shape) continue;
      const std::vector<double> b = as_doubles(*before), x = as_doubles(got[o]), y = as_doubles(want[o]);
      if (b.empty() || x.empty()) continue;
      const double unit = rounding_unit(want[o].dtype);
      Tensor dx(DType::kFloat64, want[o].shape), dy(DType::kFloat64, want[o].shape);
      slack[o].resize(b.size());
      for (size_t i = 0; i < b.size(); ++i) {
        dx.data<double>()[i] = b[i] - x[i];
        dy.data<double>()[i] = b[i] - y[i];
        slack[o][i] = unit * std::fabs(y[i]);
      }
      at[o] = std::max(atol, tol[o] * largest_magnitude(as_doubles(dy)));
      normwise[o] = low != DType::kUndefined;
      if (normwise[o] && anchored && (*float32_run)[o].shape == want[o].shape) {
        // The float32 run's step from the same w: by the triangle inequality a run as accurate as the reference is
        // within twice the reference step's normwise distance from it.
        std::vector<double> z = as_doubles((*float32_run)[o]);
        for (size_t i = 0; i < z.size(); ++i) z[i] = b[i] - z[i];
        anchor_rtol[o] = 2 * normwise_error(as_doubles(dy), z);
      }
      auto& [sx, sy] = steps[o] = {std::move(dx), std::move(dy)};
      gp[o] = &sx;
      wp[o] = &sy;
    }
  }
  // The optimizer's updated state in a 16-bit model: functions of the gradients (Adam's m and v, Adafactor's
  // accumulators, momentum), compared normwise like the steps, for the same reasons.
  for (size_t k = 0; step && low != DType::kUndefined && k < step->weights.size(); ++k)
    for (const std::string& s : step->weights[k].state_updated) {
      const auto it = out_at.find(s);
      if (it == out_at.end() || !is_floating(want[it->second].dtype)) continue;
      const size_t o = it->second;
      normwise[o] = 1;
      if (anchored && (*float32_run)[o].shape == want[o].shape)
        anchor_rtol[o] = 2 * normwise_error(as_doubles(want[o]), as_doubles((*float32_run)[o]));
    }
  const std::map<size_t, Tensor> patched =
      step ? amplified_elements(out_at, gp, wp, rt, at, slack, *step, r) : std::map<size_t, Tensor>();
  for (size_t o = 0; o < want.size(); ++o) {
    auto p = patched.find(o);
    const Tensor& x = p == patched.end() ? *gp[o] : p->second;
    const std::string& name = g.values[static_cast<size_t>(g.outputs[o])].name;
    if (normwise[o]) {
      // In a model that computes in 16 bits a gradient element that is a small sum of large terms carries their
      // 16-bit rounding, large relative to itself, and an adaptive step divides each element by its row's or its own
      // size, so an element far below the largest carries the largest's rounding: the step is compared as a whole,
      // by its normwise relative error (as the torch references are).
      const double e = normwise_error(as_doubles(x), as_doubles(*wp[o])), limit = std::max(rt[o], anchor_rtol[o]);
      r.max_rel_error = std::max(r.max_rel_error, e);
      if (!(e <= limit) && r.passed) {
        r.passed = false;
        r.worst = fmt::format("{}'{}': normwise relative error {:.3g}, more than {:.3g}",
                              steps.count(o) ? "the step w - w.updated of " : "output ", name, e, limit);
      }
    } else if (slack[o].empty()) {
      compare_tensor(x, *wp[o], rt[o], at[o], name, "reference", r);
    } else {
      compare_typed<double>(x, *wp[o], rt[o], at[o], name, "the reference's", r, &slack[o],
                            "the step w - w.updated of");
    }
  }
  return r;
}

nlohmann::json make_report(const Compiled& p, const CostReport& cost, const PodRun* run, const CheckResult* check,
                           const ExpectedResult* expected) {
  using nlohmann::json;
  const Target& t = p.target;
  const DeviceMesh& mesh = p.program.mesh;
  json j;
  const DeviceMesh user = mesh.user();
  j["mesh"] = {{"shape", user.shape}, {"axes", user.axes}};
  if (user.has_device_order()) j["mesh"]["devices"] = user.devices;
  j["devices"] = mesh.num_devices();
  j["target"] = t.name;
  j["target_spec"] = json::parse(t.to_json());   // every number the cost model used (loadable with --target FILE)
  j["device_order"] = t.device_order_str(mesh);  // which mesh axes lie along which physical dim
  j["sharding_file"] = p.sharding_file;
  j["sharding_file_implicit"] = p.sharding_file_implicit;
  j["precision"] = precision_name(p.precision);
  if (!p.graph.dim_hints.empty()) {  // partition over the dim symbols: every size below is at these hints
    j["dim_hints"] = json::object();
    for (const auto& [sym, hint] : p.graph.dim_hints) j["dim_hints"][sym] = hint;
    for (const auto& [sym, least] : smallest_sizes(p.program, p.graph.dim_hints)) j["smallest_sizes"][sym] = least;
  }
  for (const auto& [sym, d] : p.graph.runtime_dims)  // known only at run time: costed at their bounds
    j["data_dependent_dims"][sym] = {
        {"bound", d.bound}, {"bound_from", d.given ? "--dim" : "the op"}, {"counts", d.what}, {"node", d.node}};
  j["model_flops"] = cost.model_flops;
  j["compile_time_s"] = {{"load", p.times.load},
                         {"propagate", p.times.propagate},
                         {"partition", p.times.partition},
                         {"measure_ops", p.times.measure_ops},
                         {"cost", p.times.cost}};
  // The per-device and per-collective lists have thousands of entries on a pod-sized training step: each entry is
  // built in place and moved, not copied out of an initializer list (make_report was 15% of `simulate --training`).
  json per_device = json::array();
  per_device.get_ref<json::array_t&>().reserve(static_cast<size_t>(mesh.num_devices()));
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    json& e = per_device.emplace_back(json::object());
    e["device"] = d;
    e["compute_s"] = cost.compute_time_s;
    e["communication_s"] = cost.communication_time_s;
    if (run) e["peak_memory_bytes"] = run->devices[d].peak_memory_bytes;
  }
  json& sim = j["simulated"];
  sim["overlap"] = cost.overlap;
  sim["step_time_s"] = cost.step_time_s;
  sim["compute_time_s"] = cost.compute_time_s;
  sim["communication_time_s"] = cost.communication_time_s;
  sim["flops_utilization"] = cost.flops_utilization;
  sim["per_device"] = std::move(per_device);
  {
    json at_peak, total;
    for (size_t k = 0; k < kMemoryKinds; ++k) {
      const std::string name(memory_kind_name(static_cast<MemoryKind>(k)));
      at_peak[name] = cost.memory.at_peak[k];
      if (static_cast<MemoryKind>(k) != MemoryKind::kTransient) total[name] = cost.memory.total[k];
    }
    const int pn = cost.memory.peak_node;
    sim["memory"] = {{"peak_bytes", cost.memory.peak_bytes},
                     {"peak_node", pn >= 0 ? p.program.program.nodes[static_cast<size_t>(pn)].name : std::string()},
                     {"at_peak", std::move(at_peak)},
                     {"total", std::move(total)}};
  }
  // One entry per (kind, node, value, axes, bytes, reason), in first-seen order, with its count.
  const std::vector<CollectiveRecord>& records = p.program.collectives;
  auto same = [&](size_t a, size_t b) {
    const CollectiveRecord &x = records[a], &y = records[b];
    return x.kind == y.kind && x.bytes == y.bytes && x.mesh_axes == y.mesh_axes && x.for_node == y.for_node &&
           x.value == y.value && x.reason == y.reason;
  };
  auto hash = [&](size_t a) {
    const CollectiveRecord& x = records[a];
    size_t h = std::hash<std::string>()(x.for_node) ^ (std::hash<std::string>()(x.value) * 31);
    return h ^ (static_cast<size_t>(x.bytes) * 1000003u) ^ static_cast<size_t>(x.kind);
  };
  std::unordered_map<size_t, size_t, decltype(hash), decltype(same)> first(records.size(), hash, same);
  std::vector<std::pair<size_t, int>> order;  // (first record, count)
  for (size_t i = 0; i < records.size(); ++i) {
    auto [it, added] = first.try_emplace(i, order.size());
    if (added)
      order.emplace_back(i, 1);
    else
      ++order[it->second].second;
  }
  json colls = json::array();
  colls.get_ref<json::array_t&>().reserve(order.size());
  for (const auto& [i, count] : order) {
    const CollectiveRecord& c = records[i];
    json& e = colls.emplace_back(json::object());
    e["kind"] = std::string(collective_name(c.kind));
    e["node"] = c.for_node;
    e["value"] = c.value;
    e["axes"] = mesh.axis_names(c.mesh_axes);
    e["bytes"] = c.bytes;
    e["count"] = count;
    e["time_s"] = collective_time(c.kind, static_cast<double>(c.bytes), c.mesh_axes, mesh, t);
    e["reason"] = c.reason;
  }
  j["collectives"] = std::move(colls);
  j["warnings"] = p.program.warnings;
  json& pads = j["padding"] = json::array();
  for (const PaddedDim& d : padded_interface_dims(p.graph, p.plan.shardings, mesh))
    pads.push_back({{"value", p.graph.values[static_cast<size_t>(d.value)].name},
                    {"dim", d.dim},
                    {"size", d.size},
                    {"axes", mesh.axis_names(d.axes)},
                    {"shards", d.shards},
                    {"per_shard", d.per_shard},
                    {"padding", d.padding()},
                    {"empty_shards", d.empty_shards()}});
  if (p.training) {
    json weights = json::array();
    int64_t bytes = 0;
    for (const TrainingStep::Weight& w : p.training->weights) {
      const Value& v = p.graph.values[static_cast<size_t>(p.graph.at(w.name))];
      bytes += v.nbytes();
      json& e = weights.emplace_back(json::object());
      e["name"] = w.name;
      e["grad"] = w.grad;
      e["updated"] = w.updated;
      e["shape"] = v.shape;
      e["bytes"] = v.nbytes();
    }
    json& tr = j["training"];
    tr["loss"] = p.training->loss;
    tr["weights"] = std::move(weights);
    tr["weight_bytes"] = bytes;
    tr["unused"] = p.training->unused;
    tr["ignored"] = p.training->ignored;
    tr["remat"] = remat_name(p.training->remat);
    tr["shard_update"] = p.shard_update.empty() ? json(nullptr) : json(p.shard_update);
    tr["recomputed_nodes"] = p.training->recomputed_nodes;
    tr["recomputed_flops"] = p.training->recomputed_flops;
  }
  if (p.auto_result) j["auto"] = auto_json(*p.auto_result, p.graph, p.annotations.mesh.user());
  if (p.pipeline)
    j["pipeline"] = pipeline_json(*p.pipeline, p.pipeline_axis, p.microbatch_search, prefix_and_suffix(p));
  if (!p.stage_search.empty()) {
    json& st = j["auto_stages"] = json::array();
    for (const StageSearchEntry& e : p.stage_search) {
      json x = {{"stages", e.stages}, {"microbatches", e.microbatches}, {"fits", e.fits}};
      if (e.error.empty())
        x["step_s"] = e.step_s, x["peak_bytes"] = e.peak_bytes, x["sharding"] = e.sharding;
      else
        x["error"] = e.error;
      st.push_back(std::move(x));
    }
  }
  if (run) {
    j["host"] = {{"wall_s", run->wall_s}, {"gflops", run->wall_s > 0 ? run->host_flops / run->wall_s / 1e9 : 0.0}};
  }
  if (check) {
    j["check"] = {{"passed", check->passed},
                  {"max_abs_error", check->max_abs_error},
                  {"max_rel_error", check->max_rel_error},
                  {"tolerance", check->tolerance}};
    if (!check->passed) j["check"]["worst"] = check->worst;
    for (const CheckResult::Amplified& a : check->amplified)
      j["check"]["amplified"].push_back(
          {{"weight", a.weight}, {"elements", a.elements}, {"of", a.total}, {"max_abs_error", a.max_abs_error}});
  }
  if (expected) {
    json outs = json::array();
    for (const ExpectedResult::Output& o : expected->outputs)
      outs.push_back({{"name", o.name},
                      {"file", o.file},
                      {"passed", o.check.passed},
                      {"max_abs_error", o.check.max_abs_error},
                      {"max_rel_error", o.check.max_rel_error}});
    j["expected"] = {{"dir", expected->dir}, {"passed", expected->passed}, {"outputs", outs}};
    if (!expected->passed) j["expected"]["worst"] = expected->worst;
  }
  return j;
}

std::string prefix_and_suffix(const Compiled& p) {
  const int axis = p.annotations.mesh.axis_index(p.pipeline_axis);
  auto sharding = [&](const std::string& name) -> const TensorSharding* {
    const int v = p.graph.find(name);
    return v >= 0 && static_cast<size_t>(v) < p.plan.shardings.size() ? &p.plan.shardings[static_cast<size_t>(v)]
                                                                      : nullptr;
  };
  const TensorSharding* stream = sharding(p.pipeline->stream);
  const TensorSharding* results = sharding(p.pipeline->results);
  const std::vector<int> stream_axes = stream ? stream->tiled_axes() : std::vector<int>();
  const bool prefix_split = std::find(stream_axes.begin(), stream_axes.end(), axis) != stream_axes.end();
  const bool suffix_split = results && !results->dims.empty() &&
                            std::find(results->dims[0].begin(), results->dims[0].end(), axis) != results->dims[0].end();
  return fmt::format("prefix {} over {}, suffix with its batch {} over {}", prefix_split ? "split" : "replicated",
                     p.pipeline_axis, suffix_split ? "split" : "replicated", p.pipeline_axis);
}

nlohmann::json pipeline_json(const PipelineLayout& l, const std::string& axis,
                             const std::vector<MicrobatchCandidate>& search, const std::string& prefix_and_suffix) {
  nlohmann::json j;
  j["axis"] = axis;
  j["schedule"] = schedule_name(l.schedule);
  j["stages"] = l.stages;
  j["microbatches"] = l.microbatches;
  j["microbatch"] = l.microbatch;
  j["layers"] = l.layers;
  j["layers_per_block"] = l.layers_per_block;
  j["rounds"] = l.rounds;
  j["layers_per_iteration"] = l.slots;
  j["iterations"] = l.iterations;
  j["padding_slots"] = l.padded;
  j["bubble_fraction"] = l.bubble;
  j["stage_layers"] = l.stage_layers;
  j["shifts"] = l.shifts.size();
  j["prefix_nodes"] = l.prefix_nodes;
  j["suffix_nodes"] = l.suffix_nodes;
  j["prefix_and_suffix"] = prefix_and_suffix;
  if (!search.empty()) {
    nlohmann::json& s = j["auto_microbatches"] = nlohmann::json::array();
    for (const MicrobatchCandidate& c : search)
      s.push_back(
          {{"microbatches", c.microbatches}, {"step_s", c.step_s}, {"peak_bytes", c.peak_bytes}, {"fits", c.fits}});
  }
  return j;
}

void write_outputs(const std::string& dir, const Graph& g, const LoadReport& signature,
                   const std::vector<Tensor>& outputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("{}: cannot create directory (--outputs): {}", dir, ec.message()));
  const std::vector<OnnxValue> values = unflatten_outputs(g, signature, outputs);
  for (size_t i = 0; i < values.size(); ++i)
    write_value_pb((std::filesystem::path(dir) / fmt::format("output_{}.pb", i)).string(), values[i],
                   signature.outputs[i].name);
}

std::pair<int, std::string> error_exit(const std::exception& e) {
  if (dynamic_cast<const InputError*>(&e)) return {2, first_line(e.what())};
  if (dynamic_cast<const UnsupportedError*>(&e)) return {3, "unsupported: " + first_line(e.what())};
  if (const auto* f = dynamic_cast<const std::filesystem::filesystem_error*>(&e))
    return {2, fmt::format("{}: {}", cut_text(f->path1().string(), 200), f->code().message())};
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return {2, "out of memory: the model's or the inputs' sizes need more than this machine has"};
  if (dynamic_cast<const std::length_error*>(&e))
    return {2, fmt::format("a size past what this machine can allocate ({})", first_line(e.what()))};
  return {4, "internal error: " + first_line(e.what())};
}

void check_output_path(const std::string& path, const char* flag, bool folder) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const std::string shown = cut_text(path, 200);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && (folder ? !fs::is_directory(st) : !fs::is_regular_file(st)))
    throw InputError(fmt::format("{}: {}: exists and is not a {}", flag, shown, folder ? "directory" : "regular file"));
  if (folder) return;  // its missing parents are created
  fs::path parent = fs::absolute(path, ec).parent_path();
  if (ec || !fs::is_directory(parent, ec)) throw InputError(fmt::format("{}: {}: no such directory", flag, shown));
  if (::access(parent.c_str(), W_OK) != 0)
    throw InputError(fmt::format("{}: {}: cannot write: {}", flag, shown, std::strerror(errno)));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
  f << j.dump(2) << "\n";
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
}

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp);
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
  write(f);
  f.close();
  std::error_code ec;
  if (!f || (std::filesystem::rename(tmp, path, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot write", path));
  }
}

nlohmann::json spec_json(const TensorSharding& s, const DeviceMesh& mesh) {
  nlohmann::json spec = nlohmann::json::array();
  for (const auto& dim : s.dims) {
    nlohmann::json names = nlohmann::json::array();
    for (int a : dim) names.push_back(mesh.axes[static_cast<size_t>(a)]);
    spec.push_back(names.empty() ? nlohmann::json(nullptr) : names.size() == 1 ? names[0] : names);
  }
  return spec;
}

void print_summary(const nlohmann::json& r, const std::string& model) {
  std::vector<std::string> mesh;
  for (size_t a = 0; a < r["mesh"]["axes"].size(); ++a)
    mesh.push_back(fmt::format("{}={}", r["mesh"]["axes"][a].get<std::string>(), r["mesh"]["shape"][a].get<int64_t>()));
  fmt::print("model     {}\n", model);
  // The annotations read without --shardings are named, so that a sibling file picked up by itself is no surprise.
  if (r.value("sharding_file_implicit", false)) {
    const std::string f = r["sharding_file"].get<std::string>();
    fmt::print("shardings {} ({}; --shardings FILE reads another)\n", f,
               f == model ? "the model's own annotations" : "found beside the model");
  }
  fmt::print("mesh      {{{}}}: {} devices, target {} ({}, device order {})\n", fmt::join(mesh, ", "),
             r["devices"].get<int64_t>(), r["target"].get<std::string>(),
             r["target_spec"]["topology"].get<std::string>(), r["device_order"].get<std::string>());
  if (const std::string pr = r.value("precision", "as-loaded"); pr != "as-loaded")
    fmt::print("precision {}\n",
               pr == "mixed"      ? "mixed: bfloat16 compute, float32 weights (each cast where read), gradients of the "
                                    "weights and optimizer state"
               : pr == "autocast" ? "autocast: contractions in bfloat16 (operands cast where read), every other op in "
                                    "the widest type of its inputs, float32 weights (torch.autocast)"
               : pr == "bf16"     ? "bf16: every float value in bfloat16"
                                  : "f32: every float value in float32");
  const nlohmann::json runtime = r.value("data_dependent_dims", nlohmann::json::object());
  DimBindings hints;
  if (r.contains("dim_hints"))
    for (const auto& [sym, hint] : r["dim_hints"].items())
      if (!runtime.contains(sym)) hints[sym] = hint.get<int64_t>();
  if (!hints.empty())
    fmt::print(
        "dims      symbolic, kept in the device files; sizes and times below at the hints {} (--hint N=V to "
        "plan at others, --dim N=V to bind)\n",
        bindings_str(hints));
  if (r.contains("smallest_sizes")) {  // a halo window over a symbolic dim (docs/shapes.md)
    std::vector<std::string> least;
    for (const auto& [sym, v] : r["smallest_sizes"].items())
      least.push_back(fmt::format("{} >= {}", sym, v.get<int64_t>()));
    fmt::print("dims      the device files serve {} (halo windows need shards as wide as their halos)\n",
               fmt::join(least, ", "));
  }
  if (!runtime.empty()) {
    constexpr size_t kShown = 6;  // a detector has hundreds: report.json lists them all
    std::vector<std::string> dims;
    for (const auto& [sym, d] : runtime.items()) {
      if (dims.size() == kShown) {
        dims.push_back(fmt::format("and {} more (report.json data_dependent_dims)", runtime.size() - kShown));
        break;
      }
      dims.push_back(d["bound"].get<int64_t>() >= 0
                         ? fmt::format("{} <= {}{} ({})", sym, d["bound"].get<int64_t>(),
                                       d.value("bound_from", "") == "--dim" ? " from --dim" : "",
                                       d["counts"].get<std::string>())
                         : fmt::format("{} unbounded, at {} ({})", sym, r["dim_hints"][sym].get<int64_t>(),
                                       d["counts"].get<std::string>()));
    }
    fmt::print(
        "dims      data-dependent, known at run time and never split; sizes and times below at their bounds: "
        "{}\n",
        fmt::join(dims, ", "));
  }
  if (r.contains("training"))
    fmt::print("training  one step: loss '{}', {} weights ({}){}{}{}\n", r["training"]["loss"].get<std::string>(),
               r["training"]["weights"].size(), human_bytes(r["training"]["weight_bytes"].get<double>()),
               r["training"]["shard_update"].is_string()
                   ? fmt::format(", weight update sharded over '{}'", r["training"]["shard_update"].get<std::string>())
                   : std::string(),
               r["training"]["unused"].empty()
                   ? std::string()
                   : fmt::format(", {} not reaching the loss", r["training"]["unused"].size()),
               r["training"]["ignored"].empty()
                   ? std::string()
                   : fmt::format("; not trained, not floating point: {}",
                                 fmt::join(r["training"]["ignored"].get<std::vector<std::string>>(), ", ")));
  if (r.contains("training") && r["training"].value("recomputed_nodes", 0) > 0)
    fmt::print(
        "remat     {}: {} forward nodes recomputed in the backward pass ({:.3g} FLOPs, {:.1f}% of the model FLOPs)\n",
        r["training"]["remat"].get<std::string>(), r["training"]["recomputed_nodes"].get<int>(),
        r["training"]["recomputed_flops"].get<double>(),
        100 * r["training"]["recomputed_flops"].get<double>() / std::max(1.0, r["model_flops"].get<double>()));
  if (r.contains("auto_stages")) {
    std::vector<std::string> tried;
    for (const auto& e : r["auto_stages"])
      tried.push_back(e.contains("error")
                          ? fmt::format("{}: refused", e["stages"].get<int64_t>())
                          : fmt::format("{}: {}{}", e["stages"].get<int64_t>(), human_time(e["step_s"].get<double>()),
                                        e["fits"].get<bool>() ? "" : " (too big)"));
    fmt::print("stages    --auto chose {} stage(s){}; tried {}\n",
               r.contains("pipeline") ? r["pipeline"]["stages"].get<int64_t>() : int64_t{1},
               r.contains("pipeline") ? fmt::format(" over '{}'", r["pipeline"]["axis"].get<std::string>()) : "",
               fmt::join(tried, ", "));
  }
  if (r.contains("pipeline")) {
    const auto& pl = r["pipeline"];
    fmt::print("pipeline  {} over {}: {} stages of {} {}, {} microbatches of {}, {} iterations, bubble {:.1f}%{}\n",
               pl["schedule"].get<std::string>(), pl["axis"].get<std::string>(), pl["stages"].get<int64_t>(),
               pl["rounds"].get<int64_t>() * pl["layers_per_iteration"].get<int64_t>(),
               pl["layers_per_block"].get<int64_t>() > 1
                   ? fmt::format("block(s) of {} layers", pl["layers_per_block"].get<int64_t>())
                   : std::string("layer(s)"),
               pl["microbatches"].get<int64_t>(), pl["microbatch"].get<int64_t>(), pl["iterations"].get<int64_t>(),
               100 * pl["bubble_fraction"].get<double>(),
               pl["padding_slots"].get<int64_t>() > 0
                   ? fmt::format(" ({} padding slots)", pl["padding_slots"].get<int64_t>())
                   : std::string());
    if (pl.contains("auto_microbatches")) {
      std::vector<std::string> tried;
      for (const auto& c : pl["auto_microbatches"])
        tried.push_back(fmt::format("{}: {}{}", c["microbatches"].get<int64_t>(), human_time(c["step_s"].get<double>()),
                                    c["fits"].get<bool>() ? "" : " (too big)"));
      fmt::print("          --auto chose {} microbatches; steps tried: {}\n", pl["microbatches"].get<int64_t>(),
                 fmt::join(tried, ", "));
    }
  }
  int64_t total = 0;
  double bytes = 0;
  for (const auto& c : r["collectives"]) {
    total += c["count"].get<int64_t>();
    bytes += c["bytes"].get<double>() * c["count"].get<double>();
  }
  fmt::print("collectives {} ({} per device per step)\n", total, human_bytes(bytes));
  // Each entry on a line of its own while they fit on a screen; beyond that one line per kind and mesh axes (a
  // 96-layer training step has thousands of entries; the report lists them all).
  constexpr size_t kListed = 40;
  if (r["collectives"].size() <= kListed) {
    // Entries that differ only in their reasons print alike: one line, their counts summed, in order of first use.
    struct Line {
      std::string head, at;  // "kind over {axes} bytes", "node (value)"
      int64_t count = 0;
    };
    std::vector<Line> lines;
    std::map<std::pair<std::string, std::string>, size_t> index;
    for (const auto& c : r["collectives"]) {
      const std::string node = c["node"].get<std::string>(), value = c["value"].get<std::string>();
      Line l{
          fmt::format("{:<18} over {{{}}} {:>10}", c["kind"].get<std::string>(),
                      fmt::join(c["axes"].get<std::vector<std::string>>(), ","), human_bytes(c["bytes"].get<double>())),
          node.empty() ? fmt::format("graph output '{}'", value) : fmt::format("{} ({})", node, value)};
      auto [it, fresh] = index.emplace(std::pair{l.head, l.at}, lines.size());
      if (fresh) lines.push_back(std::move(l));
      lines[it->second].count += c["count"].get<int64_t>();
    }
    for (const Line& l : lines) fmt::print("  {} x{}  at {}\n", l.head, l.count, l.at);
  } else {
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, double>> by;  // (kind, axes): count, bytes
    for (const auto& c : r["collectives"]) {
      auto& [n, b] = by[{c["kind"].get<std::string>(),
                         fmt::format("{}", fmt::join(c["axes"].get<std::vector<std::string>>(), ","))}];
      n += c["count"].get<int64_t>();
      b += c["bytes"].get<double>() * c["count"].get<double>();
    }
    for (const auto& [key, v] : by)
      fmt::print("  {:<18} over {{{}}} x{} ({} per device)\n", key.first, key.second, v.first, human_bytes(v.second));
    fmt::print("  ({} entries by node and value in the report's \"collectives\")\n", r["collectives"].size());
  }
  for (const auto& w : r["warnings"]) fmt::print("warning   {}\n", w.get<std::string>());
  // Padded split dims: the first few, then how many more the report lists.
  constexpr size_t kPaddingLines = 8;
  const nlohmann::json& pads = r.contains("padding") ? r["padding"] : nlohmann::json::array();
  for (size_t i = 0; i < pads.size() && i < kPaddingLines; ++i) {
    const auto& d = pads[i];
    const int64_t shards = d["shards"].get<int64_t>(), empty = d["empty_shards"].get<int64_t>();
    fmt::print("warning   padding: '{}' dim {} of {} over {{{}}}={}: {}\n", d["value"].get<std::string>(),
               d["dim"].get<int>(), d["size"].get<int64_t>(), fmt::join(d["axes"].get<std::vector<std::string>>(), ","),
               shards,
               empty > 0 ? fmt::format("{} of {} shards hold only padding", empty, shards)
                         : fmt::format("shards of {}, {} of {} indices padding", d["per_shard"].get<int64_t>(),
                                       d["padding"].get<int64_t>(), d["per_shard"].get<int64_t>() * shards));
  }
  if (pads.size() > kPaddingLines)
    fmt::print("warning   padding: {} more padded dims in the report's \"padding\"\n", pads.size() - kPaddingLines);
  const auto& s = r["simulated"];
  fmt::print("simulated step {} (compute {}, communication {}{}), FLOPs utilization {:.1f}% of {:.3g} model FLOPs\n",
             human_time(s["step_time_s"].get<double>()), human_time(s["compute_time_s"].get<double>()),
             human_time(s["communication_time_s"].get<double>()), s.value("overlap", false) ? ", overlapped" : "",
             100 * s["flops_utilization"].get<double>(), r["model_flops"].get<double>());
  if (!r.contains("host") && !s["per_device"].empty() && s["per_device"][0].contains("peak_memory_bytes")) {
    std::vector<std::string> parts;  // what is live at the peak, by kind
    for (size_t k = 0; k < kMemoryKinds && s.contains("memory"); ++k) {
      const std::string kind(memory_kind_name(static_cast<MemoryKind>(k)));
      const double b = s["memory"]["at_peak"].value(kind, 0.0);
      if (b > 0) parts.push_back(fmt::format("{} {}", kind, human_bytes(b)));
    }
    fmt::print("memory    {} per device at peak (static estimate{}{})\n",
               human_bytes(s["per_device"][0]["peak_memory_bytes"].get<double>()), parts.empty() ? "" : ": ",
               fmt::join(parts, ", "));
  }
  if (r.contains("auto")) {
    const auto& a = r["auto"];
    fmt::print(
        "auto      searched {} plans in {} ({} decisions for {} tensors, {} descents, {} sweeps{}{}), memory "
        "limit {}\n",
        a["evaluations"].get<int64_t>(), human_time(a["search_time_s"].get<double>()), a["groups"].get<int64_t>(),
        a["variables"].get<int64_t>(), a["starts"].get<int64_t>(), a["sweeps"].get<int64_t>(),
        a["budget_exhausted"].get<bool>() ? ", time budget spent" : "",
        a["layer_blocks"].get<int64_t>() > 0
            ? fmt::format(", costed on 1 and 2 of {} alike layer blocks", a["layer_blocks"].get<int64_t>())
            : "",
        human_bytes(a["memory_limit_bytes"].get<double>()));
    for (const auto& c : a["choices"]) {
      if (c["free"].get<bool>()) continue;
      fmt::print("  {:<40} x{:<3} {}\n", c["group"].get<std::string>(), c["values"].size(), c["spec"].dump());
    }
    auto line = [&](const nlohmann::json& c) {
      if (!c["valid"].get<bool>())
        return fmt::format("  {:<18} not partitionable: {}", c["name"].get<std::string>(),
                           c["error"].get<std::string>());
      std::string step;  // a training step's build: its remat policy and weight-update sharding
      if (r.contains("training"))
        step =
            fmt::format(", remat {}{}", c["remat"].get<std::string>(),
                        c["shard_update"].is_string() ? ", update sharded over " + c["shard_update"].get<std::string>()
                                                      : std::string());
      if (c.contains("same_as"))
        return fmt::format("  {:<18} the same plan as {}", c["name"].get<std::string>(),
                           c["same_as"].get<std::string>());
      return fmt::format("  {:<18} step {:>12}  memory {:>10} per device{}{}{}", c["name"].get<std::string>(),
                         human_time(c["step_time_s"].get<double>()), human_bytes(c["peak_memory_bytes"].get<double>()),
                         step, c.value("estimated", false) ? " (estimated)" : "",
                         c["fits"].get<bool>() ? "" : "  (does not fit)");
    };
    fmt::print("{}\n", line(a["chosen"]));
    for (const auto& b : a["baselines"]) fmt::print("{}\n", line(b));
  }
  if (r.contains("host")) {
    int64_t peak = 0;
    for (const auto& d : s["per_device"]) peak = std::max<int64_t>(peak, d.value("peak_memory_bytes", int64_t{0}));
    fmt::print("host      {} wall, {:.2f} GFLOP/s, peak device memory {}\n",
               human_time(r["host"]["wall_s"].get<double>()), r["host"]["gflops"].get<double>(),
               human_bytes(static_cast<double>(peak)));
  }
  if (r.contains("check")) {
    const auto& c = r["check"];
    fmt::print("check     {} (max abs error {:.3g}, max rel error {:.3g}; {}){}\n",
               c["passed"].get<bool>() ? "passed" : "FAILED", c["max_abs_error"].get<double>(),
               c["max_rel_error"].get<double>(), c.value("tolerance", ""),
               c.contains("worst") ? ": " + c["worst"].get<std::string>() : "");
    if (c.contains("amplified")) {
      std::vector<std::string> ws;
      int64_t n = 0;
      double worst = 0;
      for (const auto& a : c["amplified"]) {
        ws.push_back(fmt::format("{} ({} of {})", a["weight"].get<std::string>(), a["elements"].get<int64_t>(),
                                 a["of"].get<int64_t>()));
        n += a["elements"].get<int64_t>();
        worst = std::max(worst, a["max_abs_error"].get<double>());
      }
      fmt::print(
          "amplified {} elements of {} weights differ by up to {:.3g} where their gradient is within the tolerance "
          "of 0: the optimizer divides it by its own size, so its sign, rounding noise, decides the step (not "
          "failed; docs/training.md): {}\n",
          n, ws.size(), worst, fmt::join(ws, ", "));
    }
  }
  if (r.contains("expected")) {
    const auto& e = r["expected"];
    // An infinite error (a shape or count mismatch) is null in JSON.
    auto err = [](const nlohmann::json& x) { return x.is_number() ? fmt::format("{:.3g}", x.get<double>()) : "inf"; };
    fmt::print("expected  {} against {}{}\n", e["passed"].get<bool>() ? "passed" : "FAILED",
               e["dir"].get<std::string>(), e.contains("worst") ? ": " + e["worst"].get<std::string>() : "");
    for (const auto& o : e["outputs"])
      fmt::print("  {:<14} {:<24} max abs error {}, max rel error {}{}\n",
                 std::filesystem::path(o["file"].get<std::string>()).filename().string(), o["name"].get<std::string>(),
                 err(o["max_abs_error"]), err(o["max_rel_error"]), o["passed"].get<bool>() ? "" : "  FAILED");
  }
}

}  // namespace gspmd::cli
