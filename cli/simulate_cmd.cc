// gspmd-onnx simulate: the run report from the cost model alone (no initializer data read, nothing executed).
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/trace.h"

namespace gspmd::cli {

int cmd_simulate(const SimulateOptions& o) {
  check_output_path(o.report, "--report");
  check_output_path(o.trace, "--trace");
  // The pipeline and the report are left for the process's exit to release, not freed object by object: on a
  // training step of the 96-layer decoder (20k nodes), freeing them took as long as partitioning (bench/README.md).
  Compiled& p = *new Compiled(compile_model(o.common, /*load_data=*/false));
  CostReport cost = p.cost(o.common.overlap);
  nlohmann::json& report = *new nlohmann::json(make_report(p, cost, nullptr, nullptr));
  for (auto& d : report["simulated"]["per_device"]) d["peak_memory_bytes"] = cost.peak_memory_bytes;
  if (!o.report.empty()) write_json(o.report, report);
  if (!o.trace.empty()) write_trace(o.trace, p.program, cost, p.target.name, {}, pipeline_track(p));
  print_summary(report, o.common.model);
  return 0;
}

}  // namespace gspmd::cli
