// One conformance test: load the model through the frontend, read the .pb test data, run it on one device and
// partitioned on meshes {2} and {2x2}, compare with the expected outputs.
#include "tests/conformance/conformance.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/pod/pod.h"
#include "cli/wiring.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::conformance {

namespace fs = std::filesystem;

const char* status_name(Status s) {
  switch (s) {
    case Status::kPass: return "pass";
    case Status::kSkip: return "skip";
    default: return "fail";
  }
}

namespace {

Status status_from(const std::string& s) {
  if (s == "pass") return Status::kPass;
  if (s == "skip") return Status::kSkip;
  return Status::kFail;
}

nlohmann::json mode_json(const ModeResult& m) { return {{"status", status_name(m.status)}, {"message", m.message}}; }
ModeResult mode_from(const nlohmann::json& j) {
  return {status_from(j.at("status").get<std::string>()), j.at("message").get<std::string>()};
}

}  // namespace

nlohmann::json to_json(const TestResult& r) {
  return {{"folder", r.folder},
          {"name", r.name},
          {"op_types", r.op_types},
          {"frozen", r.frozen},
          {"fallbacks", r.fallbacks},
          {"single", mode_json(r.single)},
          {"sharded", mode_json(r.sharded)},
          {"seconds", r.seconds}};
}

TestResult result_from_json(const nlohmann::json& j) {
  TestResult r;
  r.folder = j.at("folder");
  r.name = j.at("name");
  r.op_types = j.at("op_types").get<std::vector<std::string>>();
  r.frozen = j.at("frozen").get<std::vector<std::string>>();
  r.fallbacks = j.at("fallbacks").get<std::vector<std::string>>();
  r.single = mode_from(j.at("single"));
  r.sharded = mode_from(j.at("sharded"));
  r.seconds = j.at("seconds");
  return r;
}

namespace {

/// Elements of a floating-point tensor as doubles; empty optional for other dtypes.
bool float_values(const Tensor& t, std::vector<double>& out) {
  const int64_t n = t.numel();
  out.resize(static_cast<size_t>(n));
  switch (t.dtype) {
    case DType::kFloat32:
      for (int64_t i = 0; i < n; ++i) out[i] = t.data<float>()[i];
      return true;
    case DType::kFloat64:
      for (int64_t i = 0; i < n; ++i) out[i] = t.data<double>()[i];
      return true;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) out[i] = half_to_float(t.data<uint16_t>()[i]);
      return true;
    case DType::kBFloat16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(t.data<uint16_t>()[i]);
      return true;
    default: return false;
  }
}

}  // namespace

std::string compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.dtype != want.dtype) return fmt::format("dtype {} vs {}", dtype_name(got.dtype), dtype_name(want.dtype));
  if (got.shape != want.shape) return fmt::format("shape {} vs {}", shape_str(got.shape), shape_str(want.shape));
  std::vector<double> a, b;
  if (float_values(got, a)) {
    float_values(want, b);
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(b[i]) ? std::isnan(a[i])
                           : (std::isinf(b[i]) ? a[i] == b[i] : std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i])))
        continue;
      return fmt::format("element {} (flat): {:.9g} vs {:.9g}", i, a[i], b[i]);
    }
    return "";
  }
  if (got.bytes == want.bytes) return "";
  const size_t es = dtype_size(got.dtype);
  for (size_t i = 0; i * es < got.bytes.size(); ++i)
    if (std::memcmp(got.bytes.data() + i * es, want.bytes.data() + i * es, es) != 0) {
      auto as_i64 = [&](const Tensor& t) -> std::string {
        const std::byte* p = t.bytes.data() + i * es;
        switch (t.dtype) {
          case DType::kInt64: return std::to_string(*reinterpret_cast<const int64_t*>(p));
          case DType::kInt32: return std::to_string(*reinterpret_cast<const int32_t*>(p));
          case DType::kInt16: return std::to_string(*reinterpret_cast<const int16_t*>(p));
          case DType::kInt8: return std::to_string(*reinterpret_cast<const int8_t*>(p));
          case DType::kUInt64: return std::to_string(*reinterpret_cast<const uint64_t*>(p));
          case DType::kUInt32: return std::to_string(*reinterpret_cast<const uint32_t*>(p));
          case DType::kUInt16: return std::to_string(*reinterpret_cast<const uint16_t*>(p));
          default: return std::to_string(static_cast<unsigned>(*reinterpret_cast<const uint8_t*>(p)));
        }
      };
      return fmt::format("element {} (flat): {} vs {}", i, as_i64(got), as_i64(want));
    }
  return "";
}

