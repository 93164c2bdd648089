// gspmd-onnx explain: every value's sharding (three notations) with its origin, and every collective with its reason.
#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/html.h"
#include "cli/report.h"

namespace gspmd::cli {

namespace {

/// Device ids as "0,1" or "0,2,...(+6)" (at most four listed).
std::string device_list(const std::vector<int64_t>& ds) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ds.size() && i < 4; ++i) parts.push_back(std::to_string(ds[i]));
  std::string s = fmt::format("{}", fmt::join(parts, ","));
  if (ds.size() > 4) s += fmt::format(",..(+{})", ds.size() - 4);
  return s;
}

std::string plan_line(const AutoPlanCost& c, bool training, const DeviceMesh& mesh) {
  if (!c.valid) return fmt::format("{:<14} cannot be partitioned: {}", c.name, c.error);
  return fmt::format(
      "{:<14} step {:.6g} s (compute {:.6g} s, communication {:.6g} s), peak memory {} bytes per "
      "device{}{}{}{}",
      c.name, c.step_time_s, c.compute_time_s, c.communication_time_s, c.peak_memory_bytes,
      training ? fmt::format(", remat {}", remat_name(c.step.remat)) : "",
      c.step.update_axis >= 0 ? fmt::format(", weight update sharded over '{}'", mesh.axes[c.step.update_axis]) : "",
      c.estimated ? ", estimated" : "", c.fits ? "" : " (does not fit)");
}

/// Why the --auto plan beat the obvious alternatives: their step times and memory next to the chosen one.
void explain_auto(const AutoResult& a, const DeviceMesh& user_mesh, bool training) {
  fmt::print("--auto searched {} plans in {:.3f} s ({} decisions for {} tensors; memory limit {} bytes per device{})\n",
             a.evaluations, a.search_time_s, a.groups, a.variables, a.memory_limit_bytes,
             a.layer_blocks > 0 ? fmt::format("; the classical plans estimated from 1 and 2 of {} alike layer blocks, "
                                              "the chosen one costed on the whole model",
                                              a.layer_blocks)
                                : "");
  fmt::print("  {}\n", plan_line(a.chosen, training, user_mesh));
  for (const AutoPlanCost& b : a.baselines) {
    if (!b.same_as.empty()) {
      fmt::print("  {:<14} the same plan as {} under the annotations\n", b.name, b.same_as);
      continue;
    }
    std::string why;
    if (!b.valid)
      why = "it cannot be partitioned";
    else if (!b.fits)
      why =
          fmt::format("it needs {} bytes per device, over the limit of {}", b.peak_memory_bytes, a.memory_limit_bytes);
    else if (b.step_time_s > a.chosen.step_time_s * (1 + 1e-9))
      why = fmt::format(
          "its step is {:.1f}% longer{}", 100 * (b.step_time_s / a.chosen.step_time_s - 1),
          b.communication_time_s > a.chosen.communication_time_s
              ? fmt::format(" ({:.6g} s more communication)", b.communication_time_s - a.chosen.communication_time_s)
              : "");
    else if (b.peak_memory_bytes > a.chosen.peak_memory_bytes)
      why = "the same step time, more memory";
    else
      why = "nothing: it costs the same as the chosen plan (the search keeps the first plan it reaches at a cost)";
    fmt::print("  {}\n    not chosen: {}\n", plan_line(b, training, user_mesh), why);
  }
  fmt::print("  chosen annotations (layer numbers as #; the rest is propagated):\n");
  for (const AutoChoice& c : a.choices)
    if (c.annotated)
      fmt::print("    {:<40} x{:<3} {}\n", c.group, c.values.size(), c.sharding.to_partition_spec(user_mesh));
  fmt::print("\n");
}

