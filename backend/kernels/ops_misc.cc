// Ops without a family of their own (core/rules/misc_ops.cc holds the rules of those that have one), plain C++: linear
// quantization (QuantizeLinear, DequantizeLinear, opset 10/13: per-tensor or per-axis scale and zero point;
// DynamicQuantizeLinear), Det, Trilu, EyeLike, Unique, ReverseSequence, NonMaxSuppression, TfIdfVectorizer (integer
// pools). Reference: the ONNX operator specs (onnx/docs/Operators.md) at the node's opset.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

/// Per-element index of the scale / zero point: 0 for per-tensor (scalar or [1]), else the coordinate along axis.
struct QuantIndex {
  int64_t inner = 1, count = 1;  // elements after `axis`, scale count
  int64_t at(int64_t i) const { return count == 1 ? 0 : (i / inner) % count; }
};

QuantIndex quant_index(const Ctx& c, const Shape& x, const Tensor& scale) {
  QuantIndex q;
  if (scale.numel() == 1 && scale.shape.size() <= 1) return q;
  if (scale.shape.size() != 1) c.fail(fmt::format("scale must be a scalar or 1-D, got {}", shape_str(scale.shape)));
  const int64_t axis = c.axis(c.node.i("axis", 1), static_cast<int64_t>(x.size()));
  if (scale.shape[0] != x[axis])
    c.fail(fmt::format("scale has {} elements but axis {} of {} has {}", scale.shape[0], axis, shape_str(x), x[axis]));
  for (size_t d = static_cast<size_t>(axis) + 1; d < x.size(); ++d) q.inner *= x[d];
  q.count = scale.shape[0];
  return q;
}

std::vector<Tensor> quantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor scale = cast_tensor(c, c.req(1), DType::kFloat32);
  const Tensor* zp = c.in(2);
  const DType out_t = zp ? zp->dtype : DType::kUInt8;
  const QuantIndex q = quant_index(c, x.shape, scale);
  if (zp && zp->numel() != scale.numel()) c.fail("zero point and scale differ in size");
  const Tensor xf = cast_tensor(c, x, DType::kFloat32);
  Tensor out(out_t, x.shape);
  const float* xs = xf.data<float>();
  const float* sc = scale.data<float>();
  auto run = [&]<class T>() {
    const T* z = zp ? zp->data<T>() : nullptr;
    T* o = out.data<T>();
    constexpr float lo = static_cast<float>(std::numeric_limits<T>::lowest());
    constexpr float hi = static_cast<float>(std::numeric_limits<T>::max());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t k = q.at(i);
      float v = std::nearbyint(xs[i] / sc[k]) + (z ? static_cast<float>(z[k]) : 0.f);
      o[i] = static_cast<T>(std::min(hi, std::max(lo, v)));
    }
  };
  switch (out_t) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    default: c.bad_dtype(out_t);
  }
  return one(std::move(out));
}

std::vector<Tensor> dequantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const Tensor& scale = c.req(1);
  const Tensor* zp = c.in(2);
  if (scale.dtype != DType::kFloat32) c.bad_dtype(scale.dtype);
  const QuantIndex q = quant_index(c, x.shape, scale);
  if (zp && (zp->dtype != x.dtype || zp->numel() != scale.numel()))
    c.fail("zero point must have the input's type and the scale's size");
  Tensor out(DType::kFloat32, x.shape);
  float* o = out.data<float>();
  const float* sc = scale.data<float>();
  auto run = [&]<class T>() {
    const T* xs = x.data<T>();
    const T* z = zp ? zp->data<T>() : nullptr;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t k = q.at(i);
      o[i] = static_cast<float>(static_cast<int64_t>(xs[i]) - (z ? static_cast<int64_t>(z[k]) : 0)) * sc[k];
    }
  };
  switch (x.dtype) {
    case DType::kUInt8: run.template operator()<uint8_t>(); break;
    case DType::kInt8: run.template operator()<int8_t>(); break;
    case DType::kInt32: run.template operator()<int32_t>(); break;
    default: c.bad_dtype(x.dtype);
  }
  return one(std::move(out));
}

