// oneDNN 2.6 wrappers (see onednn.h). The only file of backend/kernels that includes dnnl.hpp.
#include "backend/kernels/onednn.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include <dnnl.hpp>
#include <omp.h>

namespace gspmd::dnn {
namespace {

using dnnl::memory;
using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

/// Binary key: op kind + integers + floats, memcpy'd.
struct Key {
  std::string s;
  explicit Key(char kind) { s.push_back(kind); }
  Key& add(int64_t v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(float v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(const std::vector<int64_t>& v) {
    add(static_cast<int64_t>(v.size()));
    for (int64_t x : v) add(x);
    return *this;
  }
};

/// Thread-safe primitive cache. An empty primitive records "oneDNN has no implementation" for that key.
/// The key also holds the calling thread's OpenMP thread count: a primitive is specialised for the thread count it
/// was created with (the pod runs devices concurrently on one thread each, a single device on all threads).
class Cache {
 public:
  template <class Make>
  dnnl::primitive get(const Key& key, Make&& make, bool allow_unimplemented) {
    Key k = key;
    k.add(static_cast<int64_t>(omp_get_max_threads()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(k.s);
      if (it != map_.end()) return it->second;
    }
    dnnl::primitive p;
    try {
      p = make();
      ++created_;
    } catch (const dnnl::error& e) {
      if (!allow_unimplemented) throw std::runtime_error(std::string("oneDNN: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    map_.emplace(k.s, p);
    return p;
  }
  int64_t created() const { return created_; }

 private:
  std::atomic<int64_t> created_{0};
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mu_;
  std::unordered_map<std::string, dnnl::primitive> map_;
};

Cache& cache() {
  static Cache c;
  return c;
}

memory::dims to_dims(const std::vector<int64_t>& v) { return memory::dims(v.begin(), v.end()); }

/// Element strides of a plain row-major layout of `d`.
memory::dims row_major_strides(const memory::dims& d) {
  memory::dims st(d.size());
  int64_t s = 1;
  for (size_t i = d.size(); i-- > 0;) {
    st[i] = s;
    s *= d[i];
  }
  return st;
}

memory::desc plain_md(const std::vector<int64_t>& dims) {
  const memory::dims d = to_dims(dims);
  return memory::desc(d, dt::f32, row_major_strides(d));
}

memory mem(const memory::desc& md, const float* p) { return memory(md, engine(), const_cast<float*>(p)); }

/// Attributes of every primitive here: the caller provides the scratchpad (scratchpad_mode::user). With the library's
/// scratchpad, Debian's oneDNN (built without DNNL_ENABLE_CONCURRENT_EXEC) shares one buffer between primitives, and
/// the emulator's devices, which execute primitives concurrently on their own threads, corrupt each other's results.
dnnl::primitive_attr attrs() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

/// The memory descriptor `what` (dnnl_query_src_md, dnnl_query_weights_md, ...) of primitive `p`; a zero
/// descriptor when it has none.
memory::desc query_md(const dnnl::primitive& p, dnnl_query_t what) {
  const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(p.get_primitive_desc(), what, 0);
  return md ? memory::desc(*md) : memory::desc();
}

/// Executes `p` on this thread's stream with `args`, plus a scratchpad from a buffer of this thread (grown as needed)
/// when the primitive wants one.
void execute(dnnl::primitive& p, std::unordered_map<int, memory> args) {
  try {
    const memory::desc scratch_md = query_md(p, dnnl_query_scratchpad_md);
    if (const size_t need = scratch_md.get_size(); need > 0) {
      thread_local std::vector<std::byte> scratch;
      if (scratch.size() < need) scratch.resize(need);
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(scratch_md, engine(), scratch.data()));
    }
    p.execute(stream(), args);
    stream().wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN: ") + e.what());
  }
}

dnnl::algorithm eltwise_alg(Eltwise op, float& alpha, float& beta) {
  alpha = 0.f;
  beta = 0.f;
  switch (op) {
    case Eltwise::kRelu: return dnnl::algorithm::eltwise_relu;
    case Eltwise::kTanh: return dnnl::algorithm::eltwise_tanh;
    case Eltwise::kExp: return dnnl::algorithm::eltwise_exp;
    case Eltwise::kSqrt: return dnnl::algorithm::eltwise_sqrt;
    case Eltwise::kLog: return dnnl::algorithm::eltwise_log;
    case Eltwise::kAbs: return dnnl::algorithm::eltwise_abs;
    case Eltwise::kSigmoid: return dnnl::algorithm::eltwise_logistic;
    case Eltwise::kNeg: alpha = -1.f; return dnnl::algorithm::eltwise_linear;
    case Eltwise::kReciprocal: alpha = 1.f; beta = -1.f; return dnnl::algorithm::eltwise_pow;
  }
  throw std::logic_error("eltwise op");
}

dnnl::algorithm binary_alg(Binary op) {
  switch (op) {
    case Binary::kAdd: return dnnl::algorithm::binary_add;
    case Binary::kSub: return dnnl::algorithm::binary_sub;
    case Binary::kMul: return dnnl::algorithm::binary_mul;
    case Binary::kDiv: return dnnl::algorithm::binary_div;
    case Binary::kMax: return dnnl::algorithm::binary_max;
    case Binary::kMin: return dnnl::algorithm::binary_min;
  }
  throw std::logic_error("binary op");
}

dnnl::algorithm reduce_alg(Reduce op) {
  switch (op) {
    case Reduce::kSum: return dnnl::algorithm::reduction_sum;
    case Reduce::kMean: return dnnl::algorithm::reduction_mean;
    case Reduce::kMax: return dnnl::algorithm::reduction_max;
    case Reduce::kMin: return dnnl::algorithm::reduction_min;
    case Reduce::kProd: return dnnl::algorithm::reduction_mul;
    case Reduce::kL1: return dnnl::algorithm::reduction_norm_lp_power_p_sum;
    case Reduce::kL2: return dnnl::algorithm::reduction_norm_lp_sum;
    case Reduce::kSumSquare: return dnnl::algorithm::reduction_norm_lp_power_p_sum;
  }
  throw std::logic_error("reduce op");
}

}  // namespace

void eltwise(Eltwise op, const float* in, float* out, int64_t n) {
  float alpha, beta;
  const dnnl::algorithm alg = eltwise_alg(op, alpha, beta);
  const memory::desc md = plain_md({n});
  Key k('e');
  k.add(static_cast<int64_t>(op)).add(n);
  dnnl::primitive p = cache().get(
      k,
      [&] {
        dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, alg, md, alpha, beta);
        return dnnl::primitive(dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(d, attrs(), engine())));
      },
      false);
  execute(p, {{DNNL_ARG_SRC, mem(md, in)}, {DNNL_ARG_DST, mem(md, out)}});
}

bool binary(Binary op, const float* a, const float* b, float* dst, const std::vector<int64_t>& dims,
            const std::vector<int64_t>& b_dims) {
  const memory::desc amd = plain_md(dims), bmd = plain_md(b_dims);
  Key k('b');
  k.add(static_cast<int64_t>(op)).add(dims).add(b_dims);
  dnnl::primitive p = cache().get(
      k,
      [&] {
        dnnl::binary::desc d(binary_alg(op), amd, bmd, amd);
        return dnnl::primitive(dnnl::binary(dnnl::binary::primitive_desc(d, attrs(), engine())));
      },
      true);
  if (!p) return false;
  execute(p, {{DNNL_ARG_SRC_0, mem(amd, a)}, {DNNL_ARG_SRC_1, mem(bmd, b)}, {DNNL_ARG_DST, mem(amd, dst)}});
  return true;
}

namespace {

/// One matmul call on dims (batch may be absent: 2-D).
dnnl::primitive matmul_prim(bool batched, int64_t a_batch, int64_t b_batch, int64_t batch, int64_t m, int64_t k,
                            int64_t n, bool ta, bool tb, float alpha, float beta, memory::desc& amd,
                            memory::desc& bmd, memory::desc& cmd, bool allow_unimplemented) {
  if (batched) {
    amd = memory::desc({a_batch, m, k}, dt::f32, ta ? memory::dims{m * k, 1, m} : memory::dims{m * k, k, 1});
    bmd = memory::desc({b_batch, k, n}, dt::f32, tb ? memory::dims{k * n, 1, k} : memory::dims{k * n, n, 1});
    cmd = plain_md({batch, m, n});
  } else {
    amd = memory::desc({m, k}, dt::f32, ta ? memory::dims{1, m} : memory::dims{k, 1});
    bmd = memory::desc({k, n}, dt::f32, tb ? memory::dims{1, k} : memory::dims{n, 1});
    cmd = plain_md({m, n});
  }
  Key key('m');
  key.add(static_cast<int64_t>(batched)).add(a_batch).add(b_batch).add(batch).add(m).add(k).add(n);
  key.add(static_cast<int64_t>(ta * 2 + tb)).add(alpha).add(beta);
  return cache().get(
      key,
      [&] {
        dnnl::primitive_attr attr = attrs();
        if (alpha != 1.f) attr.set_output_scales(0, {alpha});
        if (beta != 0.f) {
          dnnl::post_ops po;
          po.append_sum(beta);
          attr.set_post_ops(po);
        }
        dnnl::matmul::desc d(amd, bmd, cmd);
        return dnnl::primitive(dnnl::matmul(dnnl::matmul::primitive_desc(d, attr, engine())));
      },
      allow_unimplemented);
}

}  // namespace

void matmul(const float* a, const float* b, float* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k,
            int64_t n, bool trans_a, bool trans_b, float alpha, float beta) {
  const int64_t batch = std::max(a_batch, b_batch);
  memory::desc amd, bmd, cmd;
  if (batch == 1 || (b_batch == 1 && !trans_a)) {
    // Shared weights: fold A's batch into M.
    dnnl::primitive p = matmul_prim(false, 1, 1, 1, batch * m, k, n, trans_a, trans_b, alpha, beta, amd, bmd, cmd,
                                    false);
    execute(p, {{DNNL_ARG_SRC, mem(amd, a)}, {DNNL_ARG_WEIGHTS, mem(bmd, b)}, {DNNL_ARG_DST, mem(cmd, c)}});
    return;
  }
  dnnl::primitive p =
      matmul_prim(true, a_batch, b_batch, batch, m, k, n, trans_a, trans_b, alpha, beta, amd, bmd, cmd, true);
  if (p) {
    execute(p, {{DNNL_ARG_SRC, mem(amd, a)}, {DNNL_ARG_WEIGHTS, mem(bmd, b)}, {DNNL_ARG_DST, mem(cmd, c)}});
    return;
  }
  // Batch broadcast oneDNN does not implement: one 2-D matmul per batch entry.
  p = matmul_prim(false, 1, 1, 1, m, k, n, trans_a, trans_b, alpha, beta, amd, bmd, cmd, false);
  for (int64_t i = 0; i < batch; ++i) {
    const float* ai = a + (a_batch == 1 ? 0 : i * m * k);
    const float* bi = b + (b_batch == 1 ? 0 : i * k * n);
    execute(p, {{DNNL_ARG_SRC, mem(amd, ai)}, {DNNL_ARG_WEIGHTS, mem(bmd, bi)}, {DNNL_ARG_DST, mem(cmd, c + i * m * n)}});
  }
}

namespace {

/// matmul_fused's primitive and memory descriptors. Folds A's batch into M (one 2-D product) when B has no batch and
/// every post-op operand folds too; otherwise a 3-D batched product.
struct FusedMatmul {
  dnnl::primitive prim;  // empty: unimplemented
  memory::desc a, b, c;
  memory::desc bias;     // zero desc: no bias
  float scale = 1.f;     // output scale
  size_t first = 0;      // post-ops before this one are the bias or the scale, not oneDNN post-ops
  std::vector<memory::desc> src1;  // per post-op (empty desc for eltwise)
};

FusedMatmul fused_matmul_prim(int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
                              const std::vector<PostOp>& post) {
  const int64_t batch = std::max(a_batch, b_batch);
  bool fold = batch == 1 || b_batch == 1;
  for (const PostOp& p : post) {
    if (p.kind != PostOp::Kind::kBinary) continue;
    if (p.src1_dims.size() != 3) throw std::logic_error("matmul_fused: src1 dims must be [batch, M, N]");
    const int64_t bt = p.src1_dims[0], mt = p.src1_dims[1];
    fold = fold && (batch == 1 || (bt == 1 && mt == 1) || (bt == batch && mt == m));
  }
  FusedMatmul f;
  if (fold) {
    f.a = plain_md({batch * m, k});
    f.b = plain_md({k, n});
    f.c = plain_md({batch * m, n});
  } else {
    f.a = plain_md({a_batch, m, k});
    f.b = plain_md({b_batch, k, n});
    f.c = plain_md({batch, m, n});
  }
  Key key('F');
  key.add(a_batch).add(b_batch).add(m).add(k).add(n);
  dnnl::post_ops po;
  // a leading per-column bias runs as the matmul's bias, a leading scalar scale as its output scale
  f.first = 0;
  if (!post.empty() && post[0].kind == PostOp::Kind::kBinary && post[0].alg == Binary::kAdd &&
      post[0].src1_dims == std::vector<int64_t>{1, 1, n}) {
    f.bias = fold ? plain_md({1, n}) : plain_md({1, 1, n});
    f.first = 1;
  } else if (!post.empty() && post[0].kind == PostOp::Kind::kScale) {
    f.scale = post[0].value;
    f.first = 1;
  }
  for (size_t i = 0; i < post.size(); ++i) {
    const PostOp& p = post[i];
    key.add(static_cast<int64_t>(p.kind)).add(static_cast<int64_t>(p.alg)).add(p.src1_dims).add(p.value);
    if (i < f.first) {
      f.src1.emplace_back();
      continue;
    }
    if (p.kind == PostOp::Kind::kScale) return f;  // only first: unimplemented
    if (p.kind == PostOp::Kind::kGeluErf) {
      po.append_eltwise(1.f, dnnl::algorithm::eltwise_gelu_erf, 0.f, 0.f);
      f.src1.emplace_back();
      continue;
    }
    std::vector<int64_t> d = p.src1_dims;
    if (fold) d = {d[0] * d[1], d[2]};  // [1 or batch*M, N or 1]
    f.src1.push_back(plain_md(d));
    po.append_binary(binary_alg(p.alg), f.src1.back());
  }
  f.prim = cache().get(
      key,
      [&] {
        dnnl::primitive_attr attr = attrs();
        attr.set_post_ops(po);
        if (f.scale != 1.f) attr.set_output_scales(0, {f.scale});
        dnnl::matmul::desc d = !f.bias.is_zero() ? dnnl::matmul::desc(f.a, f.b, f.bias, f.c) : dnnl::matmul::desc(f.a, f.b, f.c);
        dnnl::matmul::primitive_desc pd(d, attr, engine());
        // oneDNN's reference matmul (plain loops) is orders of magnitude slower than the unfused ops: unimplemented
        if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0)
          throw dnnl::error(dnnl_unimplemented, "only a reference implementation");
        return dnnl::primitive(dnnl::matmul(pd));
      },
      true);
  return f;
}

}  // namespace

bool matmul_fused(const float* a, const float* b, float* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k,
                  int64_t n, const std::vector<PostOp>& post, const std::vector<const float*>& src1) {
  FusedMatmul f = fused_matmul_prim(a_batch, b_batch, m, k, n, post);
  if (!f.prim) return false;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, mem(f.a, a)}, {DNNL_ARG_WEIGHTS, mem(f.b, b)}, {DNNL_ARG_DST, mem(f.c, c)}};
  if (!f.bias.is_zero()) args.emplace(DNNL_ARG_BIAS, mem(f.bias, src1.at(0)));
  for (size_t i = f.first; i < post.size(); ++i)
    if (post[i].kind == PostOp::Kind::kBinary)
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(static_cast<int>(i - f.first)) | DNNL_ARG_SRC_1,
                   mem(f.src1[i], src1.at(i)));
  execute(f.prim, args);
  return true;
}

