// core/shapes: shape rules that the data-movement, indexing and einsum kernels (backend/kernels/ops_shape_ops.cc,
// ops_index.cc, ops_index_resize.cc, ops_einsum.cc) and their shape functions (core/shapes/shape_ops.cc, index.cc,
// einsum.cc) both apply, so that both compute the same output sizes and report the same spec violations: Reshape,
// Flatten, Squeeze, Unsqueeze, Concat, Slice, Split and Pad shapes, GatherND, Resize's output size and Einsum's
// labels, and scalar operands' values. Templated on the context: the kernels' Ctx or the shape functions' ShapeCtx
// (both have `node`, `opset`, `n_out`, `fail`, `axis` and `prefix`). Included by core/shapes/*.cc and
// backend/kernels/*.cc only.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/ir.h"

namespace gspmd::shapes {

/// Reshape's output shape for input shape `in` and target `spec`: 0 copies the input dim (unless `allowzero`), one
/// -1 takes what is left.
template <class C>
Shape reshape_target(const C& c, const Shape& in, const std::vector<int64_t>& spec, bool allowzero) {
  Shape s(spec.size());
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < spec.size(); ++i) {
    int64_t d = spec[i];
    if (d == 0 && !allowzero) {
      if (i >= in.size()) c.fail(fmt::format("shape entry {} is 0 but the input has rank {}", i, in.size()));
      d = in[i];
    } else if (d == -1) {
      if (infer >= 0) c.fail("shape has more than one -1");
      infer = static_cast<int64_t>(i);
      continue;
    } else if (d < 0) {
      c.fail(fmt::format("invalid shape entry {}", d));
    }
    s[i] = d;
    if (__builtin_mul_overflow(known, d, &known))
      c.fail(fmt::format("cannot reshape {} to [{}]", shape_str(in), fmt::join(spec, ",")));
  }
  const int64_t n = num_elements(in);
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      c.fail(fmt::format("cannot reshape {} to [{}]", shape_str(in), fmt::join(spec, ",")));
    s[infer] = n / known;
  }
  if (num_elements(s) != n) c.fail(fmt::format("cannot reshape {} to {}", shape_str(in), shape_str(s)));
  return s;
}

/// Flatten's 2-D output shape (attribute axis in [-r, r]).
template <class C>
Shape flatten_shape(const C& c, const Shape& in) {
  const int64_t r = static_cast<int64_t>(in.size());
  int64_t a = c.node.i("axis", 1);
  if (a < 0) a += r;
  if (a < 0 || a > r) c.fail(fmt::format("axis {} out of range for rank {}", c.node.i("axis", 1), r));
  return {num_elements(Shape(in.begin(), in.begin() + a)), num_elements(Shape(in.begin() + a, in.end()))};
}

/// Squeeze's output shape: `axes` dropped (each must have size 1), every size-1 dim when `axes` is empty.
template <class C>
Shape squeeze_shape(const C& c, const Shape& in, const std::vector<int64_t>& axes) {
  const int64_t r = static_cast<int64_t>(in.size());
  std::vector<char> drop(r, 0);
  if (axes.empty()) {
    for (int64_t i = 0; i < r; ++i) drop[i] = in[i] == 1;
  } else {
    for (int64_t a : axes) {
      const int64_t k = c.axis(a, r);
      if (in[k] != 1) c.fail(fmt::format("cannot squeeze axis {} of size {}", a, in[k]));
      drop[k] = 1;
    }
  }
  Shape s;
  for (int64_t i = 0; i < r; ++i)
    if (!drop[i]) s.push_back(in[i]);
  return s;
}

/// Unsqueeze's output shape: a 1 inserted at each of `axes` (axes of the output, no repeats).
template <class C>
Shape unsqueeze_shape(const C& c, const Shape& in, const std::vector<int64_t>& axes) {
  const int64_t r = static_cast<int64_t>(in.size() + axes.size());
  std::vector<char> ins(r, 0);
  for (int64_t a : axes) {
    const int64_t k = c.axis(a, r);
    if (ins[k]++) c.fail(fmt::format("axis {} repeated", a));
  }
  Shape s;
  size_t j = 0;
  for (int64_t i = 0; i < r; ++i) s.push_back(ins[i] ? 1 : in[j++]);
  return s;
}

