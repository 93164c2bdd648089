// The sharding sidecar (docs/sharding-file.md): read + write. The only frontend file that includes nlohmann/json.
#include <algorithm>
#include <functional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "onnx_frontend/file_util.h"
#include "onnx_frontend/frontend.h"

namespace gspmd {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const json kNull;  // an absent "axes": the dim is not split

std::string quoted(const std::string& name) { return json(name).dump(); }

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string default_axis_name(size_t i) {
  static const char* const kNames[] = {"x", "y", "z", "w"};
  return i < 4 ? kNames[i] : fmt::format("a{}", i);
}

std::string mesh_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

struct Reader {
  const std::string& path;
  const Graph& g;
  DeviceMesh mesh;

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw InputError(key.empty() ? fmt::format("{}: {}", path, why) : fmt::format("{}: {}: {}", path, key, why));
  }

  void check_keys(const json& obj, const std::string& key, std::initializer_list<const char*> allowed) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return it.key() == a; })) {
        std::vector<std::string> names(allowed.begin(), allowed.end());
        fail(key, fmt::format("unknown key '{}' (expected {})", it.key(), join(names)));
      }
    }
  }

  void read_mesh(const json& root, const DeviceMesh* cli_mesh) {
    if (!root.contains("mesh")) {
      if (!cli_mesh) fail("mesh", "the file has no mesh and no --mesh was given");
      mesh = *cli_mesh;
      return;
    }
    const json& jm = root["mesh"];
    if (!jm.is_object()) fail("mesh", "expected an object like {\"shape\": [2, 2], \"axes\": [\"data\", \"model\"]}");
    check_keys(jm, "mesh", {"shape", "axes"});
    std::vector<int64_t> shape;
    std::vector<std::string> axes;
    bool has_shape = jm.contains("shape"), has_axes = jm.contains("axes");
    if (has_shape) {
      const json& js = jm["shape"];
      if (!js.is_array() || js.empty()) fail("mesh.shape", "expected a non-empty list of axis sizes");
      for (size_t i = 0; i < js.size(); ++i) {
        if (!js[i].is_number_integer() || js[i].get<int64_t>() < 1)
          fail("mesh.shape", fmt::format("sizes must be positive integers (entry {} is {})", i, js[i].dump()));
        shape.push_back(js[i].get<int64_t>());
      }
    }
    if (has_axes) {
      const json& ja = jm["axes"];
      if (!ja.is_array() || ja.empty()) fail("mesh.axes", "expected a non-empty list of axis names");
      for (size_t i = 0; i < ja.size(); ++i) {
        if (!ja[i].is_string() || ja[i].get<std::string>().empty())
          fail("mesh.axes", fmt::format("entry {} is {}, not an axis name", i, ja[i].dump()));
        std::string a = ja[i].get<std::string>();
        if (std::find(axes.begin(), axes.end(), a) != axes.end())
          fail("mesh.axes", fmt::format("axis name '{}' appears twice", a));
        axes.push_back(std::move(a));
      }
    }
    if (has_shape && has_axes && shape.size() != axes.size())
      fail("mesh", fmt::format("shape has {} entries but axes has {}", shape.size(), axes.size()));
    if (!has_shape && !has_axes) fail("mesh", "expected \"shape\" and \"axes\"");
    const size_t rank = has_shape ? shape.size() : axes.size();
    if (cli_mesh) {
      if (static_cast<size_t>(cli_mesh->rank()) != rank) {
        std::string file_axes = has_axes ? fmt::format(" ({})", join(axes)) : "";
        fail("mesh", fmt::format("--mesh {} has {} axes but the file's mesh has {}{}", mesh_text(cli_mesh->shape),
                                 cli_mesh->rank(), rank, file_axes));
      }
      shape = cli_mesh->shape;  // --mesh overrides the sizes
    } else if (!has_shape) {
      fail("mesh", "has no shape and no --mesh was given");
    }
    if (!has_axes)
      for (size_t i = 0; i < rank; ++i) axes.push_back(default_axis_name(i));
    mesh.shape = std::move(shape);
    mesh.axes = std::move(axes);
  }

  /// Parses "x:(pre)size" (Shardy's sub-axis of mesh axis x); false for any other string.
  bool parse_sub_axis(const std::string& a, int* u, int64_t* pre, int64_t* size) const {
    static const std::regex re(R"(^(.+):\((\d{1,12})\)(\d{1,12})$)");
    std::smatch m;
    if (!std::regex_match(a, m, re)) return false;
    const DeviceMesh user = mesh.user();
    *u = user.axis_index(m[1].str());
    *pre = std::stoll(m[2].str());
    *size = std::stoll(m[3].str());
    return *u >= 0;
  }

  /// Refines the mesh with the sub-axes the file names anywhere (tensors, rules, unreduced lists).
  void read_sub_axes(const json& root) {
    std::vector<std::vector<int64_t>> cuts(mesh.shape.size());
    bool any = false;
    std::function<void(const json&)> scan = [&](const json& j) {
      if (j.is_string()) {
        int u = -1;
        int64_t pre = 0, size = 0;
        if (!parse_sub_axis(j.get<std::string>(), &u, &pre, &size)) return;
        const int64_t n = mesh.shape[static_cast<size_t>(u)];
        if (pre < 1 || size < 1 || n % pre != 0 || (n / pre) % size != 0)
          fail("", fmt::format("sub-axis '{}' does not fit axis '{}' of size {}", j.get<std::string>(),
                               mesh.axes[static_cast<size_t>(u)], n));
        if (pre > 1) cuts[static_cast<size_t>(u)].push_back(pre);
        if (pre * size < n) cuts[static_cast<size_t>(u)].push_back(pre * size);
        any = true;
      } else if (j.is_array() || j.is_object()) {
        for (const auto& e : j) scan(e);
      }
    };
    if (root.contains("tensors")) scan(root["tensors"]);
    if (root.contains("rules")) scan(root["rules"]);
    if (!any) return;
    try {
      mesh = mesh.refine(cuts);
    } catch (const std::invalid_argument& e) {
      fail("", fmt::format("sub-axes that do not nest: {}", e.what()));
    }
  }

  /// The mesh axes a name stands for: an axis, or (on a refined mesh) the parts of a user axis or of a sub-axis.
  std::vector<int> axis_ids(const json& j, const std::string& key) const {
    if (!j.is_string()) fail(key, fmt::format("{} is not a mesh axis name", j.dump()));
    std::string a = j.get<std::string>();
    const DeviceMesh user = mesh.user();
    int u = user.axis_index(a);
    if (u >= 0) return mesh.parts_between(u, 1, user.shape[static_cast<size_t>(u)]);
    int64_t pre = 0, size = 0;
    if (parse_sub_axis(a, &u, &pre, &size)) return mesh.parts_between(u, pre, pre * size);
    fail(key, fmt::format("unknown mesh axis '{}' (mesh axes: {})", a, join(user.axes)));
  }

  // A parsed entry before it meets a tensor: the per-dim axes, unreduced axes, reduction and priority.
  struct Entry {
    TensorSharding sharding;
    int priority = 0;
    bool open = false;            // "open": true on the object form
    std::vector<char> open_dims;  // per dim: {"axes": [...], "open": true}
  };

  /// `j[name]` when present: true or false. Fails otherwise.
  bool flag(const json& j, const char* name, const std::string& key) const {
    if (!j.contains(name)) return false;
    if (!j[name].is_boolean()) fail(key, fmt::format("\"{}\" must be true or false (got {})", name, j[name].dump()));
    return j[name].get<bool>();
  }

  Entry parse_entry(const json& j, const std::string& key) const {
    Entry e;
    const json* spec = &j;
    if (j.is_object()) {
      check_keys(j, key, {"spec", "unreduced", "partial", "reduction", "priority", "open"});
      e.open = flag(j, "open", key);
      if (!j.contains("spec")) fail(key, "the object form needs a \"spec\" list");
      spec = &j["spec"];
      const char* ukey = j.contains("unreduced") ? "unreduced" : (j.contains("partial") ? "partial" : nullptr);
      if (ukey) {
        const json& ju = j[ukey];
        std::vector<json> items;
        if (ju.is_string())
          items.push_back(ju);
        else if (ju.is_array())
          items.assign(ju.begin(), ju.end());
        else
          fail(key, fmt::format("\"{}\" must be a list of mesh axis names", ukey));
        for (const json& a : items)
          for (int id : axis_ids(a, key)) {
            if (std::find(e.sharding.unreduced.begin(), e.sharding.unreduced.end(), id) != e.sharding.unreduced.end())
              fail(key, fmt::format("mesh axis '{}' is used twice", mesh.axis_names({id})[0]));
            e.sharding.unreduced.push_back(id);
          }
        std::sort(e.sharding.unreduced.begin(), e.sharding.unreduced.end());
      }
      if (j.contains("reduction")) {
        const json& jr = j["reduction"];
        std::string r = jr.is_string() ? jr.get<std::string>() : "";
        if (r == "sum")
          e.sharding.reduction = ReductionKind::kSum;
        else if (r == "max")
          e.sharding.reduction = ReductionKind::kMax;
        else if (r == "min")
          e.sharding.reduction = ReductionKind::kMin;
        else if (r == "prod")
          e.sharding.reduction = ReductionKind::kProd;
        else
          fail(key, fmt::format("reduction must be \"sum\", \"max\", \"min\" or \"prod\" (got {})", jr.dump()));
      }
      if (j.contains("priority")) {
        const json& jp = j["priority"];
        if (!jp.is_number_integer() || jp.get<int64_t>() < INT32_MIN || jp.get<int64_t>() > INT32_MAX)
          fail(key, fmt::format("priority must be an integer (got {})", jp.dump()));
        e.priority = static_cast<int>(jp.get<int64_t>());
      }
    }
    if (!spec->is_array())
      fail(key, fmt::format("expected a partition spec (a list with one entry per dimension) or an object with "
                            "\"spec\" (got {})",
                            spec->dump()));
    std::vector<int> used(e.sharding.unreduced);
    for (size_t d = 0; d < spec->size(); ++d) {
      const json* dim = &(*spec)[d];
      bool open = false;
      if (dim->is_object()) {  // {"axes": [...], "open": true}: Shardy's open dim
        check_keys(*dim, key, {"axes", "open"});
        open = flag(*dim, "open", key);
        dim = dim->contains("axes") ? &(*dim)["axes"] : &kNull;
      }
      e.open_dims.push_back(open);
      const json& entry = *dim;
      std::vector<int> axes;
      if (entry.is_null()) {
      } else if (entry.is_string()) {
        axes = axis_ids(entry, key);
      } else if (entry.is_array()) {
        for (const json& a : entry)
          for (int id : axis_ids(a, key)) axes.push_back(id);
      } else {
        fail(key, fmt::format("spec entry {} is {}; expected null, an axis name, a list of axis names or "
                              "{{\"axes\": [...], \"open\": true}}",
                              d, entry.dump()));
      }
      for (int a : axes) {
        if (std::find(used.begin(), used.end(), a) != used.end())
          fail(key, fmt::format("mesh axis '{}' is used twice", mesh.axis_names({a})[0]));
        used.push_back(a);
      }
      e.sharding.dims.push_back(std::move(axes));
    }
    if (std::none_of(e.open_dims.begin(), e.open_dims.end(), [](char c) { return c; })) e.open_dims.clear();
    return e;
  }

  void check_rank(const Entry& e, const Value& v, const std::string& key, const std::string& who) const {
    if (e.sharding.rank() != static_cast<int>(v.shape.size()))
      fail(key, fmt::format("spec has {} entries but {} has rank {}", e.sharding.rank(), who, v.shape.size()));
  }
};

}  // namespace

