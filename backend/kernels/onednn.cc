// oneDNN 2.6 wrappers (see onednn.h): what the wrappers share (engine, stream, primitive cache, execution;
// onednn_impl.h) and the elementwise, binary, transpose, softmax, layer-norm and reduction primitives. The matmuls are
// in onednn_matmul.cc, convolution and pooling in onednn_conv.cc.
#include "backend/kernels/onednn.h"
#include "core/ir/ir.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "backend/kernels/onednn_impl.h"

namespace gspmd::dnn {
namespace detail {

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

Cache& cache() {
  static Cache c;
  return c;
}

memory::dims to_dims(const std::vector<int64_t>& v) { return memory::dims(v.begin(), v.end()); }

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

dnnl::primitive_attr attrs() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

memory::desc query_md(const dnnl::primitive& p, dnnl_query_t what) {
  const dnnl_memory_desc_t* md = dnnl_primitive_desc_query_md(p.get_primitive_desc(), what, 0);
  return md ? memory::desc(*md) : memory::desc();
}

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
    throw InternalError(std::string("oneDNN: ") + e.what());
  }
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
  throw InternalError("binary op");
}

}  // namespace detail

using namespace detail;

namespace {

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
    case Eltwise::kReciprocal:
      alpha = 1.f;
      beta = -1.f;
      return dnnl::algorithm::eltwise_pow;
  }
  throw InternalError("eltwise op");
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
  throw InternalError("reduce op");
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
                                         log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate, md, md,
                                         axis);
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

}  // namespace gspmd::dnn
