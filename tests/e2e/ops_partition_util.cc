// The ops_partition tests' cases, runs and checks (ops_partition_util.h).
#include "tests/e2e/ops_partition_util.h"

namespace gspmd::ops_partition {

const std::vector<DeviceMesh>& all_meshes() {
  static const std::vector<DeviceMesh> m = {mesh_of({2}), mesh_of({2, 2}), mesh_of({2, 3}), mesh_of({3})};
  return m;
}

std::vector<TensorSharding> all_shardings(int rank, const DeviceMesh& mesh) {
  std::vector<std::vector<int>> opts = {{}};
  for (int a = 0; a < mesh.rank(); ++a) opts.push_back({a});
  if (mesh.rank() == 2) {
    opts.push_back({0, 1});
    opts.push_back({1, 0});
  }
  std::vector<TensorSharding> out;
  TensorSharding cur = TensorSharding::replicated(rank);
  std::function<void(int, unsigned)> rec = [&](int d, unsigned used) {
    if (d == rank) {
      out.push_back(cur);
      return;
    }
    for (const auto& o : opts) {
      unsigned m = 0;
      for (int a : o) m |= 1u << a;
      if (m & used) continue;
      cur.dims[d] = o;
      rec(d + 1, used | m);
    }
    cur.dims[d].clear();
  };
  rec(0, 0);
  return out;
}

TensorSharding spec(int rank, std::vector<std::vector<int>> dims) {
  TensorSharding s = TensorSharding::replicated(rank);
  s.dims = std::move(dims);
  return s;
}

Tensor make_input(const Value& v, const InputGen& gen, std::mt19937& rng) {
  Tensor t(v.dtype, v.shape);
  const int64_t n = t.numel();
  std::uniform_real_distribution<float> u(-1.f, 1.f), pos(0.5f, 2.f);
  auto fval = [&]() -> double {
    switch (gen.kind) {
      case Gen::kPositive: return pos(rng);
      case Gen::kNonZero: {
        float x = pos(rng);
        return (rng() & 1) ? x : -x;
      }
      case Gen::kSmallSet: return static_cast<double>(rng() % 3);
      default: return u(rng);
    }
  };
  switch (v.dtype) {
    case DType::kFloat32:
      for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(fval());
      break;
    case DType::kFloat64:
      for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = fval();
      break;
    case DType::kBool:
      for (int64_t i = 0; i < n; ++i) t.data<bool>()[i] = (rng() & 1) != 0;
      break;
    case DType::kInt64:
    case DType::kInt32: {
      int64_t lo = 0, hi = 3;
      if (gen.kind == Gen::kIds) hi = gen.hi;
      if (gen.kind == Gen::kIdsSigned) lo = -gen.hi, hi = gen.hi;
      for (int64_t i = 0; i < n; ++i) {
        int64_t x = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo));
        if (v.dtype == DType::kInt64)
          t.data<int64_t>()[i] = x;
        else
          t.data<int32_t>()[i] = static_cast<int32_t>(x);
      }
      break;
    }
    default: throw std::logic_error("make_input: unsupported dtype");
  }
  return t;
}

std::string value_desc(const Graph& g, int v) {
  const Value& x = g.values[v];
  return x.name + ":" + std::string(dtype_name(x.dtype)) + shape_str(x.shape);
}

std::string run_one(const Case& c, const Annotations& ann, const std::vector<Tensor>& inputs,
                    const std::vector<Tensor>& ref, SpmdProgram* keep) {
  try {
    ShardingPlan plan = propagate(c.g, ann);
    SpmdProgram p = partition(c.g, plan, ann.mesh);
    PodRun r = run_spmd(p, c.g, inputs);
    std::string why;
    if (r.outputs.size() != ref.size()) return "wrong number of outputs";
    for (size_t o = 0; o < ref.size(); ++o) {
      std::string d = testing::compare_tensors(r.outputs[o], ref[o]);
      if (!d.empty()) {
        why += (why.empty() ? "" : "; ") + std::string("output ") + c.g.values[c.g.outputs[o]].name + " (" +
               plan.shardings[c.g.outputs[o]].to_partition_spec(ann.mesh) + " -> final " +
               p.final_shardings[c.g.outputs[o]].to_partition_spec(ann.mesh) + "): " + d;
      }
    }
    if (keep) *keep = std::move(p);
    return why;
  } catch (const std::exception& e) {
    return std::string("exception: ") + e.what();
  }
}

std::string describe(const Case& c, const Annotations& ann) {
  std::ostringstream os;
  os << c.name << " (opset " << c.g.opset << ") inputs {";
  bool first = true;
  for (int v : c.g.inputs) os << (first ? "" : ", ") << value_desc(c.g, v), first = false;
  os << "} mesh " << ann.mesh.str() << " annotations {";
  first = true;
  for (const auto& [v, a] : ann.by_value)
    os << (first ? "" : ", ") << c.g.values[v].name << "=" << a.sharding.to_partition_spec(ann.mesh), first = false;
  os << "}";
  return os.str();
}