/// Concat's output shape and normalised axis for the inputs' shapes (equal except along attribute axis).
template <class C>
std::pair<Shape, int64_t> concat_shape(const C& c, const std::vector<const Shape*>& shapes) {
  if (shapes.empty()) c.fail("needs at least one input");
  const Shape& first = *shapes[0];
  const int64_t r = static_cast<int64_t>(first.size());
  if (!c.node.has("axis")) c.fail("missing attribute 'axis'");
  const int64_t ax = c.axis(c.node.i("axis"), r);
  Shape os = first;
  os[ax] = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = *shapes[i];
    bool ok = static_cast<int64_t>(s.size()) == r;
    for (int64_t d = 0; ok && d < r; ++d) ok = d == ax || s[d] == first[d];
    if (!ok)
      c.fail(
          fmt::format("input {} has shape {}, incompatible with {} on axis {}", i, shape_str(s), shape_str(first), ax));
    os[ax] += s[ax];
  }
  return {os, ax};
}

/// Slice's result per dim of the input: output shape, first index read and step (0 and 1 on dims not sliced).
struct SliceDims {
  Shape out;
  std::vector<int64_t> start, step;
};

/// Slice of `in` by starts / ends / axes / steps (axes empty: 0..n-1; steps empty: all 1), clamped as the spec says.
template <class C>
SliceDims slice_dims(const C& c, const Shape& in, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                     std::vector<int64_t> axes, std::vector<int64_t> steps) {
  const int64_t r = static_cast<int64_t>(in.size());
  const size_t n = starts.size();
  if (ends.size() != n) c.fail("starts and ends differ in length");
  if (axes.empty())
    for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(n, 1);
  if (axes.size() != n || steps.size() != n) c.fail("starts, ends, axes and steps differ in length");
  SliceDims sd{in, std::vector<int64_t>(r, 0), std::vector<int64_t>(r, 1)};
  std::vector<char> seen(r, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = c.axis(axes[i], r);
    if (seen[a]++) c.fail(fmt::format("axis {} repeated", axes[i]));
    const int64_t dim = in[a], step = steps[i];
    if (step == 0) c.fail("step is 0");
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i], e = ends[i] < 0 ? ends[i] + dim : ends[i];
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      sd.out[a] = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      sd.out[a] = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    sd.start[a] = s;
    sd.step[a] = step;
  }
  return sd;
}

/// Split's output sizes along an axis of size `dim`: `sizes` (input or attribute 'split') when given, else
/// num_outputs parts (opset 18; the last may be smaller) or n_out() equal parts.
template <class C>
std::vector<int64_t> split_sizes(const C& c, int64_t dim, std::vector<int64_t> sizes) {
  if (sizes.empty()) {
    const int64_t k = c.node.has("num_outputs") ? c.node.i("num_outputs") : static_cast<int64_t>(c.n_out());
    if (k <= 0) c.fail("no outputs");
    const int64_t chunk = (dim + k - 1) / k;
    for (int64_t i = 0; i < k; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
    if (!c.node.has("num_outputs") && dim % k != 0)
      c.fail(fmt::format("axis of size {} does not split evenly into {} outputs", dim, k));
  }
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) c.fail("negative split size");
    total += s;
  }
  if (total != dim) c.fail(fmt::format("split sizes [{}] do not sum to {}", fmt::join(sizes, ","), dim));
  if (!c.node.outputs.empty() && sizes.size() != c.node.outputs.size())
    c.fail(fmt::format("{} split sizes for {} outputs", sizes.size(), c.node.outputs.size()));
  return sizes;
}

/// Pad's amounts per dim of the input (before, after; negative crops) and the output shape.
struct PadDims {
  std::vector<int64_t> lo, hi;
  Shape out;
};

/// Pad of `in` by `pads` ([begins of axes..., ends of axes...]) over `axes`.
template <class C>
PadDims pad_dims(const C& c, const Shape& in, const std::vector<int64_t>& pads, const std::vector<int64_t>& axes) {
  const int64_t r = static_cast<int64_t>(in.size()), na = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * na)
    c.fail(fmt::format("pads has {} entries for {} axes", pads.size(), na));
  PadDims p{std::vector<int64_t>(r, 0), std::vector<int64_t>(r, 0), Shape(r)};
  for (int64_t i = 0; i < na; ++i) {
    const int64_t a = c.axis(axes[i], r);
    p.lo[a] = pads[i];
    p.hi[a] = pads[i + na];
  }
  for (int64_t d = 0; d < r; ++d) {
    p.out[d] = in[d] + p.lo[d] + p.hi[d];
    if (p.out[d] < 0) c.fail("negative output dim");
  }
  return p;
}

