// core/shapes: shape rules that a kernel (backend/kernels) and its shape function (core/shapes/<family>.cc) both
// apply, so that both compute the same output sizes and report the same spec violations: axes and broadcasting, the
// sliding-window geometry of Conv, ConvTranspose and the pools (auto_pad, pads, strides, dilations, ceil_mode,
// output_padding, output_shape), and the loss operands' check, the optimizers' input lists. Templated on the context:
// the kernels' Ctx or the shape functions' ShapeCtx (both have `node` and `fail`). Included by core/shapes/*.cc and
// backend/kernels/*.cc only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/ir/ir.h"

namespace gspmd::shapes {

/// Axis `a` normalised into [0, rank) (negative counts from the end); `c` (a Ctx or a ShapeCtx) fails when it is out
/// of range.
template <class C>
int64_t normalize_axis(const C& c, int64_t a, int64_t rank) {
  const int64_t r = a < 0 ? a + rank : a;
  if (r < 0 || r >= rank) c.fail("axis " + std::to_string(a) + " out of range for rank " + std::to_string(rank));
  return r;
}

/// numpy broadcast of two shapes; fails naming both shapes. `c` is a kernel's Ctx or a shape function's ShapeCtx (its
/// fail() throws).
template <class C>
Shape broadcast_shapes(const C& c, const Shape& a, const Shape& b) {
  const size_t r = a.size() > b.size() ? a.size() : b.size();
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da == db || db == 1)
      out[i] = da;
    else if (da == 1)
      out[i] = db;
    else
      c.fail("shapes " + shape_str(a) + " and " + shape_str(b) + " cannot broadcast");
  }
  return out;
}

/// Per spatial dim: input size, kernel, stride, dilation, pads, output size.
struct Window {
  std::vector<int64_t> in, k, s, d, pl, pr, out;
  size_t n() const { return in.size(); }
  /// Effective kernel extent (k-1)*d+1.
  int64_t ext(size_t i) const { return (k[i] - 1) * d[i] + 1; }
};

/// Attribute `name` with one entry per spatial dim (n), `def` for each when absent.
template <class C>
std::vector<int64_t> ints_or(const C& c, const char* name, size_t n, int64_t def) {
  std::vector<int64_t> v = c.node.ints(name);
  if (v.empty()) v.assign(n, def);
  if (v.size() != n) c.fail(fmt::format("'{}' has {} entries for {} spatial dims", name, v.size(), n));
  return v;
}

/// Builds the window of a Conv / pool node (auto_pad, pads, strides, dilations, ceil_mode) for spatial input
/// dims `in` and kernel `k`.
template <class C>
Window make_window(const C& c, const std::vector<int64_t>& in, const std::vector<int64_t>& k, bool ceil_mode,
                   bool use_dilations = true) {
  const size_t n = in.size();
  Window w;
  w.in = in;
  w.k = k;
  if (k.size() != n) c.fail(fmt::format("kernel has {} dims for {} spatial dims", k.size(), n));
  w.s = ints_or(c, "strides", n, 1);
  w.d = use_dilations ? ints_or(c, "dilations", n, 1) : std::vector<int64_t>(n, 1);
  for (size_t i = 0; i < n; ++i)
    if (w.s[i] <= 0 || w.d[i] <= 0 || w.k[i] <= 0) c.fail("kernel, strides and dilations must be positive");
  const std::string ap = c.node.s("auto_pad", "NOTSET");
  w.pl.assign(n, 0);
  w.pr.assign(n, 0);
  w.out.assign(n, 0);
  if (ap == "NOTSET") {
    std::vector<int64_t> pads = c.node.ints("pads");
    if (pads.empty()) pads.assign(2 * n, 0);
    if (pads.size() != 2 * n) c.fail(fmt::format("pads has {} entries for {} spatial dims", pads.size(), n));
    for (size_t i = 0; i < n; ++i) {
      w.pl[i] = pads[i];
      w.pr[i] = pads[i + n];
      const int64_t span = in[i] + w.pl[i] + w.pr[i] - w.ext(i);
      if (span < 0)
        c.fail(fmt::format("kernel extent {} exceeds padded input {} on spatial dim {}", w.ext(i),
                           in[i] + w.pl[i] + w.pr[i], i));
      int64_t o = (ceil_mode ? (span + w.s[i] - 1) / w.s[i] : span / w.s[i]) + 1;
      // A window may not start inside the right padding (PyTorch / onnxruntime rule).
      if (ceil_mode && (o - 1) * w.s[i] >= in[i] + w.pl[i]) --o;
      w.out[i] = o;
    }
  } else if (ap == "VALID") {
    for (size_t i = 0; i < n; ++i) {
      const int64_t span = in[i] - w.ext(i);
      if (span < 0) c.fail("kernel larger than input with auto_pad VALID");
      w.out[i] = (ceil_mode ? (span + w.s[i] - 1) / w.s[i] : span / w.s[i]) + 1;
    }
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    for (size_t i = 0; i < n; ++i) {
      w.out[i] = (in[i] + w.s[i] - 1) / w.s[i];
      const int64_t total = std::max<int64_t>(0, (w.out[i] - 1) * w.s[i] + w.ext(i) - in[i]);
      w.pl[i] = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
      w.pr[i] = total - w.pl[i];
    }
  } else {
    c.fail(fmt::format("unknown auto_pad '{}'", ap));
  }
  return w;
}

