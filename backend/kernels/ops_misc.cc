// Resize (opset 10-17), Upsample (opset 7-9) and Einsum. Plain C++, except that float32 two-operand Einsums
// that reduce to a batched matrix product run on oneDNN matmul.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"
#include "backend/kernels/shape_rules_data.h"

namespace gspmd::kern {
namespace {

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
                           ((a + 2) * s - (a + 3)) * s * s + 1,
                           ((a + 2) * (1 - s) - (a + 3)) * (1 - s) * (1 - s) + 1,
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
    taps[d] = make_taps(c, cfg, x.shape[d], os[d], scales[d], roi.empty() ? 0.0 : roi[d],
                        roi.empty() ? 1.0 : roi[d + r]);
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

// ---------------------------------------------------------------------------------------------------------------
// Einsum.

Tensor permute_to(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape ps(perm.size());
  std::vector<int64_t> st(perm.size());
  const std::vector<int64_t> xs = contiguous_strides(x.shape);
  for (size_t i = 0; i < perm.size(); ++i) {
    ps[i] = x.shape[perm[i]];
    st[i] = xs[perm[i]];
  }
  Tensor out(x.dtype, ps);
  const std::vector<int64_t> ds = contiguous_strides(ps);
  strided_copy(out.bytes.data(), ds.data(), x.bytes.data(), st.data(), ps, dtype_size(x.dtype));
  return out;
}

// Einsum as one batched matmul [batch, M, K] x [batch, K, N] when it is one (two float operands, distinct labels per
// operand, no broadcasting, every label in both inputs or in the output); nullopt otherwise.
std::optional<Tensor> einsum_as_matmul(const Ctx& c, EinsumLabels& e) {
  const DType dt = c.req(0).dtype;
  const std::vector<std::vector<int>>& ops = e.ops;
  std::map<int, int64_t>& size = e.size;
  if (ops.size() != 2 || (dt != DType::kFloat32 && dt != DType::kFloat64)) return std::nullopt;
  const Tensor& a = c.req(0);
  const Tensor& b = c.req(1);
  auto in = [](const std::vector<int>& o, int l) { return std::find(o.begin(), o.end(), l) != o.end(); };
  auto distinct = [](const std::vector<int>& o) {
    std::vector<int> v = o;
    std::sort(v.begin(), v.end());
    return std::adjacent_find(v.begin(), v.end()) == v.end();
  };
  bool ok = distinct(ops[0]) && distinct(ops[1]);
  for (size_t i = 0; ok && i < 2; ++i)
    for (size_t d = 0; d < ops[i].size(); ++d) ok = ok && c.req(i).shape[d] == size[ops[i][d]];
  std::vector<int> batch, m, n, k;
  for (const auto& [l, s] : size) {
    const bool ia = in(ops[0], l), ib = in(ops[1], l), io = in(e.out, l);
    if (ia && ib && io) batch.push_back(l);
    else if (ia && !ib && io) m.push_back(l);
    else if (!ia && ib && io) n.push_back(l);
    else if (ia && ib && !io) k.push_back(l);
    else ok = false;
  }
  if (!ok) return std::nullopt;
  auto pos = [](const std::vector<int>& o, int l) {
    return static_cast<int64_t>(std::find(o.begin(), o.end(), l) - o.begin());
  };
  auto prod = [&](const std::vector<int>& ls) {
    int64_t p = 1;
    for (int l : ls) p *= size[l];
    return p;
  };
  std::vector<int64_t> pa, pb;
  for (int l : batch) pa.push_back(pos(ops[0], l));
  for (int l : m) pa.push_back(pos(ops[0], l));
  for (int l : k) pa.push_back(pos(ops[0], l));
  for (int l : batch) pb.push_back(pos(ops[1], l));
  for (int l : k) pb.push_back(pos(ops[1], l));
  for (int l : n) pb.push_back(pos(ops[1], l));
  const Tensor at = permute_to(a, pa), bt = permute_to(b, pb);
  const int64_t B = prod(batch), M = prod(m), N = prod(n), K = prod(k);
  std::vector<int> cl = batch;
  cl.insert(cl.end(), m.begin(), m.end());
  cl.insert(cl.end(), n.begin(), n.end());
  Shape cs;
  for (int l : cl) cs.push_back(size[l]);
  Tensor cm(dt, cs);
  if (cm.numel() > 0) {
    if (dt == DType::kFloat32 && K > 0) {
      dnn::matmul(at.data<float>(), bt.data<float>(), cm.data<float>(), B, B, M, K, N);
    } else {
      dispatch_float(c, dt, [&]<class T>() {
        const T* A = at.data<T>();
        const T* Bm = bt.data<T>();
        T* C = cm.data<T>();
        for (int64_t bi = 0; bi < B; ++bi)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              T acc = 0;
              for (int64_t p = 0; p < K; ++p) acc += A[(bi * M + i) * K + p] * Bm[(bi * K + p) * N + j];
              C[(bi * M + i) * N + j] = acc;
            }
      });
    }
  }
  std::vector<int64_t> po;
  for (int l : e.out) po.push_back(pos(cl, l));
  return permute_to(cm, po);
}

// Einsum in general: one loop over every label; operands read with per-label strides (0 on broadcast, summed for
// repeated labels = diagonals).
Tensor einsum_loop(const Ctx& c, EinsumLabels& e) {
  const DType dt = c.req(0).dtype;
  const std::vector<std::vector<int>>& ops = e.ops;
  std::map<int, int64_t>& size = e.size;
  const std::vector<int>& out_labels = e.out;
  auto is_out = [&](int l) { return std::find(out_labels.begin(), out_labels.end(), l) != out_labels.end(); };
  std::vector<int> all;
  for (int l : out_labels) all.push_back(l);
  for (const auto& [l, s] : size)
    if (!is_out(l)) all.push_back(l);
  const size_t nl = all.size(), no = ops.size();
  Shape dims;
  for (int l : all) dims.push_back(size[l]);
  std::vector<std::vector<int64_t>> st(no, std::vector<int64_t>(nl, 0));
  for (size_t i = 0; i < no; ++i) {
    const Tensor& t = c.req(i);
    const std::vector<int64_t> ts = contiguous_strides(t.shape);
    for (size_t d = 0; d < ops[i].size(); ++d) {
      if (t.shape[d] == 1 && size[ops[i][d]] != 1) continue;
      const size_t li = static_cast<size_t>(std::find(all.begin(), all.end(), ops[i][d]) - all.begin());
      st[i][li] += ts[d];
    }
  }
  const std::vector<int64_t> ost = contiguous_strides(e.out_shape);
  Tensor out(dt, e.out_shape);
  if (num_elements(dims) == 0) return out;
  dispatch_numeric(c, dt, [&]<class T>() {
    T* o = out.data<T>();
    std::vector<const T*> src(no);
    for (size_t i = 0; i < no; ++i) src[i] = c.req(i).data<T>();
    std::vector<int64_t> idx(nl, 0), off(no, 0);
    int64_t oo = 0;
    const int64_t total = num_elements(dims);
    for (int64_t it = 0; it < total; ++it) {
      T p = T(1);
      for (size_t i = 0; i < no; ++i) p *= src[i][off[i]];
      o[oo] += p;
      for (size_t d = nl; d-- > 0;) {
        const bool wrap = ++idx[d] == dims[d];
        const int64_t step = wrap ? -(dims[d] - 1) : 1;
        if (wrap) idx[d] = 0;
        for (size_t i = 0; i < no; ++i) off[i] += step * st[i][d];
        if (d < out_labels.size()) oo += step * ost[d];
        if (!wrap) break;
      }
    }
  });
  return out;
}

std::vector<Tensor> einsum_kernel(const Ctx& c) {
  const DType dt = c.req(0).dtype;
  std::vector<const Shape*> shapes;
  for (size_t i = 0; i < c.ins.size(); ++i) {
    if (c.req(i).dtype != dt) c.fail("inputs have different dtypes");
    shapes.push_back(&c.req(i).shape);
  }
  EinsumLabels e = einsum_labels(c, shapes);
  if (std::optional<Tensor> r = einsum_as_matmul(c, e)) return one(std::move(*r));
  return one(einsum_loop(c, e));
}

}  // namespace

void register_misc(KernelTable& t) {
  t["Resize"] = resize_kernel;
  t["Upsample"] = resize_kernel;
  t["Einsum"] = einsum_kernel;
}

}  // namespace gspmd::kern
