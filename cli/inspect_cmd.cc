// gspmd-onnx inspect: the model's values as a table (names to annotate, their shapes, the torch module each belongs
// to), a starter sharding file for a classical plan (--template), and what each rule of a sharding file matches
// (--shardings). docs/cli.md, "inspect".
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/report.h"
#include "cli/wiring.h"
#include "core/auto/auto.h"
#include "core/ir/name_pattern.h"
#include "core/rules/rule.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace {

/// A value's shape with its symbolic dims by name, as shape_str writes static ones: "[batch,16,64]" (dims_str, which
/// explain uses, puts spaces between dims).
std::string shape_text(const Value& v) {
  if (!v.sym) return shape_str(v.shape);
  std::string s = "[";
  for (size_t d = 0; d < v.sym->dims.size(); ++d) s += (d ? "," : "") + v.sym->dims[d].str();
  return s + "]";
}

/// A weight: a float initializer of more than one element (as --training's trainable set and the sharding file's
/// annotated weights, which the loader keeps by name).
bool is_weight(const Value& v) { return v.is_initializer && is_floating(v.dtype) && num_elements(v.shape) > 1; }

Graph load_for_inspect(const std::string& model) {
  LoadOptions lo = kernel_load_options();
  lo.load_data = false;
  lo.keep_symbols = true;
  lo.variable = [](const Value& v) { return is_floating(v.dtype) && num_elements(v.shape) > 1; };
  return load_model(model, lo);
}

struct Row {
  std::string name, shape, dtype, kind, op, module;
};

void print_table(const Graph& g, const InspectOptions& o) {
  std::optional<NamePattern> re;
  if (!o.match.empty()) re = NamePattern(o.match, "--match");
  const auto consumers = g.consumers();
  std::vector<char> is_input(g.values.size(), 0), is_output(g.values.size(), 0);
  for (int v : g.inputs) is_input[static_cast<size_t>(v)] = 1;
  for (int v : g.outputs) is_output[static_cast<size_t>(v)] = 1;
  std::vector<Row> rows;
  int64_t weights = 0, params = 0, bytes = 0;
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (val.producer < 0 && !val.is_initializer && !is_input[v]) continue;  // an unused name
    const bool weight = is_weight(val);
    if (o.weights && !weight) continue;
    const int node = val.producer >= 0 ? val.producer : consumers[v].empty() ? -1 : consumers[v][0];
    Row r{val.name,
          shape_text(val),
          std::string(dtype_name(val.dtype)),
          is_input[v]          ? "input"
          : weight             ? "weight"
          : val.is_initializer ? "constant"
          : is_output[v]       ? "output"
                               : "value",
          val.producer >= 0 ? g.nodes[static_cast<size_t>(val.producer)].op_type : "-",
          node >= 0 ? torch_module_path(g.nodes[static_cast<size_t>(node)].name) : ""};
    if (r.module.empty()) r.module = "-";
    if (re && !re->search(r.name) && !re->search(r.module)) continue;
    if (weight) ++weights, params += num_elements(val.shape), bytes += val.nbytes();
    rows.push_back(std::move(r));
  }
  Row head{"name", "shape", "dtype", "kind", "op", "module"};
  size_t w[5] = {head.name.size(), head.shape.size(), head.dtype.size(), head.kind.size(), head.op.size()};
  for (const Row& r : rows) {
    w[0] = std::max(w[0], r.name.size());
    w[1] = std::max(w[1], r.shape.size());
    w[2] = std::max(w[2], r.dtype.size());
    w[3] = std::max(w[3], r.kind.size());
    w[4] = std::max(w[4], r.op.size());
  }
  auto line = [&](const Row& r) {
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:<{}}  {}\n", r.name, w[0], r.shape, w[1], r.dtype, w[2], r.kind, w[3],
               r.op, w[4], r.module);
  };
  line(head);
  for (const Row& r : rows) line(r);
  fmt::print("{} values, {} weights ({} parameters, {} bytes)\n", rows.size(), weights, params, bytes);
}

/// The mesh a template is written for: --mesh's shape, its axes named for the plan ("data", "model").
DeviceMesh template_mesh(const InspectOptions& o) {
  if (!o.mesh) throw InputError("--template: needs --mesh (the mesh the starter file is for)");
  DeviceMesh m = DeviceMesh::parse(*o.mesh);
  if (m.rank() == 1) m.axes = {o.template_name == "megatron" ? "model" : "data"};
  if (m.rank() == 2) m.axes = {"data", "model"};
  return m;
}

/// `key` as an anchored regex over names, a layer number ('#' of layer_key) matching any whole number.
std::string key_regex(const std::string& key) {
  std::string re = "^";
  for (char c : key) {
    if (c == '#')
      re += "\\d+";
    else if (std::string_view(".[]()*+?{}|^$\\").find(c) != std::string_view::npos)
      re += std::string("\\") + c;
    else
      re += c;
  }
  return re + "$";
}

