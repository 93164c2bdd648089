// The sharding sidecar (docs/sharding-file.md): read + write. The only frontend file that includes nlohmann/json.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/ir/json_bounded.h"
#include "core/ir/name_pattern.h"
#include "onnx_frontend/file_util.h"
#include "onnx_frontend/frontend.h"

namespace gspmd {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const json kNull;  // an absent "axes": the dim is not split

std::string quoted(const std::string& name) { return json(name).dump(); }
std::string tensor_key(const std::string& name) { return "tensors." + quoted(name); }
std::string rule_key(size_t i) { return fmt::format("rules[{}]", i); }

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string default_axis_name(size_t i) {
  static const char* const kNames[] = {"x", "y", "z", "w"};
  return i < 4 ? kNames[i] : fmt::format("a{}", i);
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
    check_keys(jm, "mesh", {"shape", "axes", "devices"});
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
        fail("mesh", fmt::format("--mesh {} has {} axes but the file's mesh has {}{}",
                                 frontend::mesh_shape_text(cli_mesh->shape), cli_mesh->rank(), rank, file_axes));
      }
      shape = cli_mesh->shape;  // --mesh overrides the sizes
    } else if (!has_shape) {
      fail("mesh", "has no shape and no --mesh was given");
    }
    if (!has_axes)
      for (size_t i = 0; i < rank; ++i) axes.push_back(default_axis_name(i));
    if (!device_count(shape))
      fail("mesh.shape", fmt::format("{} has more than the {} devices a mesh may have",
                                     frontend::mesh_shape_text(shape), kMaxDevices));
    mesh.shape = std::move(shape);
    mesh.axes = std::move(axes);
    if (jm.contains("devices")) read_devices(jm["devices"], cli_mesh);
  }

  /// The mesh's device order: the device id at each mesh position, row-major (identity = none).
  void read_devices(const json& jd, const DeviceMesh* cli_mesh) {
    if (!jd.is_array() || jd.empty())
      fail("mesh.devices", "expected a list of device ids, one per mesh position (row-major over shape)");
    for (size_t i = 0; i < jd.size(); ++i) {
      if (!jd[i].is_number_integer())
        fail("mesh.devices", fmt::format("entry {} is {}, not a device id", i, jd[i].dump()));
      mesh.devices.push_back(jd[i].get<int64_t>());
    }
    if (cli_mesh && static_cast<int64_t>(jd.size()) != cli_mesh->num_devices())
      fail("mesh.devices", fmt::format("has {} entries but --mesh {} has {} devices", jd.size(),
                                       frontend::mesh_shape_text(cli_mesh->shape), cli_mesh->num_devices()));
    try {
      mesh.check_devices();
    } catch (const std::invalid_argument& e) {
      fail("mesh.devices", e.what());
    }
    if (!mesh.has_device_order()) mesh.devices.clear();
  }

  /// Parses "x:(pre)size" (Shardy's sub-axis of mesh axis x); false for any other string.
  bool parse_sub_axis(const std::string& a, int* u, int64_t* pre, int64_t* size) const {
    const std::optional<SubAxisName> sub = parse_sub_axis_name(a);
    if (!sub) return false;
    *u = mesh.user().axis_index(sub->parent);
    *pre = sub->pre;
    *size = sub->size;
    return *u >= 0;
  }

  /// Refines the mesh with the sub-axes the file names anywhere (tensors, rules, unreduced lists) and those its HLO
  /// entries need (each decoded once, here, into decoded_hlo).
  void read_sub_axes(const json& root) {
    std::vector<std::vector<int64_t>> cuts(mesh.shape.size());
    bool any = false;
    auto hlo_entry = [&](const json& j, const std::string& key) {
      if (!j.is_object() || !j.contains("hlo")) return;
      if (!j["hlo"].is_string()) fail(key, "\"hlo\" must be a string of XLA HLO sharding text");
      try {
        ParsedSharding p = sharding_from_hlo(j["hlo"].get<std::string>(), mesh);
        const auto c = p.mesh.cuts();
        for (size_t u = 0; u < c.size(); ++u) cuts[u].insert(cuts[u].end(), c[u].begin(), c[u].end());
        any = any || p.mesh.is_refined();
        decoded_hlo.emplace(key, std::move(p));
      } catch (const std::invalid_argument& e) {
        fail(key, fmt::format("hlo: {}", e.what()));
      }
    };
    if (root.contains("tensors") && root["tensors"].is_object())
      for (auto it = root["tensors"].begin(); it != root["tensors"].end(); ++it)
        hlo_entry(it.value(), tensor_key(it.key()));
    if (root.contains("rules") && root["rules"].is_array())
      for (size_t i = 0; i < root["rules"].size(); ++i) hlo_entry(root["rules"][i], rule_key(i));
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

  // A parsed entry before it meets a tensor: the per-dim axes, unreduced axes, reduction and priority, in one of
  // the notations.
  struct Entry {
    TensorSharding sharding;  // on `mesh`
    int priority = 0;
    bool open = false;            // "open": true on the object form
    std::vector<char> open_dims;  // per dim: {"axes": [...], "open": true}
    const char* notation = "spec";
    bool any_rank = false;  // hlo "{replicated}": replicated at the tensor's rank
    bool min_rank = false;  // sbp: `sharding` has the rank its splits need; unsplit dims are added to the tensor's
  };

  /// `j[name]` when present: true or false. Fails otherwise.
  bool flag(const json& j, const char* name, const std::string& key) const {
    if (!j.contains(name)) return false;
    if (!j[name].is_boolean()) fail(key, fmt::format("\"{}\" must be true or false (got {})", name, j[name].dump()));
    return j[name].get<bool>();
  }

  Entry parse_entry(const json& j, const std::string& key) const {
    Entry e;
    if (j.is_object() && (j.contains("hlo") || j.contains("sbp"))) {
      if (j.contains("spec") + j.contains("hlo") + j.contains("sbp") > 1)
        fail(key, "give one of \"spec\", \"hlo\" or \"sbp\"");
      if (j.contains("hlo")) {
        check_keys(j, key, {"hlo", "reduction", "priority", "open"});
        const ParsedSharding& p = decoded_hlo.at(key);
        e.notation = "hlo";
        e.any_rank = p.any_rank;
        e.sharding = p.any_rank ? p.sharding : remap(p.sharding, p.mesh, mesh);
      } else {
        check_keys(j, key, {"sbp", "priority", "open"});
        const json& js = j["sbp"];
        std::vector<std::string> sbp;
        for (const json& x : js.is_array() ? js : json::array({nullptr})) {
          if (!x.is_string()) fail(key, "\"sbp\" must be a list with one entry per mesh axis, like [\"S(0)\", \"B\"]");
          sbp.push_back(x.get<std::string>());
        }
        try {
          e.sharding = sharding_from_sbp(sbp, mesh);
        } catch (const std::invalid_argument& ex) {
          fail(key, fmt::format("sbp: {}", ex.what()));
        }
        e.notation = "sbp";
        e.min_rank = true;
      }
      read_reduction_and_priority(j, key, e);
      e.open = flag(j, "open", key);
      return e;
    }
    const json* spec = &j;
    if (j.is_object()) {
      check_keys(j, key, {"spec", "hlo", "sbp", "unreduced", "partial", "reduction", "priority", "open"});
      e.open = flag(j, "open", key);
      if (!j.contains("spec")) fail(key, "the object form needs \"spec\", \"hlo\" or \"sbp\"");
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
      read_reduction_and_priority(j, key, e);
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

  void read_reduction_and_priority(const json& j, const std::string& key, Entry& e) const {
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

  /// The entry's sharding for value `v` (`who` names it in errors): checks or supplies the rank.
  TensorSharding sharding_for(const Entry& e, const Value& v, const std::string& key, const std::string& who) const {
    const int rank = static_cast<int>(v.shape.size());
    TensorSharding s = e.sharding;
    if (e.any_rank) {
      s.dims.assign(static_cast<size_t>(rank), {});
    } else if (e.min_rank) {
      if (s.rank() > rank)
        fail(key, fmt::format("sbp: S({}) splits dim {} but {} has rank {}", s.rank() - 1, s.rank() - 1, who, rank));
      s.dims.resize(static_cast<size_t>(rank));
    } else if (s.rank() != rank) {
      fail(key, std::string(e.notation) == "hlo"
                    ? fmt::format("hlo: the tile assignment has {} tensor dims but {} has rank {}", s.rank(), who, rank)
                    : fmt::format("spec has {} entries but {} has rank {}", s.rank(), who, rank));
    }
    return s;
  }

  std::map<std::string, ParsedSharding> decoded_hlo;  // HLO entries by key (read_sub_axes)
};

}  // namespace

std::function<bool(const Value&)> sharding_file_names(const std::string& path) {
  json root;
  try {
    root = parse_json_bounded(frontend::read_file(path), path);
  } catch (const std::exception&) {
    return {};  // read_sharding_file reports it
  }
  if (!root.is_object()) return {};
  std::set<std::string> names;
  std::vector<NamePattern> patterns;
  if (root.contains("tensors") && root["tensors"].is_object())
    for (auto it = root["tensors"].begin(); it != root["tensors"].end(); ++it) names.insert(it.key());
  if (root.contains("rules") && root["rules"].is_array())
    for (const json& rule : root["rules"]) {
      if (!rule.is_object() || !rule.contains("match") || !rule["match"].is_string()) continue;
      if (auto p = NamePattern::try_compile(rule["match"].get<std::string>(), nullptr)) patterns.push_back(*p);
    }
  if (names.empty() && patterns.empty()) return {};
  return [names = std::move(names), patterns = std::move(patterns)](const Value& v) {
    return names.count(v.name) != 0 ||
           std::any_of(patterns.begin(), patterns.end(), [&](const NamePattern& re) { return re.search(v.name); });
  };
}

Annotations read_sharding_file(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh,
                               std::vector<RuleMatches>* rules) {
  std::string text = frontend::read_file(path);
  json root;
  try {
    root = parse_json_bounded(text, path);
  } catch (const json::exception& e) {  // malformed, or a number out of range ("1E6212")
    std::string what = e.what();
    auto p = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && p != std::string::npos) what = what.substr(p + 2);
    throw InputError(fmt::format("{}: malformed JSON: {}", path, what));
  }
  Reader r{path, g, {}, {}};
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
      const std::string key = tensor_key(it.key());
      int id = g.find(it.key());
      if (id < 0) r.fail(key, fmt::format("no value named '{}' in the model", it.key()));
      auto e = r.parse_entry(it.value(), key);
      TensorSharding s = r.sharding_for(e, g.values[id], key, "the tensor");
      ann.by_value[id] = Annotation{std::move(s), e.priority, fmt::format("{}: {}", path, key), e.open, e.open_dims};
    }
  }
  if (root.contains("rules")) {
    const json& jr = root["rules"];
    if (!jr.is_array()) r.fail("rules", "expected a list of {\"match\": REGEX, \"spec\": [...]}");
    std::vector<char> claimed(g.values.size(), 0);
    for (const auto& [id, a] : ann.by_value) claimed[id] = 1;  // explicit entries win over rules
    for (size_t i = 0; i < jr.size(); ++i) {
      const std::string key = rule_key(i);
      const json& rule = jr[i];
      if (!rule.is_object()) r.fail(key, "expected an object {\"match\": REGEX, \"spec\": [...]}");
      if (!rule.contains("match") || !rule["match"].is_string()) r.fail(key, "needs \"match\": a regular expression");
      const std::string pattern = rule["match"].get<std::string>();
      std::string why;
      const std::optional<NamePattern> re = NamePattern::try_compile(pattern, &why);
      if (!re) r.fail(key + ".match", fmt::format("invalid regular expression {}: {}", quoted(cut_text(pattern)), why));
      json body = rule;
      body.erase("match");
      if (!body.contains("spec") && !body.contains("hlo") && !body.contains("sbp"))
        r.fail(key, "needs \"spec\": a partition spec (or \"hlo\" or \"sbp\")");
      auto e = r.parse_entry(body, key);
      RuleMatches* m = rules ? &rules->emplace_back(RuleMatches{key, pattern, {}, {}}) : nullptr;
      for (size_t v = 0; v < g.values.size(); ++v) {
        if (claimed[v] || !re->search(g.values[v].name)) continue;
        const std::string who =
            m ? "the tensor" : fmt::format("'{}' (matched by {})", g.values[v].name, quoted(pattern));
        TensorSharding s;
        try {
          s = r.sharding_for(e, g.values[v], key, who);
        } catch (const InputError& err) {
          if (!m) throw;
          m->failed.emplace_back(static_cast<int>(v), err.what());
          continue;
        }
        if (m) m->annotated.push_back(static_cast<int>(v));
        claimed[v] = 1;
        ann.by_value[static_cast<int>(v)] = Annotation{
            std::move(s), e.priority, fmt::format("{}: {} ({})", path, key, quoted(pattern)), e.open, e.open_dims};
      }
    }
  }
  return ann;
}