bool matmul_fused_supported(int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
                            const std::vector<PostOp>& post) {
  return static_cast<bool>(fused_matmul_prim(a_batch, b_batch, m, k, n, post).prim);
}

int64_t primitives_created() { return cache().created(); }

bool transpose(const void* src, void* dst, const std::vector<int64_t>& src_dims, const std::vector<int64_t>& perm,
               int elem_bytes) {
  const dt type = elem_bytes == 4 ? dt::s32 : elem_bytes == 2 ? dt::f16 : elem_bytes == 1 ? dt::s8 : dt::undef;
  if (type == dt::undef || src_dims.empty() || src_dims.size() > DNNL_MAX_NDIMS) return false;
  const size_t r = src_dims.size();
  const memory::dims src_strides = row_major_strides(to_dims(src_dims));
  memory::dims out(r), view_strides(r);
  for (size_t i = 0; i < r; ++i) {
    out[i] = src_dims[static_cast<size_t>(perm[i])];
    view_strides[i] = src_strides[static_cast<size_t>(perm[i])];
  }
  const memory::desc from(out, type, view_strides), to(out, type, row_major_strides(out));
  Key k('t');
  k.add(src_dims).add(perm).add(static_cast<int64_t>(elem_bytes));
  dnnl::primitive p = cache().get(
      k,
      [&] {
        return dnnl::primitive(dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to, attrs())));
      },
      true);
  if (!p) return false;
  memory a(from, engine(), const_cast<void*>(src)), b(to, engine(), dst);
  execute(p, {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
  return true;
}

void softmax(const float* in, float* out, const std::vector<int64_t>& dims, int axis, bool log) {
  const memory::desc md = plain_md(dims);
  Key k('s');
  k.add(dims).add(static_cast<int64_t>(axis)).add(static_cast<int64_t>(log));
  dnnl::primitive p = cache().get(
      k,
      [&] {
        dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference,
                                         log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md,
                                         md, axis);
        return dnnl::primitive(
            dnnl::softmax_v2_forward(dnnl::softmax_v2_forward::primitive_desc(d, attrs(), engine())));
      },
      false);
  execute(p, {{DNNL_ARG_SRC, mem(md, in)}, {DNNL_ARG_DST, mem(md, out)}});
}

