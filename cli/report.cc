// The report (report.json) of a compiled model, and the CLI's output helpers (cli/report.h). The human summary
// printed from it: summary.cc; --check's comparisons: check.cc.
#include "cli/report.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "core/sharding/padding.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {
namespace {

nlohmann::json cost_json(const AutoPlanCost& c, const DeviceMesh& mesh) {
  nlohmann::json j = {{"name", c.name}, {"valid", c.valid}};
  if (!c.same_as.empty()) j["same_as"] = c.same_as;
  if (!c.valid) {
    j["error"] = c.error;
    return j;
  }
  j["step_time_s"] = c.step_time_s;
  j["compute_time_s"] = c.compute_time_s;
  j["communication_time_s"] = c.communication_time_s;
  j["peak_memory_bytes"] = c.peak_memory_bytes;
  j["fits"] = c.fits;
  j["estimated"] = c.estimated;
  j["remat"] = remat_name(c.step.remat);
  j["shard_update"] = c.step.update_axis >= 0 ? nlohmann::json(mesh.axes[c.step.update_axis]) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json auto_json(const AutoResult& a, const Graph& g, const DeviceMesh& mesh) {
  nlohmann::json choices = nlohmann::json::array();
  for (const AutoChoice& c : a.choices) {
    std::vector<std::string> names;
    for (int v : c.values) names.push_back(g.values[v].name);
    choices.push_back(
        {{"group", c.group},
         {"values", names},
         {"spec", c.annotated ? nlohmann::json::parse(c.sharding.to_partition_spec(mesh)) : nlohmann::json(nullptr)},
         {"free", !c.annotated}});
  }
  nlohmann::json baselines = nlohmann::json::array();
  for (const AutoPlanCost& b : a.baselines) baselines.push_back(cost_json(b, mesh));
  return {{"search_time_s", a.search_time_s},
          {"evaluations", a.evaluations},
          {"variables", a.variables},
          {"groups", a.groups},
          {"sweeps", a.sweeps},
          {"starts", a.starts},
          {"budget_exhausted", a.budget_exhausted},
          {"layer_blocks", a.layer_blocks},
          {"memory_limit_bytes", a.memory_limit_bytes},
          {"chosen", cost_json(a.chosen, mesh)},
          {"baselines", baselines},
          {"choices", choices}};
}

}  // namespace

std::string human_bytes(double b) {
  if (b >= 1 << 30) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (b >= 1 << 20) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{:.0f} B", b);
}

std::string human_time(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} us", s * 1e6);
}