Outcome run_case(const Case& c, const std::vector<DeviceMesh>& meshes) {
  Outcome out;
  std::mt19937 rng(20240601u);
  std::vector<Tensor> inputs;
  for (int v : c.g.inputs) inputs.push_back(make_input(c.g.values[v], c.gens.at(v), rng));
  std::vector<Tensor> ref;
  try {
    ref = run_single(c.g, inputs).outputs;
  } catch (const std::exception& e) {
    out.failures.push_back(c.name + ": run_single failed: " + e.what());
    return out;
  }
  for (const DeviceMesh& mesh : meshes) {
    std::vector<std::vector<TensorSharding>> opts;
    for (int v : c.shardable) opts.push_back(all_shardings(static_cast<int>(c.g.values[v].shape.size()), mesh));
    int64_t total = 1;
    for (const auto& o : opts) total *= static_cast<int64_t>(o.size());
    std::vector<int64_t> picks;
    const int64_t cap = static_cast<int64_t>(c.cap) * 2;  // annotation sets per mesh and graph
    if (total <= cap) {
      for (int64_t i = 0; i < total; ++i) picks.push_back(i);
    } else {
      std::mt19937_64 prng(1234567u + static_cast<uint64_t>(mesh.num_devices()) * 31 + c.name.size());
      picks.push_back(0);
      std::vector<int64_t> seen = {0};
      while (static_cast<int64_t>(picks.size()) < cap) {
        int64_t k = static_cast<int64_t>(prng() % static_cast<uint64_t>(total));
        if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
        seen.push_back(k);
        picks.push_back(k);
      }
    }
    std::vector<std::vector<TensorSharding>> out_opts;
    for (int v : c.out_ann) out_opts.push_back(all_shardings(static_cast<int>(c.g.values[v].shape.size()), mesh));
    int j = 0;
    for (int64_t k : picks) {
      Annotations ann;
      ann.mesh = mesh;
      int64_t rest = k;
      for (size_t i = 0; i < c.shardable.size(); ++i) {
        const TensorSharding& s = opts[i][static_cast<size_t>(rest % static_cast<int64_t>(opts[i].size()))];
        rest /= static_cast<int64_t>(opts[i].size());
        // Unsplit: usually left to propagation, sometimes pinned replicated by the user.
        if (s.is_replicated() && (j + static_cast<int>(i)) % 3 != 0) continue;
        ann.by_value[c.shardable[i]] = Annotation{s, 0, "test"};
      }
      for (size_t i = 0; i < c.out_ann.size(); ++i)
        if (j % 3 == 2)
          ann.by_value[c.out_ann[i]] = Annotation{
              out_opts[i][static_cast<size_t>((j * 7 + static_cast<int>(i) * 3) % out_opts[i].size())], 0, "test"};
      ++j;
      ++out.cases;
      std::string why = run_one(c, ann, inputs, ref);
      if (!why.empty()) out.failures.push_back(describe(c, ann) + ": " + why);
    }
  }
  return out;
}

void run_all(const std::string& family, const std::vector<Case>& cases, const std::vector<DeviceMesh>& meshes) {
  auto t0 = std::chrono::steady_clock::now();
  int total = 0, failed = 0, shown = 0;
  constexpr int kMaxShown = 40;  // full lines per family; every failing graph is counted in the summary below
  std::ostringstream msg, summary;
  for (const Case& c : cases) {
    Outcome o = run_case(c, meshes);
    total += o.cases;
    failed += static_cast<int>(o.failures.size());
    if (!o.failures.empty())
      summary << "\n  " << o.failures.size() << "/" << o.cases << " cases fail: " << c.name << " (opset " << c.g.opset
              << ")";
    for (const auto& f : o.failures)
      if (shown++ < kMaxShown) msg << "\n  FAIL " << f;
  }
  if (shown > kMaxShown) msg << "\n  ... " << shown - kMaxShown << " more";
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ops] " << family << ": " << cases.size() << " graphs x " << meshes.size() << " meshes, " << total
            << " sharding cases, " << failed << " failures, " << s << " s\n";
  if (failed)
    ADD_FAILURE() << family << ": " << failed << " of " << total << " cases differ. Per graph:" << summary.str()
                  << "\nFirst failures:" << msg.str();
}

std::map<std::string, int> count_kinds(const SpmdProgram& p) {
  std::map<std::string, int> m;
  for (const auto& c : p.collectives) ++m[std::string(collective_name(c.kind))];
  return m;
}

std::string collectives_str(const SpmdProgram& p) {
  std::ostringstream os;
  for (const auto& c : p.collectives)
    os << "\n  " << c.kind << " bytes=" << c.bytes << " value=" << c.value << " for=" << c.for_node << ": " << c.reason;
  return os.str();
}

SpmdProgram expect_exact(const Case& c, const DeviceMesh& mesh, std::vector<std::pair<std::string, TensorSharding>> a,
                         std::vector<Tensor> inputs) {
  Annotations ann;
  ann.mesh = mesh;
  for (auto& [k, s] : a) ann.by_value[c.g.at(k)] = Annotation{s, 0, "t"};
  if (inputs.empty()) {
    std::mt19937 rng(20240601u);
    for (int v : c.g.inputs) inputs.push_back(make_input(c.g.values[v], c.gens.at(v), rng));
  }
  std::vector<Tensor> ref = run_single(c.g, inputs).outputs;
  SpmdProgram p;
  std::string why = run_one(c, ann, inputs, ref, &p);
  EXPECT_EQ(why, "") << describe(c, ann);
  return p;
}

}  // namespace gspmd::ops_partition