void layer_norm(const float* in, float* out, int64_t outer, int64_t inner, const float* scale, const float* bias,
                float eps, float* mean, float* var) {
  const memory::desc md = plain_md({outer, inner}), smd = plain_md({outer}), cmd = plain_md({inner});
  Key k('l');
  k.add(outer).add(inner).add(eps).add(static_cast<int64_t>((scale ? 1 : 0) + (bias ? 2 : 0)));
  dnnl::primitive p = cache().get(
      k,
      [&] {
        auto flags = dnnl::normalization_flags::none;
        if (scale) flags = flags | dnnl::normalization_flags::use_scale;
        if (bias) flags = flags | dnnl::normalization_flags::use_shift;
        dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_training, md, smd, eps, flags);
        return dnnl::primitive(
            dnnl::layer_normalization_forward(dnnl::layer_normalization_forward::primitive_desc(d, attrs(), engine())));
      },
      false);
  std::vector<float> tmp_mean, tmp_var;
  if (!mean) {
    tmp_mean.resize(outer);
    mean = tmp_mean.data();
  }
  if (!var) {
    tmp_var.resize(outer);
    var = tmp_var.data();
  }
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, mem(md, in)},
                                       {DNNL_ARG_DST, mem(md, out)},
                                       {DNNL_ARG_MEAN, mem(smd, mean)},
                                       {DNNL_ARG_VARIANCE, mem(smd, var)}};
  if (scale) args.emplace(DNNL_ARG_SCALE, mem(cmd, scale));
  if (bias) args.emplace(DNNL_ARG_SHIFT, mem(cmd, bias));
  execute(p, args);
}

