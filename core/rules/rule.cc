#include "core/rules/rule.h"

#include <map>
#include <numeric>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "core/ir/attrs.h"
#include "core/rules/rule_maker.h"

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// Registry. Builtins are registered lazily and explicitly (no static initializers: a static library would drop the
// family object files).

namespace {
using Key = std::pair<std::string, std::string>;

std::map<Key, RuleBuilder>& raw_registry() {
  static std::map<Key, RuleBuilder> m;
  return m;
}

void register_builtin_rules() {
  rules_internal::register_elementwise_rules();
  rules_internal::register_matmul_rules();
  rules_internal::register_shape_rules();
  rules_internal::register_reduce_norm_rules();
  rules_internal::register_gather_rules();
  rules_internal::register_conv_pool_rules();
  rules_internal::register_einsum_rules();
  rules_internal::register_index_rules();
  rules_internal::register_misc_rules();
  rules_internal::register_pipeline_rules();
}

std::map<Key, RuleBuilder>& registry() {
  static const bool init = (register_builtin_rules(), true);
  (void)init;
  return raw_registry();
}

std::string factor_name(int f) {
  static const char* kLetters = "ijklmnopqrstuvwxyzabcdefgh";
  if (f < 26) return std::string(1, kLetters[f]);
  return fmt::format("f{}", f);
}

std::string dims_str(const DimFactors& df) {
  std::string s = "[";
  for (size_t d = 0; d < df.size(); ++d) {
    if (d) s += ",";
    if (df[d].empty()) s += "1";
    for (int f : df[d]) s += factor_name(f);
  }
  return s + "]";
}
}  // namespace

RuleResult get_rule(const Graph& g, const Node& node) {
  auto& reg = registry();
  std::string domain = node.domain == "ai.onnx" ? std::string() : node.domain;
  auto it = reg.find({domain, node.op_type});
  if (it == reg.end()) return RuleResult();
  RuleResult r;
  try {
    r = it->second(g, node);
    if (r.status == RuleResult::kOk) check(g, node, *r.rule);
  } catch (const std::exception& e) {
    return RuleResult::builder_error(e.what());
  }
  if (r.status == RuleResult::kOk && r.rule->linear_operands.size() < node.inputs.size())
    r.rule->linear_operands.resize(node.inputs.size(), false);
  if (r.status == RuleResult::kOk && !g.runtime_dims.empty()) {  // a data-dependent dim is never split
    auto hold = [&](const std::vector<int>& values, const std::vector<DimFactors>& dims) {
      for (size_t i = 0; i < values.size() && i < dims.size(); ++i) {
        const std::vector<char> runtime = runtime_dims_of(g, values[i]);
        for (size_t d = 0; d < runtime.size() && d < dims[i].size(); ++d)
          if (runtime[d])
            for (int f : dims[i][d]) r.rule->factor_kinds[static_cast<size_t>(f)] = FactorKind::kNeedReplication;
      }
    };
    hold(node.inputs, r.rule->operands);
    hold(node.outputs, r.rule->results);
  }
  if (r.status == RuleResult::kNoRule) r.status = RuleResult::kNotExpressible;  // a builder cannot say "no rule"
  return r;
}

std::string RuleResult::describe() const {
  switch (status) {
    case kOk: return "";
    case kNoRule: return "has no sharding rule";
    case kNotExpressible:
      return reason.empty() ? "has no sharding rule for this instance"
                            : "has no sharding rule for this instance: " + reason;
    case kBuilderError: return "has no sharding rule: rule builder error (a bug): " + reason;
  }
  return "";
}