namespace {

using nlohmann::json;

/// The report's "simulated": the step's times, per device, and the memory at the peak.
json simulated_json(const Compiled& p, const CostReport& cost, const PodRun* run) {
  const DeviceMesh& mesh = p.program.mesh;
  json sim;
  // The per-device and per-collective lists have thousands of entries on a pod-sized training step: each entry is
  // built in place and moved, not copied out of an initializer list (make_report was 15% of `simulate --training`).
  json per_device = json::array();
  per_device.get_ref<json::array_t&>().reserve(static_cast<size_t>(mesh.num_devices()));
  for (int64_t d = 0; d < mesh.num_devices(); ++d) {
    json& e = per_device.emplace_back(json::object());
    e["device"] = d;
    e["compute_s"] = cost.compute_time_s;
    e["communication_s"] = cost.communication_time_s;
    if (run) e["peak_memory_bytes"] = run->devices[d].peak_memory_bytes;
  }
  sim["overlap"] = cost.overlap;
  sim["step_time_s"] = cost.step_time_s;
  sim["compute_time_s"] = cost.compute_time_s;
  sim["communication_time_s"] = cost.communication_time_s;
  sim["flops_utilization"] = cost.flops_utilization;
  sim["per_device"] = std::move(per_device);
  {
    json at_peak, total;
    for (size_t k = 0; k < kMemoryKinds; ++k) {
      const std::string name(memory_kind_name(static_cast<MemoryKind>(k)));
      at_peak[name] = cost.memory.at_peak[k];
      if (static_cast<MemoryKind>(k) != MemoryKind::kTransient) total[name] = cost.memory.total[k];
    }
    const int pn = cost.memory.peak_node;
    sim["memory"] = {{"peak_bytes", cost.memory.peak_bytes},
                     {"peak_node", pn >= 0 ? p.program.program.nodes[static_cast<size_t>(pn)].name : std::string()},
                     {"at_peak", std::move(at_peak)},
                     {"total", std::move(total)}};
  }
  return sim;
}

/// The report's "collectives": one entry per (kind, node, value, axes, bytes, reason), in first-seen order, with its
/// count and time.
json collectives_json(const Compiled& p) {
  const DeviceMesh& mesh = p.program.mesh;
  const std::vector<CollectiveRecord>& records = p.program.collectives;
  auto same = [&](size_t a, size_t b) {
    const CollectiveRecord &x = records[a], &y = records[b];
    return x.kind == y.kind && x.bytes == y.bytes && x.mesh_axes == y.mesh_axes && x.for_node == y.for_node &&
           x.value == y.value && x.reason == y.reason;
  };
  auto hash = [&](size_t a) {
    const CollectiveRecord& x = records[a];
    size_t h = std::hash<std::string>()(x.for_node) ^ (std::hash<std::string>()(x.value) * 31);
    return h ^ (static_cast<size_t>(x.bytes) * 1000003u) ^ static_cast<size_t>(x.kind);
  };
  std::unordered_map<size_t, size_t, decltype(hash), decltype(same)> first(records.size(), hash, same);
  std::vector<std::pair<size_t, int>> order;  // (first record, count)
  for (size_t i = 0; i < records.size(); ++i) {
    auto [it, added] = first.try_emplace(i, order.size());
    if (added)
      order.emplace_back(i, 1);
    else
      ++order[it->second].second;
  }
  json colls = json::array();
  colls.get_ref<json::array_t&>().reserve(order.size());
  for (const auto& [i, count] : order) {
    const CollectiveRecord& c = records[i];
    json& e = colls.emplace_back(json::object());
    e["kind"] = std::string(collective_name(c.kind));
    e["node"] = c.for_node;
    e["value"] = c.value;
    e["axes"] = mesh.axis_names(c.mesh_axes);
    e["bytes"] = c.bytes;
    e["count"] = count;
    e["time_s"] = collective_time(c.kind, static_cast<double>(c.bytes), c.mesh_axes, mesh, p.target);
    e["reason"] = c.reason;
  }
  return colls;
}

/// The report's "padding": the split dims whose shards are padded.
json padding_json(const Compiled& p) {
  const DeviceMesh& mesh = p.program.mesh;
  json pads = json::array();
  for (const PaddedDim& d : padded_interface_dims(p.graph, p.plan.shardings, mesh))
    pads.push_back({{"value", p.graph.values[static_cast<size_t>(d.value)].name},
                    {"dim", d.dim},
                    {"size", d.size},
                    {"axes", mesh.axis_names(d.axes)},
                    {"shards", d.shards},
                    {"per_shard", d.per_shard},
                    {"padding", d.padding()},
                    {"empty_shards", d.empty_shards()}});
  return pads;
}

/// The report's "training": the step's loss, weights, remat and weight-update sharding.
json training_json(const Compiled& p) {
  json weights = json::array();
  int64_t bytes = 0;
  for (const TrainingStep::Weight& w : p.training->weights) {
    const Value& v = p.graph.values[static_cast<size_t>(p.graph.at(w.name))];
    bytes += v.nbytes();
    json& e = weights.emplace_back(json::object());
    e["name"] = w.name;
    e["grad"] = w.grad;
    e["updated"] = w.updated;
    e["shape"] = v.shape;
    e["bytes"] = v.nbytes();
  }
  json tr;
  tr["loss"] = p.training->loss;
  tr["weights"] = std::move(weights);
  tr["weight_bytes"] = bytes;
  tr["unused"] = p.training->unused;
  tr["ignored"] = p.training->ignored;
  tr["remat"] = remat_name(p.training->remat);
  tr["shard_update"] = p.shard_update.empty() ? json(nullptr) : json(p.shard_update);
  tr["recomputed_nodes"] = p.training->recomputed_nodes;
  tr["recomputed_flops"] = p.training->recomputed_flops;
  return tr;
}

/// The report's "auto_stages": --pipeline auto's stage counts.
json stages_json(const Compiled& p) {
  json st = json::array();
  for (const StageSearchEntry& e : p.stage_search) {
    json x = {{"stages", e.stages}, {"microbatches", e.microbatches}, {"fits", e.fits}};
    if (e.error.empty())
      x["step_s"] = e.step_s, x["peak_bytes"] = e.peak_bytes, x["sharding"] = e.sharding;
    else
      x["error"] = e.error;
    st.push_back(std::move(x));
  }
  return st;
}

/// What a run measured and checked: "host", "check", "expected".
void add_results(json& j, const PodRun* run, const CheckResult* check, const ExpectedResult* expected) {
  if (run) {
    j["host"] = {{"wall_s", run->wall_s}, {"gflops", run->wall_s > 0 ? run->host_flops / run->wall_s / 1e9 : 0.0}};
  }
  if (check) {
    j["check"] = {{"passed", check->passed},
                  {"max_abs_error", check->max_abs_error},
                  {"max_rel_error", check->max_rel_error},
                  {"tolerance", check->tolerance}};
    if (!check->passed) j["check"]["worst"] = check->worst;
    for (const CheckResult::Amplified& a : check->amplified)
      j["check"]["amplified"].push_back(
          {{"weight", a.weight}, {"elements", a.elements}, {"of", a.total}, {"max_abs_error", a.max_abs_error}});
  }
  if (expected) {
    json outs = json::array();
    for (const ExpectedResult::Output& o : expected->outputs)
      outs.push_back({{"name", o.name},
                      {"file", o.file},
                      {"passed", o.check.passed},
                      {"max_abs_error", o.check.max_abs_error},
                      {"max_rel_error", o.check.max_rel_error}});
    j["expected"] = {{"dir", expected->dir}, {"passed", expected->passed}, {"outputs", outs}};
    if (!expected->passed) j["expected"]["worst"] = expected->worst;
  }
}

}  // namespace