void reduce(Reduce op, const float* in, float* out, const std::vector<int64_t>& dims,
            const std::vector<int64_t>& out_dims) {
  const memory::desc imd = plain_md(dims), omd = plain_md(out_dims);
  Key k('r');
  k.add(static_cast<int64_t>(op)).add(dims).add(out_dims);
  dnnl::primitive p = cache().get(
      k,
      [&] {
        const float p = op == Reduce::kL1 ? 1.f : op == Reduce::kL2 || op == Reduce::kSumSquare ? 2.f : 0.f;
        dnnl::reduction::desc d(reduce_alg(op), imd, omd, p, 0.f);
        return dnnl::primitive(dnnl::reduction(dnnl::reduction::primitive_desc(d, attrs(), engine())));
      },
      false);
  execute(p, {{DNNL_ARG_SRC, mem(imd, in)}, {DNNL_ARG_DST, mem(omd, out)}});
}

namespace {

/// A convolution (or deconvolution) primitive of geometry `g` whose src, weights and dst formats oneDNN picks
/// (format_tag::any; query_md tells which). Throws dnnl::error when oneDNN has no implementation.
dnnl::primitive make_conv(const ConvGeom& g, bool bias) {
  const memory::desc src_any(to_dims(g.src), dt::f32, memory::format_tag::any);
  const memory::desc wei_any(to_dims(g.wei), dt::f32, memory::format_tag::any);
  const memory::desc dst_any(to_dims(g.dst), dt::f32, memory::format_tag::any);
  const memory::desc bias_md = bias ? plain_md({g.dst[1]}) : memory::desc();
  const memory::dims st = to_dims(g.strides), dl = to_dims(g.dilations), pl = to_dims(g.pad_l),
                     pr = to_dims(g.pad_r);
  auto make = [&]<class Prim>(dnnl::algorithm alg) {  // convolution_forward or deconvolution_forward
    typename Prim::desc d(dnnl::prop_kind::forward_inference, alg, src_any, wei_any, bias_md, dst_any, st, dl, pl, pr);
    return dnnl::primitive(Prim(typename Prim::primitive_desc(d, attrs(), engine())));
  };
  return g.deconv ? make.template operator()<dnnl::deconvolution_forward>(dnnl::algorithm::deconvolution_direct)
                  : make.template operator()<dnnl::convolution_forward>(dnnl::algorithm::convolution_direct);
}

/// Runs a reorder between two memories (plain <-> blocked).
void reorder(memory& from, memory& to) {
  dnnl::primitive r;
  try {
    r = dnnl::reorder(dnnl::reorder::primitive_desc(from, to, attrs()));
  } catch (const dnnl::error& e) {
    throw std::runtime_error(std::string("oneDNN: ") + e.what());
  }
  execute(r, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
}

std::atomic<int64_t> packed_weight_reorders_{0};

/// Weights reordered to a convolution's blocked layout, kept while their owner lives (conv's `wei_owner`).
struct PackedWeights {
  std::weak_ptr<const void> owner;
  memory packed;
  size_t bytes = 0;
};

/// The packed weights for `key` (geometry + weight address) if they were made from the same owner in layout `md`.
/// Otherwise reorders `from` into a new memory of `md` and keeps it, dropping the entries whose owner is gone (and
/// all of them past kMaxBytes in all).
memory packed_weights(const std::string& key, const std::shared_ptr<const void>& owner, memory& from,
                      const memory::desc& md) {
  static constexpr size_t kMaxBytes = size_t{1} << 30;
  static std::mutex mu;
  static std::unordered_map<std::string, PackedWeights> cache;
  static size_t total = 0;
  const auto same_owner = [&](const PackedWeights& p) {
    return !p.owner.owner_before(owner) && !owner.owner_before(p.owner) && !p.owner.expired();
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end() && same_owner(it->second) && it->second.packed.get_desc() == md) return it->second.packed;
  }
  memory packed(md, engine());
  reorder(from, packed);
  ++packed_weight_reorders_;
  const size_t bytes = md.get_size();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) {
    total -= it->second.bytes;
    cache.erase(it);
  }
  for (auto it = cache.begin(); it != cache.end();) {  // drop the weights of dead owners
    if (it->second.owner.expired()) {
      total -= it->second.bytes;
      it = cache.erase(it);
    } else {
      ++it;
    }
  }
  if (total + bytes > kMaxBytes) {
    cache.clear();
    total = 0;
  }
  if (bytes <= kMaxBytes) {
    cache.emplace(key, PackedWeights{owner, packed, bytes});
    total += bytes;
  }
  return packed;
}

}  // namespace

