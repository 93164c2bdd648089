// oneDNN 2.6 wrappers (see onednn.h): matmul (C = alpha * op(A) op(B) + beta * C, batched, batch broadcast) and
// matmul_fused (matmul with oneDNN post-ops: bias, output scale, binary operands, GELU).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "backend/kernels/onednn_impl.h"
#include "core/ir/ir.h"

namespace gspmd::dnn {

using namespace detail;

namespace {

/// One matmul call on dims (batch may be absent: 2-D).
dnnl::primitive matmul_prim(bool batched, int64_t a_batch, int64_t b_batch, int64_t batch, int64_t m, int64_t k,
                            int64_t n, bool ta, bool tb, float alpha, float beta, memory::desc& amd, memory::desc& bmd,
                            memory::desc& cmd, bool allow_unimplemented) {
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

void matmul(const float* a, const float* b, float* c, int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
            bool trans_a, bool trans_b, float alpha, float beta) {
  const int64_t batch = std::max(a_batch, b_batch);
  memory::desc amd, bmd, cmd;
  if (batch == 1 || (b_batch == 1 && !trans_a)) {
    // Shared weights: fold A's batch into M.
    dnnl::primitive p =
        matmul_prim(false, 1, 1, 1, batch * m, k, n, trans_a, trans_b, alpha, beta, amd, bmd, cmd, false);
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
    execute(p,
            {{DNNL_ARG_SRC, mem(amd, ai)}, {DNNL_ARG_WEIGHTS, mem(bmd, bi)}, {DNNL_ARG_DST, mem(cmd, c + i * m * n)}});
  }
}

namespace {

/// matmul_fused's primitive and memory descriptors. Folds A's batch into M (one 2-D product) when B has no batch and
/// every post-op operand folds too; otherwise a 3-D batched product.
struct FusedMatmul {
  dnnl::primitive prim;  // empty: unimplemented
  memory::desc a, b, c;
  memory::desc bias;               // zero desc: no bias
  float scale = 1.f;               // output scale
  size_t first = 0;                // post-ops before this one are the bias or the scale, not oneDNN post-ops
  std::vector<memory::desc> src1;  // per post-op (empty desc for eltwise)
};

FusedMatmul fused_matmul_prim(int64_t a_batch, int64_t b_batch, int64_t m, int64_t k, int64_t n,
                              const std::vector<PostOp>& post) {
  const int64_t batch = std::max(a_batch, b_batch);
  bool fold = batch == 1 || b_batch == 1;
  for (const PostOp& p : post) {
    if (p.kind != PostOp::Kind::kBinary) continue;
    if (p.src1_dims.size() != 3) throw InternalError("matmul_fused: src1 dims must be [batch, M, N]");
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
        dnnl::matmul::desc d =
            !f.bias.is_zero() ? dnnl::matmul::desc(f.a, f.b, f.bias, f.c) : dnnl::matmul::desc(f.a, f.b, f.c);
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

}  // namespace gspmd::dnn