namespace {

/// `s` as a partition spec: the list, or {"spec", "unreduced"[, "reduction"]} for a partial value. Sub-axes print as
/// "x:(pre)size" unless a whole axis is used.
ojson spec_entry(const TensorSharding& s, const DeviceMesh& mesh) {
  auto names = [&](const std::vector<int>& axes) {
    ojson list = ojson::array();
    for (const std::string& n : mesh.axis_names(axes)) list.push_back(n);
    return list;
  };
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
  if (s.unreduced.empty()) return spec;
  ojson entry = ojson::object();
  entry["spec"] = spec;
  entry["unreduced"] = names(s.unreduced);
  if (s.reduction != ReductionKind::kSum) entry["reduction"] = std::string(reduction_name(s.reduction));
  return entry;
}

bool same_sharding(const TensorSharding& a, const TensorSharding& b) {
  return a.dims == b.dims && a.unreduced == b.unreduced;
}

/// {"hlo": TEXT[, "reduction"]}, or nothing when the text does not read back to `s` (axes of size 1).
std::optional<ojson> hlo_entry(const TensorSharding& s, const DeviceMesh& mesh) {
  const std::string text = s.to_hlo(mesh, /*iota=*/true);
  const ParsedSharding p = sharding_from_hlo(text, mesh);
  if (!same_sharding(p.any_rank ? TensorSharding::replicated(s.rank()) : remap(p.sharding, p.mesh, mesh), s))
    return std::nullopt;
  ojson entry = ojson::object();
  entry["hlo"] = text;
  if (!s.unreduced.empty() && s.reduction != ReductionKind::kSum)
    entry["reduction"] = std::string(reduction_name(s.reduction));
  return entry;
}

/// {"sbp": [...]}, one entry per user mesh axis from the role of its first part, or nothing when that does not read
/// back to `s` (sub-axes, or a dim whose axes are not in mesh-axis order).
std::optional<ojson> sbp_entry(const TensorSharding& s, const DeviceMesh& mesh) {
  std::vector<std::string> sbp;
  for (int u = 0; u < static_cast<int>(mesh.user().shape.size()); ++u) {
    const int a = mesh.parts_of(u).front();
    std::string e = "B";
    for (int d = 0; d < s.rank(); ++d)
      if (std::find(s.dims[d].begin(), s.dims[d].end(), a) != s.dims[d].end()) e = fmt::format("S({})", d);
    if (std::find(s.unreduced.begin(), s.unreduced.end(), a) != s.unreduced.end())
      e = s.reduction == ReductionKind::kSum ? "P" : fmt::format("P({})", reduction_name(s.reduction));
    sbp.push_back(e);
  }
  TensorSharding back = sharding_from_sbp(sbp, mesh);
  if (back.rank() > s.rank()) return std::nullopt;
  back.dims.resize(static_cast<size_t>(s.rank()));
  if (!same_sharding(back, s)) return std::nullopt;
  ojson entry = ojson::object();
  entry["sbp"] = sbp;
  return entry;
}

}  // namespace