/// Builds the window of a ConvTranspose node for spatial input dims `in` and kernel `k`: w.in is X's spatial size,
/// w.out Y's (from output_shape, auto_pad SAME_*, or pads and output_padding).
template <class C>
Window make_deconv_window(const C& c, const std::vector<int64_t>& in, const std::vector<int64_t>& k) {
  const size_t nsp = in.size();
  Window w;
  w.in = in;
  w.k = k;
  w.s = ints_or(c, "strides", nsp, 1);
  w.d = ints_or(c, "dilations", nsp, 1);
  const std::vector<int64_t> opad = ints_or(c, "output_padding", nsp, 0);
  std::vector<int64_t> oshape = c.node.ints("output_shape");
  if (oshape.size() == nsp + 2) oshape.erase(oshape.begin(), oshape.begin() + 2);
  if (!oshape.empty() && oshape.size() != nsp) c.fail("output_shape does not match the spatial rank");
  const std::string ap = c.node.s("auto_pad", "NOTSET");
  std::vector<int64_t> pads = c.node.ints("pads");
  if (pads.empty()) pads.assign(2 * nsp, 0);
  if (pads.size() != 2 * nsp) c.fail(fmt::format("pads has {} entries for {} spatial dims", pads.size(), nsp));
  w.pl.assign(nsp, 0);
  w.pr.assign(nsp, 0);
  w.out.assign(nsp, 0);
  for (size_t i = 0; i < nsp; ++i) {
    const int64_t full = w.s[i] * (in[i] - 1) + opad[i] + w.ext(i);
    if (!oshape.empty() || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      w.out[i] = !oshape.empty() ? oshape[i] : in[i] * w.s[i];
      const int64_t total = std::max<int64_t>(0, full - w.out[i]);
      if (ap == "SAME_UPPER") {
        w.pl[i] = total / 2;
        w.pr[i] = total - total / 2;
      } else {
        w.pl[i] = total - total / 2;
        w.pr[i] = total / 2;
      }
    } else if (ap == "NOTSET" || ap == "VALID") {
      if (ap == "NOTSET") {
        w.pl[i] = pads[i];
        w.pr[i] = pads[i + nsp];
      }
      w.out[i] = full - w.pl[i] - w.pr[i];
    } else {
      c.fail(fmt::format("unknown auto_pad '{}'", ap));
    }
    if (w.out[i] < 0) c.fail("negative output size");
  }
  return w;
}

/// NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss: fails unless input x is [N, C, d1..dk] and target is
/// int32/int64 [N, d1..dk].
template <class C>
void check_loss_operands(const C& c, const Shape& x, DType target_dtype, const Shape& target) {
  if (x.size() < 2) c.fail(fmt::format("input must have rank >= 2, got {}", shape_str(x)));
  if (target_dtype != DType::kInt64 && target_dtype != DType::kInt32)
    c.fail(fmt::format("target must be int32 or int64, got {}", dtype_name(target_dtype)));
  Shape want{x[0]};
  want.insert(want.end(), x.begin() + 2, x.end());
  if (target != want)
    c.fail(fmt::format("target shape {} does not match input {} (needs {})", shape_str(target), shape_str(x),
                       shape_str(want)));
}

/// The ai.onnx.preview.training optimizers' inputs: R, T, then `groups` lists (X, G, states) of n tensors each. Returns
/// n; fails unless the `n_in` inputs make such lists and every list's k-th tensor has X_k's type (`type_of(i)`: input
/// i's TensorType).
template <class C, class TypeOf>
size_t optimizer_arity(const C& c, size_t n_in, size_t groups, TypeOf&& type_of) {
  if (n_in < 2 || (n_in - 2) % groups != 0)
    c.fail(fmt::format("expects R, T and {} lists of the same length, got {} inputs", groups, n_in));
  const size_t n = (n_in - 2) / groups;
  for (size_t k = 0; k < n; ++k)
    for (size_t g = 1; g < groups; ++g) {
      const TensorType a = type_of(2 + k), b = type_of(2 + g * n + k);
      if (a != b)
        c.fail(fmt::format("input {} ({} {}) does not match input {} ({} {})", 2 + g * n + k, dtype_name(b.dtype),
                           shape_str(b.shape), 2 + k, dtype_name(a.dtype), shape_str(a.shape)));
    }
  return n;
}

}  // namespace gspmd::shapes
