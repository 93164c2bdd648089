// gspmd-onnx partition: writes DIR/device_<k>.onnx, DIR/shardings.json, DIR/report.json, completely or not at all.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace fs = std::filesystem;

namespace {

/// The model's values with the shardings the program's plan gives them, for --annotated-model: p.graph and its plan,
/// or with --pipeline the values that the model and the pipelined graph share, and each layer weight with its
/// stacked weight's sharding without the stage (and round) dims, and each value inside the layers its stage-stacked
/// copies' sharding without the stage dim when every copy has the same (none otherwise; a value computed from
/// constants has one copy, unstacked), so the file read back with the same --pipeline gives the same plan.
std::pair<Graph, std::vector<TensorSharding>> model_shardings(const Compiled& p) {
  if (!p.pipeline) return {p.graph, p.plan.shardings};
  Graph named;
  std::vector<TensorSharding> shardings;
  auto add = [&](const std::string& name, TensorSharding s) {
    Value v = p.reference->values[static_cast<size_t>(p.reference->at(name))];
    v.producer = -1;
    v.data = nullptr;
    named.add_value(std::move(v));
    s.unreduced.clear();
    s.reduction = ReductionKind::kSum;
    shardings.push_back(std::move(s));
  };
  for (const Value& v : p.reference->values)
    if (const int id = p.graph.find(v.name); id >= 0) add(v.name, p.plan.shardings[static_cast<size_t>(id)]);
  for (const PipelineLayout::StackedWeight& w : p.pipeline->weights) {
    TensorSharding s = p.plan.shardings[static_cast<size_t>(p.graph.at(w.name))];
    s.dims.erase(s.dims.begin(), s.dims.begin() + w.stage_dim + 1);
    for (const std::string& m : w.members)
      if (!m.empty() && named.find(m) < 0) add(m, s);
  }
  for (const auto& [name, v0] : p.pipeline->block_values) {
    auto inst = p.pipeline->block_instances.find(v0);
    if (inst == p.pipeline->block_instances.end() || named.find(name) >= 0) continue;
    const size_t rank = p.reference->values[static_cast<size_t>(p.reference->at(name))].shape.size();
    std::optional<TensorSharding> common;
    for (const std::string& copy : inst->second) {
      TensorSharding s = p.plan.shardings[static_cast<size_t>(p.graph.at(copy))];
      if (s.dims.size() == rank + 1) s.dims.erase(s.dims.begin());  // a stage-stacked copy
      if (common && !(*common == s)) {
        common.reset();
        break;
      }
      common = std::move(s);
    }
    if (common) add(name, std::move(*common));
  }
  return {std::move(named), std::move(shardings)};
}

/// An existing output directory may be replaced only if it holds nothing but what partition writes.
bool is_our_output(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    bool ours = n == "shardings.json" || n == "report.json" || n == "auto.sharding.json" ||
                (n.rfind("device_", 0) == 0 && e.path().extension() == ".onnx");
    if (!ours || !e.is_regular_file()) return false;
  }
  return true;
}

/// --auto: the annotations that produce the chosen plan (the sharding file's constraints and the search's choices),
/// as a short sharding file a user can read, edit and pin with --shardings. One tensor per line, in graph order.
void write_auto_sharding_file(const fs::path& path, const Compiled& p) {
  const Annotations& a = p.auto_result->annotations;  // on the user's mesh
  const DeviceMesh& mesh = a.mesh;
  auto names = [&](const std::vector<int>& axes) {
    nlohmann::json list = nlohmann::json::array();
    for (int x : axes) list.push_back(mesh.axes[x]);
    return list;
  };
  nlohmann::json jm = {{"shape", mesh.shape}, {"axes", mesh.axes}};
  if (mesh.has_device_order()) jm["devices"] = mesh.devices;
  std::string out = "{\n  \"mesh\": " + jm.dump() + ",\n  \"tensors\": {";
  bool first = true;
  for (const auto& [v, ann] : a.by_value) {
    const TensorSharding& s = ann.sharding;
    const nlohmann::json spec = spec_json(s, mesh);
    nlohmann::json entry = spec;
    if (!s.unreduced.empty() || ann.priority != 0) {
      entry = {{"spec", spec}};
      if (!s.unreduced.empty()) entry["unreduced"] = names(s.unreduced);
      if (!s.unreduced.empty() && s.reduction != ReductionKind::kSum)
        entry["reduction"] = std::string(reduction_name(s.reduction));
      if (ann.priority != 0) entry["priority"] = ann.priority;
    }
    out += first ? "\n    " : ",\n    ";
    out += nlohmann::json(p.graph.values[v].name).dump() + ": " + entry.dump();
    first = false;
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  std::ofstream f(path);
  f << out;
  if (!f) throw InputError(fmt::format("{}: cannot write", path.string()));
}

/// The signal that interrupts `partition` while it writes its temporary folder (0: none). The handler only records
/// it; the write loop removes the folder and dies of the signal (docs/cli.md).
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void record_stop_signal(int sig) { g_stop_signal = sig; }

/// SIGINT and SIGTERM recorded (not fatal) while it lives; the previous handlers back after.
struct StopSignals {
  using Handler = void (*)(int);
  Handler old_int, old_term;
  StopSignals()
      : old_int(std::signal(SIGINT, record_stop_signal)), old_term(std::signal(SIGTERM, record_stop_signal)) {}
  ~StopSignals() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
  /// When a signal came: removes `tmp` and dies of that signal, as without the handler.
  static void die_if_stopped(const fs::path& tmp) {
    if (const int sig = g_stop_signal) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
      std::signal(sig, SIG_DFL);
      std::raise(sig);
    }
  }
};

}  // namespace

