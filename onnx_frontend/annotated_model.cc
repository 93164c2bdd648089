// Annotated models (docs/sharding-file.md, "Annotated models"): the unpartitioned model with every value's sharding
// as ONNX's multi-device annotations (NodeProto.device_configurations, ModelProto.configuration; onnx >= 1.18), and
// back. onnx 1.12 has no such messages: onnx_multidevice.proto has them, and they travel as unknown fields of
// onnx 1.12's NodeProto / ModelProto with upstream's field numbers, through protobuf's reflection API.
#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include <fmt/format.h>
#include <google/protobuf/unknown_field_set.h>
#include <nlohmann/json.hpp>

#include "core/ir/json_bounded.h"
#include "onnx_frontend/file_util.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/onnx_multidevice.pb.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace {

namespace md = gspmd::onnx_multidevice;
namespace fs = std::filesystem;

constexpr int kNodeDeviceConfigurations = 10;  // NodeProto.device_configurations
constexpr int kModelConfiguration = 26;        // ModelProto.configuration
constexpr const char* kConfiguration = "gspmd";
constexpr const char* kUnreducedKey = "gspmd.unreduced";

/// The unknown fields of `msg` (onnx 1.12 keeps the fields it does not know there).
google::protobuf::UnknownFieldSet* unknown(google::protobuf::Message& msg) {
  return msg.GetReflection()->MutableUnknownFields(&msg);
}

/// Every field `number` of `msg`'s unknown fields, parsed as T; throws `bad(k)` for an entry that is not a T.
template <class T, class Bad>
std::vector<T> unknown_messages(const google::protobuf::Message& msg, int number, Bad bad) {
  std::vector<T> out;
  const google::protobuf::UnknownFieldSet& u = msg.GetReflection()->GetUnknownFields(msg);
  for (int k = 0; k < u.field_count(); ++k) {
    const google::protobuf::UnknownField& f = u.field(k);
    if (f.number() != number) continue;
    out.emplace_back();
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED ||
        !out.back().ParseFromString(f.length_delimited()))
      bad(out.size() - 1);
  }
  return out;
}

/// Replaces the unknown fields `number` of `msg` by `values`.
template <class T>
void set_unknown_messages(google::protobuf::Message& msg, int number, const std::vector<T>& values) {
  unknown(msg)->DeleteByNumber(number);
  for (const T& v : values) unknown(msg)->AddLengthDelimited(number, v.SerializeAsString());
}

bool has_unknown(const google::protobuf::Message& msg, int number) {
  const google::protobuf::UnknownFieldSet& u = msg.GetReflection()->GetUnknownFields(msg);
  for (int k = 0; k < u.field_count(); ++k)
    if (u.field(k).number() == number) return true;
  return false;
}

/// Per device, the index of the shard it holds under `s`: shards enumerated row-major over the split dims (the
/// first split dim major), as ShardingSpecProto.device lists them.
std::vector<int64_t> shard_of_devices(const TensorSharding& s, const DeviceMesh& mesh) {
  std::vector<int64_t> shard(static_cast<size_t>(mesh.num_devices()), 0);
  for (int64_t k = 0; k < mesh.num_devices(); ++k)
    for (const auto& axes : s.dims)
      if (!axes.empty())
        shard[static_cast<size_t>(k)] = shard[static_cast<size_t>(k)] * mesh.axes_size(axes) + mesh.tile_index(k, axes);
  return shard;
}

