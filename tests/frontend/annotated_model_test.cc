// Annotated models (write_annotated_model / read_annotated_model, docs/sharding-file.md "Annotated models"): the
// shardings written as ONNX's multi-device annotations read back identical, on a plain and a refined mesh, with
// unreduced values; the messages for annotations gspmd-onnx cannot read.
#include <gtest/gtest.h>

#include "tests/frontend/onnx_headers.h"  // before the generated header (ONNX_ML)

#include <google/protobuf/unknown_field_set.h>

#include <fstream>
#include <functional>

#include "core/propagation/propagation.h"
#include "core/rules/rule.h"
#include "onnx_frontend/onnx_multidevice.pb.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

namespace md = onnx_multidevice;

const std::string kGpt = std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt_opset17.onnx";
const std::string kMegatron = std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt.megatron.sharding.json";

/// The GPT model and its propagated Megatron plan on 2x2.
struct Gpt {
  Graph g = load_model(kGpt, test::load_opts());
  DeviceMesh mesh = DeviceMesh::parse("2x2");  // --mesh (axes x, y); the file names them data, model
  ShardingPlan plan;
  Annotations ann;
  Gpt() {
    ann = read_sharding_file(kMegatron, g, &mesh);
    plan = propagate(g, ann);
  }
};

/// A node's device configurations (unknown field 10), and writing them back.
std::vector<md::NodeDeviceConfigurationProto> configs_of(const onnx::NodeProto& n) {
  std::vector<md::NodeDeviceConfigurationProto> out;
  const auto& u = n.GetReflection()->GetUnknownFields(n);
  for (int k = 0; k < u.field_count(); ++k)
    if (u.field(k).number() == 10) EXPECT_TRUE(out.emplace_back().ParseFromString(u.field(k).length_delimited()));
  return out;
}

void set_configs(onnx::NodeProto& n, const std::vector<md::NodeDeviceConfigurationProto>& configs) {
  auto* u = n.GetReflection()->MutableUnknownFields(&n);
  u->DeleteByNumber(10);
  for (const auto& c : configs) u->AddLengthDelimited(10, c.SerializeAsString());
}

onnx::NodeProto* node_named(onnx::ModelProto& m, const std::string& name) {
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == name) return &n;
  return nullptr;
}