namespace {

/// Everything a rule builder reads of node `n` (op, domain, attributes, the opset, each operand's and result's
/// presence, dtype, shape and data-dependent dims, the values of constant operands), as bytes: equal keys give equal
/// rules. False for a node whose rule is not shared: one with a graph attribute, or a constant operand larger than 64
/// KiB.
bool rule_key(const Graph& g, const Node& n, std::string& key) {
  key.clear();
  auto put = [&](const void* p, size_t size) { key.append(static_cast<const char*>(p), size); };
  auto num = [&](int64_t v) { put(&v, sizeof v); };
  auto str = [&](const std::string& s) {
    num(static_cast<int64_t>(s.size()));
    key += s;
  };
  auto shape = [&](const Shape& s) {
    num(static_cast<int64_t>(s.size()));
    if (!s.empty()) put(s.data(), s.size() * sizeof(int64_t));
  };
  str(n.domain);
  str(n.op_type);
  num(g.opset);
  for (const auto& [name, a] : n.attrs) {  // a body, or a large tensor, makes the rule the node's own
    if (std::holds_alternative<std::shared_ptr<const Graph>>(a)) return false;
    if (const auto* t = std::get_if<Tensor>(&a); t && t->bytes.size() > 65536) return false;
  }
  attr_bytes(n.attrs, put, [](const Graph&) {});
  auto value = [&](int v) {
    num(v < 0 ? -1 : static_cast<int64_t>(g.values.at(static_cast<size_t>(v)).dtype));
    if (v >= 0) shape(g.values[static_cast<size_t>(v)].shape);
    if (v >= 0 && g.values[static_cast<size_t>(v)].sym) {  // which dims are data-dependent (get_rule holds them)
      const std::vector<char> runtime = runtime_dims_of(g, v);
      num(static_cast<int64_t>(runtime.size()));
      key.append(runtime.begin(), runtime.end());
    }
  };
  num(static_cast<int64_t>(n.inputs.size()));
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    value(n.inputs[i]);
    const Tensor* t = rules_internal::constant_input(g, n, static_cast<int>(i));
    if (t && t->bytes.size() > 65536) return false;
    num(t ? static_cast<int64_t>(t->bytes.size()) : -1);
    if (t) put(t->bytes.data(), t->bytes.size());
  }
  num(static_cast<int64_t>(n.outputs.size()));
  for (int v : n.outputs) value(v);
  return true;
}

}  // namespace

RuleTable::RuleTable(const Graph& g) {
  index_.reserve(g.nodes.size());
  std::unordered_map<std::string, size_t> built;  // rule_key -> its result in results_ (accepted rules only)
  std::string key;
  for (const Node& n : g.nodes) {
    const bool keyed = rule_key(g, n, key);
    if (keyed) {
      auto it = built.find(key);
      if (it != built.end()) {
        index_.push_back(it->second);
        continue;
      }
    }
    index_.push_back(results_.size());
    results_.push_back(get_rule(g, n));
    // Only accepted rules are shared: a rejection's reason may name the node.
    if (keyed && results_.back().status == RuleResult::kOk) built.emplace(key, results_.size() - 1);
  }
}

std::vector<int> RuleTable::builder_errors() const {
  std::vector<int> out;
  for (int n = 0; n < size(); ++n)
    if ((*this)[n].status == RuleResult::kBuilderError) out.push_back(n);
  return out;
}

void RuleTable::check_graph(const Graph& g) const {
  if (index_.size() != g.nodes.size())
    throw std::invalid_argument(
        fmt::format("rule table of {} nodes used for graph '{}' of {} nodes", index_.size(), g.name, g.nodes.size()));
}

const RuleTable& rules_for(const Graph& g, const RuleTable* rules, std::optional<RuleTable>& storage) {
  if (rules) {
    rules->check_graph(g);
    return *rules;
  }
  storage.emplace(g);
  return *storage;
}

// ---------------------------------------------------------------------------------------------------------------
// check

namespace {

// Node input (or output) i's label for errors: "operand 1 ('w')".
std::string tensor_label(const Graph& g, const Node& node, bool result, size_t i) {
  const int v = (result ? node.outputs : node.inputs)[i];
  const std::string name = v >= 0 ? fmt::format(" ('{}')", g.values.at(v).name) : "";
  return fmt::format("{} {}{}", result ? "result" : "operand", i, name);
}

}  // namespace