/// DynamicQuantizeLinear (opset 11): uint8 y, scale = (max(0, max x) - min(0, min x)) / 255, zero point =
/// saturate(round(-min(0, min x) / scale)), y = saturate(round(x / scale) + zero point); rounding half to even.
std::vector<Tensor> dynamic_quantize_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.dtype != DType::kFloat32) c.bad_dtype(x.dtype);
  const float* p = x.data<float>();
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  const float scale = (hi - lo) / 255.f;
  const float zpf = scale == 0 ? 0.f : std::min(255.f, std::max(0.f, std::nearbyint(-lo / scale)));
  Tensor y(DType::kUInt8, x.shape), ys(DType::kFloat32, {}), yz(DType::kUInt8, {});
  uint8_t* d = y.data<uint8_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = scale == 0 ? zpf : std::nearbyint(p[i] / scale) + zpf;
    d[i] = static_cast<uint8_t>(std::min(255.f, std::max(0.f, v)));
  }
  ys.data<float>()[0] = scale;
  yz.data<uint8_t>()[0] = static_cast<uint8_t>(zpf);
  std::vector<Tensor> outs;
  outs.push_back(std::move(y));
  outs.push_back(std::move(ys));
  outs.push_back(std::move(yz));
  return outs;
}

// ---------------------------------------------------------------------------------------------------------------
// Det, Trilu, EyeLike.

/// Det (opset 11): determinant of each [M, M] matrix of [*, M, M], LU with partial pivoting in double.
std::vector<Tensor> det_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const size_t r = x.shape.size();
  if (r < 2 || x.shape[r - 1] != x.shape[r - 2])
    c.fail(fmt::format("input must be [*, M, M], got {}", shape_str(x.shape)));
  const int64_t M = x.shape[r - 1];
  const Shape os(x.shape.begin(), x.shape.end() - 2);
  const Tensor xd = cast_tensor(c, x, DType::kFloat64);
  Tensor out(DType::kFloat64, os);
  std::vector<double> a(static_cast<size_t>(M * M));
  for (int64_t b = 0; b < num_elements(os); ++b) {
    std::copy(xd.data<double>() + b * M * M, xd.data<double>() + (b + 1) * M * M, a.begin());
    double det = 1;
    for (int64_t k = 0; k < M && det != 0; ++k) {
      int64_t piv = k;
      for (int64_t i = k + 1; i < M; ++i)
        if (std::abs(a[i * M + k]) > std::abs(a[piv * M + k])) piv = i;
      if (a[piv * M + k] == 0) {
        det = 0;
        break;
      }
      if (piv != k) {
        for (int64_t j = 0; j < M; ++j) std::swap(a[k * M + j], a[piv * M + j]);
        det = -det;
      }
      det *= a[k * M + k];
      for (int64_t i = k + 1; i < M; ++i) {
        const double f = a[i * M + k] / a[k * M + k];
        for (int64_t j = k; j < M; ++j) a[i * M + j] -= f * a[k * M + j];
      }
    }
    out.data<double>()[b] = det;
  }
  return one(cast_tensor(c, out, x.dtype));
}

std::vector<Tensor> trilu_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() < 2) c.fail("input must have rank >= 2");
  int64_t k = 0;
  if (const Tensor* t = c.in(1)) {
    const std::vector<int64_t> kv = t->as_int64s();
    if (kv.size() != 1) c.fail("k must have one element");
    k = kv[0];
  }
  const bool upper = c.node.i("upper", 1) != 0;
  const int64_t n = x.shape[x.shape.size() - 2], m = x.shape.back();
  const int64_t mats = n * m == 0 ? 0 : x.numel() / (n * m);
  Tensor out(x.dtype, x.shape);
  const size_t es = dtype_size(x.dtype);
  for (int64_t b = 0; b < mats; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) {
        const bool keep = upper ? j - i >= k : j - i <= k;
        const size_t off = static_cast<size_t>((b * n + i) * m + j) * es;
        if (keep) std::memcpy(out.bytes.data() + off, x.bytes.data() + off, es);
      }
  return one(std::move(out));
}

std::vector<Tensor> eye_like_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (x.shape.size() != 2) c.fail("input must be 2-D");
  const DType dt = c.node.has("dtype") ? static_cast<DType>(c.node.i("dtype")) : x.dtype;
  const int64_t k = c.node.i("k", 0);
  Tensor out(dt, x.shape);
  dispatch_all(c, dt, [&]<class T>() {
    for (int64_t i = 0; i < x.shape[0]; ++i)
      if (i + k >= 0 && i + k < x.shape[1]) out.data<T>()[i * x.shape[1] + i + k] = T(1);
  });
  return one(std::move(out));
}

// ---------------------------------------------------------------------------------------------------------------
// Unique, ReverseSequence, NonMaxSuppression, TfIdfVectorizer.