/// What loading did besides converting: constants folded, nodes rewritten for inference, constant nodes left to run
/// (over the folding cap), shape-function disagreements with ONNX inference.
void explain_loading(const LoadReport& r) {
  int64_t bytes = 0;
  for (const LoadReport::Folded& f : r.folded) bytes += f.bytes;
  fmt::print(
      "loading: {} nodes folded into constants ({} bytes), {} rewritten, {} constant nodes kept, {} shape "
      "disagreements\n",
      r.folded.size(), bytes, r.rewrites.size(), r.not_folded.size(), r.shape_disagreements.size());
  for (const LoadReport::Folded& f : r.folded)
    fmt::print("  folded    node '{}' ({}) -> {} ({} bytes)\n", f.node, f.op_type, fmt::join(f.outputs, ", "), f.bytes);
  for (const std::string& s : r.rewrites) fmt::print("  rewritten {}\n", s);
  for (const std::string& s : r.not_folded) fmt::print("  kept      {}\n", s);
  for (const std::string& s : r.shape_disagreements) fmt::print("  shape     {}\n", s);
  fmt::print("\n");
}

/// "[data, model] (FILE: tensors."w")": open dims marked "?" (Shardy's notation), a wholly open annotation "(open)".
std::string annotation_str(const Annotation& a, const DeviceMesh& mesh) {
  std::string spec = "[";
  for (int d = 0; d < a.sharding.rank(); ++d) {
    std::vector<std::string> names = mesh.axis_names(a.sharding.dims[d]);
    if (a.dim_open(d)) names.push_back("?");
    spec += (d ? ", " : "") + (names.empty() ? std::string("null") : fmt::format("{}", fmt::join(names, " ")));
  }
  spec += "]";
  if (!a.sharding.unreduced.empty())
    spec += fmt::format(" unreduced={{{}}}", fmt::join(mesh.axis_names(a.sharding.unreduced), ", "));
  return fmt::format("{}{} ({})", spec, a.open ? " (open)" : "", a.source);
}

/// `explain --constraints`: every annotation, whether it is a constraint or open, what the program holds, and the
/// collectives that reshard the value (after its producer, or for a consumer) with their simulated time.
void explain_constraints(const Compiled& p) {
  const Graph& g = p.graph;
  const DeviceMesh& mesh = p.program.mesh;
  std::map<std::string, std::vector<const CollectiveRecord*>> by_value;
  for (const CollectiveRecord& c : p.program.collectives) by_value[c.value].push_back(&c);
  fmt::print("{} annotations\n", p.annotations.by_value.size());
  for (const auto& [v, a] : p.annotations.by_value) {
    const TensorSharding& held = p.program.final_shardings[v];
    fmt::print("{} {}\n  annotated {}\n", g.values[v].name, shape_str(g.values[v].shape), annotation_str(a, mesh));
    if (a.open)
      fmt::print("  open      a starting point only: the program holds {}\n", held.to_partition_spec(mesh));
    else if (!(held == a.sharding))
      fmt::print("  open dims extended by propagation: the program holds {}\n", held.to_partition_spec(mesh));
    const auto it = by_value.find(g.values[v].name);
    if (it == by_value.end()) {
      fmt::print("  kept      as computed; no collective reshards it\n");
      continue;
    }
    double seconds = 0;
    for (const CollectiveRecord* c : it->second) {
      const double t = collective_time(c->kind, static_cast<double>(c->bytes), c->mesh_axes, mesh, p.target);
      seconds += t;
      fmt::print("  resharded {} over {{{}}}, {} bytes per device, {:.3g} s, for {}: {}\n", collective_name(c->kind),
                 fmt::join(mesh.axis_names(c->mesh_axes), ","), c->bytes, t,
                 c->for_node.empty() ? "graph output" : c->for_node, c->reason);
    }
    fmt::print("  cost      {} collective{}, {:.3g} s per step\n", it->second.size(), it->second.size() == 1 ? "" : "s",
               seconds);
  }
}

