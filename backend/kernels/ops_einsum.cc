// The einsum family (core/rules/einsum.cc): Einsum (opset 12; explicit and implicit equations, ellipsis, repeated
// labels, numpy broadcasting; labels parsed by einsum_labels, core/shapes/geometry_data.h). Reference: the ONNX
// operator spec (onnx/docs/Operators.md). Plain C++, except that float32 two-operand Einsums that reduce to a batched
// matrix product run on oneDNN matmul.
#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"
#include "backend/kernels/onednn.h"
#include "core/shapes/geometry_data.h"

namespace gspmd::kern {
namespace {

// Shape rules shared with the shape functions (core/shapes/geometry_data.h).
using shapes::einsum_labels;
using shapes::EinsumLabels;

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
    if (ia && ib && io)
      batch.push_back(l);
    else if (ia && !ib && io)
      m.push_back(l);
    else if (!ia && ib && io)
      n.push_back(l);
    else if (ia && ib && !io)
      k.push_back(l);
    else
      ok = false;
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

void register_einsum(KernelTable& t) { t["Einsum"] = einsum_kernel; }

}  // namespace gspmd::kern