void write_sharding_file(const std::string& path, const Graph& g, const DeviceMesh& mesh,
                         const std::vector<TensorSharding>& shardings, ShardingNotation notation) {
  if (shardings.size() != g.values.size())
    throw std::invalid_argument(
        fmt::format("write_sharding_file: {} shardings for {} values", shardings.size(), g.values.size()));
  // A refined mesh is written as the user's mesh.
  std::string out = "{\n  \"mesh\": ";
  const DeviceMesh user = mesh.user();
  ojson jm;
  jm["shape"] = user.shape;
  jm["axes"] = user.axes;
  if (user.has_device_order()) jm["devices"] = user.devices;
  out += jm.dump();
  out += ",\n  \"tensors\": {";
  for (size_t v = 0; v < g.values.size(); ++v) {
    const TensorSharding& s = shardings[v];
    std::optional<ojson> entry;
    if (notation == ShardingNotation::kHlo) entry = hlo_entry(s, mesh);
    if (notation == ShardingNotation::kSbp) entry = sbp_entry(s, mesh);
    out += v ? ",\n    " : "\n    ";
    out += quoted(g.values[v].name) + ": " + (entry ? *entry : spec_entry(s, mesh)).dump();
  }
  out += g.values.empty() ? "}\n}\n" : "\n  }\n}\n";
  frontend::write_file_atomic(path, out);
}

}  // namespace gspmd