/// `s` as ONNX's ShardingSpecProto for the value `name` of `shape`: one sharded_dim per split dim (one
/// simple_sharding: the dim and its shard count), one `device` entry per shard: the device holding it, or a negative
/// key of index_to_device_group_map (-1, -2, ...) when several devices replicate it. Unreduced axes replicate.
md::ShardingSpecProto encode(const std::string& name, const TensorSharding& s, const Shape& shape,
                             const DeviceMesh& mesh) {
  md::ShardingSpecProto spec;
  spec.set_tensor_name(name);
  int64_t shards = 1;
  for (size_t d = 0; d < s.dims.size(); ++d) {
    if (s.dims[d].empty()) continue;
    auto* sd = spec.add_sharded_dim();
    sd->set_axis(static_cast<int64_t>(d));
    auto* ss = sd->add_simple_sharding();
    ss->set_dim_value(shape.at(d));
    ss->set_num_shards(mesh.axes_size(s.dims[d]));
    shards *= ss->num_shards();
  }
  std::vector<std::vector<int64_t>> holders(static_cast<size_t>(shards));
  const std::vector<int64_t> shard = shard_of_devices(s, mesh);
  for (int64_t k = 0; k < mesh.num_devices(); ++k)
    holders[static_cast<size_t>(shard[static_cast<size_t>(k)])].push_back(k);
  int64_t key = -1;
  for (const auto& h : holders) {
    if (h.size() == 1) {
      spec.add_device(h[0]);
      continue;
    }
    spec.add_device(key);
    auto* e = spec.add_index_to_device_group_map();
    e->set_key(key--);
    for (int64_t k : h) e->add_value(k);
  }
  return spec;
}

/// Reads one annotated model: its configuration, mesh and sharding specs.
struct Reader {
  const std::string& path;
  const Graph& g;
  onnx::ModelProto m;
  DeviceMesh mesh;

  [[noreturn]] void fail(const std::string& why) const { throw InputError(fmt::format("{}: {}", path, why)); }

  std::string meta(const std::string& key) const {
    for (const auto& e : m.metadata_props())
      if (e.key() == key) return e.value();
    return "";
  }