/// Unique (opset 11): unique elements (no axis: of the flattened input) or unique slices along `axis`, sorted
/// ascending (lexicographically for slices) when sorted=1, else in order of first occurrence. Outputs Y, indices
/// (first occurrence), inverse_indices, counts (int64, 1-D).
std::vector<Tensor> unique_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const bool has_axis = c.node.has("axis");
  const bool sorted = c.node.i("sorted", 1) != 0;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t axis = has_axis ? c.axis(c.node.i("axis"), rank) : 0;
  int64_t outer = 1, A = x.numel(), inner = 1;
  if (has_axis) {
    A = x.shape[axis];
    for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
    for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  }
  std::vector<int64_t> order(static_cast<size_t>(A));  // slice ids, sorted or by first occurrence
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> rep;  // per unique: its first slice
  std::vector<int64_t> inverse(static_cast<size_t>(A)), counts;
  dispatch_all(c, x.dtype, [&]<class T>() {
    const T* p = x.data<T>();
    // Slice j is p[o * A * inner + j * inner + i] for o < outer, i < inner, compared in (o, i) order.
    auto cmp = [&](int64_t a, int64_t b) -> int {
      for (int64_t o = 0; o < outer; ++o) {
        const T* pa = p + o * A * inner + a * inner;
        const T* pb = p + o * A * inner + b * inner;
        for (int64_t i = 0; i < inner; ++i) {
          if (pa[i] < pb[i]) return -1;
          if (pb[i] < pa[i]) return 1;
        }
      }
      return 0;
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
    // Groups of equal slices in sorted order; the first of each group (stable sort) is its first occurrence.
    std::vector<int64_t> group_of(static_cast<size_t>(A));
    std::vector<int64_t> firsts;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || cmp(order[k - 1], order[k]) != 0) firsts.push_back(order[k]);
      group_of[order[k]] = static_cast<int64_t>(firsts.size()) - 1;
    }
    std::vector<int64_t> pos(firsts.size());  // group -> output position
    std::iota(pos.begin(), pos.end(), 0);
    if (!sorted) {
      std::vector<int64_t> by_first(firsts.size());
      std::iota(by_first.begin(), by_first.end(), 0);
      std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) { return firsts[a] < firsts[b]; });
      for (size_t k = 0; k < by_first.size(); ++k) pos[by_first[k]] = static_cast<int64_t>(k);
    }
    rep.assign(firsts.size(), 0);
    counts.assign(firsts.size(), 0);
    for (size_t gi = 0; gi < firsts.size(); ++gi) rep[pos[gi]] = firsts[gi];
    for (int64_t j = 0; j < A; ++j) {
      inverse[j] = pos[group_of[j]];
      ++counts[inverse[j]];
    }
  });
  const int64_t U = static_cast<int64_t>(rep.size());
  Shape ys = has_axis ? x.shape : Shape{U};
  if (has_axis) ys[axis] = U;
  Tensor y(x.dtype, ys);
  const size_t es = dtype_size(x.dtype), row = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t u = 0; u < U; ++u)
      std::memcpy(y.bytes.data() + (o * U + u) * row, x.bytes.data() + (o * A + rep[u]) * row, row);
  std::vector<Tensor> outs;
  outs.push_back(std::move(y));
  outs.push_back(Tensor::from_int64s(rep));
  outs.push_back(Tensor::from_int64s(inverse));
  outs.push_back(Tensor::from_int64s(counts));
  outs.resize(std::max<size_t>(1, std::min<size_t>(4, c.n_out())));
  return outs;
}

/// ReverseSequence (opset 10): for each batch entry b, reverses the first sequence_lens[b] steps along time_axis.
std::vector<Tensor> reverse_sequence_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  const std::vector<int64_t> lens = c.req(1).as_int64s();
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank < 2) c.fail(fmt::format("input must have rank >= 2, got {}", shape_str(x.shape)));
  const int64_t ta = c.axis(c.node.i("time_axis", 0), rank), ba = c.axis(c.node.i("batch_axis", 1), rank);
  if (ta == ba || std::min(ta, ba) != 0 || std::max(ta, ba) != 1) c.fail("time_axis and batch_axis must be 0 and 1");
  const int64_t T = x.shape[ta], B = x.shape[ba];
  if (static_cast<int64_t>(lens.size()) != B)
    c.fail(fmt::format("sequence_lens has {} entries, batch is {}", lens.size(), B));
  const size_t row = static_cast<size_t>(x.numel() / std::max<int64_t>(1, T * B)) * dtype_size(x.dtype);
  Tensor out = x;
  auto at = [&](int64_t t, int64_t b) { return (ta == 0 ? t * B + b : b * T + t) * static_cast<int64_t>(row); };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = lens[b];
    if (len < 0 || len > T) c.bad_data(fmt::format("sequence_lens[{}] = {} is out of range [0, {}]", b, len, T));
    for (int64_t t = 0; t < len; ++t)
      std::memcpy(out.bytes.data() + at(t, b), x.bytes.data() + at(len - 1 - t, b), row);
  }
  return one(std::move(out));
}

