// The partitioner's windowed handler (GSPMD paper §3.4, "halo exchange"): a Conv or pooling op whose spatial dim is
// split over devices. Each device receives the rows its window needs from its neighbours (collective-permute), takes
// its window at its own offset (ShardSlice) and masks the rows outside the global input with the op's padding value
// (MaskPad); the local op then runs without padding on that dim. Spatial parameters follow the ONNX Conv and
// MaxPool specs (auto_pad resolved against the global output size).
#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {
namespace {

WindowSemantics window_semantics(const Node& node) {
  const OpHandler* h = find_handler(node);
  return h ? h->window : WindowSemantics{};
}

}  // namespace

/// Kernel extent, stride and begin padding of spatial dim `sd` of a Conv/pool node, with auto_pad resolved
/// against the global output size (ONNX Conv / MaxPool specs).
Partitioner::SpatialParams Partitioner::spatial_params(const Node& node, int sd) const {
  const Shape& xs = g_.values[node.inputs[0]].shape;
  const Shape& ys = g_.values[node.outputs[0]].shape;
  const size_t k = xs.size() - 2;
  std::vector<int64_t> kernel = node.ints("kernel_shape");
  if (kernel.empty() && window_semantics(node).kernel_from_weights) {
    const Shape& ws = g_.values[node.inputs[1]].shape;
    kernel.assign(ws.begin() + 2, ws.end());
  }
  std::vector<int64_t> strides = node.ints("strides", std::vector<int64_t>(k, 1));
  std::vector<int64_t> dil = node.ints("dilations", std::vector<int64_t>(k, 1));
  std::vector<int64_t> pads = node.ints("pads", std::vector<int64_t>(2 * k, 0));
  SpatialParams p{(kernel.at(sd) - 1) * dil.at(sd) + 1, strides.at(sd), pads.at(sd), pads.at(k + sd)};
  const std::string ap = node.s("auto_pad", "NOTSET");
  if (ap == "VALID") {
    p.pad_begin = p.pad_end = 0;
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    int64_t total = std::max<int64_t>(0, (ys[2 + sd] - 1) * p.stride + p.extent - xs[2 + sd]);
    p.pad_begin = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
    p.pad_end = total - p.pad_begin;
  }
  return p;
}

std::vector<Partitioner::Window> Partitioner::plan_windows(const Node& node, const OpShardingRule& rule,
                                                           FactorSharding& F) {
  std::vector<Window> out;
  if (rule.operands.empty()) return out;
  const WindowSemantics sem = window_semantics(node);
  const DimFactors& xf = rule.operands[0];
  for (size_t d = 0; d < xf.size(); ++d) {
    if (xf[d].size() != 1) continue;
    const int f = xf[d][0];
    if (rule.factor_kinds[f] != FactorKind::kWindowed || F[f].empty()) continue;
    Window w;
    w.dim = static_cast<int>(d);
    w.axes = F[f];
    w.full = g_.values[node.inputs[0]].shape[d];
    w.n = mesh_.axes_size(w.axes);
    w.h_loc = ceil_div(w.full, w.n);
    w.o_loc = ceil_div(g_.values[node.outputs[0]].shape[d], w.n);
    SpatialParams sp = spatial_params(node, static_cast<int>(d) - 2);
    w.stride = sp.stride;
    w.pad_begin = sp.pad_begin;
    w.window = (w.o_loc - 1) * w.stride + sp.extent;
    // Offsets are linear in t, so the extreme halos are at t = 0 or t = n - 1.
    const int64_t drift = w.o_loc * w.stride - w.h_loc;  // how much further each tile's window starts
    w.left = std::max<int64_t>({0, w.pad_begin, w.pad_begin - (w.n - 1) * drift});
    w.right =
        std::max<int64_t>({0, w.window - w.pad_begin - w.h_loc, (w.n - 1) * drift + w.window - w.pad_begin - w.h_loc});
    w.base = w.left - w.pad_begin;
    w.step = drift;
    w.pad_value = sem.pad_value;
    const int64_t lowest = -w.pad_begin, highest = (w.n - 1) * w.o_loc * w.stride - w.pad_begin + w.window - 1;
    const bool reads_outside = lowest < 0 || highest >= w.full;
    std::string problem;
    if (w.left > w.h_loc || w.right > w.h_loc)
      problem = fmt::format("its halo ({} + {} rows) is wider than a shard ({} rows)", w.left, w.right, w.h_loc);
    else if (sem.average && node.i("count_include_pad", 0) == 0 && reads_outside)
      problem = fmt::format("{} with count_include_pad=0 counts only real rows", node.op_type);
    else if (sem.average && (lowest < -sp.pad_begin || highest >= w.full + sp.pad_end))
      problem = fmt::format("{} windows run past the padding (ceil_mode)", node.op_type);
    if (!problem.empty()) {
      out_.warnings.push_back(fmt::format("{} ({}): dim {} of '{}' is gathered instead of split over {}: {}", node.name,
                                          node.op_type, d, g_.values[node.inputs[0]].name, axes_str(mesh_, w.axes),
                                          problem));
      F[f].clear();
      continue;
    }
    out.push_back(std::move(w));
  }
  return out;
}

