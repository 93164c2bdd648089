// gspmd-onnx run: partition, run on the emulated pod, check, report.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "backend/pod/pod.h"
#include "cli/commands.h"
#include "cli/executor_env.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/trace.h"
#include "cli/wiring.h"
#include "core/ir/ir.h"
#include "core/ir/precision.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace fs = std::filesystem;

namespace {

/// Upper bound for pseudo-random integer inputs: the indexed dim of the table when the input feeds Gather's
/// indices (token ids stay in vocabulary), OneHot's depth when it feeds OneHot's indices (training labels), else 2.
int64_t int_bound(const Graph& g, int v, const std::vector<std::vector<int>>& consumers) {
  for (int n : consumers[v]) {
    const Node& node = g.nodes[n];
    if (node.op_type == "Gather" && node.inputs.size() == 2 && node.inputs[1] == v) {
      const Shape& s = g.values[node.inputs[0]].shape;
      int64_t axis = node.i("axis", 0);
      if (axis < 0) axis += static_cast<int64_t>(s.size());
      return s.at(axis);
    }
    if (node.op_type == "OneHot" && node.inputs.size() == 3 && node.inputs[0] == v) {  // labels stay in the classes
      const Value& depth = g.values[node.inputs[1]];
      if (depth.data) return std::max<int64_t>(1, depth.data->as_int64s().at(0));
    }
  }
  return 2;
}

/// The index inputs read from files, against the dims they index (Gather's and GatherElements' indices, OneHot's),
/// before the run: the unpartitioned run refuses an index out of range, and a partitioned lookup whose table is split
/// (Megatron's vocab-parallel embedding) must not answer it with zeros. Indices computed inside the model are checked
/// by the kernels. Throws InputError("FILE: input 'ids' holds index 512 (element 3), out of range for Gather
/// '/wte/Gather' (axis 0 of size 512)").
void check_index_inputs(const Graph& g, const std::vector<Tensor>& inputs, const std::vector<std::string>& files) {
  std::unordered_map<int, size_t> input_at;  // value id -> position in g.inputs
  for (size_t f = 0; f < g.inputs.size(); ++f) input_at.emplace(g.inputs[f], f);
  for (const Node& n : g.nodes) {
    if (!n.domain.empty()) continue;
    int indices = -1;
    int64_t size = 0, axis = 0;
    if ((n.op_type == "Gather" || n.op_type == "GatherElements") && n.inputs.size() == 2) {
      indices = n.inputs[1];
      const Shape& data = g.values[n.inputs[0]].shape;
      axis = n.i("axis", 0);
      if (axis < 0) axis += static_cast<int64_t>(data.size());
      if (axis < 0 || axis >= static_cast<int64_t>(data.size())) continue;  // the kernel reports it
      size = data[static_cast<size_t>(axis)];
    } else if (n.op_type == "OneHot" && n.inputs.size() == 3 && g.values[n.inputs[1]].data) {
      indices = n.inputs[0];
      size = g.values[n.inputs[1]].data->as_int64s().at(0);
      axis = n.i("axis", -1);
    }
    auto at = input_at.find(indices);
    const DType t = at == input_at.end() ? DType::kUndefined : inputs[at->second].dtype;
    if (t != DType::kInt64 && t != DType::kInt32 && t != DType::kInt16 && t != DType::kInt8 && t != DType::kUInt8)
      continue;
    const std::vector<int64_t> ids = inputs[at->second].as_int64s();
    for (size_t e = 0; e < ids.size(); ++e)
      if (ids[e] < -size || ids[e] >= size)
        throw InputError(
            fmt::format("{}: input '{}' holds index {} (element {}), out of range for {} '{}' (axis {} of "
                        "size {})",
                        files[at->second], g.values[indices].name, ids[e], e, n.op_type, n.name, axis, size));
  }
}

}  // namespace