nlohmann::json make_report(const Compiled& p, const CostReport& cost, const PodRun* run, const CheckResult* check,
                           const ExpectedResult* expected) {
  const Target& t = p.target;
  const DeviceMesh& mesh = p.program.mesh;
  json j;
  const DeviceMesh user = mesh.user();
  j["mesh"] = {{"shape", user.shape}, {"axes", user.axes}};
  if (user.has_device_order()) j["mesh"]["devices"] = user.devices;
  j["devices"] = mesh.num_devices();
  j["target"] = t.name;
  j["target_spec"] = json::parse(t.to_json());   // every number the cost model used (loadable with --target FILE)
  j["device_order"] = t.device_order_str(mesh);  // which mesh axes lie along which physical dim
  j["sharding_file"] = p.sharding_file;
  j["sharding_file_implicit"] = p.sharding_file_implicit;
  j["precision"] = precision_name(p.precision);
  if (!p.graph.dim_hints.empty()) {  // partition over the dim symbols: every size below is at these hints
    j["dim_hints"] = json::object();
    for (const auto& [sym, hint] : p.graph.dim_hints) j["dim_hints"][sym] = hint;
    for (const auto& [sym, least] : smallest_sizes(p.program, p.graph.dim_hints)) j["smallest_sizes"][sym] = least;
  }
  for (const auto& [sym, d] : p.graph.runtime_dims)  // known only at run time: costed at their bounds
    j["data_dependent_dims"][sym] = {
        {"bound", d.bound}, {"bound_from", d.given ? "--dim" : "the op"}, {"counts", d.what}, {"node", d.node}};
  j["model_flops"] = cost.model_flops;
  j["compile_time_s"] = {{"load", p.times.load},
                         {"propagate", p.times.propagate},
                         {"partition", p.times.partition},
                         {"measure_ops", p.times.measure_ops},
                         {"cost", p.times.cost}};
  j["simulated"] = simulated_json(p, cost, run);
  j["collectives"] = collectives_json(p);
  j["warnings"] = p.program.warnings;
  j["padding"] = padding_json(p);
  if (p.training) j["training"] = training_json(p);
  if (p.auto_result) j["auto"] = auto_json(*p.auto_result, p.graph, p.annotations.mesh.user());
  if (p.pipeline)
    j["pipeline"] = pipeline_json(*p.pipeline, p.pipeline_axis, p.microbatch_search, prefix_and_suffix(p));
  if (!p.stage_search.empty()) j["auto_stages"] = stages_json(p);
  add_results(j, run, check, expected);
  return j;
}

std::string prefix_and_suffix(const Compiled& p) {
  const int axis = p.annotations.mesh.axis_index(p.pipeline_axis);
  auto sharding = [&](const std::string& name) -> const TensorSharding* {
    const int v = p.graph.find(name);
    return v >= 0 && static_cast<size_t>(v) < p.plan.shardings.size() ? &p.plan.shardings[static_cast<size_t>(v)]
                                                                      : nullptr;
  };
  const TensorSharding* stream = sharding(p.pipeline->stream);
  const TensorSharding* results = sharding(p.pipeline->results);
  const std::vector<int> stream_axes = stream ? stream->tiled_axes() : std::vector<int>();
  const bool prefix_split = std::find(stream_axes.begin(), stream_axes.end(), axis) != stream_axes.end();
  const bool suffix_split = results && !results->dims.empty() &&
                            std::find(results->dims[0].begin(), results->dims[0].end(), axis) != results->dims[0].end();
  return fmt::format("prefix {} over {}, suffix with its batch {} over {}", prefix_split ? "split" : "replicated",
                     p.pipeline_axis, suffix_split ? "split" : "replicated", p.pipeline_axis);
}