/// --pipeline: what the transformation built (docs/pipeline.md).
void explain_pipeline(const PipelineLayout& l, const std::string& axis) {
  fmt::print(
      "pipeline: {} over '{}', {} stages, {} microbatches of {} rows (batch rows i*{} + m), {} iterations, "
      "bubble {:.1f}%\n",
      schedule_name(l.schedule), axis, l.stages, l.microbatches, l.microbatch, l.microbatches, l.iterations,
      100 * l.bubble);
  for (size_t s = 0; s < l.stage_layers.size(); ++s) {
    std::vector<std::string> layers;
    for (int64_t k : l.stage_layers[s]) layers.push_back(l.block_name(k));
    fmt::print("  stage {} runs layers {}\n", s, fmt::join(layers, ", "));
  }
  fmt::print(
      "  {} stacked weights (stage dim over '{}'), e.g. '{}'; a shift per iteration (a collective-permute "
      "over '{}')\n",
      l.weights.size(), axis, l.weights.empty() ? "" : l.weights.front().name, axis);
  fmt::print(
      "  the prefix ({} nodes, before layer {}) and the suffix ({} nodes) run replicated over '{}'; the last "
      "stage's results are all-reduced over '{}' where the suffix reads them\n\n",
      l.prefix_nodes, l.stage_layers.empty() || l.stage_layers[0].empty() ? 0 : l.stage_layers[0][0], l.suffix_nodes,
      axis, axis);
}

}  // namespace

namespace {

/// The real (unpadded) extent of each of `shards` shards of a dim of `size` (ceil(size / shards) each, the last ones
/// short or empty).
std::vector<int64_t> shard_extents(int64_t size, int64_t shards) {
  const int64_t per = (size + shards - 1) / shards;
  std::vector<int64_t> out;
  for (int64_t k = 0; k < shards; ++k) out.push_back(std::clamp<int64_t>(size - k * per, 0, per));
  return out;
}

/// Boxes of `cell` (rows x cols, each the devices holding that shard), drawn as jax.debug.visualize_array_sharding
/// does, each box as wide (tall) as its shard's real extent `col_extent[c]` (`row_extent[r]`) against the full shard:
/// padded shards are drawn smaller (DTensor's visualize_sharding shows the ranges instead; we do both).
std::string boxes(const std::vector<std::vector<std::vector<int64_t>>>& cell, const std::vector<int64_t>& row_extent,
                  const std::vector<int64_t>& col_extent) {
  const size_t rows = cell.size(), cols = cell[0].size();
  size_t label = 0;
  for (const auto& row : cell)
    for (const auto& c : row) label = std::max(label, device_list(c).size());
  const int64_t row_full = *std::max_element(row_extent.begin(), row_extent.end());
  const int64_t col_full = *std::max_element(col_extent.begin(), col_extent.end());
  const bool uneven_cols = *std::min_element(col_extent.begin(), col_extent.end()) < col_full;
  const bool uneven_rows = *std::min_element(row_extent.begin(), row_extent.end()) < row_full;
  // Even shards: every box as wide as the widest label, one line tall. Uneven: the full width doubled and two lines,
  // scaled by each shard's extent (never narrower than its label).
  const double full_width = static_cast<double>(label + 2) * (uneven_cols ? 2 : 1);
  std::vector<size_t> width(cols);
  for (size_t c = 0; c < cols; ++c)
    width[c] = std::max<size_t>(
        label + 2, static_cast<size_t>(std::lround(full_width * static_cast<double>(col_extent[c]) / col_full)));
  auto line = [&](const char* l, const char* m, const char* r) {
    std::string out = l;
    for (size_t c = 0; c < cols; ++c) {
      for (size_t i = 0; i < width[c]; ++i) out += "─";
      out += c + 1 < cols ? m : r;
    }
    return out + "\n";
  };
  std::string out = line("┌", "┬", "┐");
  for (size_t r = 0; r < rows; ++r) {
    const int64_t height =
        uneven_rows ? std::max<int64_t>(1, std::lround(2.0 * static_cast<double>(row_extent[r]) / row_full)) : 1;
    for (int64_t h = 0; h < height; ++h) {
      out += "│";
      for (size_t c = 0; c < cols; ++c)
        out += fmt::format("{:^{}}│", h == 0 ? device_list(cell[r][c]) : std::string(), width[c]);
      out += "\n";
    }
    out += r + 1 < rows ? line("├", "┼", "┤") : line("└", "┴", "┘");
  }
  return out;
}

}  // namespace