  /// The mesh of the gspmd.mesh_shape / gspmd.mesh_axes metadata (a refined mesh names its sub-axes
  /// "x:(pre)size"), else --mesh; --mesh must have the metadata's (user) shape.
  void read_mesh(const DeviceMesh* cli_mesh) {
    const std::string shape_text = meta("gspmd.mesh_shape"), axes_text = meta("gspmd.mesh_axes");
    if (shape_text.empty()) {
      if (!cli_mesh) fail("the model has no gspmd.mesh_shape metadata and no --mesh was given");
      mesh = *cli_mesh;
      return;
    }
    DeviceMesh listed;
    try {
      listed = DeviceMesh::parse(shape_text);
    } catch (const InputError&) {
      fail(fmt::format("metadata gspmd.mesh_shape '{}' is not a mesh shape like 2x2", shape_text));
    }
    std::vector<std::string> names;
    for (size_t b = 0, e; b <= axes_text.size(); b = e + 1) {
      e = std::min(axes_text.find(',', b), axes_text.size());
      names.push_back(axes_text.substr(b, e - b));
    }
    if (names.size() != listed.shape.size())
      fail(fmt::format("metadata gspmd.mesh_axes '{}' does not name the {} axes of gspmd.mesh_shape '{}'", axes_text,
                       listed.shape.size(), shape_text));
    // A refined mesh's axes are parts "x:(pre)size" of the user's axes (docs/partitioning.md): rebuild it.
    DeviceMesh user;
    std::vector<std::vector<int64_t>> cuts;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::optional<SubAxisName> sub = parse_sub_axis_name(names[i]);
      const bool part = sub.has_value();
      const std::string parent = part ? sub->parent : names[i];
      int u = user.axis_index(parent);
      if (u < 0) {
        user.axes.push_back(parent);
        user.shape.push_back(1);
        cuts.emplace_back();
        u = user.rank() - 1;
      } else if (!part) {
        fail(fmt::format("metadata gspmd.mesh_axes '{}' names axis '{}' twice", axes_text, parent));
      }
      if (part && sub->pre > 1) cuts[static_cast<size_t>(u)].push_back(sub->pre);
      user.shape[static_cast<size_t>(u)] *= listed.shape[i];
    }
    const std::string devices_text = meta("gspmd.mesh_devices");
    try {
      for (size_t b = 0, e; !devices_text.empty() && b <= devices_text.size(); b = e + 1) {
        e = std::min(devices_text.find(',', b), devices_text.size());
        user.devices.push_back(std::stoll(devices_text.substr(b, e - b)));
      }
      user.check_devices();
    } catch (const std::exception& e) {
      fail(fmt::format("metadata gspmd.mesh_devices '{}' is not the mesh's device order: {}", devices_text, e.what()));
    }
    try {
      mesh = user.refine(cuts);
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("metadata gspmd.mesh_axes '{}': {}", axes_text, e.what()));
    }
    if (mesh.axes != names || mesh.shape != listed.shape)
      fail(fmt::format("metadata gspmd.mesh_axes '{}' is not a mesh gspmd-onnx writes", axes_text));
    if (cli_mesh && cli_mesh->shape != user.shape)
      fail(
          fmt::format("--mesh {} does not match the annotated model's mesh {} (its sharding specs list that mesh's "
                      "devices)",
                      frontend::mesh_shape_text(cli_mesh->shape), frontend::mesh_shape_text(user.shape)));
  }

  /// The configuration the nodes' annotations refer to: the model's only one, or the one named "gspmd".
  std::string read_configuration() {
    auto bad = [&](size_t k) { fail(fmt::format("configuration {} is not a DeviceConfigurationProto", k)); };
    const std::vector<md::DeviceConfigurationProto> configs =
        unknown_messages<md::DeviceConfigurationProto>(m, kModelConfiguration, bad);
    if (configs.empty())
      fail("nodes carry device_configurations but the model lists no configuration (ModelProto.configuration)");
    const md::DeviceConfigurationProto* c = configs.size() == 1 ? &configs[0] : nullptr;
    for (const auto& x : configs)
      if (!c && x.name() == kConfiguration) c = &x;
    if (!c) {
      std::vector<std::string> names;
      for (const auto& x : configs) names.push_back("'" + x.name() + "'");
      fail(fmt::format("the model has {} device configurations ({}) and none is named '{}'", configs.size(),
                       fmt::join(names, ", "), kConfiguration));
    }
    if (c->num_devices() != mesh.num_devices())
      fail(fmt::format("configuration '{}' has {} devices but the mesh {} has {}", c->name(), c->num_devices(),
                       mesh.str(), mesh.num_devices()));
    return c->name();
  }

  /// The sharding `spec` describes for a value of `shape` (exactly: the device assignment must be the mesh's tiling
  /// of that sharding). `where` prefixes errors.
  TensorSharding decode(const md::ShardingSpecProto& spec, const Shape& shape, const std::string& where) const {
    auto bad = [&](const std::string& why) { fail(fmt::format("{}: {}", where, why)); };
    const int64_t rank = static_cast<int64_t>(shape.size()), n = mesh.num_devices();
    std::vector<std::pair<int64_t, int64_t>> split;  // (tensor dim, shards), in sharded_dim order
    int64_t shards = 1;
    for (const auto& sd : spec.sharded_dim()) {
      if (sd.axis() < -rank || sd.axis() >= rank)
        bad(fmt::format("sharded_dim axis {} is out of range for rank {}", sd.axis(), rank));
      const int64_t d = sd.axis() < 0 ? sd.axis() + rank : sd.axis();
      for (const auto& [other, _] : split)
        if (other == d) bad(fmt::format("dim {} is sharded twice", d));
      if (sd.simple_sharding_size() != 1)
        bad(fmt::format("dim {} has {} simple_sharding entries; gspmd-onnx reads one (no fused reshape axes)", d,
                        sd.simple_sharding_size()));
      const md::SimpleShardedDimProto& ss = sd.simple_sharding(0);
      if (ss.num_shards() < 1 || ss.num_shards() > n)
        bad(fmt::format("dim {} has num_shards {} (the mesh has {} devices)", d, ss.num_shards(), n));
      if (ss.has_dim_value() && ss.dim_value() != shape[static_cast<size_t>(d)])
        bad(fmt::format("dim {} has dim_value {} but the value's dim is {}", d, ss.dim_value(),
                        shape[static_cast<size_t>(d)]));
      split.emplace_back(d, ss.num_shards());
      shards *= ss.num_shards();
    }
    if (spec.device_size() != shards) bad(fmt::format("lists {} devices for {} shards", spec.device_size(), shards));
    std::map<int64_t, std::vector<int64_t>> groups;
    for (const auto& e : spec.index_to_device_group_map()) groups[e.key()].assign(e.value().begin(), e.value().end());
    std::vector<int64_t> shard(static_cast<size_t>(n), -1);
    for (int64_t i = 0; i < shards; ++i) {
      const int64_t entry = spec.device(static_cast<int>(i));
      const auto group = groups.find(entry);
      for (int64_t k : group != groups.end() ? group->second : std::vector<int64_t>{entry}) {
        if (k < 0 || k >= n) bad(fmt::format("device {} is not on the mesh {}", k, mesh.str()));
        if (shard[static_cast<size_t>(k)] >= 0) bad(fmt::format("device {} holds two shards", k));
        shard[static_cast<size_t>(k)] = i;
      }
    }
    for (int64_t k = 0; k < n; ++k)
      if (shard[static_cast<size_t>(k)] < 0) bad(fmt::format("device {} holds no shard", k));
    // Dim j's shard index on device k; the mesh axes that move it, ordered by how far (the major axis first).
    TensorSharding s = TensorSharding::replicated(static_cast<int>(rank));
    int64_t stride = shards;
    for (const auto& [d, count] : split) {
      stride /= count;
      auto index = [&, count = count](int64_t k) { return shard[static_cast<size_t>(k)] / stride % count; };
      std::vector<std::pair<int64_t, int>> moves;
      int64_t step = n;  // row-major mesh-position distance between neighbours along axis a
      for (int a = 0; a < mesh.rank(); ++a) {
        step /= mesh.shape[static_cast<size_t>(a)];
        const int64_t moved = index(mesh.device_at(step)) - index(mesh.device_at(0));
        if (mesh.shape[static_cast<size_t>(a)] > 1 && moved != 0) moves.emplace_back(moved, a);
      }
      std::sort(moves.rbegin(), moves.rend());
      for (const auto& [_, a] : moves) s.dims[static_cast<size_t>(d)].push_back(a);
    }
    if (shard_of_devices(s, mesh) != shard)
      bad(fmt::format("the device assignment is not a tiling of the mesh {} (as {} would be)", mesh.str(),
                      s.to_partition_spec(mesh)));
    return s;
  }

  /// The mesh axes a name in gspmd.unreduced stands for (a user axis: all its parts).
  std::vector<int> axis_ids(const std::string& name) const {
    const int a = mesh.axis_index(name);
    if (a >= 0) return {a};
    const int u = mesh.user().axis_index(name);
    if (u < 0) fail(fmt::format("metadata {}: unknown mesh axis '{}'", kUnreducedKey, name));
    return mesh.parts_of(u);
  }

  void read_unreduced(Annotations& ann) const {
    const std::string text = meta(kUnreducedKey);
    if (text.empty()) return;
    nlohmann::json j;
    try {
      j = parse_json_bounded(text, fmt::format("metadata {}", kUnreducedKey));
    } catch (const nlohmann::json::exception&) {  // malformed, or a number out of range
      fail(fmt::format("metadata {} is not a JSON object", kUnreducedKey));
    } catch (const InputError& e) {
      fail(e.what());
    }
    if (!j.is_object()) fail(fmt::format("metadata {} is not a JSON object", kUnreducedKey));
    for (auto it = j.begin(); it != j.end(); ++it) {
      const int v = g.find(it.key());
      const auto a = ann.by_value.find(v);
      if (v < 0 || a == ann.by_value.end()) continue;
      const nlohmann::json& e = it.value();
      if (!e.is_object() || !e.contains("axes") || !e["axes"].is_array())
        fail(
            fmt::format("metadata {}: \"{}\" is not {{\"axes\": [...], \"reduction\": ...}}", kUnreducedKey, it.key()));
      TensorSharding& s = a->second.sharding;
      for (const auto& name : e["axes"])
        for (int id : axis_ids(name.is_string() ? name.get<std::string>() : name.dump())) s.unreduced.push_back(id);
      std::sort(s.unreduced.begin(), s.unreduced.end());
      const std::string r = e.value("reduction", std::string("sum"));
      bool known = false;
      for (ReductionKind k : {ReductionKind::kSum, ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd}) {
        if (reduction_name(k) != r) continue;
        s.reduction = k;
        known = true;
      }
      if (!known) fail(fmt::format("metadata {}: \"{}\" has the unknown reduction '{}'", kUnreducedKey, it.key(), r));
    }
  }
};