Annotations read_sharding_file(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh) {
  std::string text = frontend::read_file(path);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    auto p = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && p != std::string::npos) what = what.substr(p + 2);
    throw InputError(fmt::format("{}: malformed JSON: {}", path, what));
  }
  Reader r{path, g, {}};
  if (!root.is_object()) r.fail("", "expected a JSON object with \"mesh\" and \"tensors\"");
  r.check_keys(root, "", {"version", "mesh", "tensors", "rules"});
  if (root.contains("version") && root["version"] != 1)
    r.fail("version", fmt::format("unsupported version {} (this tool reads version 1)", root["version"].dump()));
  r.read_mesh(root, cli_mesh);
  r.read_sub_axes(root);

  Annotations ann;
  ann.mesh = r.mesh;
  if (root.contains("tensors")) {
    const json& jt = root["tensors"];
    if (!jt.is_object()) r.fail("tensors", "expected an object mapping value names to partition specs");
    for (auto it = jt.begin(); it != jt.end(); ++it) {
      const std::string key = "tensors." + quoted(it.key());
      int id = g.find(it.key());
      if (id < 0) r.fail(key, fmt::format("no value named '{}' in the model", it.key()));
      auto e = r.parse_entry(it.value(), key);
      r.check_rank(e, g.values[id], key, "the tensor");
      ann.by_value[id] =
          Annotation{std::move(e.sharding), e.priority, fmt::format("{}: {}", path, key), e.open, e.open_dims};
    }
  }
  if (root.contains("rules")) {
    const json& jr = root["rules"];
    if (!jr.is_array()) r.fail("rules", "expected a list of {\"match\": REGEX, \"spec\": [...]}");
    std::vector<char> claimed(g.values.size(), 0);
    for (const auto& [id, a] : ann.by_value) claimed[id] = 1;  // explicit entries win over rules
    for (size_t i = 0; i < jr.size(); ++i) {
      const std::string key = fmt::format("rules[{}]", i);
      const json& rule = jr[i];
      if (!rule.is_object()) r.fail(key, "expected an object {\"match\": REGEX, \"spec\": [...]}");
      if (!rule.contains("match") || !rule["match"].is_string()) r.fail(key, "needs \"match\": a regular expression");
      const std::string pattern = rule["match"].get<std::string>();
      std::regex re;
      try {
        re = std::regex(pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        r.fail(key + ".match", fmt::format("invalid regular expression {}: {}", quoted(pattern), e.what()));
      }
      json body = rule;
      body.erase("match");
      if (!body.contains("spec")) r.fail(key, "needs \"spec\": a partition spec");
      auto e = r.parse_entry(body, key);
      for (size_t v = 0; v < g.values.size(); ++v) {
        if (claimed[v] || !std::regex_search(g.values[v].name, re)) continue;
        r.check_rank(e, g.values[v], key, fmt::format("'{}' (matched by {})", g.values[v].name, quoted(pattern)));
        claimed[v] = 1;
        ann.by_value[static_cast<int>(v)] = Annotation{
            e.sharding, e.priority, fmt::format("{}: {} ({})", path, key, quoted(pattern)), e.open, e.open_dims};
      }
    }
  }
  return ann;
}

