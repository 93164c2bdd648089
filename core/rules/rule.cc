#include "core/rules/rule.h"

#include <map>
#include <numeric>
#include <utility>

#include <fmt/format.h>

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

std::optional<OpShardingRule> get_rule(const Graph& g, const Node& node) {
  auto& reg = registry();
  std::string domain = node.domain == "ai.onnx" ? std::string() : node.domain;
  auto it = reg.find({domain, node.op_type});
  if (it == reg.end()) return std::nullopt;
  std::optional<OpShardingRule> r;
  try {
    r = it->second(g, node);
  } catch (const std::exception&) {
    return std::nullopt;  // malformed instance: no rule (the partitioner replicates, loudly)
  }
  if (!r) return r;
  // Sanity: the rule must match the node's arity and the values' ranks.
  if (r->operands.size() != node.inputs.size() || r->results.size() != node.outputs.size()) return std::nullopt;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    int v = node.inputs[i];
    if (v < 0) continue;
    if (r->operands[i].size() != g.values.at(v).shape.size()) return std::nullopt;
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    int v = node.outputs[i];
    if (v < 0) continue;
    if (r->results[i].size() != g.values.at(v).shape.size()) return std::nullopt;
  }
  if (r->linear_operands.size() < node.inputs.size()) r->linear_operands.resize(node.inputs.size(), false);
  return r;
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
    std::vector<std::vector<int>> assign(fs.size());
    if (fs.size() == 1) {
      assign[0] = axes;  // a single-factor dim: any split (uneven too) is the factor's split
    } else {
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

void add_builtin(const std::string& op_type, RuleBuilder b) { raw_registry()[{std::string(), op_type}] = std::move(b); }

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

int add_factor(OpShardingRule& r, int64_t size, FactorKind kind) {
  r.factor_sizes.push_back(size);
  r.factor_kinds.push_back(kind);
  return r.num_factors() - 1;
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

std::pair<DimFactors, DimFactors> reshape_factors(OpShardingRule& r, const Shape& in, const Shape& out) {
  DimFactors din(in.size()), dout(out.size());
  const int ni = static_cast<int>(in.size()), no = static_cast<int>(out.size());
  if (num_elements(in) != num_elements(out) || num_elements(in) == 0) {
    for (int i = 0; i < ni; ++i)
      if (in[i] != 1) din[i] = {add_factor(r, in[i], FactorKind::kNeedReplication)};
    for (int j = 0; j < no; ++j)
      if (out[j] != 1) dout[j] = {add_factor(r, out[j], FactorKind::kNeedReplication)};
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
    int f = add_factor(r, g, FactorKind::kPassThrough);
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
    if (a > 1) din[i].push_back(add_factor(r, a, FactorKind::kNeedReplication));
    for (++i; i < ni; ++i)
      if (in[i] != 1) din[i] = {add_factor(r, in[i], FactorKind::kNeedReplication)};
  }
  if (j < no) {
    if (b > 1) dout[j].push_back(add_factor(r, b, FactorKind::kNeedReplication));
    for (++j; j < no; ++j)
      if (out[j] != 1) dout[j] = {add_factor(r, out[j], FactorKind::kNeedReplication)};
  }
  return {din, dout};
}

}  // namespace rules_internal
}  // namespace gspmd
