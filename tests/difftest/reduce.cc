// Reducing a failing case while it fails the same way (random_graph.h).
#include "tests/difftest/generator.h"

namespace gspmd::difftest {

namespace {

/// Keeps outputs `outs` (value names), prunes, drops unused inputs, remaps annotations and input tensors by name.
Repro restrict_outputs(const Repro& r, const std::vector<std::string>& outs) {
  Repro n;
  n.g = r.g;
  std::map<std::string, Tensor> in_by_name;
  for (size_t i = 0; i < r.g.inputs.size(); ++i)
    in_by_name[r.g.values[static_cast<size_t>(r.g.inputs[i])].name] = r.inputs[i];
  std::map<std::string, Annotation> ann_by_name;
  for (const auto& [v, a] : r.ann.by_value) ann_by_name[r.g.values[static_cast<size_t>(v)].name] = a;
  n.g.outputs.clear();
  for (const auto& o : outs) n.g.outputs.push_back(n.g.at(o));
  // Inputs nothing reaches from the outputs are dropped: prune, then rebuild the input list.
  n.g.prune();
  std::set<int> used;
  for (const Node& x : n.g.nodes)
    for (int i : x.inputs)
      if (i >= 0) used.insert(i);
  for (int o : n.g.outputs) used.insert(o);
  std::vector<int> ins;
  for (int v : n.g.inputs)
    if (used.count(v)) ins.push_back(v);
  n.g.inputs = ins;
  n.g.prune();
  for (int v : n.g.inputs) n.inputs.push_back(in_by_name.at(n.g.values[static_cast<size_t>(v)].name));
  n.ann.mesh = r.ann.mesh;
  for (auto& [name, a] : ann_by_name) {
    int v = n.g.find(name);
    if (v >= 0) n.ann.by_value[v] = a;
  }
  return n;
}

std::vector<std::string> output_names(const Graph& g) {
  std::vector<std::string> o;
  for (int v : g.outputs) o.push_back(g.values[static_cast<size_t>(v)].name);
  return o;
}

/// Replaces the single-output node producing `v` by a graph input holding v's reference value.
std::optional<Repro> cut_at(const Repro& r, int v) {
  const int prod = r.g.values[static_cast<size_t>(v)].producer;
  if (prod < 0 || r.g.nodes[static_cast<size_t>(prod)].outputs.size() != 1) return std::nullopt;
  Graph probe = r.g;
  probe.outputs = {v};
  Tensor val;
  try {
    val = run_single(probe, r.inputs).outputs.at(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  Repro n = r;
  n.g.nodes.erase(n.g.nodes.begin() + prod);
  for (auto& x : n.g.values) x.producer = -1;
  for (size_t k = 0; k < n.g.nodes.size(); ++k)
    for (int o : n.g.nodes[k].outputs) n.g.values[static_cast<size_t>(o)].producer = static_cast<int>(k);
  n.g.inputs.push_back(v);
  n.inputs.push_back(std::move(val));
  return restrict_outputs(n, output_names(n.g));
}

TensorSharding drop_axis(const TensorSharding& s, int axis, bool renumber) {
  TensorSharding t = s;
  auto fix = [&](std::vector<int>& l) {
    l.erase(std::remove(l.begin(), l.end(), axis), l.end());
    if (renumber)
      for (int& a : l)
        if (a > axis) --a;
  };
  for (auto& d : t.dims) fix(d);
  fix(t.unreduced);
  if (t.unreduced.empty()) t.reduction = ReductionKind::kSum;  // as the sharding file loader would leave it
  return t;
}

}  // namespace

Repro reduce_repro(Repro r, const CheckResult& failure, int budget) {
  const std::string sig = failure_signature(failure);
  auto still_fails = [&](const Repro& c) {
    if (budget-- <= 0) return false;
    CheckResult x = check_case(c.g, c.ann, c.inputs);
    return x.status == CheckResult::kFail && failure_signature(x) == sig;
  };
  bool changed = true;
  while (changed && budget > 0) {
    changed = false;
    // 1. A single output, earliest first.
    if (r.g.outputs.size() > 1 || !r.g.nodes.empty()) {
      for (int v = 0; v < static_cast<int>(r.g.values.size()); ++v) {
        if (r.g.values[static_cast<size_t>(v)].producer < 0) continue;
        if (r.g.outputs.size() == 1 && r.g.outputs[0] == v) break;
        Repro c = restrict_outputs(r, {r.g.values[static_cast<size_t>(v)].name});
        if (c.g.nodes.size() < r.g.nodes.size() || (c.g.nodes.size() == r.g.nodes.size() && r.g.outputs.size() > 1)) {
          if (still_fails(c)) {
            r = std::move(c);
            changed = true;
            break;
          }
        }
      }
    }
    // 2. Cut producers into inputs.
    for (size_t k = 0; k < r.g.nodes.size() && r.g.nodes.size() > 1; ++k) {
      for (int in : r.g.nodes[k].inputs) {
        if (in < 0 || r.g.values[static_cast<size_t>(in)].producer < 0) continue;
        auto c = cut_at(r, in);
        if (c && c->g.nodes.size() < r.g.nodes.size() && still_fails(*c)) {
          r = std::move(*c);
          changed = true;
          break;
        }
      }
      if (changed) break;
    }
    if (changed) continue;
    // 3. Fewer annotations, then fewer axes per annotation.
    for (auto it = r.ann.by_value.begin(); it != r.ann.by_value.end(); ++it) {
      Repro c = r;
      c.ann.by_value.erase(it->first);
      if (still_fails(c)) {
        r = std::move(c);
        changed = true;
        break;
      }
    }
    if (changed) continue;
    for (auto& [v, a] : r.ann.by_value) {
      for (int ax = 0; ax < r.ann.mesh.rank() && !changed; ++ax) {
        TensorSharding t = drop_axis(a.sharding, ax, false);
        if (t == a.sharding) continue;
        Repro c = r;
        c.ann.by_value[v].sharding = t;
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
        }
      }
      if (changed) break;
    }
    if (changed) continue;
    // 4. Smaller meshes: drop an axis, or shrink it to 2.
    for (int ax = 0; ax < r.ann.mesh.rank() && !changed; ++ax) {
      if (r.ann.mesh.rank() > 1) {
        Repro c = r;
        c.ann.mesh.shape.erase(c.ann.mesh.shape.begin() + ax);
        c.ann.mesh.axes.erase(c.ann.mesh.axes.begin() + ax);
        for (auto& [v, a] : c.ann.by_value) a.sharding = drop_axis(a.sharding, ax, true);
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
          break;
        }
      }
      for (int64_t sz = 2; sz < r.ann.mesh.shape[static_cast<size_t>(ax)]; ++sz) {
        Repro c = r;
        c.ann.mesh.shape[static_cast<size_t>(ax)] = sz;
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
          break;
        }
      }
    }
  }
  return r;
}

}  // namespace gspmd::difftest
