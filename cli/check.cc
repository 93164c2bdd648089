// --check and the expected outputs' comparison (cli/report.h): elementwise tolerances, the 16-bit rule, adaptive
// optimizers' amplified elements.
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

}  // namespace gspmd::cli