namespace rules_internal {

void check_tensor_dims(const Graph& g, const Node& node, const OpShardingRule& rule, bool result, size_t i) {
  const auto& vals = result ? node.outputs : node.inputs;
  const DimFactors& df = (result ? rule.results : rule.operands).at(i);
  const auto label = [&] { return tensor_label(g, node, result, i); };  // only on errors
  if (vals[i] < 0) {
    if (!df.empty()) throw RuleError(fmt::format("{} is absent but has {} dims of factors", label(), df.size()));
    return;
  }
  const Shape& shape = g.values.at(vals[i]).shape;
  if (df.size() != shape.size())
    throw RuleError(fmt::format("{} has rank {} but {} dims of factors", label(), shape.size(), df.size()));
  std::vector<char> seen(static_cast<size_t>(rule.num_factors()), 0);
  for (size_t d = 0; d < df.size(); ++d) {
    int64_t product = 1;
    for (int f : df[d]) {
      if (f < 0 || f >= rule.num_factors())
        throw RuleError(fmt::format("{} dim {}: factor id {} out of range (the rule has {} factors)", label(), d, f,
                                    rule.num_factors()));
      if (seen[static_cast<size_t>(f)]++)
        throw RuleError(fmt::format("{} indexes factor {} twice", label(), factor_name(f)));
      product *= rule.factor_sizes[static_cast<size_t>(f)];
    }
    if (df[d].empty() || product == shape[d]) continue;
    const FactorKind k = rule.factor_kinds[static_cast<size_t>(df[d][0])];
    const bool sized_elsewhere = df[d].size() == 1 && (k == FactorKind::kWindowed || k == FactorKind::kPermutation ||
                                                       k == FactorKind::kNeedReplication);
    if (!sized_elsewhere)
      throw RuleError(fmt::format("{} dim {} has size {} but its factors {} multiply to {}", label(), d, shape[d],
                                  dims_str({df[d]}), product));
  }
}

}  // namespace rules_internal

void check(const Graph& g, const Node& node, const OpShardingRule& rule) {
  if (rule.factor_kinds.size() != rule.factor_sizes.size())
    throw RuleError(
        fmt::format("{} factor sizes but {} factor kinds", rule.factor_sizes.size(), rule.factor_kinds.size()));
  if (rule.operands.size() != node.inputs.size() || rule.results.size() != node.outputs.size())
    throw RuleError(fmt::format("the rule has {} operands and {} results, the node {} inputs and {} outputs",
                                rule.operands.size(), rule.results.size(), node.inputs.size(), node.outputs.size()));
  if (rule.linear_operands.size() > node.inputs.size())
    throw RuleError(
        fmt::format("linear_operands has {} entries for {} inputs", rule.linear_operands.size(), node.inputs.size()));
  for (int f = 0; f < rule.num_factors(); ++f)
    if (rule.factor_sizes[static_cast<size_t>(f)] < 0)
      throw RuleError(fmt::format("factor {} has size {}", factor_name(f), rule.factor_sizes[static_cast<size_t>(f)]));
  for (size_t i = 0; i < node.inputs.size(); ++i) rules_internal::check_tensor_dims(g, node, rule, false, i);
  for (size_t i = 0; i < node.outputs.size(); ++i) rules_internal::check_tensor_dims(g, node, rule, true, i);
  for (int b : rule.bias_operands)
    if (b < 0 || b >= static_cast<int>(node.inputs.size()) || node.inputs[static_cast<size_t>(b)] < 0)
      throw RuleError(fmt::format("bias operand {} is not a present input", b));
  if (rule.shape_operand >= 0) {
    const auto s = static_cast<size_t>(rule.shape_operand);
    if (s >= node.inputs.size() || node.inputs[s] < 0)
      throw RuleError(fmt::format("shape operand {} is not a present input", rule.shape_operand));
    for (const auto& dim : rule.operands[s])
      if (!dim.empty()) throw RuleError(fmt::format("shape operand {} indexes factors", rule.shape_operand));
  }
  if (rule.group_factor >= rule.num_factors())
    throw RuleError(
        fmt::format("group factor {} out of range (the rule has {} factors)", rule.group_factor, rule.num_factors()));
  // Sizes per factor: the dims a factor is alone in; every factor must index some dim, and a factor whose size
  // differs from a dim it is alone in (sized by another side) must match one of them.
  std::vector<char> used(static_cast<size_t>(rule.num_factors()), 0), matched(used), alone(used), in_x(used);
  auto scan = [&](const DimFactors& df, int v, bool operand0) {
    for (size_t d = 0; d < df.size(); ++d)
      for (int f : df[d]) {
        used[static_cast<size_t>(f)] = 1;
        if (operand0) in_x[static_cast<size_t>(f)] = 1;
        if (df[d].size() != 1) continue;
        alone[static_cast<size_t>(f)] = 1;
        if (g.values.at(v).shape[d] == rule.factor_sizes[static_cast<size_t>(f)]) matched[static_cast<size_t>(f)] = 1;
      }
  };
  for (size_t i = 0; i < node.inputs.size(); ++i) scan(rule.operands[i], node.inputs[i], i == 0);
  for (size_t i = 0; i < node.outputs.size(); ++i) scan(rule.results[i], node.outputs[i], false);
  for (int f = 0; f < rule.num_factors(); ++f) {
    const auto uf = static_cast<size_t>(f);
    if (!used[uf]) throw RuleError(fmt::format("factor {} indexes no dim", factor_name(f)));
    if (alone[uf] && !matched[uf])
      throw RuleError(fmt::format("factor {} (size {}) matches the size of no dim it indexes", factor_name(f),
                                  rule.factor_sizes[uf]));
    if (rule.factor_kinds[uf] == FactorKind::kWindowed && !in_x[uf])
      throw RuleError(fmt::format("windowed factor {} does not index operand 0", factor_name(f)));
  }
}