namespace {

/// An error that makes a mode "skip" rather than "fail": the executor or the frontend does not support something
/// the test uses (an op, a dtype, strings).
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_unsupported_input(const std::string& msg) {
  for (const char* k : {"not supported", "unsupported", "is not a tensor", "control flow"})
    if (msg.find(k) != std::string::npos) return true;
  return false;
}

struct DataSet {
  std::vector<OnnxValue> inputs;   // input_<i>.pb, in file order (== graph input order)
  std::vector<OnnxValue> outputs;  // output_<i>.pb
};

/// DIR/<stem>_<i>.pb, each read as the model declares value i (a tensor, a sequence or an optional).
std::vector<OnnxValue> read_numbered(const fs::path& dir, const char* stem, const std::vector<ValueKind>& kinds) {
  std::vector<OnnxValue> v;
  for (size_t i = 0;; ++i) {
    fs::path p = dir / fmt::format("{}_{}.pb", stem, i);
    if (!fs::exists(p)) break;
    v.push_back(read_value_pb(p.string(), i < kinds.size() ? kinds[i] : ValueKind::kTensor));
  }
  return v;
}

bool is_tensor(const OnnxValue& v) { return v.structure.kind == ValueKind::kTensor; }

/// Symbolic input dims bound to the data set's sizes.
std::map<std::string, int64_t> data_dims(const ModelInfo& info, const DataSet& ds) {
  std::map<std::string, int64_t> dims;
  for (size_t i = 0; i < info.inputs.size() && i < ds.inputs.size(); ++i) {
    if (!is_tensor(ds.inputs[i])) continue;
    const Tensor& t = ds.inputs[i].tensors.at(0);
    for (size_t k = 0; k < info.input_dim_params[i].size() && k < t.shape.size(); ++k)
      if (!info.input_dim_params[i][k].empty()) dims.emplace(info.input_dim_params[i][k], t.shape[k]);
  }
  return dims;
}

LoadOptions base_options(const ModelInfo& info, const DataSet& ds) {
  LoadOptions lo = cli::kernel_load_options();
  lo.dims = data_dims(info, ds);
  for (size_t i = 0; i < info.inputs.size() && i < ds.inputs.size(); ++i)
    if (!is_tensor(ds.inputs[i])) lo.structured_inputs[info.inputs[i]] = ds.inputs[i];
  lo.strict_shapes = true;  // a shape function that disagrees with ONNX inference fails the test
  return lo;
}

/// True for the loader's error about a value left untyped (a data-dependent shape, or no static shape).
bool untyped(const InputError& e) {
  const std::string w = e.what();
  return w.find("has a data-dependent shape") != std::string::npos ||
         w.find("has no static shape") != std::string::npos;
}

/// Loads the model; when a shape depends on input values, retries with small inputs frozen: first integer inputs
/// of at most 64 elements, then any input of at most 64 elements. Returns the graph and the frozen names.
/// A loaded model: the graph and its signature (how sequence and optional inputs / outputs are flattened).
struct Loaded {
  Graph g;
  LoadReport report;
};

Loaded load(const std::string& model, const ModelInfo& info, const DataSet& ds, std::vector<std::string>& frozen) {
  Loaded out;
  // Inputs whose data contradicts the declared static shape (a few suite models declare 'like' as [3,4] and feed
  // [1]) are always frozen: the test's data is what the op must see.
  auto mismatching = [&](size_t i) {
    if (!is_tensor(ds.inputs[i])) return false;
    const Tensor& t = ds.inputs[i].tensors.at(0);
    const std::vector<int64_t>& decl = info.input_shapes[i];
    if (decl.empty()) return false;
    if (decl.size() != t.shape.size()) return true;
    for (size_t k = 0; k < decl.size(); ++k)
      if (decl[k] >= 0 && decl[k] != t.shape[k]) return true;
    return false;
  };
  frozen.clear();
  LoadOptions first = base_options(info, ds);
  for (size_t i = 0; i < info.inputs.size() && i < ds.inputs.size(); ++i)
    if (mismatching(i)) {
      first.frozen_inputs[info.inputs[i]] = ds.inputs[i].tensors.at(0);
      frozen.push_back(info.inputs[i]);
    }
  try {
    out.g = load_model(model, first, &out.report);
    return out;
  } catch (const InputError& e) {
    if (!untyped(e)) throw;
  }
  for (int stage = 0; stage < 2; ++stage) {
    LoadOptions lo = base_options(info, ds);
    frozen.clear();
    for (size_t i = 0; i < info.inputs.size() && i < ds.inputs.size(); ++i) {
      if (!is_tensor(ds.inputs[i])) continue;
      const Tensor& t = ds.inputs[i].tensors.at(0);
      const bool is_int = t.dtype == DType::kInt64 || t.dtype == DType::kInt32;
      if (mismatching(i) || (t.numel() <= 64 && (is_int || stage == 1))) {
        lo.frozen_inputs[info.inputs[i]] = t;
        frozen.push_back(info.inputs[i]);
      }
    }
    if (frozen.empty()) continue;
    try {
      out.g = load_model(model, lo, &out.report);
      return out;
    } catch (const InputError& e) {
      if (stage == 1 || !untyped(e)) throw;
    }
  }
  out.g = load_model(model, first, &out.report);  // rethrows the original error
  return out;
}

/// The graph's inputs, taken from the data set by name (frozen ones are not graph inputs any more) and flattened
/// as the model was loaded (sequences and optionals: one graph input per element).
std::vector<Tensor> graph_inputs(const Loaded& l, const ModelInfo& info, const DataSet& ds) {
  std::vector<OnnxValue> in;
  for (const FlatValue& f : l.report.inputs) {
    auto it = std::find(info.inputs.begin(), info.inputs.end(), f.name);
    const size_t k = static_cast<size_t>(it - info.inputs.begin());
    if (it == info.inputs.end() || k >= ds.inputs.size())
      throw std::runtime_error(fmt::format("no test data for graph input '{}'", f.name));
    in.push_back(ds.inputs[k]);
  }
  return flatten_inputs(l.g, l.report, std::move(in));
}

std::string compare_outputs(const Loaded& l, std::vector<Tensor> got, const DataSet& ds) {
  const std::vector<OnnxValue> outs = unflatten_outputs(l.g, l.report, std::move(got));
  if (outs.size() < ds.outputs.size())
    return fmt::format("{} outputs, the test expects {}", outs.size(), ds.outputs.size());
  for (size_t i = 0; i < ds.outputs.size(); ++i) {
    const OnnxValue& o = outs[i];
    const OnnxValue& want = ds.outputs[i];
    const std::string& name = l.report.outputs[i].name;
    const ValueStructure a = o.structure, b = want.structure;
    if (a.kind != b.kind || a.present != b.present || (a.present && a.of_sequence != b.of_sequence))
      return fmt::format("output {} '{}': {} vs {}", i, name, structure_str(a), structure_str(b));
    if (o.tensors.size() != want.tensors.size())
      return fmt::format("output {} '{}': {} elements vs {}", i, name, o.tensors.size(), want.tensors.size());
    for (size_t e = 0; e < o.tensors.size(); ++e) {
      std::string d = compare(o.tensors[e], want.tensors[e]);
      if (d.empty()) continue;
      if (is_tensor(o)) return fmt::format("output {} '{}': {}", i, name, d);
      return fmt::format("output {} '{}' element {}: {}", i, name, e, d);
    }
  }
  return "";
}

/// Random input shardings for `mesh`: per graph input and mesh axis, a uniformly chosen dim or none.
Annotations random_annotations(const Graph& g, const DeviceMesh& mesh, std::mt19937_64& rng) {
  Annotations ann;
  ann.mesh = mesh;
  for (int v : g.inputs) {
    const int rank = static_cast<int>(g.values[v].shape.size());
    TensorSharding s = TensorSharding::replicated(rank);
    for (int a = 0; a < mesh.rank(); ++a) {
      const int k = static_cast<int>(rng() % static_cast<uint64_t>(rank + 1));
      if (k < rank) s.dims[k].push_back(a);
    }
    Annotation an;
    an.sharding = s;
    an.source = "conformance";
    ann.by_value[v] = an;
  }
  return ann;
}

std::string describe(const Graph& g, const Annotations& ann) {
  std::string s;
  for (const auto& [v, a] : ann.by_value) {
    if (a.sharding.is_replicated()) continue;
    s += fmt::format("{}{}: {}", s.empty() ? "" : ", ", g.values[v].name, a.sharding.to_partition_spec(ann.mesh));
  }
  return s.empty() ? "all inputs replicated" : s;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

template <class F>
ModeResult guarded(const char* stage_hint, F&& f) {
  try {
    std::string why = f();
    if (why.empty()) return {Status::kPass, ""};
    return {Status::kFail, why};
  } catch (const Skip& e) {
    return {Status::kSkip, e.what()};
  } catch (const UnsupportedError& e) {
    return {Status::kSkip, e.what()};
  } catch (const std::exception& e) {
    return {Status::kFail, fmt::format("{}{}", stage_hint, e.what())};
  }
}

}  // namespace

/// The test data of `set_dirs` (input_<i>.pb, output_<i>.pb), bfloat16 tensors stored as uint16 retagged as the
/// model declares them. Throws Skip when a data set cannot be read (a sequence .pb): the test is unsupported.
std::vector<DataSet> load_data_sets(const std::vector<fs::path>& set_dirs, const ModelInfo& info) {
  std::vector<DataSet> sets;
  try {
    for (const fs::path& sd : set_dirs)
      sets.push_back({read_numbered(sd, "input", info.input_kinds), read_numbered(sd, "output", info.output_kinds)});
  } catch (const InputError& e) {
    throw Skip(fmt::format("test data: {}", e.what()));
  }
  // Older test data stores bfloat16 tensors as uint16 (same bits): take the dtype the model declares.
  auto retag = [](OnnxValue& v, DType want) {
    for (Tensor& t : v.tensors)
      if (t.dtype == DType::kUInt16 && want == DType::kBFloat16) t.dtype = want;
  };
  for (DataSet& ds : sets) {
    for (size_t i = 0; i < ds.inputs.size() && i < info.input_dtypes.size(); ++i)
      retag(ds.inputs[i], info.input_dtypes[i]);
    for (size_t i = 0; i < ds.outputs.size() && i < info.output_dtypes.size(); ++i)
      retag(ds.outputs[i], info.output_dtypes[i]);
  }
  return sets;
}

TestResult run_test(const std::string& dir, uint64_t seed, const std::function<void(const TestResult&)>& after_single) {
  const auto t0 = std::chrono::steady_clock::now();
  TestResult r;
  const fs::path d(dir);
  r.name = d.filename().string();
  r.folder = d.parent_path().filename().string();
  const std::string model = (d / "model.onnx").string();

  ModelInfo info;
  std::vector<DataSet> sets;
  std::vector<fs::path> set_dirs;
  try {
    info = read_model_info(model);
    for (const std::string& op : info.op_types)
      if (std::find(r.op_types.begin(), r.op_types.end(), op) == r.op_types.end()) r.op_types.push_back(op);
    for (const auto& e : fs::directory_iterator(d))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
        set_dirs.push_back(e.path());
    std::sort(set_dirs.begin(), set_dirs.end());
    if (set_dirs.empty()) throw std::runtime_error("no test_data_set_* directory");
  } catch (const std::exception& e) {
    r.single = r.sharded = {Status::kFail, fmt::format("reading the test: {}", e.what())};
    return r;
  }

  // Per data set: the loaded graph (models whose shapes need frozen inputs are loaded once per data set).
  std::vector<Loaded> graphs;
  ModeResult load_result = guarded("load: ", [&]() -> std::string {
    sets = load_data_sets(set_dirs, info);
    try {
      for (size_t k = 0; k < sets.size(); ++k) {
        std::vector<std::string> frozen;
        if (k > 0 && r.frozen.empty()) break;
        graphs.push_back(load(model, info, sets[k], frozen));
        if (k == 0) r.frozen = frozen;
      }
    } catch (const InputError& e) {
      if (is_unsupported_input(e.what())) throw Skip(e.what());
      throw;
    }
    return "";
  });
  auto graph_for = [&](size_t k) -> const Loaded& { return graphs[graphs.size() == 1 ? 0 : k]; };
  if (load_result.status != Status::kPass) {
    r.single = r.sharded = load_result;
  } else {
    r.single = guarded("run_single: ", [&]() -> std::string {
      for (size_t k = 0; k < sets.size(); ++k) {
        const Loaded& l = graph_for(k);
        PodRun run = run_single(l.g, graph_inputs(l, info, sets[k]));
        std::string why = compare_outputs(l, std::move(run.outputs), sets[k]);
        if (!why.empty()) return sets.size() > 1 ? fmt::format("data set {}: {}", k, why) : why;
      }
      return "";
    });

    if (after_single) {
      TestResult partial = r;
      partial.sharded = {Status::kFail, "before the first sharded run"};
      after_single(partial);
    }
    std::mt19937_64 rng(seed ^ fnv1a(r.id()));
    std::set<std::string> fallbacks;
    ModeResult sharded{Status::kPass, ""};
    for (const char* mesh_text : {"2", "2x2"}) {
      const DeviceMesh mesh = DeviceMesh::parse(mesh_text);
      std::string where;
      ModeResult m = guarded("", [&]() -> std::string {
        for (size_t k = 0; k < sets.size(); ++k) {
          const Loaded& l = graph_for(k);
          const Graph& g = l.g;
          Annotations ann = random_annotations(g, mesh, rng);
          where = fmt::format("mesh {} [{}]{}", mesh_text, describe(g, ann),
                              sets.size() > 1 ? fmt::format(" data set {}", k) : "");
          if (after_single) {  // so that a crash can name the sharding it happened with
            TestResult partial = r;
            partial.sharded = {Status::kFail, where};
            after_single(partial);
          }
          std::string stage = "propagate";
          try {
            ShardingPlan plan = propagate(g, ann);
            stage = "partition";
            SpmdProgram p = partition(g, plan, ann.mesh);
            for (const std::string& w : p.warnings) fallbacks.insert(w);
            stage = "run_spmd";
            PodRun run = run_spmd(p, g, graph_inputs(l, info, sets[k]));
            std::string why = compare_outputs(l, std::move(run.outputs), sets[k]);
            if (!why.empty()) return fmt::format("{}: {}", where, why);
          } catch (const UnsupportedError&) {
            throw;
          } catch (const std::exception& e) {
            throw std::runtime_error(fmt::format("{}: {}: {}", where, stage, e.what()));
          }
        }
        return "";
      });
      if (m.status == Status::kSkip && !where.empty()) m.message = fmt::format("{}: {}", where, m.message);
      // The first failure wins; a skip only replaces a pass.
      if ((m.status == Status::kFail && sharded.status != Status::kFail) ||
          (m.status == Status::kSkip && sharded.status == Status::kPass))
        sharded = m;
    }
    r.sharded = sharded;
    r.fallbacks.assign(fallbacks.begin(), fallbacks.end());
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace gspmd::conformance