int64_t packed_weight_reorders() { return packed_weight_reorders_; }

bool conv(const ConvGeom& g, const float* src, const float* wei, const float* bias, float* dst,
          std::shared_ptr<const void> wei_owner) {
  Key k(g.deconv ? 'D' : 'C');
  k.add(g.src).add(g.wei).add(g.wei_strides).add(g.dst).add(g.strides).add(g.dilations).add(g.pad_l).add(g.pad_r);
  k.add(static_cast<int64_t>(bias != nullptr));
  dnnl::primitive p = cache().get(k, [&] { return make_conv(g, bias != nullptr); }, true);
  if (!p) return false;
  const memory::desc src_md = query_md(p, dnnl_query_src_md), wei_md = query_md(p, dnnl_query_weights_md),
                     dst_md = query_md(p, dnnl_query_dst_md);
  const memory::desc src_plain = plain_md(g.src), dst_plain = plain_md(g.dst);
  const memory::desc wei_user(to_dims(g.wei), dt::f32, to_dims(g.wei_strides));
  memory src_u = mem(src_plain, src), dst_u = mem(dst_plain, dst), wei_u = mem(wei_user, wei);
  memory src_m = src_u, dst_m = dst_u, wei_m = wei_u;
  if (src_md != src_plain) {
    src_m = memory(src_md, engine());
    reorder(src_u, src_m);
  }
  if (wei_md != wei_user) {
    if (wei_owner) {
      Key pk = k;
      pk.add(static_cast<int64_t>(reinterpret_cast<uintptr_t>(wei)));
      wei_m = packed_weights(pk.s, wei_owner, wei_u, wei_md);
    } else {
      wei_m = memory(wei_md, engine());
      reorder(wei_u, wei_m);
    }
  }
  if (dst_md != dst_plain) dst_m = memory(dst_md, engine());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, wei_m}, {DNNL_ARG_DST, dst_m}};
  if (bias) args.emplace(DNNL_ARG_BIAS, mem(plain_md({g.dst[1]}), bias));
  execute(p, args);
  if (dst_md != dst_plain) reorder(dst_m, dst_u);
  return true;
}