int Partitioner::exchange_halos(const Node& node, int x, const std::vector<Window>& windows) {
  const int gx = node.inputs[0];
  const std::string& name = g_.values[gx].name;
  for (const Window& w : windows) {
    require_static_dim(gx, static_cast<size_t>(w.dim), fmt::format("{} ({}): a halo window", node.name, node.op_type));
    const DType dt = P().values[x].dtype;
    auto rows = [&](int64_t from, int64_t to) {
      Shape s = P().values[x].shape;
      s[w.dim] = to - from;
      return emit("Slice", {x, int64_const("starts", {from}), int64_const("ends", {to}), int64_const("axes", {w.dim})},
                  name + "/halo", dt, s);
    };
    auto permute = [&](int v, int64_t shift, const std::string& side) {
      return collective(
          {.kind = Collective::kCollectivePermute, .mesh_axes = w.axes, .shift = shift}, v, P().values[v].shape,
          node.name, gx,
          fmt::format("{} ({}) reads {} rows of '{}' dim {} from its {} neighbour over {} (halo)", node.name,
                      node.op_type, P().values[v].shape[w.dim], name, w.dim, side, axes_str(mesh_, w.axes)));
    };
    std::vector<int> parts;
    if (w.left > 0) parts.push_back(permute(rows(w.h_loc - w.left, w.h_loc), 1, "left"));
    parts.push_back(x);
    if (w.right > 0) parts.push_back(permute(rows(0, w.right), -1, "right"));
    if (parts.size() > 1) {
      Shape s = P().values[x].shape;
      s[w.dim] = w.left + w.h_loc + w.right;
      x = emit("Concat", parts, name + "/window", dt, s, {{"axis", int64_t{w.dim}}});
    }
    if (w.base != 0 || w.step != 0 || w.window != w.left + w.h_loc + w.right) {
      Shape s = P().values[x].shape;
      s[w.dim] = w.window;
      x = emit(gspmd_node(ShardSliceAttrs{
                   .axis = w.dim, .mesh_axes = w.axes, .shard_size = w.step, .base = w.base, .size = w.window}),
               {x}, name + "/window", dt, s);
    }
    const int64_t lowest = -w.pad_begin, highest = (w.n - 1) * w.o_loc * w.stride - w.pad_begin + w.window - 1;
    if (lowest < 0 || highest >= w.full)
      x = emit(gspmd_node(MaskPadAttrs{.axis = w.dim,
                                       .mesh_axes = w.axes,
                                       .full_size = w.full,
                                       .value = w.pad_value,
                                       .base = -w.pad_begin,
                                       .step = w.o_loc * w.stride}),
               {x}, name + "/window", dt, P().values[x].shape);
  }
  return x;
}

void Partitioner::set_window_attrs(Node& local, const Node& global, const std::vector<Window>& windows) const {
  const size_t nsp = g_.values[global.inputs[0]].shape.size() - 2;
  std::vector<int64_t> pads(2 * nsp, 0);
  for (size_t sd = 0; sd < nsp; ++sd) {
    SpatialParams sp = spatial_params(global, static_cast<int>(sd));
    pads[sd] = sp.pad_begin;
    pads[nsp + sd] = sp.pad_end;
  }
  for (const Window& w : windows) pads[w.dim - 2] = pads[nsp + w.dim - 2] = 0;
  local.attrs["pads"] = pads;
  local.attrs.erase("auto_pad");
}

}  // namespace gspmd::partition_internal
