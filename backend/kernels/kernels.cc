// backend/kernels: kernel table, run_kernel, and the shared helpers of kernels_util.h.
#include "backend/kernels/kernels.h"

#include <algorithm>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd {
namespace kern {

const Tensor& Ctx::req(size_t i) const {
  const Tensor* t = in(i);
  if (!t) fail(fmt::format("missing required input {}", i));
  return *t;
}

std::string Ctx::prefix() const { return fmt::format("node '{}' ({}): ", node.name, node.op_type); }

void Ctx::fail(std::string_view msg) const { throw KernelError(prefix() + std::string(msg)); }

void Ctx::bad_data(std::string_view msg) const { throw InputError(prefix() + std::string(msg)); }

void Ctx::unsupported(std::string_view msg) const { throw UnsupportedError(prefix() + std::string(msg)); }

void Ctx::bad_dtype(DType t) const { unsupported(fmt::format("no kernel for dtype {}", dtype_name(t))); }

int64_t Ctx::axis(int64_t a, int64_t rank) const { return normalize_axis(*this, a, rank); }

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

std::vector<int64_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  const std::vector<int64_t> cs = contiguous_strides(in);
  const size_t off = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i) st[off + i] = in[i] == 1 ? 0 : cs[i];
  return st;
}

namespace {
template <class T>
void strided_copy_t(T* dst, const int64_t* dst_strides, const T* src, const int64_t* src_strides, const Shape& shape) {
  Plan<2> p = make_plan<2>(shape, {dst_strides, src_strides});
  if (p.empty) return;
  const size_t r = p.dims.size();
  if (r >= 2 && p.st[r - 1][0] == 1 && p.st[r - 1][1] != 1) {
    // Transpose-like: the destination is contiguous along the last dim but the source is not. If some other dim
    // is contiguous in the source, move it next to the last one and copy in square tiles (cache friendly).
    size_t k = r;
    for (size_t i = 0; i + 1 < r; ++i)
      if (p.st[i][1] == 1) k = i;
    if (k < r) {
      std::rotate(p.dims.begin() + k, p.dims.begin() + k + 1, p.dims.begin() + (r - 1));
      std::rotate(p.st.begin() + k, p.st.begin() + k + 1, p.st.begin() + (r - 1));
      const int64_t n1 = p.dims[r - 2], n2 = p.dims[r - 1];
      const int64_t d1 = p.st[r - 2][0], s2 = p.st[r - 1][1];  // d2 == 1, s1 == 1
      Plan<2> outer;
      outer.dims.assign(p.dims.begin(), p.dims.end() - 2);
      outer.st.assign(p.st.begin(), p.st.end() - 2);
      if (outer.dims.empty()) {
        outer.dims.push_back(1);
        outer.st.push_back({});
      }
      constexpr int64_t kTile = 8;  // measured best on this host (power-of-two strides alias in L1 with larger tiles)
      for_each_row(outer, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        for (int64_t o = 0; o < n; ++o) {
          T* d = dst + off[0] + o * st[0];
          const T* s = src + off[1] + o * st[1];
          for (int64_t i0 = 0; i0 < n1; i0 += kTile)
            for (int64_t j0 = 0; j0 < n2; j0 += kTile) {
              const int64_t i1 = std::min(n1, i0 + kTile), j1 = std::min(n2, j0 + kTile);
              for (int64_t i = i0; i < i1; ++i)
                for (int64_t j = j0; j < j1; ++j) d[i * d1 + j] = s[i + j * s2];
            }
        }
      });
      return;
    }
  }
  for_each_row_parallel(p, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
    T* d = dst + off[0];
    const T* s = src + off[1];
    if (st[0] == 1 && st[1] == 1) {
      std::memcpy(d, s, static_cast<size_t>(n) * sizeof(T));
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * st[0]] = s[i * st[1]];
    }
  });
}
}  // namespace