/// GatherND's output shape for data `x`, indices `it` and batch_dims `b`.
template <class C>
Shape gather_nd_shape(const C& c, const Shape& x, const Shape& it, int64_t b) {
  const int64_t r = static_cast<int64_t>(x.size()), q = static_cast<int64_t>(it.size());
  if (q < 1 || b < 0 || b >= std::min(r, q)) c.fail("bad ranks or batch_dims");
  const int64_t last = it.back();
  if (last < 1 || last > r - b) c.fail(fmt::format("indices last dim {} out of range", last));
  for (int64_t i = 0; i < b; ++i)
    if (x[i] != it[i]) c.fail("batch dims of data and indices differ");
  Shape os(it.begin(), it.end() - 1);
  os.insert(os.end(), x.begin() + b + last, x.end());
  return os;
}

/// A numeric tensor's first element as a double (a scalar operand: Range's start / limit / delta, OneHot's depth);
/// fails for an empty tensor or a non-numeric dtype.
template <class C>
double first_element(const C& c, const Tensor& t, const char* what) {
  if (t.numel() < 1) c.fail(fmt::format("{} must have one element", what));
  switch (t.dtype) {
    case DType::kFloat32: return t.data<float>()[0];
    case DType::kFloat64: return t.data<double>()[0];
    case DType::kFloat16: return half_to_float(t.data<uint16_t>()[0]);
    case DType::kBFloat16: return bf16_to_float(t.data<uint16_t>()[0]);
    case DType::kInt8: return t.data<int8_t>()[0];
    case DType::kInt16: return t.data<int16_t>()[0];
    case DType::kInt32: return t.data<int32_t>()[0];
    case DType::kInt64: return static_cast<double>(t.data<int64_t>()[0]);
    case DType::kBool:
    case DType::kUInt8: return t.data<uint8_t>()[0];
    case DType::kUInt16: return t.data<uint16_t>()[0];
    case DType::kUInt32: return t.data<uint32_t>()[0];
    case DType::kUInt64: return static_cast<double>(t.data<uint64_t>()[0]);
    default: c.fail(fmt::format("{} must be numeric, got {}", what, dtype_name(t.dtype)));
  }
}

/// A float tensor's elements (float32 or float64) as doubles.
template <class C>
std::vector<double> float_values(const C& c, const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kFloat32)
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<float>()[i];
  else if (t.dtype == DType::kFloat64)
    for (size_t i = 0; i < v.size(); ++i) v[i] = t.data<double>()[i];
  else
    c.fail(fmt::format("expected a float tensor, got {}", dtype_name(t.dtype)));
  return v;
}

/// Throws UnsupportedError for the opset-18 Resize attributes (axes, keep_aspect_ratio_policy, antialias).
template <class C>
void reject_resize18_attrs(const C& c) {
  if (c.node.has("axes") || c.node.s("keep_aspect_ratio_policy", "stretch") != "stretch" ||
      c.node.i("antialias", 0) != 0)
    throw UnsupportedError(c.prefix() +
                           "no kernel for opset-18 Resize attributes (axes, keep_aspect_ratio_policy, antialias)");
}

/// Resize / Upsample output shape of an input of shape `in`: `sizes` when given (then `scales` becomes
/// sizes / in), else floor(in * scale) with the scales in float32 precision like the reference.
template <class C>
Shape resize_shape(const C& c, const Shape& in, std::vector<double>& scales, const std::vector<int64_t>& sizes) {
  const size_t r = in.size();
  Shape os(r);
  if (!sizes.empty()) {
    if (sizes.size() != r) c.fail(fmt::format("sizes has {} entries for rank {}", sizes.size(), r));
    scales.resize(r);
    for (size_t i = 0; i < r; ++i) {
      os[i] = sizes[i];
      scales[i] = in[i] == 0 ? 1.0 : static_cast<double>(sizes[i]) / static_cast<double>(in[i]);
    }
    return os;
  }
  if (scales.size() != r) c.fail(fmt::format("scales has {} entries for rank {}", scales.size(), r));
  for (size_t i = 0; i < r; ++i) {
    if (!(scales[i] > 0) || !std::isfinite(static_cast<float>(scales[i])))  // NaN too (found by the model fuzzer)
      c.fail(fmt::format("scales must be positive and finite, got {}", scales[i]));
    const double size = std::floor(static_cast<double>(in[i]) * static_cast<float>(scales[i]));
    if (size >= 0x1p62) c.fail(fmt::format("scale {} makes dim {} of size {} past 2^62", scales[i], i, in[i]));
    os[i] = static_cast<int64_t>(size);
  }
  return os;
}