// The dims a partition over the symbols is checked at (check_symbolic_program): the symbols at 101, 103, 105, ...
// (distinct, and larger than the hints), all at 1, and each at its hint + 2; those that break one of the program's
// guards (the model's seq <= 64 for a 64-row position table, a halo window's height >= 7) are left out. None for a
// static model.
std::vector<DimBindings> check_dims(const Graph& g) {
  if (g.dim_hints.empty()) return {};
  DimBindings large, ones, near;
  int64_t next = 101;
  for (const auto& [sym, hint] : g.dim_hints) {
    large[sym] = next;
    ones[sym] = 1;
    near[sym] = hint + 2;
    next += 2;
  }
  std::vector<DimBindings> r;
  for (const DimBindings& at : {large, ones, near})
    if (std::all_of(g.dim_guards.begin(), g.dim_guards.end(),
                    [&](const auto& guard) { return guard.first.eval(at) == guard.second.eval(at); }))
      r.push_back(at);
  return r;
}

namespace {

// True when the unpartitioned model types at the dims `at` (check_symbolic_program of the model as its own program).
bool model_holds_at(const Graph& g, const DimBindings& at) {
  SpmdProgram whole;
  whole.program = g;
  try {
    check_symbolic_program(whole, g, at);
    return true;
  } catch (const UnsupportedError&) {
    return false;
  }
}

}  // namespace

int cmd_partition(const PartitionOptions& o) {
  if (o.common.mesh)  // early, before the model is read; again below for a mesh from the sharding file
    check_materialized_devices(DeviceMesh::parse(*o.common.mesh), "partition", "writes one file per device");
  if (o.out_dir.empty()) throw InputError("-o: '' is not a directory name");
  fs::path out = fs::absolute(o.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  if (fs::exists(out) && (!fs::is_directory(out) || !is_our_output(out)))
    throw InputError(fmt::format("{}: exists and is not a gspmd-onnx output directory; not overwriting", o.out_dir));
  fs::path annotated;
  if (!o.annotated_model.empty()) {
    annotated = fs::absolute(o.annotated_model).lexically_normal();
    if (annotated.parent_path() == out || annotated == out)
      throw InputError(fmt::format("--annotated-model: {} is inside the output directory {}; write it elsewhere",
                                   o.annotated_model, o.out_dir));
    if (!fs::is_directory(annotated.parent_path()))
      throw InputError(fmt::format("--annotated-model: {}: no such directory", annotated.parent_path().string()));
    // Never over an input: the model, or an annotated model read as the sharding file.
    for (const auto& [input, what] :
         {std::pair{o.common.model, "the input model"}, std::pair{o.common.shardings, "the sharding file read"}}) {
      std::error_code ec;
      if (!input.empty() && fs::exists(annotated) && fs::equivalent(annotated, input, ec))
        throw InputError(fmt::format("--annotated-model: {} is {}; write it elsewhere", o.annotated_model, what));
    }
  }
  CommonOptions common = o.common;
  common.keep_symbols = true;
  Compiled p = compile_model(common);
  check_materialized_devices(p.annotations.mesh.user(), "partition", "writes one file per device");
  for (const DimBindings& at : check_dims(p.program.program)) {  // the soundness check (docs/shapes.md)
    try {
      check_symbolic_program(p.program, p.graph, at);
    } catch (const UnsupportedError&) {
      if (model_holds_at(p.graph, at)) throw;  // else the model itself has no shapes there (a pool over 1 row)
    }
  }

  fs::path tmp = out.parent_path() / fmt::format(".{}.tmp-{}", out.filename().string(), ::getpid());
  const StopSignals stop_signals;  // an interrupted partition leaves no temporary folder
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) throw InputError(fmt::format("{}: cannot create directory: {}", o.out_dir, ec.message()));
  try {
    const int64_t n = p.program.mesh.num_devices();
    ExportOptions eo;
    if (o.collectives == "ort") eo.collectives = CollectiveFormat::kOrt;
    ProgressLine line;
    for (int64_t k = 0; k < n; ++k) {
      StopSignals::die_if_stopped(tmp);
      line.update([&] { return fmt::format("partition: writing device_{}.onnx ({}/{})", k, k + 1, n); });
      export_device(p.program, p.graph, k, (tmp / fmt::format("device_{}.onnx", k)).string(), eo);
    }
    line.finish();
    const ShardingNotation notation = o.notation == "hlo"   ? ShardingNotation::kHlo
                                      : o.notation == "sbp" ? ShardingNotation::kSbp
                                                            : ShardingNotation::kSpec;
    write_sharding_file((tmp / "shardings.json").string(), p.graph, p.program.mesh, p.program.final_shardings,
                        notation);
    if (p.auto_result) write_auto_sharding_file(tmp / "auto.sharding.json", p);
    if (!annotated.empty())  // before DIR appears: a failure leaves neither
      if (auto [named, shardings] = model_shardings(p); true)
        write_annotated_model(o.common.model, named, p.program.mesh, shardings, annotated.string());
    CostReport cost = p.cost(o.common.overlap);
    nlohmann::json report = make_report(p, cost, nullptr, nullptr);
    write_json((tmp / "report.json").string(), report);
    StopSignals::die_if_stopped(tmp);
    if (fs::exists(out)) fs::remove_all(out);
    fs::rename(tmp, out);
    print_summary(report, o.common.model);
    fmt::print("wrote     {}/device_{{0..{}}}.onnx, shardings.json, {}report.json{}\n", o.out_dir, n - 1,
               p.auto_result ? "auto.sharding.json, " : "", annotated.empty() ? "" : ", " + o.annotated_model);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return 0;
}

}  // namespace gspmd::cli