void strided_copy(std::byte* dst, const int64_t* dst_strides, const std::byte* src, const int64_t* src_strides,
                  const Shape& shape, size_t elem) {
  switch (elem) {
    case 1:
      return strided_copy_t(reinterpret_cast<uint8_t*>(dst), dst_strides, reinterpret_cast<const uint8_t*>(src),
                            src_strides, shape);
    case 2:
      return strided_copy_t(reinterpret_cast<uint16_t*>(dst), dst_strides, reinterpret_cast<const uint16_t*>(src),
                            src_strides, shape);
    case 4:
      return strided_copy_t(reinterpret_cast<uint32_t*>(dst), dst_strides, reinterpret_cast<const uint32_t*>(src),
                            src_strides, shape);
    case 8:
      return strided_copy_t(reinterpret_cast<uint64_t*>(dst), dst_strides, reinterpret_cast<const uint64_t*>(src),
                            src_strides, shape);
    default: {
      // Odd element sizes: add a trailing byte dimension.
      Shape s = shape;
      s.push_back(static_cast<int64_t>(elem));
      std::vector<int64_t> ds(dst_strides, dst_strides + shape.size()), ss(src_strides, src_strides + shape.size());
      for (auto& x : ds) x *= static_cast<int64_t>(elem);
      for (auto& x : ss) x *= static_cast<int64_t>(elem);
      ds.push_back(1);
      ss.push_back(1);
      strided_copy_t(reinterpret_cast<uint8_t*>(dst), ds.data(), reinterpret_cast<const uint8_t*>(src), ss.data(), s);
    }
  }
}

Tensor broadcast_to(const Tensor& t, const Shape& out) {
  if (t.shape == out) return t;
  Tensor r(t.dtype, out);
  const std::vector<int64_t> ss = broadcast_strides(t.shape, out), ds = contiguous_strides(out);
  strided_copy(r.bytes.data(), ds.data(), t.bytes.data(), ss.data(), out, dtype_size(t.dtype));
  return r;
}

Tensor cast_tensor(const Ctx& c, const Tensor& t, DType to) {
  if (t.dtype == to) return t;
  const int64_t n = t.numel();
  if (is_half(t.dtype)) {  // 16-bit floats widen exactly to float32 first
    Tensor f(DType::kFloat32, t.shape);
    const uint16_t* s = t.data<uint16_t>();
    float* d = f.data<float>();
    if (t.dtype == DType::kFloat16)
      for (int64_t i = 0; i < n; ++i) d[i] = half_to_float(s[i]);
    else
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
    return to == DType::kFloat32 ? f : cast_tensor(c, f, to);
  }
  if (is_half(to)) {  // narrow through float32 (one rounding from float32; double sources round twice)
    const Tensor f = t.dtype == DType::kFloat32 ? Tensor() : cast_tensor(c, t, DType::kFloat32);
    const float* s = t.dtype == DType::kFloat32 ? t.data<float>() : f.data<float>();
    Tensor r(to, t.shape);
    uint16_t* d = r.data<uint16_t>();
    if (to == DType::kFloat16)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_half(s[i]);
    else if (c.node.i("gspmd_truncate_bf16", 0) == 0)
      for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
    else  // a model's own Cast before opset 19: the ONNX reference (and its test data) truncates to bfloat16
      for (int64_t i = 0; i < n; ++i) {
        uint32_t b;
        std::memcpy(&b, &s[i], 4);
        d[i] =
            (b & 0x7fffffffu) > 0x7f800000u ? static_cast<uint16_t>((b >> 16) | 0x40) : static_cast<uint16_t>(b >> 16);
      }
    return r;
  }
  Tensor r(to, t.shape);
  const bool to_bool = to == DType::kBool;
  dispatch_all(c, t.dtype, [&]<class From>() {
    const From* src = t.data<From>();
    if (to_bool) {
      uint8_t* d = r.data<uint8_t>();
      for (int64_t i = 0; i < n; ++i) d[i] = src[i] != From(0);
      return;
    }
    dispatch_all(c, to, [&]<class To>() {
      To* d = r.data<To>();
      for (int64_t i = 0; i < n; ++i) d[i] = saturate_cast<To>(src[i]);
    });
  });
  return r;
}

const KernelTable& table() {
  static const KernelTable t = [] {
    KernelTable k;
    register_elementwise(k);
    register_elementwise_unary(k);
    register_matmul(k);
    register_reduce_norm(k);
    register_gather(k);
    register_conv_pool(k);
    register_conv_pool_norm(k);
    register_einsum(k);
    register_shape_ops(k);
    register_index(k);
    register_index_resize(k);
    register_rnn(k);
    register_loss(k);
    register_signal(k);
    register_spatial(k);
    register_misc(k);
    register_training(k);
    register_control(k);
    register_pipeline(k);
    return k;
  }();
  return t;
}

}  // namespace kern

