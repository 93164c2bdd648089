// oneDNN 2.6 wrappers (see onednn.h): convolution and deconvolution (weights reordered to oneDNN's blocked layout,
// kept while their owner lives) and pooling.
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "backend/kernels/onednn_impl.h"
#include "core/ir/ir.h"

namespace gspmd::dnn {

using namespace detail;

namespace {

/// A convolution (or deconvolution) primitive of geometry `g` whose src, weights and dst formats oneDNN picks
/// (format_tag::any; query_md tells which). Throws dnnl::error when oneDNN has no implementation.
dnnl::primitive make_conv(const ConvGeom& g, bool bias) {
  const memory::desc src_any(to_dims(g.src), dt::f32, memory::format_tag::any);
  const memory::desc wei_any(to_dims(g.wei), dt::f32, memory::format_tag::any);
  const memory::desc dst_any(to_dims(g.dst), dt::f32, memory::format_tag::any);
  const memory::desc bias_md = bias ? plain_md({g.dst[1]}) : memory::desc();
  const memory::dims st = to_dims(g.strides), dl = to_dims(g.dilations), pl = to_dims(g.pad_l), pr = to_dims(g.pad_r);
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
    throw InternalError(std::string("oneDNN: ") + e.what());
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
  dnnl::primitive p = cache().get(
      k, [&] { return make_conv(g, bias != nullptr); }, true);
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
          const std::vector<int64_t>& dst_dims, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
          const std::vector<int64_t>& dilations, const std::vector<int64_t>& pad_l, const std::vector<int64_t>& pad_r) {
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
        const dnnl::algorithm alg = op == Pool::kMax          ? dnnl::algorithm::pooling_max
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