/// A picture of how a value is laid out on the mesh, in the manner of jax.debug.visualize_array_sharding: one box
/// per shard, listing the devices that hold it. A 1-D or 2-D value is drawn whole; a value of higher rank as 2-D
/// slices over its last two split dims (or its last two dims when fewer are split), one picture per tile of its other
/// split dims (at most 4). More than 16x16 shards get no picture.
std::string sharding_picture(const Shape& shape, const TensorSharding& s, const DeviceMesh& mesh) {
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) return "";
  std::vector<int> split;
  for (int d = 0; d < rank; ++d)
    if (s.shards(d, mesh) > 1) split.push_back(d);
  int row_dim = -1, col_dim = rank - 1;  // row_dim -1: one row
  if (rank == 2) row_dim = 0;
  if (rank > 2) {
    if (split.size() >= 2) row_dim = split[split.size() - 2];
    if (!split.empty()) col_dim = split.back();
    if (split.size() < 2) row_dim = col_dim == rank - 1 ? rank - 2 : rank - 1;
    if (row_dim > col_dim) std::swap(row_dim, col_dim);
  }
  const int64_t rows = row_dim < 0 ? 1 : s.shards(row_dim, mesh), cols = s.shards(col_dim, mesh);
  if (rows > 16 || cols > 16) return "";
  std::vector<int> others;  // split dims not drawn: one picture per tile of theirs
  for (int d : split)
    if (d != row_dim && d != col_dim) others.push_back(d);
  std::vector<int> other_axes;
  for (int d : others) other_axes.insert(other_axes.end(), s.dims[d].begin(), s.dims[d].end());
  const int64_t slices = mesh.axes_size(other_axes);
  std::string out;
  for (int64_t t = 0; t < std::min<int64_t>(slices, 4); ++t) {
    std::vector<std::vector<std::vector<int64_t>>> cell(rows, std::vector<std::vector<int64_t>>(cols));
    for (int64_t d = 0; d < mesh.num_devices(); ++d)
      if (mesh.tile_index(d, other_axes) == t)
        cell[row_dim < 0 ? 0 : mesh.tile_index(d, s.dims[row_dim])][mesh.tile_index(d, s.dims[col_dim])].push_back(d);
    if (rank > 2)
      out +=
          fmt::format("dims {} x {}{}\n", row_dim, col_dim,
                      others.empty() ? std::string()
                                     : fmt::format(", tile {} of {} over dims {}", t, slices, fmt::join(others, ",")));
    out += boxes(cell, row_dim < 0 ? std::vector<int64_t>{1} : shard_extents(shape[row_dim], rows),
                 shard_extents(shape[col_dim], cols));
  }
  if (slices > 4) out += fmt::format("({} more slices)\n", slices - 4);
  if (!s.unreduced.empty()) out += "(each box holds a partial value: the devices listed in a box sum to it)\n";
  return out;
}

std::string shard_ranges(const Shape& shape, const TensorSharding& s, const DeviceMesh& mesh) {
  if (!s.is_tiled()) return "";
  std::vector<std::pair<std::string, std::vector<int64_t>>> ranges;  // (range, devices), in device order
  std::map<std::string, size_t> index;
  for (int64_t dev = 0; dev < mesh.num_devices(); ++dev) {
    std::vector<std::string> dims;
    bool empty = false;
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      const int64_t at = std::min(s.offset(d, shape, mesh, dev), shape[d]), n = s.valid(d, shape, mesh, dev);
      empty |= n == 0;
      dims.push_back(s.shards(d, mesh) == 1 ? ":" : fmt::format("{}:{}", at, at + n));
    }
    std::string r = fmt::format("[{}]{}", fmt::join(dims, ", "), empty ? " (padding only)" : "");
    auto [it, fresh] = index.emplace(r, ranges.size());
    if (fresh) ranges.emplace_back(r, std::vector<int64_t>{});
    ranges[it->second].second.push_back(dev);
  }
  std::string out = "  shards    (index ranges, as DTensor's visualize_sharding lists them)\n";
  constexpr size_t kListed = 32;
  for (size_t i = 0; i < ranges.size() && i < kListed; ++i)
    out += fmt::format("    {:<24} device{} {}\n", ranges[i].first, ranges[i].second.size() == 1 ? "" : "s",
                       device_list(ranges[i].second));
  if (ranges.size() > kListed) out += fmt::format("    ({} more shards)\n", ranges.size() - kListed);
  return out;
}

