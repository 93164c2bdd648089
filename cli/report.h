// The JSON report of partition / run (schema: docs/cli.md) and the terminal summary.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "backend/pod/pod.h"
#include "cli/commands.h"
#include "core/cost/cost.h"

namespace gspmd::cli {

/// Result of --check: outputs of the partitioned run against the unpartitioned one.
struct CheckResult {
  bool passed = true;
  double max_abs_error = 0;  // max |partitioned - reference| over all outputs
  double max_rel_error = 0;  // per output: max |partitioned - reference| / max |reference| (normwise)
  std::string worst;         // "output 'logits' element 123: 1.5 vs 1.49"
};

/// Compares outputs elementwise: passes when |a-b| <= atol + rtol*|b| everywhere (integers and bools: exactly).
CheckResult compare_outputs(const Graph& g, const std::vector<Tensor>& got, const std::vector<Tensor>& want,
                            double rtol, double atol);

/// Builds the report (docs/cli.md fields, plus "target_spec" and "device_order" from p.target). `run` and `check` may
/// be null (partition, simulate: no measured fields). With --auto, "auto" holds the search: time, evaluations, the
/// chosen plan's cost, the baselines' and every group's choice.
nlohmann::json make_report(const Pipeline& p, const CostReport& cost, const PodRun* run, const CheckResult* check);

/// Writes each ONNX output of `signature` as DIR/output_<i>.pb (ONNX test-data layout, named as the output; a
/// sequence or optional as its proto, from the graph's flattened `outputs`), creating DIR. Throws InputError naming
/// the file when it cannot be written.
void write_outputs(const std::string& dir, const Graph& g, const LoadReport& signature,
                   const std::vector<Tensor>& outputs);

/// Writes `j` to `path` (pretty-printed); throws InputError("PATH: cannot write") on failure.
void write_json(const std::string& path, const nlohmann::json& j);

/// Prints the human summary of a report to stdout.
void print_summary(const nlohmann::json& report, const std::string& model);

}  // namespace gspmd::cli