nlohmann::json pipeline_json(const PipelineLayout& l, const std::string& axis,
                             const std::vector<MicrobatchCandidate>& search, const std::string& prefix_and_suffix) {
  nlohmann::json j;
  j["axis"] = axis;
  j["schedule"] = schedule_name(l.schedule);
  j["stages"] = l.stages;
  j["microbatches"] = l.microbatches;
  j["microbatch"] = l.microbatch;
  j["layers"] = l.layers;
  j["layers_per_block"] = l.layers_per_block;
  j["rounds"] = l.rounds;
  j["layers_per_iteration"] = l.slots;
  j["iterations"] = l.iterations;
  j["padding_slots"] = l.padded;
  j["bubble_fraction"] = l.bubble;
  j["stage_layers"] = l.stage_layers;
  j["shifts"] = l.shifts.size();
  j["prefix_nodes"] = l.prefix_nodes;
  j["suffix_nodes"] = l.suffix_nodes;
  j["prefix_and_suffix"] = prefix_and_suffix;
  if (!search.empty()) {
    nlohmann::json& s = j["auto_microbatches"] = nlohmann::json::array();
    for (const MicrobatchCandidate& c : search)
      s.push_back(
          {{"microbatches", c.microbatches}, {"step_s", c.step_s}, {"peak_bytes", c.peak_bytes}, {"fits", c.fits}});
  }
  return j;
}

void write_outputs(const std::string& dir, const Graph& g, const LoadReport& signature,
                   const std::vector<Tensor>& outputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw InputError(fmt::format("{}: cannot create directory (--outputs): {}", dir, ec.message()));
  const std::vector<OnnxValue> values = unflatten_outputs(g, signature, outputs);
  for (size_t i = 0; i < values.size(); ++i)
    write_value_pb((std::filesystem::path(dir) / fmt::format("output_{}.pb", i)).string(), values[i],
                   signature.outputs[i].name);
}

std::pair<int, std::string> error_exit(const std::exception& e) {
  if (dynamic_cast<const InputError*>(&e)) return {2, first_line(e.what())};
  if (dynamic_cast<const UnsupportedError*>(&e)) return {3, "unsupported: " + first_line(e.what())};
  if (const auto* f = dynamic_cast<const std::filesystem::filesystem_error*>(&e))
    return {2, fmt::format("{}: {}", cut_text(f->path1().string(), 200), f->code().message())};
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return {2, "out of memory: the model's or the inputs' sizes need more than this machine has"};
  if (dynamic_cast<const std::length_error*>(&e))
    return {2, fmt::format("a size past what this machine can allocate ({})", first_line(e.what()))};
  return {4, "internal error: " + first_line(e.what())};
}

void check_output_path(const std::string& path, const char* flag, bool folder) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const std::string shown = cut_text(path, 200);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st) && (folder ? !fs::is_directory(st) : !fs::is_regular_file(st)))
    throw InputError(fmt::format("{}: {}: exists and is not a {}", flag, shown, folder ? "directory" : "regular file"));
  if (folder) return;  // its missing parents are created
  fs::path parent = fs::absolute(path, ec).parent_path();
  if (ec || !fs::is_directory(parent, ec)) throw InputError(fmt::format("{}: {}: no such directory", flag, shown));
  if (::access(parent.c_str(), W_OK) != 0)
    throw InputError(fmt::format("{}: {}: cannot write: {}", flag, shown, std::strerror(errno)));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
  f << j.dump(2) << "\n";
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
}

void write_atomically(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp);
  if (!f) throw InputError(fmt::format("{}: cannot write", path));
  write(f);
  f.close();
  std::error_code ec;
  if (!f || (std::filesystem::rename(tmp, path, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    throw InputError(fmt::format("{}: cannot write", path));
  }
}

nlohmann::json spec_json(const TensorSharding& s, const DeviceMesh& mesh) {
  nlohmann::json spec = nlohmann::json::array();
  for (const auto& dim : s.dims) {
    nlohmann::json names = nlohmann::json::array();
    for (int a : dim) names.push_back(mesh.axes[static_cast<size_t>(a)]);
    spec.push_back(names.empty() ? nlohmann::json(nullptr) : names.size() == 1 ? names[0] : names);
  }
  return spec;
}

}  // namespace gspmd::cli