std::vector<Tensor> make_inputs(const Graph& g, const LoadReport& signature, const RunOptions& o,
                                const TrainingStep* step) {
  if (!o.common.inputs_dir.empty()) {
    // One file per ONNX input (a tensor, sequence or optional), flattened as the model was loaded.
    std::vector<OnnxValue> values;
    std::vector<std::string> paths;
    for (size_t i = 0; i < signature.inputs.size(); ++i) {
      paths.push_back((fs::path(o.common.inputs_dir) / fmt::format("input_{}.pb", i)).string());
      values.push_back(read_value_pb(paths.back(), signature.inputs[i].structure.kind));
    }
    std::vector<Tensor> inputs = flatten_inputs(g, signature, std::move(values));
    for (size_t i = 0, f = 0; i < signature.inputs.size(); ++i)
      for (size_t e = 0; e < signature.inputs[i].values.size(); ++e, ++f) {
        const Tensor& t = inputs[f];
        const Value& v = g.values[g.inputs[f]];
        if (t.shape != v.shape || t.dtype != v.dtype)
          throw InputError(fmt::format("{}: {} {} but input '{}' is {} {}", paths[i], dtype_name(t.dtype),
                                       shape_str(t.shape), v.name, dtype_name(v.dtype), shape_str(v.shape)));
      }
    check_no_extra_files(o.common.inputs_dir, "input", signature.inputs.size(), "--inputs");
    std::vector<std::string> file_of;  // per g.inputs entry: the file it was read from
    for (size_t i = 0; i < signature.inputs.size(); ++i)
      file_of.insert(file_of.end(), signature.inputs[i].values.size(), paths[i]);
    check_index_inputs(g, inputs, file_of);
    return inputs;
  }
  std::vector<Tensor> inputs;
  std::mt19937_64 rng(o.seed);
  auto consumers = g.consumers();
  std::unordered_set<std::string> zeros;  // the variables' optimizer state
  if (step)
    for (const TrainingStep::Weight& w : step->weights) zeros.insert(w.state.begin(), w.state.end());
  for (int v : g.inputs) {
    const Value& val = g.values[v];
    Tensor t(val.dtype, val.shape);
    const int64_t n = t.numel();
    if (zeros.count(val.name)) {
      inputs.push_back(std::move(t));  // Tensor's storage starts zeroed
      continue;
    }
    switch (val.dtype) {
      case DType::kFloat32: {
        std::normal_distribution<float> d(0.f, 1.f);
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = d(rng);
        break;
      }
      case DType::kFloat16:
      case DType::kBFloat16: {
        std::normal_distribution<float> d(0.f, 1.f);
        const bool f16 = val.dtype == DType::kFloat16;
        for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = f16 ? float_to_half(d(rng)) : float_to_bf16(d(rng));
        break;
      }
      case DType::kFloat64: {
        std::normal_distribution<double> d(0.0, 1.0);
        for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = d(rng);
        break;
      }
      case DType::kInt64:
      case DType::kInt32: {
        std::uniform_int_distribution<int64_t> d(0, int_bound(g, v, consumers) - 1);
        for (int64_t i = 0; i < n; ++i) {
          if (val.dtype == DType::kInt64)
            t.data<int64_t>()[i] = d(rng);
          else
            t.data<int32_t>()[i] = static_cast<int32_t>(d(rng));
        }
        break;
      }
      case DType::kBool: {
        std::bernoulli_distribution d(0.5);
        for (int64_t i = 0; i < n; ++i) t.data<uint8_t>()[i] = d(rng);
        break;
      }
      default:
        throw UnsupportedError(
            fmt::format("input '{}': cannot generate {} data; pass --inputs", val.name, dtype_name(val.dtype)));
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

namespace {

/// --check of a graph that computes in 16 bits: the graph retyped to float32 (set_precision kF32) and run on one
/// device with `inputs` widened, the anchor compare_outputs measures the reference's own rounding against. Empty
/// when the graph has no 16-bit value or cannot be retyped (then the fixed 16-bit tolerance alone applies).
std::vector<Tensor> float32_run(const Graph& g, const std::vector<Tensor>& inputs, const RunProgress& progress,
                                const ExecutorOptions& exec) {
  if (compute_precision(g) == DType::kUndefined) return {};
  Graph f = g;
  try {
    set_precision(f, Precision::kF32, {}, kernel_load_options().shape_function);
  } catch (const UnsupportedError&) {
    return {};
  }
  std::vector<Tensor> wide;
  for (const Tensor& t : inputs)
    wide.push_back(t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat16 ? widen_half(t) : t);
  return run_single(f, wide, progress, exec).outputs;
}

/// The inputs of `ref` (the model, or its training step) from the program's `inputs` (p.graph's), by name: the same
/// tensor, or, for a layer weight that --pipeline stacked into a graph input (Compiled::stacked_inputs), its row of
/// the stacked tensor (PipelineLayout::weights: member i is row i in row-major order over the lead dims).
std::vector<Tensor> reference_inputs(const Compiled& p, const Graph& ref, const std::vector<Tensor>& inputs) {
  auto input_of = [&](const std::string& name) -> const Tensor* {
    const int v = p.graph.find(name);
    const auto at = std::find(p.graph.inputs.begin(), p.graph.inputs.end(), v);
    return v < 0 || at == p.graph.inputs.end() ? nullptr : &inputs.at(static_cast<size_t>(at - p.graph.inputs.begin()));
  };
  std::vector<Tensor> out;
  for (int v : ref.inputs) {
    const Value& val = ref.values[static_cast<size_t>(v)];
    if (const Tensor* t = input_of(val.name)) {
      out.push_back(*t);
      continue;
    }
    const Tensor* stacked = nullptr;
    size_t row = 0, rows = 1;
    if (p.pipeline)
      for (const PipelineLayout::StackedWeight& w : p.pipeline->weights)
        for (size_t i = 0; i < w.members.size() && !stacked; ++i)
          if (w.members[i] == val.name && (stacked = input_of(w.name))) row = i, rows = w.members.size();
    if (!stacked) throw InternalError(fmt::format("run --check: no input of the program for '{}'", val.name));
    Tensor t(val.dtype, val.shape);
    const size_t bytes = stacked->bytes.size() / rows;
    if (bytes != t.bytes.size())
      throw InternalError(fmt::format("run --check: '{}' is not a row of its stacked input", val.name));
    std::memcpy(t.bytes.data(), stacked->bytes.data() + row * bytes, bytes);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

CheckResult check_against_reference(const Compiled& p, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& outputs, double rtol, double atol,
                                    const RunProgress& progress, const ExecutorOptions& exec) {
  if (!p.reference || !p.reference_training) {  // the model itself (with --pipeline: as loaded; same signature)
    const Graph& ref = p.reference ? *p.reference : p.graph;
    const std::vector<Tensor> ref_inputs = p.stacked_inputs ? reference_inputs(p, ref, inputs) : inputs;
    const std::vector<Tensor> anchor =
        p.training ? float32_run(ref, ref_inputs, progress, exec) : std::vector<Tensor>();
    return compare_outputs(p.graph, outputs, run_single(ref, ref_inputs, progress, exec).outputs, rtol, atol,
                           p.training ? &*p.training : nullptr, &inputs, anchor.empty() ? nullptr : &anchor);
  }
  // --pipeline --training: the model's own step, fed by input name, and the program's outputs in its terms.
  const TrainingStep ref =
      build_training_step(*p.reference, *p.reference_training, kernel_load_options().shape_function);
  const std::vector<Tensor> ref_inputs = reference_inputs(p, ref.graph, inputs);
  std::map<std::string, const Tensor*> got;
  for (size_t k = 0; k < p.graph.outputs.size(); ++k)
    got[p.graph.values[static_cast<size_t>(p.graph.outputs[k])].name] = &outputs[k];
  // A layer weight's outputs are rows of its stacked weight's: "<member><suffix>" is row i of "<stacked><suffix>".
  std::map<std::string, std::pair<std::string, size_t>> member;  // layer weight -> (stacked weight, row)
  for (const PipelineLayout::StackedWeight& w : p.pipeline->weights)
    for (size_t i = 0; i < w.members.size(); ++i)
      if (!w.members[i].empty()) member[w.members[i]] = {w.name, i};
  std::vector<Tensor> mine;
  for (int v : ref.graph.outputs) {
    const std::string& name = ref.graph.values[static_cast<size_t>(v)].name;
    if (auto it = got.find(name); it != got.end()) {
      mine.push_back(*it->second);
      continue;
    }
    const Tensor* row_of = nullptr;
    size_t row = 0, rows = 0;
    for (auto m = member.upper_bound(name); m != member.begin();) {
      --m;
      if (name.compare(0, m->first.size(), m->first) != 0) continue;
      auto it = got.find(m->second.first + name.substr(m->first.size()));
      if (it == got.end()) continue;
      row_of = it->second;
      row = m->second.second;
      for (const auto& w : p.pipeline->weights)
        if (w.name == m->second.first) rows = w.members.size();
      break;
    }
    if (!row_of) throw InternalError(fmt::format("--pipeline --training: no output of the step for '{}'", name));
    const Value& rv = ref.graph.values[static_cast<size_t>(v)];
    Tensor t(rv.dtype, rv.shape);
    const size_t bytes = row_of->bytes.size() / rows;
    if (bytes != t.bytes.size())
      throw InternalError(fmt::format("--pipeline --training: '{}' is not a row of its stacked output", name));
    std::memcpy(t.bytes.data(), row_of->bytes.data() + row * bytes, bytes);
    mine.push_back(std::move(t));
  }
  return compare_outputs(ref.graph, mine, run_single(ref.graph, ref_inputs, progress, exec).outputs, rtol, atol, &ref,
                         &ref_inputs);
}

void check_fits_memory(const Graph& g) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  for (const Value& v : g.values) {  // at most 2^50 bytes each (the loader's limit): no overflow
    const double bytes = static_cast<double>(num_elements(v.shape)) * static_cast<double>(dtype_size(v.dtype));
    if (bytes > memory)
      throw InputError(
          fmt::format("value '{}' has the shape {}: {:.3g} bytes, more than this machine's memory ({:.3g} "
                      "bytes)",
                      cut_text(v.name), cut_text(shape_str(v.shape), 200), bytes, memory));
  }
}

int cmd_run(const RunOptions& o) {
  if (o.backend == "mpi") return cmd_run_mpi(o);
  if (o.warmup != 1) throw InputError("--warmup: needs --backend mpi (the emulator executes once)");
  if (o.repeat != 1) throw InputError("--repeat: needs --backend mpi (the emulator executes once)");
  if (o.common.mesh)  // early, before the model is read; again below for a mesh from the sharding file
    check_materialized_devices(DeviceMesh::parse(*o.common.mesh), "run", "emulates every device in this process");
  check_output_path(o.outputs_dir, "--outputs", /*folder=*/true);
  check_output_path(o.report, "--report");
  check_output_path(o.trace, "--trace");
  Compiled p = compile_model(o.common);
  check_materialized_devices(p.annotations.mesh.user(), "run", "emulates every device in this process");
  check_fits_memory(p.graph);
  std::vector<Tensor> inputs = make_inputs(p.graph, p.load_report, o, p.training ? &*p.training : nullptr);
  std::vector<OnnxValue> expected;  // read before the run: a bad --expected is bad input (exit 2), found early
  if (!o.expected_dir.empty()) expected = read_expected_outputs(o.expected_dir, p.load_report);
  const ExecutorOptions exec = executor_options_from_env();
  PodRun run = o.program_dir.empty()
                   ? run_spmd(p.program, p.graph, inputs,
                              node_progress(fmt::format("run: {} devices", p.program.mesh.num_devices())), exec)
                   : DeviceFiles(p, o.common, o.program_dir).run(inputs, exec);
  if (const char* prof = std::getenv("GSPMD_PROFILE"); prof && *prof && std::string(prof) != "0")
    fmt::print(stderr, "host profile ({} devices):\n{}", p.program.mesh.num_devices(), format_profile(run));
  CheckResult check;
  if (o.check)
    check = check_against_reference(p, inputs, run.outputs, o.rtol, o.atol, node_progress("run: reference, 1 device"),
                                    exec);
  ExpectedResult exp;
  if (!o.expected_dir.empty())
    exp = compare_expected(p.graph, p.load_report, run.outputs, expected, o.expected_dir, o.rtol, o.atol);
  if (!o.outputs_dir.empty()) write_outputs(o.outputs_dir, p.graph, p.load_report, run.outputs);
  CostReport cost = p.cost(o.common.overlap);
  nlohmann::json report =
      make_report(p, cost, &run, o.check ? &check : nullptr, o.expected_dir.empty() ? nullptr : &exp);
  for (std::string& w : nonfinite_warnings(p.graph, run.outputs)) report["warnings"].push_back(std::move(w));
  if (!o.report.empty()) write_json(o.report, report);
  if (!o.trace.empty()) write_trace(o.trace, p.program, cost, p.target.name, {}, pipeline_track(p));
  print_summary(report, o.common.model);
  return (o.check && !check.passed) || !exp.passed ? 1 : 0;
}

}  // namespace gspmd::cli