/// Rewrites relative external-data locations of `m`'s initializers (relative to `from`) to be relative to `to`.
void move_external_data(onnx::ModelProto& m, const fs::path& from, const fs::path& to) {
  if (fs::absolute(from).lexically_normal() == fs::absolute(to).lexically_normal()) return;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    if (!frontend::is_external(t)) continue;
    for (auto& kv : *t.mutable_external_data())
      if (kv.key() == "location" && fs::path(kv.value()).is_relative())
        kv.set_value(fs::absolute(from / kv.value()).lexically_normal().lexically_relative(fs::absolute(to)).string());
  }
}

}  // namespace

namespace frontend {

bool has_sharding_annotations(const onnx::ModelProto& m) {
  if (has_unknown(m, kModelConfiguration)) return true;
  for (const auto& n : m.graph().node())
    if (has_unknown(n, kNodeDeviceConfigurations)) return true;
  return false;
}

void set_mesh_metadata(onnx::ModelProto& m, const DeviceMesh& mesh) {
  std::vector<std::pair<std::string, std::string>> values = {
      {"gspmd.mesh_shape", frontend::mesh_shape_text(mesh.shape)},
      {"gspmd.mesh_axes", fmt::format("{}", fmt::join(mesh.axes, ","))}};
  if (mesh.has_device_order())
    values.emplace_back("gspmd.mesh_devices", fmt::format("{}", fmt::join(mesh.devices, ",")));
  std::vector<onnx::StringStringEntryProto> kept;
  for (const auto& e : m.metadata_props())
    if (e.key() != "gspmd.mesh_shape" && e.key() != "gspmd.mesh_axes" && e.key() != "gspmd.mesh_devices")
      kept.push_back(e);
  m.clear_metadata_props();
  for (const auto& e : kept) *m.add_metadata_props() = e;
  for (const auto& [key, value] : values) {
    auto* e = m.add_metadata_props();
    e->set_key(key);
    e->set_value(value);
  }
}

}  // namespace frontend

