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
  return spatial_params(node, sd, xs[2 + sd], ys[2 + sd]);
}

Partitioner::SpatialParams Partitioner::spatial_params(const Node& node, int sd, int64_t x, int64_t y) const {
  const size_t k = g_.values[node.inputs[0]].shape.size() - 2;
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
    int64_t total = std::max<int64_t>(0, (y - 1) * p.stride + p.extent - x);
    p.pad_begin = ap == "SAME_UPPER" ? total / 2 : total - total / 2;
    p.pad_end = total - p.pad_begin;
  }
  return p;
}

int64_t Partitioner::spatial_output(const Node& node, int sd, int64_t x) const {
  const std::string ap = node.s("auto_pad", "NOTSET");
  const SpatialParams p = spatial_params(node, sd, x, 1);  // explicit and VALID pads do not depend on y
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") return ceil_div(x, p.stride);
  const int64_t span = x + p.pad_begin + p.pad_end - p.extent;
  return span < 0 ? 0 : span / p.stride + 1;
}

Partitioner::Window Partitioner::window_at(const Node& node, size_t d, const std::vector<int>& axes, int64_t full,
                                           int64_t out, std::string& problem) const {
  const WindowSemantics sem = window_semantics(node);
  Window w;
  w.dim = static_cast<int>(d);
  w.axes = axes;
  w.full = full;
  w.n = mesh_.axes_size(axes);
  w.h_loc = ceil_div(full, w.n);
  w.o_loc = ceil_div(out, w.n);
  const SpatialParams sp = spatial_params(node, w.dim - 2, full, out);
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
  w.full_e = full;
  w.step_e = w.step;
  w.window_e = w.window;
  w.mask_step_e = w.o_loc * w.stride;
  // the rows the real output rows read (a shard's padding rows past `out` compute what is dropped)
  const int64_t lowest = -w.pad_begin, highest = (out - 1) * w.stride - w.pad_begin + sp.extent - 1;
  problem.clear();
  if (sem.average && node.i("count_include_pad", 0) == 0 && (lowest < 0 || highest >= full))
    problem = fmt::format("{} with count_include_pad=0 counts only real rows", node.op_type);
  else if (sem.average && highest >= full + sp.pad_end)
    problem = fmt::format("{} windows run past the padding (ceil_mode)", node.op_type);
  return w;
}

std::string Partitioner::symbolic_window(const Node& node, Window& w) {
  const int gx = node.inputs[0];
  const size_t d = static_cast<size_t>(w.dim);
  const int sd = w.dim - 2;
  // Every size of the window is periodic in the input rows x with period n * stride (x + n*stride rows give n more
  // output rows: one more per shard, and stride more input rows per shard), from the first x with an output row.
  constexpr int64_t kMaxPeriod = int64_t{1} << 16;
  const int64_t period = w.n * w.stride;
  if (period > kMaxPeriod) return fmt::format("its windows repeat only every {} sizes of the symbolic dim", period);
  const SpatialParams sp = spatial_params(node, sd);
  const int64_t first = spatial_output(node, sd, 1) >= 1 ? 1 : sp.extent - sp.pad_begin - sp.pad_end;
  int64_t left = 0, right = 0;
  for (int64_t x = first; x < first + period; ++x) {
    std::string problem;
    const Window at = window_at(node, d, w.axes, x, spatial_output(node, sd, x), problem);
    if (at.pad_begin != w.pad_begin) throw_padding_varies(node, d);
    if (!problem.empty()) return fmt::format("at {} rows, {}", x, problem);
    left = std::max(left, at.left);
    right = std::max(right, at.right);
  }
  if (std::max(left, right) > w.h_loc)
    return fmt::format("its halo ({} + {} rows at some sizes) is wider than a shard ({} rows at the hints)", left,
                       right, w.h_loc);
  const DimExpr full_e = global_dim(gx, d);
  const DimExpr out_e = global_dim(node.outputs[0], d);
  const DimExpr h_e = ceil_div(full_e, w.n), o_e = ceil_div(out_e, w.n);
  w.symbolic = true;
  w.left = left;
  w.right = right;
  w.base = left - w.pad_begin;
  w.full_e = full_e;
  w.step_e = o_e * w.stride - h_e;
  w.window_e = (o_e - 1) * w.stride + sp.extent;
  w.mask_step_e = o_e * w.stride;
  // shards at least as wide as the halos: ceil(full / n) >= max(left, right)
  if (const int64_t widest = std::max(left, right); widest > 1) {
    const DimExpr smallest = w.n * (widest - 1) + 1;
    std::pair<DimExpr, DimExpr> guard{full_e, max(full_e, smallest)};
    if (std::find(out_.dim_guards.begin(), out_.dim_guards.end(), guard) == out_.dim_guards.end())
      out_.dim_guards.push_back(std::move(guard));
  }
  return "";
}