void write_sharding_file(const std::string& path, const Graph& g, const DeviceMesh& mesh,
                         const std::vector<TensorSharding>& shardings) {
  if (shardings.size() != g.values.size())
    throw std::invalid_argument(
        fmt::format("write_sharding_file: {} shardings for {} values", shardings.size(), g.values.size()));
  // A refined mesh is written as the user's mesh; its sub-axes print as "x:(pre)size" unless a whole axis is used.
  auto names = [&](const std::vector<int>& axes) {
    ojson list = ojson::array();
    for (const std::string& n : mesh.axis_names(axes)) list.push_back(n);
    return list;
  };
  std::string out = "{\n  \"mesh\": ";
  const DeviceMesh user = mesh.user();
  ojson jm;
  jm["shape"] = user.shape;
  jm["axes"] = user.axes;
  out += jm.dump();
  out += ",\n  \"tensors\": {";
  for (size_t v = 0; v < g.values.size(); ++v) {
    const TensorSharding& s = shardings[v];
    ojson spec = ojson::array();
    for (const auto& dim : s.dims) {
      ojson list = names(dim);
      if (list.empty())
        spec.push_back(nullptr);
      else if (list.size() == 1)
        spec.push_back(list[0]);
      else
        spec.push_back(list);
    }
    ojson entry = spec;
    if (!s.unreduced.empty()) {
      entry = ojson::object();
      entry["spec"] = spec;
      entry["unreduced"] = names(s.unreduced);
      if (s.reduction != ReductionKind::kSum) entry["reduction"] = std::string(reduction_name(s.reduction));
    }
    out += v ? ",\n    " : "\n    ";
    out += quoted(g.values[v].name) + ": " + entry.dump();
  }
  out += g.values.empty() ? "}\n}\n" : "\n  }\n}\n";
  frontend::write_file_atomic(path, out);
}

}  // namespace gspmd
