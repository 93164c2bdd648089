// gspmd-onnx explain: every value's sharding (three notations) with its origin, and every collective with its reason.
#include <fmt/format.h>

#include "cli/commands.h"

namespace gspmd::cli {

int cmd_explain(const ExplainOptions& o) {
  Pipeline p = build_pipeline(o.common);
  const Graph& g = p.graph;
  const DeviceMesh& mesh = p.program.mesh;
  int only = -1;
  if (!o.value.empty()) {
    only = g.find(o.value);
    if (only < 0) throw InputError(fmt::format("--value: no value named '{}' in the model", o.value));
  }
  fmt::print("mesh {} ({} devices){}\n\n", mesh.str(), mesh.num_devices(),
             p.sharding_file.empty() ? "" : ", annotations from " + p.sharding_file);
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    if (only >= 0 && v != only) continue;
    const Value& val = g.values[v];
    const TensorSharding& s = p.program.final_shardings[v];
    fmt::print("{} {} {}\n", val.name, dtype_name(val.dtype), shape_str(val.shape));
    fmt::print("  sharding  {}   hlo {}   sbp {}\n", s.to_partition_spec(mesh), s.to_hlo(mesh), s.to_sbp(mesh));
    if (!(s == p.plan.shardings[v]))
      fmt::print("  planned   {} (the partitioner kept it {})\n", p.plan.shardings[v].to_partition_spec(mesh),
                 s.unreduced.empty() ? "as computed" : "unreduced until a consumer needs it reduced");
    fmt::print("  origin    {}\n", origin_chain(g, p.plan, v));
  }
  fmt::print("\n{} collectives\n", p.program.collectives.size());
  for (const CollectiveRecord& c : p.program.collectives) {
    if (only >= 0 && c.value != g.values[only].name) continue;
    std::vector<std::string> axes;
    for (int a : c.mesh_axes) axes.push_back(mesh.axes[a]);
    fmt::print("  {} over {{{}}} of '{}' ({} bytes per device) for {}: {}\n", c.kind, fmt::join(axes, ","), c.value,
               c.bytes, c.for_node.empty() ? "graph output" : c.for_node, c.reason);
  }
  for (const std::string& w : p.program.warnings) fmt::print("warning: {}\n", w);
  return 0;
}

}  // namespace gspmd::cli