std::vector<std::string> unreduced_origins(const Compiled& p, int v) {
  const Graph& g = p.graph;
  const DeviceMesh& mesh = p.program.mesh;
  std::vector<std::string> out;
  for (int a : p.program.final_shardings[static_cast<size_t>(v)].unreduced) {
    const std::string axis = mesh.axis_names({a})[0];
    int cur = v;
    std::string line;
    for (size_t steps = 0; steps < g.nodes.size() && line.empty() && cur >= 0; ++steps) {
      const int n = g.values[static_cast<size_t>(cur)].producer;
      const OpShardingRule* rule = n >= 0 ? p.rules.rule(n) : nullptr;
      if (!rule) break;
      const Node& node = g.nodes[static_cast<size_t>(n)];
      // The operands whose contracted dim is split over the axis; the one annotated itself is named first.
      int next = -1, best = -1, best_dim = -1;
      for (size_t i = 0; i < node.inputs.size() && i < rule->operands.size(); ++i) {
        const int in = node.inputs[i];
        if (in < 0) continue;
        // As planned, or as the program holds it (a layout the partitioner chose for the contraction).
        const TensorSharding& s = p.plan.shardings[static_cast<size_t>(in)];
        const TensorSharding& held = p.program.final_shardings[static_cast<size_t>(in)];
        auto split = [&](const TensorSharding& t, int d) {
          if (d >= t.rank()) return false;
          const std::vector<int>& axes = t.dims[static_cast<size_t>(d)];
          return std::find(axes.begin(), axes.end(), a) != axes.end();
        };
        const DimFactors& df = rule->operands[i];
        for (int d = 0; d < std::max(s.rank(), held.rank()) && d < static_cast<int>(df.size()); ++d) {
          const bool contracted =
              (split(s, d) || split(held, d)) && std::any_of(df[d].begin(), df[d].end(), [&](int f) {
                return rule->factor_kinds[static_cast<size_t>(f)] == FactorKind::kReduction;
              });
          if (contracted && (best < 0 || p.plan.axis_origins[static_cast<size_t>(in)][static_cast<size_t>(a)] == in))
            best = in, best_dim = d;
        }
        if (next < 0 && std::find(held.unreduced.begin(), held.unreduced.end(), a) != held.unreduced.end()) next = in;
      }
      if (best >= 0) {
        const int from = p.plan.axis_origins[static_cast<size_t>(best)][static_cast<size_t>(a)];
        const auto ann = p.annotations.by_value.find(from);
        line = fmt::format(
            "{} from {} ({}), which reduces over dim {} of '{}', split over {}{}", axis, node.name, node.op_type,
            best_dim, g.values[static_cast<size_t>(best)].name, axis,
            from < 0 ? " (by no annotation: a layout the partitioner chose)"
                     : fmt::format(" by annotation {}{}", g.values[static_cast<size_t>(from)].name,
                                   ann == p.annotations.by_value.end() ? "" : " (" + ann->second.source + ")"));
      }
      cur = next;
    }
    if (!line.empty()) out.push_back(std::move(line));
  }
  return out;
}