namespace {

// Kernels without float16 / bfloat16 support run on float32 copies of the 16-bit inputs; each output is rounded once
// to the type the shape function gives it (so a MatMul in bfloat16 returns bfloat16). ONNX Runtime's CPU provider
// computes these ops the same way.
std::vector<Tensor> run_widened(const kern::Ctx& ctx, kern::KernelFn fn) {
  std::vector<Tensor> wide;
  std::vector<const Tensor*> ins(ctx.ins.size(), nullptr);
  std::vector<TensorType> types(ctx.ins.size());
  std::vector<const TensorType*> type_ptrs(ctx.ins.size(), nullptr);
  wide.reserve(ctx.ins.size());
  for (size_t k = 0; k < ctx.ins.size(); ++k) {
    const Tensor* t = ctx.ins[k];
    if (!t) continue;
    types[k] = {t->dtype, t->shape};
    type_ptrs[k] = &types[k];
    if (kern::is_half(t->dtype)) {
      wide.push_back(kern::cast_tensor(ctx, *t, DType::kFloat32));
      ins[k] = &wide.back();
    } else {
      ins[k] = t;
    }
  }
  const kern::Ctx wide_ctx{ctx.node, ins, ctx.opset};
  std::vector<Tensor> out = fn(wide_ctx);
  const std::vector<TensorType> want = infer_types(ctx.node, type_ptrs, ctx.ins, ctx.opset, &kernel_evaluator());
  for (size_t k = 0; k < out.size() && k < want.size(); ++k)
    if (out[k].dtype != want[k].dtype) out[k] = kern::cast_tensor(ctx, out[k], want[k].dtype);
  return out;
}

}  // namespace

std::vector<Tensor> run_kernel(const Node& node, const std::vector<const Tensor*>& inputs, int64_t opset,
                               const std::vector<Tensor*>& donated,
                               const std::vector<const std::shared_ptr<const Tensor>*>& owners) {
  const kern::Ctx ctx{node, inputs, opset, &donated, &owners};
  const std::string key = shapes::table_key(node.domain, node.op_type);
  const auto& t = kern::table();
  auto it = key.empty() ? t.end() : t.find(key);
  if (it == t.end() && (!node.domain.empty() && node.domain != "ai.onnx"))
    ctx.unsupported(fmt::format("no kernel for domain '{}'", node.domain));
  if (it == t.end()) ctx.unsupported("no kernel for this operator");
  // (op, dtype) pairs whose kernel has no 16-bit float path, learnt on the first call: they run widened.
  static std::mutex widen_mu;
  static std::set<std::pair<std::string, DType>> widen;
  DType half_type = DType::kUndefined;
  for (const Tensor* in : inputs)
    if (in && kern::is_half(in->dtype)) half_type = in->dtype;
  const bool half = half_type != DType::kUndefined;
  if (half) {
    std::lock_guard<std::mutex> lock(widen_mu);
    if (widen.count({it->first, half_type})) return run_widened(ctx, it->second);
  }
  try {
    // With 16-bit inputs nothing is donated: a kernel may move a donated input before it finds the dtype unsupported.
    return half ? it->second(kern::Ctx{node, inputs, opset}) : it->second(ctx);
  } catch (const UnsupportedError&) {
    if (!half) throw;
    std::vector<Tensor> out = run_widened(ctx, it->second);
    std::lock_guard<std::mutex> lock(widen_mu);
    widen.insert({it->first, half_type});
    return out;
  } catch (const std::exception& e) {
    // the data, not a bug (a Loop past its limit), or a message that names the node already: as it is
    if (is_input_caused(e) || std::string_view(e.what()).rfind(ctx.prefix(), 0) == 0) throw;
    if (dynamic_cast<const SpecError*>(&e)) throw SpecError(ctx.prefix() + e.what());
    throw InternalError(ctx.prefix() + e.what());
  }
}

bool has_kernel(const std::string& domain, const std::string& op_type) {
  const std::string key = shapes::table_key(domain, op_type);
  return !key.empty() && kern::table().count(key) != 0;
}

std::vector<std::string> kernel_op_types() {
  std::vector<std::string> out;
  for (const auto& [k, fn] : kern::table()) out.push_back(k);
  std::sort(out.begin(), out.end());
  return out;
}

const ValueEvaluator& kernel_evaluator() {
  static const ValueEvaluator run = [](const Node& n, const std::vector<const Tensor*>& in, int64_t opset) {
    return run_kernel(n, in, opset);
  };
  return run;
}

}  // namespace gspmd