TEST(AnnotatedModel, WritesUpstreamMessagesAndReadsThemBack) {
  Gpt gpt;
  test::TempDir d;
  const std::string out = d.file("gpt.annotated.onnx");
  write_annotated_model(kGpt, gpt.g, gpt.ann.mesh, gpt.plan.shardings, out);

  // The wire form: ModelProto.configuration (26) and a device_configurations (10) entry per node.
  onnx::ModelProto m = test::read_onnx_model(out);
  const auto& mu = m.GetReflection()->GetUnknownFields(m);
  ASSERT_EQ(mu.field_count(), 1);
  md::DeviceConfigurationProto config;
  ASSERT_EQ(mu.field(0).number(), 26);
  ASSERT_TRUE(config.ParseFromString(mu.field(0).length_delimited()));
  EXPECT_EQ(config.name(), "gspmd");
  EXPECT_EQ(config.num_devices(), 4);
  const onnx::NodeProto* mm = node_named(m, "/h.0/mlp/fc_in/MatMul");
  ASSERT_TRUE(mm);
  const auto configs = configs_of(*mm);
  ASSERT_EQ(configs.size(), 1u);
  EXPECT_EQ(configs[0].configuration_id(), "gspmd");
  ASSERT_EQ(configs[0].sharding_spec_size(), 3);
  // The weight [128,512] split over `model` on dim 1, replicated over `data`: shard 0 on devices 0 and 2 (key -1),
  // shard 1 on 1 and 3 (key -2).
  const md::ShardingSpecProto& w = configs[0].sharding_spec(1);
  EXPECT_EQ(w.tensor_name(), "h.0.mlp.fc_in.weight");
  ASSERT_EQ(w.sharded_dim_size(), 1);
  EXPECT_EQ(w.sharded_dim(0).axis(), 1);
  EXPECT_EQ(w.sharded_dim(0).simple_sharding(0).dim_value(), 512);
  EXPECT_EQ(w.sharded_dim(0).simple_sharding(0).num_shards(), 2);
  EXPECT_EQ(std::vector<int64_t>(w.device().begin(), w.device().end()), (std::vector<int64_t>{-1, -2}));
  ASSERT_EQ(w.index_to_device_group_map_size(), 2);
  EXPECT_EQ(w.index_to_device_group_map(0).key(), -1);
  EXPECT_EQ(std::vector<int64_t>(w.index_to_device_group_map(0).value().begin(),
                                 w.index_to_device_group_map(0).value().end()),
            (std::vector<int64_t>{0, 2}));

  // Read back: every value of the loaded graph, identical.
  const Annotations back = read_annotated_model(out, gpt.g, &gpt.mesh);
  EXPECT_EQ(back.mesh.shape, gpt.mesh.shape);
  EXPECT_EQ(back.mesh.axes, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(back.by_value.size(), gpt.g.values.size());
  for (const auto& [v, a] : back.by_value) EXPECT_EQ(a.sharding, gpt.plan.shardings[v]) << gpt.g.values[v].name;
  EXPECT_EQ(back.by_value.at(gpt.g.find("h.0.mlp.fc_in.weight")).source,
            out + ": node '/h.0/mlp/fc_in/MatMul': sharding_spec 'h.0.mlp.fc_in.weight'");
}

TEST(AnnotatedModel, RefinedMeshAndUnreducedValuesRoundTrip) {
  // Mesh 4 cut into x:(1)2 x x:(2)2 (docs/partitioning.md), shardings over parts in both orders, an unreduced value.
  Gpt gpt;
  const DeviceMesh mesh = DeviceMesh::parse("4").refine({{2}});
  ASSERT_EQ(mesh.axes, (std::vector<std::string>{"x:(1)2", "x:(2)2"}));
  std::vector<TensorSharding> s;
  for (const Value& v : gpt.g.values) s.push_back(TensorSharding::replicated(static_cast<int>(v.shape.size())));
  const int w = gpt.g.find("h.0.mlp.fc_in.weight"), b = gpt.g.find("h.0.attn.q.weight"),
            h = gpt.g.find("/h.0/mlp/fc_out/MatMul_output_0");
  s[w].dims = {{1}, {0}};
  s[b].dims = {{}, {1, 0}};
  s[h].dims = {{0}, {}, {}};
  s[h].unreduced = {1};
  s[h].reduction = ReductionKind::kMax;
  test::TempDir d;
  const std::string out = d.file("refined.onnx");
  write_annotated_model(kGpt, gpt.g, mesh, s, out);
  const DeviceMesh cli = DeviceMesh::parse("4");
  const Annotations back = read_annotated_model(out, gpt.g, &cli);
  EXPECT_EQ(back.mesh.axes, mesh.axes);
  EXPECT_EQ(back.mesh.user_axes, std::vector<std::string>{"x"});
  for (const auto& [v, a] : back.by_value) EXPECT_EQ(a.sharding, s[v]) << gpt.g.values[v].name;
  EXPECT_EQ(back.by_value.at(h).sharding.unreduced, std::vector<int>{1});
  EXPECT_EQ(back.by_value.at(h).sharding.reduction, ReductionKind::kMax);
}

TEST(AnnotatedModel, DeviceOrderRoundTrips) {
  // Mesh 2x2 whose positions hold devices 0, 2, 1, 3 (docs/sharding-file.md, "Device order"): the specs list those
  // devices and read back to the same shardings on the same ordered mesh.
  Gpt gpt;
  DeviceMesh mesh = gpt.ann.mesh;
  mesh.devices = {0, 2, 1, 3};
  test::TempDir d;
  const std::string out = d.file("ordered.onnx");
  write_annotated_model(kGpt, gpt.g, mesh, gpt.plan.shardings, out);
  const Annotations back = read_annotated_model(out, gpt.g, &gpt.mesh);
  EXPECT_EQ(back.mesh.devices, mesh.devices);
  for (const auto& [v, a] : back.by_value) EXPECT_EQ(a.sharding, gpt.plan.shardings[v]) << gpt.g.values[v].name;
  // [null, "model"]: model's tile 0 holds positions (0,0) and (1,0): devices 0 and 1.
  onnx::ModelProto m = test::read_onnx_model(out);
  const auto configs = configs_of(*node_named(m, "/h.0/mlp/fc_in/MatMul"));
  const md::ShardingSpecProto& w = configs.at(0).sharding_spec(1);
  EXPECT_EQ(std::vector<int64_t>(w.index_to_device_group_map(0).value().begin(),
                                 w.index_to_device_group_map(0).value().end()),
            (std::vector<int64_t>{0, 1}));
}

TEST(AnnotatedModel, RejectsWhatItCannotRead) {
  Gpt gpt;
  test::TempDir d;
  const std::string good = d.file("good.onnx");
  write_annotated_model(kGpt, gpt.g, gpt.ann.mesh, gpt.plan.shardings, good);
  const std::string node = "/h.0/mlp/fc_in/MatMul";
  // Edits sharding_spec `k` of `node` (1: its weight, 2: its output), writes the model to `name`, returns the path.
  auto edited = [&](const std::string& name, const std::function<void(md::ShardingSpecProto&)>& edit, int k = 1) {
    onnx::ModelProto m = test::read_onnx_model(good);
    onnx::NodeProto* n = node_named(m, node);
    auto configs = configs_of(*n);
    edit(*configs[0].mutable_sharding_spec(k));
    set_configs(*n, configs);
    test::write_onnx_model(m, d.file(name));
    return d.file(name);
  };
  const std::string at = ": node '" + node + "': sharding_spec 'h.0.mlp.fc_in.weight': ";

  test::expect_input_error([&] { read_annotated_model(kGpt, gpt.g, &gpt.mesh); },
                           kGpt +
                               ": carries no sharding annotations (NodeProto.device_configurations); write one with "
                               "partition --annotated-model");
  const DeviceMesh four = DeviceMesh::parse("4");
  test::expect_input_error([&] { read_annotated_model(good, gpt.g, &four); },
                           good +
                               ": --mesh 4 does not match the annotated model's mesh 2x2 (its sharding specs list "
                               "that mesh's devices)");
  std::string f =
      edited("twice.onnx", [](md::ShardingSpecProto& s) { s.mutable_index_to_device_group_map(1)->set_value(0, 0); });
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); }, f + at + "device 0 holds two shards");
  f = edited("count.onnx", [](md::ShardingSpecProto& s) { s.add_device(3); });
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); }, f + at + "lists 3 devices for 2 shards");
  f = edited("tiling.onnx", [](md::ShardingSpecProto& s) {
    // shard 0 on devices 0 and 3, shard 1 on 1 and 2: no sharding over {data, model} places them so
    s.mutable_index_to_device_group_map(0)->set_value(1, 3);
    s.mutable_index_to_device_group_map(1)->set_value(1, 2);
  });
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
                           f + at +
                               "the device assignment is not a tiling of the mesh {data=2, model=2} (as [null, "
                               "[\"model\", \"data\"]] would be)");
  f = edited("dim.onnx", [](md::ShardingSpecProto& s) {
    s.mutable_sharded_dim(0)->mutable_simple_sharding(0)->set_dim_value(256);
  });
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
                           f + at + "dim 1 has dim_value 256 but the value's dim is 512");
  f = edited("fused.onnx",
             [](md::ShardingSpecProto& s) { s.mutable_sharded_dim(0)->add_simple_sharding()->set_num_shards(1); });
  test::expect_input_error(
      [&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
      f + at + "dim 1 has 2 simple_sharding entries; gspmd-onnx reads one (no fused reshape axes)");
  f = edited("name.onnx", [](md::ShardingSpecProto& s) { s.set_tensor_name("h.1.mlp.fc_in.weight"); });
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
                           f + ": node '" + node +
                               "': sharding_spec 'h.1.mlp.fc_in.weight': not an input or output of "
                               "the node");
  // The MatMul says its output is replicated; the Add that reads it says [data, null, model].
  f = edited(
      "conflict.onnx",
      [](md::ShardingSpecProto& s) {
        s.clear_sharded_dim();
        s.clear_device();
        s.add_device(-1);
        s.clear_index_to_device_group_map();
        auto* e = s.add_index_to_device_group_map();
        e->set_key(-1);
        for (int64_t k : {0, 1, 2, 3}) e->add_value(k);
      },
      2);
  test::expect_input_error(
      [&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
      f + ": node '/h.0/mlp/fc_in/Add': sharding_spec '/h.0/mlp/fc_in/MatMul_output_0': [\"data\", "
          "null, \"model\"] differs from node '/h.0/mlp/fc_in/MatMul''s [null, null, null]");
  {
    onnx::ModelProto m = test::read_onnx_model(good);
    const auto& u = m.GetReflection()->GetUnknownFields(m);
    md::DeviceConfigurationProto c;
    ASSERT_TRUE(c.ParseFromString(u.field(0).length_delimited()));
    c.set_num_devices(8);
    m.GetReflection()->MutableUnknownFields(&m)->DeleteByNumber(26);
    m.GetReflection()->MutableUnknownFields(&m)->AddLengthDelimited(26, c.SerializeAsString());
    test::write_onnx_model(m, d.file("devices.onnx"));
  }
  f = d.file("devices.onnx");
  test::expect_input_error([&] { read_annotated_model(f, gpt.g, &gpt.mesh); },
                           f + ": configuration 'gspmd' has 8 devices but the mesh {data=2, model=2} has 4");
}

}  // namespace
}  // namespace gspmd