bool pool(Pool op, const float* src, float* dst, const std::vector<int64_t>& src_dims,
          const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& kernel,
          const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
          const std::vector<int64_t>& pad_l, const std::vector<int64_t>& pad_r) {
  const memory::desc smd = plain_md(src_dims), dmd = plain_md(dst_dims);
  // oneDNN's only pooling for plain NCHW is a scalar loop (simple_nchw: 22 ms for resnet's 16x64x32x32 max pool);
  // its JIT pooling wants channel blocks of 8. Pool in that layout between two reorders when there are whole blocks.
  const bool blocked = (src_dims.size() == 4 || src_dims.size() == 5) && src_dims[1] % 8 == 0;
  const memory::format_tag tag = src_dims.size() == 4 ? memory::format_tag::aBcd8b : memory::format_tag::aBcde8b;
  const memory::desc sbl = blocked ? memory::desc(to_dims(src_dims), dt::f32, tag) : smd;
  const memory::desc dbl = blocked ? memory::desc(to_dims(dst_dims), dt::f32, tag) : dmd;
  Key k('p');
  k.add(static_cast<int64_t>(op)).add(src_dims).add(dst_dims).add(kernel).add(strides).add(dilations).add(pad_l);
  k.add(pad_r);
  dnnl::primitive p = cache().get(
      k,
      [&] {
        const dnnl::algorithm alg = op == Pool::kMax           ? dnnl::algorithm::pooling_max
                                    : op == Pool::kAvgInclPad ? dnnl::algorithm::pooling_avg_include_padding
                                                              : dnnl::algorithm::pooling_avg_exclude_padding;
        dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, sbl, dbl, to_dims(strides),
                                         to_dims(kernel), to_dims(dilations), to_dims(pad_l), to_dims(pad_r));
        return dnnl::primitive(
            dnnl::pooling_v2_forward(dnnl::pooling_v2_forward::primitive_desc(d, attrs(), engine())));
      },
      true);
  if (!p) return false;
  memory src_u = mem(smd, src), dst_u = mem(dmd, dst);
  if (!blocked) {
    execute(p, {{DNNL_ARG_SRC, src_u}, {DNNL_ARG_DST, dst_u}});
    return true;
  }
  memory src_b(sbl, engine()), dst_b(dbl, engine());
  reorder(src_u, src_b);
  execute(p, {{DNNL_ARG_SRC, src_b}, {DNNL_ARG_DST, dst_b}});
  reorder(dst_b, dst_u);
  return true;
}

}  // namespace gspmd::dnn