void print_template(const Graph& g, const InspectOptions& o) {
  const std::map<std::string, std::string> plans = {
      {"data", "data-parallel"}, {"fsdp", "fsdp"}, {"megatron", "megatron+data"}, {"2d", "2d"}};
  auto it = plans.find(o.template_name);
  if (it == plans.end())
    throw InputError(fmt::format("--template: '{}' is not one of data, fsdp, megatron, 2d", o.template_name));
  Annotations cons;
  cons.mesh = template_mesh(o);
  const std::string plan = cons.mesh.rank() == 1 && it->second == "megatron+data" ? "megatron" : it->second;
  AutoOptions ao;
  ao.target = Target::load("tpu-v3");
  ao.forward = &g;
  ao.build = [](Graph f, const StepChoice&) {
    AutoModel m;
    m.graph = std::move(f);
    return m;
  };
  const RuleTable rules(g);
  const std::vector<AutoChoice> choices = classical_plan(g, cons, plan, ao, &rules);
  if (choices.empty())
    throw InputError(fmt::format(
        "--template {}: {} over the mesh {} gives no such plan ({})", o.template_name, o.model, cons.mesh.str(),
        o.template_name == "2d" ? "the 2D plan needs a mesh of two axes and repeated layer blocks"
                                : "Megatron needs a mesh axis of more than one device"));
  auto spec = [&](const TensorSharding& s) { return spec_json(s, cons.mesh).dump(); };
  // A group of tied layers is one rule when its layer key matches exactly its members; else one line per tensor.
  std::vector<std::string> rule_lines, tensor_lines;
  for (const AutoChoice& c : choices) {
    if (!c.annotated) continue;
    const std::string key = layer_key(g.values[static_cast<size_t>(c.values[0])].name);
    bool one_rule = c.values.size() > 1;
    if (one_rule) {
      const NamePattern re(key_regex(key), "--template");
      size_t matched = 0;
      for (const Value& v : g.values) matched += re.search(v.name);
      one_rule = matched == c.values.size() && std::all_of(c.values.begin(), c.values.end(), [&](int v) {
                   return re.search(g.values[static_cast<size_t>(v)].name);
                 });
    }
    if (one_rule) {
      rule_lines.push_back(
          fmt::format("{{\"match\": {}, \"spec\": {}}}", nlohmann::json(key_regex(key)).dump(), spec(c.sharding)));
      continue;
    }
    for (int v : c.values)
      tensor_lines.push_back(
          fmt::format("{}: {}", nlohmann::json(g.values[static_cast<size_t>(v)].name).dump(), spec(c.sharding)));
  }
  auto block = [](const std::vector<std::string>& lines) {
    std::string s;
    for (size_t i = 0; i < lines.size(); ++i) s += (i ? ",\n    " : "\n    ") + lines[i];
    return s + (lines.empty() ? "" : "\n  ");
  };
  const nlohmann::json mesh = {{"shape", cons.mesh.shape}, {"axes", cons.mesh.axes}};
  const std::string text = fmt::format("{{\n  \"mesh\": {},\n  \"tensors\": {{{}}},\n  \"rules\": [{}]\n}}\n",
                                       mesh.dump(), block(tensor_lines), block(rule_lines));
  if (o.output.empty()) {
    fmt::print("{}", text);
    return;
  }
  check_output_path(o.output, "-o");
  write_atomically(o.output, [&](std::ostream& f) { f << text; });
  fmt::print(stderr, "wrote     {} ({} plan over {})\n", o.output, plan, cons.mesh.str());
}

/// What each entry of the sharding file matches; returns 2 when a rule fails on a tensor it matches.
int print_rule_report(const Graph& g, const InspectOptions& o) {
  std::optional<DeviceMesh> mesh;
  if (o.mesh) mesh = DeviceMesh::parse(*o.mesh);
  std::vector<RuleMatches> rules;
  const Annotations a = read_sharding_file(o.shardings, g, mesh ? &*mesh : nullptr, &rules);
  int tensors = 0;
  for (const auto& [v, ann] : a.by_value) tensors += ann.source.find(": tensors.") != std::string::npos;
  fmt::print("{}: mesh {}, {} tensors named, {} rules\n", o.shardings, a.mesh.str(), tensors, rules.size());
  constexpr size_t kListed = 6;
  size_t failures = 0, failing_rules = 0;
  for (const RuleMatches& r : rules) {
    std::string names;
    for (size_t i = 0; i < r.annotated.size() && i < kListed; ++i)
      names += (i ? ", " : " (") + g.values[static_cast<size_t>(r.annotated[i])].name;
    if (r.annotated.size() > kListed) names += fmt::format(", ... {} more", r.annotated.size() - kListed);
    if (!r.annotated.empty()) names += ")";
    fmt::print("{} {}: annotates {} tensor{}{}\n", r.key, nlohmann::json(r.pattern).dump(), r.annotated.size(),
               r.annotated.size() == 1 ? "" : "s", names);
    for (size_t i = 0; i < r.failed.size() && i < kListed; ++i) {
      const auto& [v, why] = r.failed[i];
      const Value& val = g.values[static_cast<size_t>(v)];
      const std::string prefix = fmt::format("{}: {}: ", o.shardings, r.key);
      fmt::print("  fails on '{}' {}{}: {}\n", val.name, dtype_name(val.dtype), shape_text(val),
                 why.rfind(prefix, 0) == 0 ? why.substr(prefix.size()) : why);
    }
    if (r.failed.size() > kListed) fmt::print("  fails on {} more\n", r.failed.size() - kListed);
    failures += r.failed.size();
    failing_rules += !r.failed.empty();
  }
  if (failures == 0) return 0;
  fmt::print(stderr, "error: {}: {} of {} rules fail on {} tensors (above): narrow their \"match\"\n", o.shardings,
             failing_rules, rules.size(), failures);
  return 2;
}

}  // namespace

int cmd_inspect(const InspectOptions& o) {
  if (!o.template_name.empty() && !o.shardings.empty())
    throw InputError("inspect: --template and --shardings are separate uses; give one");
  if (o.mesh && o.template_name.empty() && o.shardings.empty())
    throw InputError("--mesh: only used with --template or --shardings");
  const Graph g = load_for_inspect(o.model);
  if (!o.template_name.empty()) {
    print_template(g, o);
    return 0;
  }
  if (!o.shardings.empty()) return print_rule_report(g, o);
  print_table(g, o);
  return 0;
}

}  // namespace gspmd::cli