bool has_rule(const std::string& domain, const std::string& op_type) {
  std::string d = domain == "ai.onnx" ? std::string() : domain;
  return registry().count({d, op_type}) != 0;
}

void register_rule(const std::string& domain, const std::string& op_type, RuleBuilder b) {
  registry()[{domain == "ai.onnx" ? std::string() : domain, op_type}] = std::move(b);
}

std::string OpShardingRule::str() const {
  std::string s = "(";
  for (size_t i = 0; i < operands.size(); ++i) s += (i ? "," : "") + dims_str(operands[i]);
  s += ")->(";
  for (size_t i = 0; i < results.size(); ++i) s += (i ? "," : "") + dims_str(results[i]);
  s += ") {";
  for (int f = 0; f < num_factors(); ++f) s += fmt::format("{}{}={}", f ? ", " : "", factor_name(f), factor_sizes[f]);
  s += "}";
  auto kind_list = [&](FactorKind k, const char* label) {
    std::string l;
    for (int f = 0; f < num_factors(); ++f)
      if (factor_kinds[f] == k) l += (l.empty() ? "" : ",") + factor_name(f);
    if (!l.empty()) s += fmt::format(" {}={{{}}}", label, l);
  };
  kind_list(FactorKind::kReduction, "reduction");
  kind_list(FactorKind::kNeedReplication, "need_replication");
  kind_list(FactorKind::kPermutation, "permutation");
  kind_list(FactorKind::kWindowed, "windowed");
  if (reduction != ReductionKind::kSum) s += fmt::format(" reduce={}", reduction_name(reduction));
  if (mean) s += " mean";
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Projection

bool project_to_factors(const TensorSharding& s, const DimFactors& df, const OpShardingRule& rule,
                        const DeviceMesh& mesh, FactorSharding& out) {
  if (static_cast<int>(out.size()) < rule.num_factors()) out.resize(rule.num_factors());
  bool ok = true;
  const size_t nd = std::min(s.dims.size(), df.size());
  if (s.dims.size() != df.size()) ok = false;
  for (size_t d = 0; d < nd; ++d) {
    const auto& axes = s.dims[d];
    const auto& fs = df[d];
    if (fs.empty()) {
      if (!axes.empty()) ok = false;
      continue;
    }
    if (fs.size() == 1) {  // a single-factor dim: any split (uneven too) is the factor's split
      out[fs[0]].assign(axes.begin(), axes.end());
      continue;
    }
    if (axes.empty()) {
      for (int f : fs) out[f].clear();
      continue;
    }
    std::vector<std::vector<int>> assign(fs.size());
    size_t fi = 0;
    int64_t cap = rule.factor_sizes.at(fs[0]);
    bool good = true;
    for (int a : axes) {
      int64_t n = mesh.shape.at(a);
      while (fi < fs.size() && cap == 1 && n > 1) {  // major factor fully split: move on
        if (++fi < fs.size()) cap = rule.factor_sizes.at(fs[fi]);
      }
      if (fi >= fs.size() || cap % n != 0) {
        good = false;
        break;
      }
      assign[fi].push_back(a);
      cap /= n;
    }
    if (!good) {
      ok = false;
      continue;
    }
    for (size_t j = 0; j < fs.size(); ++j) out[fs[j]] = std::move(assign[j]);
  }
  return ok;
}

TensorSharding sharding_from_factors(const FactorSharding& fs, const DimFactors& df) {
  TensorSharding s = TensorSharding::replicated(static_cast<int>(df.size()));
  for (size_t d = 0; d < df.size(); ++d)
    for (int f : df[d])
      if (f >= 0 && f < static_cast<int>(fs.size())) s.dims[d].insert(s.dims[d].end(), fs[f].begin(), fs[f].end());
  return s;
}

TensorSharding sharding_from_factors(const FactorSharding& fs, const DimFactors& df, const OpShardingRule& rule,
                                     const DeviceMesh& mesh) {
  TensorSharding s = TensorSharding::replicated(static_cast<int>(df.size()));
  for (size_t d = 0; d < df.size(); ++d) {
    const auto& f = df[d];
    if (f.size() == 1) {
      if (f[0] < static_cast<int>(fs.size())) s.dims[d] = fs[f[0]];
      continue;
    }
    for (int x : f) {
      if (x >= static_cast<int>(fs.size()) || fs[x].empty()) break;
      int64_t n = mesh.axes_size(fs[x]), size = rule.factor_sizes.at(x);
      if (size % n != 0) break;
      s.dims[d].insert(s.dims[d].end(), fs[x].begin(), fs[x].end());
      if (n != size) break;  // partially split: minor factors cannot follow
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers for the family files

namespace rules_internal {

void add_builtin(const std::string& op_type, RuleBuilder b, const std::string& domain) {
  raw_registry()[{domain, op_type}] = std::move(b);
}

const Tensor* constant_input(const Graph& g, const Node& node, int i) {
  if (i < 0 || i >= static_cast<int>(node.inputs.size())) return nullptr;
  int v = node.inputs[i];
  if (v < 0) return nullptr;
  const Value& val = g.values.at(v);
  if (val.data) return val.data.get();
  // A Constant node producing it also counts.
  if (val.producer >= 0) {
    const Node& p = g.nodes.at(val.producer);
    if (p.op_type == "Constant" && (p.domain.empty() || p.domain == "ai.onnx")) return p.t("value");
  }
  return nullptr;
}

std::optional<int> norm_axis(int64_t axis, int rank) {
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) return std::nullopt;
  return static_cast<int>(axis);
}

DimFactors broadcast_dims(const Shape& shape, const Shape& out_shape, const std::vector<int>& out_factors) {
  DimFactors df(shape.size());
  const int off = static_cast<int>(out_shape.size()) - static_cast<int>(shape.size());
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    int j = i + off;
    if (j < 0) continue;  // cannot happen for valid broadcasting
    if (shape[i] == 1 && out_shape[j] != 1) continue;
    if (shape[i] != out_shape[j]) continue;  // defensive
    if (out_factors[j] >= 0) df[i] = {out_factors[j]};
  }
  return df;
}

std::pair<DimFactors, DimFactors> reshape_factors(RuleMaker& m, const Shape& in, const Shape& out) {
  DimFactors din(in.size()), dout(out.size());
  const int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  if (num_elements(in) != num_elements(out) || num_elements(in) == 0) {
    for (int i = 0; i < ni; ++i)
      if (in[i] != 1) din[i] = {m.factor(in[i], FactorKind::kNeedReplication)};
    for (int j = 0; j < no; ++j)
      if (out[j] != 1) dout[j] = {m.factor(out[j], FactorKind::kNeedReplication)};
    return {din, dout};
  }
  int i = 0, j = 0;
  int64_t a = 0, b = 0;  // remaining sizes of in[i], out[j] (0 = not started)
  auto skip = [&]() {
    while (i < ni && a == 0 && in[i] == 1) ++i;
    while (j < no && b == 0 && out[j] == 1) ++j;
    if (i < ni && a == 0) a = in[i];
    if (j < no && b == 0) b = out[j];
  };
  skip();
  while (i < ni && j < no) {
    int64_t g = std::gcd(a, b);
    if (g == 1) break;
    int f = m.factor(g, FactorKind::kPassThrough);
    din[i].push_back(f);
    dout[j].push_back(f);
    a /= g;
    b /= g;
    if (a == 1) {
      ++i;
      a = 0;
    }
    if (b == 1) {
      ++j;
      b = 0;
    }
    skip();
  }
  // Whatever is left cannot be matched contiguously: the rest of each side must stay replicated.
  if (i < ni) {
    if (a > 1) din[i].push_back(m.factor(a, FactorKind::kNeedReplication));
    for (++i; i < ni; ++i)
      if (in[i] != 1) din[i] = {m.factor(in[i], FactorKind::kNeedReplication)};
  }
  if (j < no) {
    if (b > 1) dout[j].push_back(m.factor(b, FactorKind::kNeedReplication));
    for (++j; j < no; ++j)
      if (out[j] != 1) dout[j] = {m.factor(out[j], FactorKind::kNeedReplication)};
  }
  return {din, dout};
}

}  // namespace rules_internal
}  // namespace gspmd