void write_annotated_model(const std::string& model_path, const Graph& g, const DeviceMesh& mesh,
                           const std::vector<TensorSharding>& shardings, const std::string& out_path) {
  if (shardings.size() != g.values.size())
    throw std::invalid_argument(
        fmt::format("write_annotated_model: {} shardings for {} values", shardings.size(), g.values.size()));
  onnx::ModelProto m;
  frontend::parse_model_file(model_path, &m);
  md::DeviceConfigurationProto config;
  config.set_name(kConfiguration);
  config.set_num_devices(static_cast<int32_t>(mesh.num_devices()));
  set_unknown_messages(m, kModelConfiguration, std::vector<md::DeviceConfigurationProto>{config});
  frontend::set_mesh_metadata(m, mesh);
  nlohmann::ordered_json unreduced = nlohmann::ordered_json::object();
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    md::NodeDeviceConfigurationProto nc;
    nc.set_configuration_id(kConfiguration);
    std::set<std::string> done;
    std::vector<std::string> names(n.input().begin(), n.input().end());
    names.insert(names.end(), n.output().begin(), n.output().end());
    for (const std::string& name : names) {
      const int v = name.empty() ? -1 : g.find(name);
      if (v < 0 || !done.insert(name).second) continue;
      const TensorSharding& s = shardings[static_cast<size_t>(v)];
      *nc.add_sharding_spec() = encode(name, s, g.values[static_cast<size_t>(v)].shape, mesh);
      if (!s.unreduced.empty())
        unreduced[name] = {{"axes", mesh.axis_names(s.unreduced)},
                           {"reduction", std::string(reduction_name(s.reduction))}};
    }
    std::vector<md::NodeDeviceConfigurationProto> configs;
    if (nc.sharding_spec_size() > 0) configs.push_back(nc);
    set_unknown_messages(n, kNodeDeviceConfigurations, configs);
  }
  std::vector<onnx::StringStringEntryProto> meta;
  for (const auto& e : m.metadata_props())
    if (e.key() != kUnreducedKey) meta.push_back(e);
  m.clear_metadata_props();
  for (const auto& e : meta) *m.add_metadata_props() = e;
  if (!unreduced.empty()) {
    auto* e = m.add_metadata_props();
    e->set_key(kUnreducedKey);
    e->set_value(unreduced.dump());
  }
  move_external_data(m, frontend::dir_of(model_path), frontend::dir_of(out_path));
  if (m.ByteSizeLong() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw UnsupportedError(fmt::format("{}: the annotated model is over protobuf's 2 GiB limit", out_path));
  frontend::write_file_atomic(out_path, m.SerializeAsString());
}

