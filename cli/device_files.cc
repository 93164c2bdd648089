// Device files (`partition -o DIR`) run again: loaded and checked against the program built from MODEL, and run one
// thread per device on the emulator (`run --program DIR`) or one MPI rank per device (cli/run_mpi.cc).
#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/wiring.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace fs = std::filesystem;

namespace {

std::string meta(const ModelInfo& info, const std::string& key) {
  auto it = info.metadata.find(key);
  return it == info.metadata.end() ? "" : it->second;
}

/// The entries of a device file's gspmd.dim_hints ("batch=17,height=224,nonzero_0=64") that name a symbolic dim of
/// `model`'s inputs, as --hint flags: the data-dependent dims' hints are their bounds, which loading finds itself.
std::vector<std::string> input_dim_hints(const std::string& model, const std::string& dim_hints) {
  std::set<std::string> params;
  for (const auto& dims : read_model_info(model).input_dim_params) params.insert(dims.begin(), dims.end());
  std::vector<std::string> out;
  for (size_t at = 0; at < dim_hints.size();) {
    const size_t end = std::min(dim_hints.find(',', at), dim_hints.size());
    const std::string entry = dim_hints.substr(at, end - at);
    const size_t eq = entry.rfind('=');
    if (eq != std::string::npos && params.count(entry.substr(0, eq))) out.push_back(entry);
    at = end + 1;
  }
  return out;
}

}  // namespace

DeviceFiles::DeviceFiles(const Compiled& p, const CommonOptions& common, std::string dir)
    : p_(p), common_(common), dir_(std::move(dir)) {}

void DeviceFiles::symbolic(const std::string& path, const ModelInfo& info) {
  if (symbolic_fingerprint_) return;
  CommonOptions symbolic = common_;  // the same partition, its dims unbound, at the files' hints (partition --hint)
  symbolic.dims.clear();
  symbolic.inputs_dir.clear();
  symbolic.keep_symbols = true;
  symbolic.hints = input_dim_hints(common_.model, meta(info, "gspmd.dim_hints"));
  const Compiled sp = compile_model(symbolic, /*load_data=*/false);
  symbolic_fingerprint_ = fmt::format("{:016x}", program_fingerprint(sp.program));
  // This run's size of each symbol, read off the model's inputs where they are the symbol.
  DimBindings dims;
  for (size_t k = 0; k < sp.graph.inputs.size() && k < p_.graph.inputs.size(); ++k) {
    const Value& v = sp.graph.values[static_cast<size_t>(sp.graph.inputs[k])];
    for (size_t d = 0; v.sym && d < v.sym->dims.size(); ++d)
      if (const std::string* sym = v.sym->dims[d].as_symbol())
        dims[*sym] = p_.graph.values[static_cast<size_t>(p_.graph.inputs[k])].shape.at(d);
  }
  // What the files assume of the dims (a halo window's shards as wide as its halos): checked here, since an
  // assumption broken could give wrong numbers rather than fail
  for (const auto& [sym, v] : smallest_sizes(sp.program, sp.graph.dim_hints))
    if (dims.count(sym) && dims.at(sym) < v)
      throw InputError(
          fmt::format("{}: the device files serve {} >= {} (halo windows need shards as wide as their "
                      "halos), and this run's {} is {}: run without --program, or partition with --dim",
                      path, sym, v, sym, dims.at(sym)));
  for (const auto& [a, b] : sp.program.program.dim_guards) {
    const std::vector<std::string> syms = a.symbols();
    if (std::all_of(syms.begin(), syms.end(), [&](const std::string& s) { return dims.count(s) != 0; }) &&
        a.eval(dims) != b.eval(dims))
      throw InputError(
          fmt::format("{}: the device files hold where {} == {}, and this run's dims ({}) break it: run "
                      "without --program, or partition with --dim",
                      path, a.str(), b.str(), bindings_str(dims)));
  }
  // The files' gspmd_dims input (a split symbolic dim): those sizes, in the order of the files' symbols.
  if (std::find(info.inputs.begin(), info.inputs.end(), kDimsInput) == info.inputs.end()) return;
  std::vector<int64_t> sizes;
  for (const std::string& sym : input_dim_symbols(sp.graph)) {
    if (!dims.count(sym))
      throw InputError(fmt::format("{}: needs the size of dim '{}', which no input of the model is", path, sym));
    sizes.push_back(dims.at(sym));
  }
  dims_ = Tensor::from_int64s(sizes);
}

Graph DeviceFiles::load(int64_t device) {
  const std::string path = (fs::path(dir_) / fmt::format("device_{}.onnx", device)).string();
  if (!fs::exists(path))
    throw InputError(
        fmt::format("{}: no such file (every device needs its device_<k>.onnx from `partition -o {}`)", path, dir_));
  ModelInfo info = read_model_info(path);
  const std::string dev = meta(info, "gspmd.device"), fp = meta(info, "gspmd.program_fingerprint");
  if (dev.empty() || fp.empty())
    throw InputError(
        fmt::format("{}: not a device model written by `gspmd-onnx partition` (no gspmd.device or "
                    "gspmd.program_fingerprint metadata)",
                    path));
  if (dev != std::to_string(device))
    throw InputError(fmt::format("{}: holds device {}, not device {}", path, dev, device));
  LoadOptions lo = kernel_load_options();
  std::string want = fmt::format("{:016x}", program_fingerprint(p_.program));
  if (!meta(info, "gspmd.dim_hints").empty()) {  // partitioned over the dim symbols (docs/shapes.md)
    symbolic(path, info);
    want = *symbolic_fingerprint_;
    if (dims_) lo.frozen_inputs[kDimsInput] = *dims_;
  }
  if (fp != want)
    throw InputError(
        fmt::format("{}: partitioned from another model, sharding, mesh or target than this run "
                    "(program fingerprint {}, this run's is {}): run partition again",
                    path, fp, want));
  const Graph& prog = p_.program.program;
  for (int v : prog.inputs) lo.input_shapes[prog.values[static_cast<size_t>(v)].name] = prog.values[v].shape;
  Graph g = load_model(path, lo);
  auto same = [&](const char* what, const std::vector<int>& a, const std::vector<int>& b) {
    if (a.size() != b.size())
      throw InputError(fmt::format("{}: has {} graph {}s, the program has {}", path, a.size(), what, b.size()));
    for (size_t k = 0; k < a.size(); ++k) {
      const Value& x = g.values[a[k]];
      const Value& y = prog.values[b[k]];
      if (x.dtype != y.dtype || x.shape != y.shape)
        throw InputError(fmt::format("{}: {} {} '{}' is {}{} but the program's is {}{}", path, what, k, x.name,
                                     dtype_name(x.dtype), shape_str(x.shape), dtype_name(y.dtype), shape_str(y.shape)));
    }
  };
  same("input", g.inputs, prog.inputs);
  same("output", g.outputs, prog.outputs);
  return g;
}

PodRun DeviceFiles::run(const std::vector<Tensor>& inputs, const ExecutorOptions& options) {
  std::vector<Graph> graphs;
  for (int64_t k = 0; k < p_.program.mesh.num_devices(); ++k) graphs.push_back(load(k));
  return run_device_graphs(p_.program, p_.graph, graphs, inputs, options);
}

}  // namespace gspmd::cli