/// NonMaxSuppression (opset 11): per batch and class, boxes sorted by descending score (ties: lower index first) with
/// score > score_threshold are kept greedily unless their IoU with a kept box exceeds iou_threshold, at most
/// max_output_boxes_per_class each. Output [k, 3] int64 (batch, class, box). center_point_box=1: [x, y, w, h];
/// else corners [y1, x1, y2, x2] in any order.
std::vector<Tensor> nms_kernel(const Ctx& c) {
  const Tensor boxes = cast_tensor(c, c.req(0), DType::kFloat32);
  const Tensor scores = cast_tensor(c, c.req(1), DType::kFloat32);
  if (boxes.shape.size() != 3 || boxes.shape[2] != 4 || scores.shape.size() != 3 || scores.shape[0] != boxes.shape[0] ||
      scores.shape[2] != boxes.shape[1])
    c.fail(fmt::format("boxes {} and scores {} must be [B, n, 4] and [B, C, n]", shape_str(boxes.shape),
                       shape_str(scores.shape)));
  const int64_t B = boxes.shape[0], n = boxes.shape[1], C = scores.shape[1];
  int64_t max_out = 0;
  if (const Tensor* t = c.in(2); t && t->numel() > 0) max_out = t->as_int64s()[0];
  float iou_th = 0, score_th = -INFINITY;
  if (const Tensor* t = c.in(3); t && t->numel() > 0) iou_th = cast_tensor(c, *t, DType::kFloat32).data<float>()[0];
  const bool has_score_th = c.in(4) && c.in(4)->numel() > 0;
  if (has_score_th) score_th = cast_tensor(c, *c.in(4), DType::kFloat32).data<float>()[0];
  const bool center = c.node.i("center_point_box", 0) != 0;
  std::vector<std::array<float, 4>> corner(static_cast<size_t>(B * n));  // y1, x1, y2, x2 with y1 <= y2, x1 <= x2
  for (int64_t i = 0; i < B * n; ++i) {
    const float* b = boxes.data<float>() + i * 4;
    if (center)
      corner[i] = {b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2};
    else
      corner[i] = {std::min(b[0], b[2]), std::min(b[1], b[3]), std::max(b[0], b[2]), std::max(b[1], b[3])};
  }
  auto iou = [](const std::array<float, 4>& a, const std::array<float, 4>& b) {
    const float ih = std::min(a[2], b[2]) - std::max(a[0], b[0]), iw = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    const float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_b = (b[2] - b[0]) * (b[3] - b[1]);
    if (ih <= 0 || iw <= 0 || area_a <= 0 || area_b <= 0) return 0.f;
    const float inter = ih * iw;
    return inter / (area_a + area_b - inter);
  };
  std::vector<int64_t> sel;
  std::vector<int64_t> order(static_cast<size_t>(n)), kept;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < C && max_out > 0; ++k) {
      const float* sc = scores.data<float>() + (b * C + k) * n;
      order.clear();
      for (int64_t i = 0; i < n; ++i)
        if (!has_score_th || sc[i] > score_th) order.push_back(i);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return sc[x] > sc[y]; });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        bool keep = true;
        for (int64_t j : kept)
          if (iou(corner[b * n + i], corner[b * n + j]) > iou_th) {
            keep = false;
            break;
          }
        if (!keep) continue;
        kept.push_back(i);
        sel.insert(sel.end(), {b, k, i});
      }
    }
  Tensor out(DType::kInt64, {static_cast<int64_t>(sel.size() / 3), 3});
  std::copy(sel.begin(), sel.end(), out.data<int64_t>());
  return one(std::move(out));
}