Annotations read_annotated_model(const std::string& path, const Graph& g, const DeviceMesh* cli_mesh) {
  Reader r{path, g, {}, {}};
  frontend::parse_model_file(path, &r.m);
  if (!frontend::has_sharding_annotations(r.m))
    r.fail(
        "carries no sharding annotations (NodeProto.device_configurations); write one with partition "
        "--annotated-model");
  r.read_mesh(cli_mesh);
  const std::string config = r.read_configuration();
  Annotations ann;
  ann.mesh = r.mesh;
  int specs = 0;
  std::map<int, std::string> first;  // value -> the node whose spec annotated it
  for (const auto& n : r.m.graph().node()) {
    const std::string where = fmt::format("node '{}'", n.name());
    auto bad = [&](size_t k) {
      r.fail(fmt::format("{}: device_configurations[{}] is not a NodeDeviceConfigurationProto", where, k));
    };
    for (const auto& nc : unknown_messages<md::NodeDeviceConfigurationProto>(n, kNodeDeviceConfigurations, bad)) {
      if (nc.configuration_id() != config) continue;
      for (const auto& spec : nc.sharding_spec()) {
        ++specs;
        const std::string& name = spec.tensor_name();
        const std::string at = fmt::format("{}: sharding_spec '{}'", where, name);
        if (std::find(n.input().begin(), n.input().end(), name) == n.input().end() &&
            std::find(n.output().begin(), n.output().end(), name) == n.output().end())
          r.fail(fmt::format("{}: not an input or output of the node", at));
        const int v = g.find(name);
        if (v < 0) continue;  // folded away at load
        TensorSharding s = r.decode(spec, g.values[static_cast<size_t>(v)].shape, at);
        const auto it = ann.by_value.find(v);
        if (it == ann.by_value.end()) {
          ann.by_value[v] = Annotation{std::move(s), 0, fmt::format("{}: {}", path, at)};
          first[v] = n.name();
        } else if (it->second.sharding != s) {
          r.fail(fmt::format("{}: {} differs from node '{}''s {}", at, s.to_partition_spec(r.mesh), first[v],
                             it->second.sharding.to_partition_spec(r.mesh)));
        }
      }
    }
  }
  if (specs > 0 && ann.by_value.empty())
    r.fail(fmt::format("none of its {} sharding specs names a value of the model", specs));
  r.read_unreduced(ann);
  return ann;
}

}  // namespace gspmd
