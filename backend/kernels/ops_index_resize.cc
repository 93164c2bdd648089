// Resize (opset 10-17) and Upsample (opset 7-9), of the index family (core/rules/index_ops.cc; its other kernels are in
// ops_index.cc). Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset; Resize-18's new
// attributes are rejected (reject_resize18_attrs). Plain C++.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "core/shapes/geometry_data.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry_data.h).
using shapes::float_values;
using shapes::reject_resize18_attrs;
using shapes::resize_shape;

// ---------------------------------------------------------------------------------------------------------------
// Resize / Upsample: separable interpolation. Per output dim, each output coordinate reads a few input indices
// with weights (1 for nearest, 2 for linear, 4 for cubic); the output is the sum over the product of them.

struct Taps {
  std::vector<std::vector<int64_t>> idx;  // per output coordinate
  std::vector<std::vector<double>> w;
  std::vector<char> outside;  // tf_crop_and_resize: coordinate outside the input -> extrapolation_value
};

struct ResizeCfg {
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  double cubic_a = -0.75, extrapolation = 0.0;
  bool exclude_outside = false;
  bool legacy = false;  // opset < 11 (Upsample, Resize-10): asymmetric, nearest floor (ceil when downsampling)
};

Taps make_taps(const Ctx& c, const ResizeCfg& cfg, int64_t in, int64_t out, double scale, double roi_start,
               double roi_end) {
  Taps t;
  t.idx.resize(out);
  t.w.resize(out);
  t.outside.assign(out, 0);
  for (int64_t o = 0; o < out; ++o) {
    double x;
    const std::string& m = cfg.coord;
    if (cfg.legacy || m == "asymmetric") {
      x = o / scale;
    } else if (m == "half_pixel") {
      x = (o + 0.5) / scale - 0.5;
    } else if (m == "pytorch_half_pixel") {
      x = out > 1 ? (o + 0.5) / scale - 0.5 : 0.0;
    } else if (m == "align_corners") {
      // The reference uses the unrounded resized length in * scale (== out when sizes were given).
      const double len = static_cast<double>(in) * scale;
      x = out == 1 || len == 1.0 ? 0.0 : static_cast<double>(o) * (in - 1) / (len - 1.0);
    } else if (m == "tf_half_pixel_for_nn") {
      x = (o + 0.5) / scale;
    } else if (m == "tf_crop_and_resize") {
      x = out > 1 ? roi_start * (in - 1) + o * (roi_end - roi_start) * (in - 1) / static_cast<double>(out - 1)
                  : 0.5 * (roi_start + roi_end) * (in - 1);
      if (x < 0 || x > in - 1) {
        t.outside[o] = 1;
        continue;
      }
    } else {
      c.unsupported(fmt::format("no kernel for coordinate_transformation_mode '{}'", m));
    }
    if (cfg.mode == "nearest") {
      int64_t i;
      if (cfg.legacy) {
        i = scale < 1.0 ? static_cast<int64_t>(std::ceil(x)) : static_cast<int64_t>(std::floor(x));
      } else if (cfg.nearest == "round_prefer_floor") {
        i = x == std::floor(x) + 0.5 ? static_cast<int64_t>(std::floor(x)) : static_cast<int64_t>(std::round(x));
      } else if (cfg.nearest == "round_prefer_ceil") {
        i = static_cast<int64_t>(std::round(x));
      } else if (cfg.nearest == "floor") {
        i = static_cast<int64_t>(std::floor(x));
      } else if (cfg.nearest == "ceil") {
        i = static_cast<int64_t>(std::ceil(x));
      } else {
        c.fail(fmt::format("unknown nearest_mode '{}'", cfg.nearest));
      }
      t.idx[o] = {std::clamp<int64_t>(i, 0, in - 1)};
      t.w[o] = {1.0};
    } else if (cfg.mode == "linear") {
      x = std::clamp(x, 0.0, static_cast<double>(in - 1));
      const int64_t i0 = static_cast<int64_t>(std::floor(x)), i1 = std::min(i0 + 1, in - 1);
      const double f = x - static_cast<double>(i0);
      t.idx[o] = {i0, i1};
      t.w[o] = {1.0 - f, f};
    } else if (cfg.mode == "cubic") {
      const double a = cfg.cubic_a;
      const int64_t i0 = static_cast<int64_t>(std::floor(x));
      const double s = x - static_cast<double>(i0);
      const double w[4] = {((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
                           ((a + 2) * s - (a + 3)) * s * s + 1, ((a + 2) * (1 - s) - (a + 3)) * (1 - s) * (1 - s) + 1,
                           ((a * (2 - s) - 5 * a) * (2 - s) + 8 * a) * (2 - s) - 4 * a};
      double sum = 0;
      for (int k = 0; k < 4; ++k) {
        const int64_t i = i0 - 1 + k;
        const bool in_range = i >= 0 && i < in;
        if (cfg.exclude_outside && !in_range) continue;
        t.idx[o].push_back(std::clamp<int64_t>(i, 0, in - 1));
        t.w[o].push_back(w[k]);
        sum += w[k];
      }
      if (cfg.exclude_outside && sum != 0)
        for (double& v : t.w[o]) v /= sum;
    } else {
      c.fail(fmt::format("unknown mode '{}'", cfg.mode));
    }
  }
  return t;
}

Tensor interpolate(const Ctx& c, const Tensor& x, const Shape& os, const std::vector<double>& scales,
                   const std::vector<double>& roi, const ResizeCfg& cfg) {
  const size_t r = x.shape.size();
  std::vector<Taps> taps(r);
  for (size_t d = 0; d < r; ++d)
    taps[d] =
        make_taps(c, cfg, x.shape[d], os[d], scales[d], roi.empty() ? 0.0 : roi[d], roi.empty() ? 1.0 : roi[d + r]);
  Tensor out(x.dtype, os);
  if (out.numel() == 0) return out;
  if (x.numel() == 0) c.fail("cannot resize an empty input to a non-empty output");
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  auto run = [&]<class T>() {
    const T* s = x.data<T>();
    T* d = out.data<T>();
    std::vector<int64_t> idx(r, 0);
    for (int64_t k = 0; k < out.numel(); ++k) {
      bool outside = false;
      for (size_t i = 0; i < r; ++i) outside = outside || taps[i].outside[idx[i]];
      double acc = 0;
      if (outside) {
        acc = cfg.extrapolation;
      } else {
        // Recursive sum over the taps of each dim.
        auto rec = [&](auto&& self, size_t dim, int64_t off, double w) -> void {
          if (dim == r) {
            acc += w * static_cast<double>(s[off]);
            return;
          }
          const auto& ti = taps[dim].idx[idx[dim]];
          const auto& tw = taps[dim].w[idx[dim]];
          for (size_t j = 0; j < ti.size(); ++j)
            if (tw[j] != 0.0 || ti.size() == 1) self(self, dim + 1, off + ti[j] * xs[dim], w * tw[j]);
        };
        rec(rec, 0, 0, 1.0);
      }
      if constexpr (std::is_integral_v<T>)
        d[k] = static_cast<T>(std::nearbyint(acc));
      else
        d[k] = static_cast<T>(acc);
      for (size_t i = r; i-- > 0;) {
        if (++idx[i] < os[i]) break;
        idx[i] = 0;
      }
    }
  };
  switch (x.dtype) {
    case DType::kInt8: run.template operator()<int8_t>(); break;
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    default: dispatch_numeric(c, x.dtype, run);
  }
  return out;
}

std::vector<Tensor> resize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const size_t r = x.shape.size();
  ResizeCfg cfg;
  cfg.mode = c.node.s("mode", "nearest");
  const bool upsample = c.node.op_type == "Upsample";
  std::vector<double> scales, roi;
  std::vector<int64_t> sizes;
  if (upsample || c.opset < 11) {
    cfg.legacy = true;
    if (upsample && c.opset < 9) {
      for (float f : c.node.floats("scales")) scales.push_back(f);
    } else {
      scales = float_values(c, c.req(1));
    }
    if (cfg.mode == "bilinear") cfg.mode = "linear";
  } else {
    reject_resize18_attrs(c);
    cfg.coord = c.node.s("coordinate_transformation_mode", "half_pixel");
    cfg.nearest = c.node.s("nearest_mode", "round_prefer_floor");
    cfg.cubic_a = c.node.f("cubic_coeff_a", -0.75f);
    cfg.exclude_outside = c.node.i("exclude_outside", 0) != 0;
    cfg.extrapolation = c.node.f("extrapolation_value", 0.f);
    if (const Tensor* t = c.in(1); t && t->numel() > 0) roi = float_values(c, *t);
    if (const Tensor* t = c.in(2); t && t->numel() > 0) scales = float_values(c, *t);
    if (const Tensor* t = c.in(3); t && t->numel() > 0) sizes = t->as_int64s();
    if (scales.empty() == sizes.empty()) c.fail("exactly one of scales and sizes must be given");
    if (!roi.empty() && roi.size() != 2 * r) c.fail(fmt::format("roi has {} entries for rank {}", roi.size(), r));
    if (cfg.coord != "tf_crop_and_resize") roi.clear();
  }
  const Shape os = resize_shape(c, x.shape, scales, sizes);
  return one(interpolate(c, x, os, scales, roi, cfg));
}

}  // namespace

void register_index_resize(KernelTable& t) {
  t["Resize"] = resize_kernel;
  t["Upsample"] = resize_kernel;
}

}  // namespace gspmd::kern