/// Einsum's equation resolved against the operands' shapes. Labels are letters; ellipsis dims get 1000 + their
/// position counted from the right (right-aligned across operands).
struct EinsumLabels {
  std::vector<std::vector<int>> ops;  // per operand, one label per dim
  std::map<int, int64_t> size;        // label -> size (size-1 dims broadcast)
  std::vector<int> out;               // the output's labels
  Shape out_shape;
};

/// Parses one operand term against its rank; raises *ell_rank to its ellipsis rank.
template <class C>
std::vector<int> einsum_term(const C& c, const std::string& term, int64_t rank, int64_t* ell_rank) {
  std::vector<int> labels;
  int64_t letters = 0;
  for (char ch : term)
    if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
  const size_t ell = term.find("...");
  const int64_t ne = ell == std::string::npos ? 0 : rank - letters;
  if (ne < 0 || (ell == std::string::npos && letters != rank))
    c.fail(fmt::format("term '{}' does not match an input of rank {}", term, rank));
  *ell_rank = std::max(*ell_rank, ne);
  for (size_t i = 0; i < term.size(); ++i) {
    const char ch = term[i];
    if (ch == '.') {
      if (term.compare(i, 3, "...") != 0) c.fail(fmt::format("bad ellipsis in '{}'", term));
      for (int64_t k = ne; k > 0; --k) labels.push_back(static_cast<int>(1000 + k - 1));
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(ch))) {
      labels.push_back(static_cast<unsigned char>(ch));
    } else if (ch != ' ') {
      c.fail(fmt::format("bad character '{}' in equation", ch));
    }
  }
  return labels;
}

/// Resolves attribute 'equation' against the operands' shapes (implicit output: ellipsis dims, then the letters
/// that occur once, in alphabetical order).
template <class C>
EinsumLabels einsum_labels(const C& c, const std::vector<const Shape*>& shapes) {
  std::string eq;
  for (char ch : c.node.s("equation"))
    if (ch != ' ') eq.push_back(ch);
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != shapes.size())
    c.fail(fmt::format("equation has {} terms for {} inputs", terms.size(), shapes.size()));
  EinsumLabels e;
  int64_t ell_rank = 0;
  std::map<int, int> count;
  for (size_t i = 0; i < terms.size(); ++i) {
    const Shape& s = *shapes[i];
    e.ops.push_back(einsum_term(c, terms[i], static_cast<int64_t>(s.size()), &ell_rank));
    for (size_t d = 0; d < e.ops[i].size(); ++d) {
      const int l = e.ops[i][d];
      ++count[l];
      auto it = e.size.find(l);
      if (it == e.size.end() || it->second == 1)
        e.size[l] = s[d];
      else if (s[d] != 1 && s[d] != it->second)
        c.fail(fmt::format("label '{}' has sizes {} and {}", l < 1000 ? std::string(1, static_cast<char>(l)) : "...",
                           it->second, s[d]));
    }
  }
  if (arrow != std::string::npos) {
    const std::string rhs = eq.substr(arrow + 2);
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (rhs[i] == '.') {
        for (int64_t k = ell_rank; k > 0; --k) e.out.push_back(static_cast<int>(1000 + k - 1));
        i += 2;
      } else {
        const int l = static_cast<unsigned char>(rhs[i]);
        if (!e.size.count(l)) c.fail(fmt::format("output label '{}' not in any input", rhs[i]));
        e.out.push_back(l);
      }
    }
  } else {
    for (int64_t k = ell_rank; k > 0; --k) e.out.push_back(static_cast<int>(1000 + k - 1));
    for (const auto& [l, n] : count)
      if (l < 1000 && n == 1) e.out.push_back(l);
  }
  for (int l : e.out) e.out_shape.push_back(e.size[l]);
  return e;
}

}  // namespace gspmd::shapes