std::vector<Partitioner::Window> Partitioner::plan_windows(const Node& node, const OpShardingRule& rule,
                                                           FactorSharding& F) {
  std::vector<Window> out;
  if (rule.operands.empty()) return out;
  const DimFactors& xf = rule.operands[0];
  const int gx = node.inputs[0];
  for (size_t d = 0; d < xf.size(); ++d) {
    if (xf[d].size() != 1) continue;
    const int f = xf[d][0];
    if (rule.factor_kinds[f] != FactorKind::kWindowed || F[f].empty()) continue;
    std::string problem;
    Window w = window_at(node, d, F[f], g_.values[gx].shape[d], g_.values[node.outputs[0]].shape[d], problem);
    if (w.left > w.h_loc || w.right > w.h_loc)
      problem = fmt::format("its halo ({} + {} rows) is wider than a shard ({} rows)", w.left, w.right, w.h_loc);
    if (problem.empty() && !global_dim(gx, d).is_constant()) problem = symbolic_window(node, w);
    if (!problem.empty()) {
      out_.warnings.push_back(fmt::format("{} ({}): dim {} of '{}' is gathered instead of split over {}: {}", node.name,
                                          node.op_type, d, g_.values[gx].name, axes_str(mesh_, w.axes), problem));
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
    const DType dt = P().values[x].dtype;
    // rows [from, to) of the local shard (from < 0: the last -from rows, whatever the shard's size)
    auto rows = [&](int64_t from, int64_t to) {
      Shape s = P().values[x].shape;
      s[w.dim] = from < 0 ? -from : to - from;
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
    if (w.left > 0)
      parts.push_back(
          permute(w.symbolic ? rows(-w.left, std::numeric_limits<int64_t>::max()) : rows(w.h_loc - w.left, w.h_loc), 1,
                  "left"));
    parts.push_back(x);
    if (w.right > 0) parts.push_back(permute(rows(0, w.right), -1, "right"));
    if (parts.size() > 1) {
      Shape s = P().values[x].shape;
      s[w.dim] = w.left + w.h_loc + w.right;
      x = emit("Concat", parts, name + "/window", dt, s, {{"axis", int64_t{w.dim}}});
    }
    if (w.symbolic || w.base != 0 || w.step != 0 || w.window != w.left + w.h_loc + w.right) {
      Shape s = P().values[x].shape;
      s[w.dim] = w.window;
      x = emit(gspmd_node(ShardSliceAttrs{
                   .axis = w.dim, .mesh_axes = w.axes, .shard_size = w.step, .base = w.base, .size = w.window}),
               {x}, name + "/window", dt, s);
      symbolic_attr("shard_size", w.step_e, w.symbolic);
      symbolic_attr("size", w.window_e, w.symbolic);
    }
    // over a symbolic dim, the last shard's padding rows are masked at every size
    const int64_t lowest = -w.pad_begin, highest = (w.n - 1) * w.o_loc * w.stride - w.pad_begin + w.window - 1;
    if (w.symbolic || lowest < 0 || highest >= w.full) {
      x = emit(gspmd_node(MaskPadAttrs{.axis = w.dim,
                                       .mesh_axes = w.axes,
                                       .full_size = w.full,
                                       .value = w.pad_value,
                                       .base = -w.pad_begin,
                                       .step = w.o_loc * w.stride}),
               {x}, name + "/window", dt, P().values[x].shape);
      symbolic_attr("full_size", w.full_e, w.symbolic);
      symbolic_attr("step", w.mask_step_e, w.symbolic);
    }
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
    // SAME padding resolved at the hints holds for a symbolic dim held whole only if it is the same at every size
    // (it is periodic in the size, with period stride)
    const bool split =
        std::any_of(windows.begin(), windows.end(), [&](const Window& w) { return w.dim == static_cast<int>(sd) + 2; });
    if (!split && !global_dim(global.inputs[0], sd + 2).is_constant())
      for (int64_t x = 1; x <= sp.stride; ++x)
        if (spatial_params(global, static_cast<int>(sd), x, spatial_output(global, static_cast<int>(sd), x)) != sp)
          throw_padding_varies(global, sd + 2);
  }
  for (const Window& w : windows) pads[w.dim - 2] = pads[nsp + w.dim - 2] = 0;
  local.attrs["pads"] = pads;
  local.attrs.erase("auto_pad");
}

void Partitioner::throw_padding_varies(const Node& node, size_t d) const {
  const int gx = node.inputs[0];
  throw UnsupportedError(fmt::format(
      "{} ({}): its SAME padding of the symbolic dim {} ({}) of '{}' changes with the size: bind it with --dim",
      node.name, node.op_type, d, global_dim(gx, d).str(), g_.values[static_cast<size_t>(gx)].name));
}

}  // namespace gspmd::partition_internal