/// TfIdfVectorizer (opset 9), integer pools (pool_int64s): per row, counts the n-grams of the pool (n in
/// [min_gram_length, max_gram_length]; n >= 2 grams also with skips: items start + k*d for d in
/// [1, max_skip_count + 1]) into output slot ngram_indexes[id]; mode TF (counts), IDF (weight where the count is
/// non-zero), TFIDF (count * weight), weights 1 when absent. As onnxruntime counts (the reference of the test data).
std::vector<Tensor> tfidf_kernel(const Ctx& c) {
  const Tensor& x = c.req(0);
  if (c.node.has("pool_strings")) c.unsupported("no kernel for string pools");
  if (x.dtype != DType::kInt32 && x.dtype != DType::kInt64) c.bad_dtype(x.dtype);
  if (x.shape.empty() || x.shape.size() > 2)
    c.fail(fmt::format("input must be 1-D or 2-D, got {}", shape_str(x.shape)));
  const std::vector<int64_t> in = x.as_int64s();
  const int64_t rows = x.shape.size() == 2 ? x.shape[0] : 1, len = x.shape.back();
  const int64_t min_n = c.node.i("min_gram_length"), max_n = c.node.i("max_gram_length"),
                max_skip = c.node.i("max_skip_count");
  const std::string mode = c.node.s("mode");
  const std::vector<int64_t> counts = c.node.ints("ngram_counts"), indexes = c.node.ints("ngram_indexes"),
                             pool = c.node.ints("pool_int64s");
  const std::vector<float> weights = c.node.floats("weights");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") c.fail(fmt::format("unknown mode '{}'", mode));
  const bool tf = mode == "TF", idf = mode == "IDF";
  if (min_n < 1 || max_n < min_n || static_cast<int64_t>(counts.size()) < max_n)
    c.fail("bad gram lengths / ngram_counts");
  // pool n-grams of length n -> ngram id.
  std::map<std::vector<int64_t>, int64_t> ids;
  int64_t id = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    const int64_t n = static_cast<int64_t>(g) + 1, begin = counts[g];
    const int64_t end = g + 1 < counts.size() ? counts[g + 1] : static_cast<int64_t>(pool.size());
    for (int64_t p = begin; p + n <= end; p += n, ++id)
      ids.emplace(std::vector<int64_t>(pool.begin() + p, pool.begin() + p + n), id);
  }
  if (static_cast<int64_t>(indexes.size()) < id) c.fail("ngram_indexes has fewer entries than the pool has n-grams");
  const int64_t width = indexes.empty() ? 0 : *std::max_element(indexes.begin(), indexes.end()) + 1;
  Tensor out(DType::kFloat32, x.shape.size() == 2 ? Shape{rows, width} : Shape{width});
  std::vector<int64_t> gram;
  std::vector<double> cnt(static_cast<size_t>(width));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = in.data() + r * len;
    std::fill(cnt.begin(), cnt.end(), 0.0);
    auto hit = [&](const std::vector<int64_t>& g) {
      auto it = ids.find(g);
      if (it != ids.end()) cnt[indexes[it->second]] += 1;
    };
    if (min_n == 1)
      for (int64_t i = 0; i < len; ++i) {
        gram.assign(1, row[i]);
        hit(gram);
      }
    for (int64_t start = 0; start < len; ++start)
      for (int64_t d = 1; d <= max_skip + 1; ++d) {
        gram.assign(1, row[start]);
        for (int64_t n = 2; n <= max_n; ++n) {
          const int64_t at = start + (n - 1) * d;
          if (at >= len) break;
          gram.push_back(row[at]);
          if (n >= min_n) hit(gram);
        }
      }
    float* o = out.data<float>() + r * width;
    for (int64_t k = 0; k < width; ++k) {
      const double w = weights.empty() ? 1.0 : weights[static_cast<size_t>(k)];
      o[k] = static_cast<float>(tf ? cnt[k] : idf ? (cnt[k] > 0 ? w : 0.0) : cnt[k] * w);
    }
  }
  return one(std::move(out));
}

}  // namespace

void register_misc(KernelTable& t) {
  t["QuantizeLinear"] = quantize_kernel;
  t["DequantizeLinear"] = dequantize_kernel;
  t["DynamicQuantizeLinear"] = dynamic_quantize_kernel;
  t["Det"] = det_kernel;
  t["Trilu"] = trilu_kernel;
  t["EyeLike"] = eye_like_kernel;
  t["Unique"] = unique_kernel;
  t["ReverseSequence"] = reverse_sequence_kernel;
  t["NonMaxSuppression"] = nms_kernel;
  t["TfIdfVectorizer"] = tfidf_kernel;
}

}  // namespace gspmd::kern