int cmd_explain(const ExplainOptions& o) {
  if (!o.html.empty()) check_output_path(o.html, "--html");
  Compiled p = compile_model(o.common);
  if (!o.html.empty()) {
    const CostReport cost = p.cost(o.common.overlap);
    write_explain_html(o.html, o.common.model, p, cost, make_report(p, cost, nullptr, nullptr));
  }
  const Graph& g = p.graph;
  const DeviceMesh& mesh = p.program.mesh;
  int only = -1;
  if (!o.value.empty()) {
    only = g.find(o.value);
    if (only < 0) throw InputError(fmt::format("--value: no value named '{}' in the model", o.value));
  }
  fmt::print("mesh {} ({} devices{}){}\n\n", mesh.str(), mesh.num_devices(),
             mesh.has_device_order() ? fmt::format(" in the order {}", fmt::join(mesh.devices, ",")) : "",
             p.sharding_file.empty() ? "" : ", annotations from " + p.sharding_file);
  if (o.constraints) {
    explain_constraints(p);
    return 0;
  }
  if (only < 0) explain_loading(p.load_report);
  if (only < 0 && p.pipeline) explain_pipeline(*p.pipeline, p.pipeline_axis);
  if (p.auto_result) explain_auto(*p.auto_result, p.annotations.mesh.user(), p.training.has_value());
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    if (only >= 0 && v != only) continue;
    const Value& val = g.values[v];
    const TensorSharding& s = p.program.final_shardings[v];
    fmt::print("{} {} {}\n", val.name, dtype_name(val.dtype), val.sym ? dims_str(val.sym->dims) : shape_str(val.shape));
    fmt::print("  sharding  {}   hlo {}   sbp {}\n", s.to_partition_spec(mesh), s.to_hlo(mesh), s.to_sbp(mesh));
    const std::vector<char> runtime = runtime_dims_of(g, v);
    for (size_t d = 0; d < runtime.size(); ++d)
      if (runtime[d])
        for (const std::string& sym : val.sym->dims[d].symbols())
          if (auto rt = g.runtime_dims.find(sym); rt != g.runtime_dims.end())
            fmt::print("  dim {}     {} reads {}, {} (node '{}', {}): known only at run time, so never split\n", d,
                       val.sym->dims[d].str(), sym, rt->second.what, rt->second.node,
                       rt->second.bound < 0
                           ? std::string("unbounded")
                           : fmt::format("at most {}{}", rt->second.bound, rt->second.given ? ", from --dim" : ""));
    if (!(s == p.plan.shardings[v]))
      fmt::print("  planned   {} (the partitioner kept it {})\n", p.plan.shardings[v].to_partition_spec(mesh),
                 s.unreduced.empty() ? "as computed" : "unreduced until a consumer needs it reduced");
    if (auto a = p.annotations.by_value.find(v); a != p.annotations.by_value.end())
      fmt::print("  annotated {}: {}\n", annotation_str(a->second, mesh),
                 a->second.open ? "open, a starting point only" : "a constraint the program keeps");
    fmt::print("  origin    {}\n", origin_chain(g, p.plan, v));
    if (const std::string axes = axis_origins_str(g, p.plan, p.annotations.by_value, mesh, v); !axes.empty())
      fmt::print("  axes      {}\n", axes);
    for (const std::string& line : unreduced_origins(p, v)) fmt::print("  unreduced {}\n", line);
    for (const LoadReport::Folded& f : p.load_report.folded)
      if (std::find(f.outputs.begin(), f.outputs.end(), val.name) != f.outputs.end())
        fmt::print("  folded    at load: node '{}' ({}) evaluated once on constants\n", f.node, f.op_type);
    if (only >= 0) {
      fmt::print("{}{}", sharding_picture(val.shape, s, mesh), shard_ranges(val.shape, s, mesh));
    }
  }
  // With --value, the collectives of that value: the count is of the ones listed.
  std::vector<const CollectiveRecord*> listed;
  for (const CollectiveRecord& c : p.program.collectives)
    if (only < 0 || c.value == g.values[only].name) listed.push_back(&c);
  if (only < 0)
    fmt::print("\n{} collectives\n", listed.size());
  else
    fmt::print("\n{} of the program's {} collectives move '{}'\n", listed.size(), p.program.collectives.size(),
               g.values[only].name);
  for (const CollectiveRecord* cp : listed) {
    const CollectiveRecord& c = *cp;
    const std::vector<std::string> axes = mesh.axis_names(c.mesh_axes);
    fmt::print("  {} over {{{}}} of '{}' ({} bytes per device) for {}: {}\n", collective_name(c.kind),
               fmt::join(axes, ","), c.value, c.bytes, c.for_node.empty() ? "graph output" : c.for_node, c.reason);
  }
  for (const std::string& w : p.program.warnings) fmt::print("warning: {}\n", w);
  return 0;
}

}  // namespace gspmd::cli
