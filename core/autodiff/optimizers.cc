// The optimizer update of the training step (--optimizer, docs/training.md): SGD, momentum and Adam as torch.optim
// computes them, Adafactor as HF transformers' does.
#include <cmath>

#include "core/autodiff/step_builder.h"

namespace gspmd::autodiff {
namespace {

/// The dtype of an adaptive optimizer's state and arithmetic for a weight of dtype `t`: float32 for 16-bit floats,
/// as mixed-precision training keeps its optimizer math in float32 (HF's Adafactor casts the gradient to float32;
/// in float16 the default epsilons, 1e-8 and 1e-30, are 0 and a zero gradient's update is 0/0).
DType optimizer_dtype(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16 ? DType::kFloat32 : t; }

/// Adafactor's update U of weight `w` (what lr multiplies) from its gradient `grad`, one step (t = o.step):
/// Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", as HF transformers'
/// `Adafactor(scale_parameter=False, relative_step=False, warmup_init=False, beta1=None)` computes it (factored over
/// the last two dims, clip_threshold 1, decay_rate -0.8, eps[0] = o.eps; docs/training.md):
///   G = g^2 + eps;  beta2_t = 1 - t^-0.8
///   rank >= 2:  R = beta2_t R + (1-beta2_t) mean_{-1}(G);  C = beta2_t C + (1-beta2_t) mean_{-2}(G)
///               U = g * rsqrt(R / mean_{-1}(R))[..., :, None] * rsqrt(C)[..., None, :]
///   otherwise:  V = beta2_t V + (1-beta2_t) G;  U = g * rsqrt(V)
///   U = U / max(1, RMS(U) / 1.0)
/// The accumulators (zeros before the step) are added to `tw` and their new values to `state_outputs`.
int adafactor_update(StepBuilder& b, const TrainingOptions& o, const Value& w, int grad16, bool data, bool variable,
                     TrainingStep::Weight& tw, std::vector<int>& state_outputs) {
  constexpr double kDecayRate = 0.8, kClipThreshold = 1.0;
  const DType dt = optimizer_dtype(w.dtype);
  const int grad = b.cast(grad16, dt);
  const double beta2 = 1 - std::pow(static_cast<double>(o.step), -kDecayRate);
  const auto mean = [&](int v, int64_t axis, bool keepdims) {
    const int64_t n = b.value(v).shape.at(static_cast<size_t>(axis));
    return b.op("Div", {b.reduce_sum(v, {axis}, keepdims), b.scalar(static_cast<double>(n), dt)});
  };
  const auto average = [&](int state, int fresh) {  // beta2_t * state + (1 - beta2_t) * fresh
    return b.op("Add", {b.op("Mul", {state, b.scalar(beta2, dt)}), b.op("Mul", {fresh, b.scalar(1 - beta2, dt)})});
  };
  const auto rsqrt = [&](int v) { return b.op("Reciprocal", {b.op("Sqrt", {v})}); };
  const auto state = [&](const std::string& suffix, Shape shape, int reduced_dim) {
    Value like = w;
    like.shape = std::move(shape);
    like.dtype = dt;
    const int s = b.state_like(w.name + suffix, like, data, variable);
    tw.state.push_back(b.value(s).name);
    tw.state_reduced_dim.push_back(reduced_dim);
    return s;
  };
  const int g2 = b.op("Add", {b.op("Mul", {grad, grad}), b.scalar(o.eps, dt)});
  int update = -1;
  const int64_t rank = static_cast<int64_t>(w.shape.size());
  if (rank >= 2) {
    Shape row_shape(w.shape.begin(), w.shape.end() - 1), col_shape = w.shape;
    col_shape.erase(col_shape.end() - 2);
    const int r = state(".adafactor_row", row_shape, static_cast<int>(rank - 1));
    const int c = state(".adafactor_col", col_shape, static_cast<int>(rank - 2));
    const int r1 = average(r, mean(g2, rank - 1, false)), c1 = average(c, mean(g2, rank - 2, false));
    state_outputs.push_back(r1);
    state_outputs.push_back(c1);
    Shape r_unsq = row_shape, c_unsq = col_shape;  // [..., n, 1] and [..., 1, m]
    r_unsq.push_back(1);
    c_unsq.insert(c_unsq.end() - 1, 1);
    const int r_factor = b.reshape(rsqrt(b.op("Div", {r1, mean(r1, rank - 2, true)})), r_unsq);
    const int c_factor = b.reshape(rsqrt(c1), c_unsq);
    update = b.op("Mul", {b.op("Mul", {grad, r_factor}), c_factor});
  } else {
    const int v = state(".adafactor_v", w.shape, -1);
    const int v1 = average(v, g2);
    state_outputs.push_back(v1);
    update = b.op("Mul", {grad, rsqrt(v1)});
  }
  std::vector<int64_t> all(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) all[static_cast<size_t>(d)] = d;
  const int mean_sq = b.op("Div", {b.reduce_sum(b.op("Mul", {update, update}), all, false),
                                   b.scalar(static_cast<double>(num_elements(w.shape)), dt)});
  const int clip =
      b.op("Max", {b.op("Div", {b.op("Sqrt", {mean_sq}), b.scalar(kClipThreshold, dt)}), b.scalar(1.0, dt)});
  return b.cast(b.op("Div", {update, clip}), w.dtype);
}

}  // namespace

int optimizer_update(StepBuilder& b, const TrainingOptions& o, const Value& w, int grad, bool data, bool variable,
                     TrainingStep::Weight& tw, std::vector<int>& state_outputs) {
  const DType dt = w.dtype;
  switch (o.optimizer) {
    case OptimizerKind::kSgd: return grad;
    case OptimizerKind::kMomentum: {
      const int v = b.state_like(w.name + ".momentum", w, data, variable);
      const int v1 = b.op("Add", {b.op("Mul", {v, b.scalar(o.momentum, dt)}), grad});
      tw.state.push_back(b.value(v).name);
      state_outputs.push_back(v1);
      return v1;
    }
    case OptimizerKind::kAdam: {
      const DType ct = optimizer_dtype(dt);
      Value like = w;
      like.dtype = ct;
      const int gc = b.cast(grad, ct);
      const int m = b.state_like(w.name + ".adam_m", like, data, variable);
      const int v = b.state_like(w.name + ".adam_v", like, data, variable);
      const int m1 =
          b.op("Add", {b.op("Mul", {m, b.scalar(o.beta1, ct)}), b.op("Mul", {gc, b.scalar(1 - o.beta1, ct)})});
      const int g2 = b.op("Mul", {gc, gc});
      const int v1 =
          b.op("Add", {b.op("Mul", {v, b.scalar(o.beta2, ct)}), b.op("Mul", {g2, b.scalar(1 - o.beta2, ct)})});
      const double t = static_cast<double>(o.step);
      const int mhat = b.op("Div", {m1, b.scalar(1 - std::pow(o.beta1, t), ct)});
      const int vhat = b.op("Div", {v1, b.scalar(1 - std::pow(o.beta2, t), ct)});
      const int update = b.cast(b.op("Div", {mhat, b.op("Add", {b.op("Sqrt", {vhat}), b.scalar(o.eps, ct)})}), dt);
      tw.state = {b.value(m).name, b.value(v).name};
      state_outputs.push_back(m1);
      state_outputs.push_back(v1);
      return update;
    }
    case OptimizerKind::kAdafactor: return adafactor_update(b, o, w, grad, data, variable, tw, state_outputs);
  }
  return grad;
}

}  // namespace gspmd::autodiff
