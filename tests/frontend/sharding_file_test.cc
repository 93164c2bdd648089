// read_sharding_file / write_sharding_file: forms, mesh rules, every error message.
#include <fstream>
#include <sstream>

#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using test::expect_input_error;
using test::frontend_data;
using test::load_opts;
using test::TempDir;

constexpr const char* kMesh = R"("mesh": {"shape": [2, 2], "axes": ["data", "model"]})";

class ShardingFile : public ::testing::Test {
 protected:
  void SetUp() override { g_ = load_model(frontend_data("mlp.onnx"), load_opts({{"batch", 4}})); }
  std::string write(const std::string& body) { return dir_.write("s.json", body); }
  std::string with_tensors(const std::string& tensors) {
    return write(std::string("{") + kMesh + R"(, "tensors": {)" + tensors + "}}");
  }
  void expect_error(const std::string& file, const std::string& rest, const DeviceMesh* cli = nullptr) {
    expect_input_error([&] { read_sharding_file(file, g_, cli); }, file + ": " + rest);
  }
  Graph g_;
  TempDir dir_;
};

TEST_F(ShardingFile, MinimalForm) {
  auto f = with_tensors(R"("x": ["data", null], "fc_in.weight": [null, "model"], "h": [["data", "model"], null])");
  Annotations a = read_sharding_file(f, g_, nullptr);
  EXPECT_EQ(a.mesh.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a.mesh.axes, (std::vector<std::string>{"data", "model"}));
  ASSERT_EQ(a.by_value.size(), 3u);
  const Annotation& x = a.by_value.at(g_.at("x"));
  EXPECT_EQ(x.sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));
  EXPECT_EQ(x.priority, 0);
  EXPECT_EQ(x.source, f + ": tensors.\"x\"");
  EXPECT_EQ(a.by_value.at(g_.at("fc_in.weight")).sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_EQ(a.by_value.at(g_.at("h")).sharding.dims, (std::vector<std::vector<int>>{{0, 1}, {}}));
}

TEST_F(ShardingFile, ObjectFormAndRules) {
  auto f = write(std::string("{") + kMesh + R"(,
    "tensors": {"h": {"spec": [null, "model"], "unreduced": ["data"], "priority": 2},
                "fc_out.weight": {"spec": ["model", null], "unreduced": "data", "reduction": "max"}},
    "rules": [{"match": "weight$", "spec": [null, "model"], "priority": 1},
              {"match": ".*", "spec": ["data", null]}]})");
  Annotations a = read_sharding_file(f, g_, nullptr);
  const Annotation& h = a.by_value.at(g_.at("h"));
  EXPECT_EQ(h.sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_EQ(h.sharding.unreduced, (std::vector<int>{0}));
  EXPECT_EQ(h.priority, 2);
  const Annotation& w2 = a.by_value.at(g_.at("fc_out.weight"));  // explicit entry wins over the rule
  EXPECT_EQ(w2.sharding.dims, (std::vector<std::vector<int>>{{1}, {}}));
  EXPECT_EQ(w2.sharding.reduction, ReductionKind::kMax);
  const Annotation& w1 = a.by_value.at(g_.at("fc_in.weight"));  // first matching rule
  EXPECT_EQ(w1.sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_EQ(w1.priority, 1);
  EXPECT_EQ(w1.source, f + ": rules[0] (\"weight$\")");
  EXPECT_EQ(a.by_value.at(g_.at("y")).sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));  // second rule
  EXPECT_EQ(a.by_value.size(), g_.values.size());
}

TEST_F(ShardingFile, CliMesh) {
  DeviceMesh cli{{4, 2}, {"x", "y"}};
  // No mesh in the file: --mesh gives shape and axis names.
  auto f = dir_.write("nomesh.json", R"({"tensors": {"x": ["x", "y"]}})");
  Annotations a = read_sharding_file(f, g_, &cli);
  EXPECT_EQ(a.mesh.shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a.mesh.axes, (std::vector<std::string>{"x", "y"}));
  // Both: --mesh overrides the sizes, the file names the axes.
  auto f2 = dir_.write("both.json", std::string("{") + kMesh + R"(, "tensors": {"x": ["model", null]}})");
  Annotations b = read_sharding_file(f2, g_, &cli);
  EXPECT_EQ(b.mesh.shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(b.mesh.axes, (std::vector<std::string>{"data", "model"}));
  // Axes only in the file, sizes from --mesh.
  auto f3 = dir_.write("axes_only.json", R"({"mesh": {"axes": ["a", "b"]}, "tensors": {}})");
  EXPECT_EQ(read_sharding_file(f3, g_, &cli).mesh.axes, (std::vector<std::string>{"a", "b"}));
  DeviceMesh cli3{{2, 2, 2}, {"x", "y", "z"}};
  expect_error(f2, "mesh: --mesh 2x2x2 has 3 axes but the file's mesh has 2 (data, model)", &cli3);
  expect_error(f, "mesh: the file has no mesh and no --mesh was given");
}

TEST_F(ShardingFile, Errors) {
  expect_error(with_tensors(R"("h.0.mlp.fc_in.weight": [null, "model"])"),
               "tensors.\"h.0.mlp.fc_in.weight\": no value named 'h.0.mlp.fc_in.weight' in the model");
  expect_error(with_tensors(R"("fc_in.weight": [null, "modle"])"),
               "tensors.\"fc_in.weight\": unknown mesh axis 'modle' (mesh axes: data, model)");
  expect_error(with_tensors(R"("fc_in.weight": ["model", "model"])"),
               "tensors.\"fc_in.weight\": mesh axis 'model' is used twice");
  expect_error(with_tensors(R"("fc_in.weight": [["data", "model"], "data"])"),
               "tensors.\"fc_in.weight\": mesh axis 'data' is used twice");
  expect_error(with_tensors(R"("h": {"spec": ["data", null], "unreduced": ["data"]})"),
               "tensors.\"h\": mesh axis 'data' is used twice");
  expect_error(with_tensors(R"("fc_in.weight": [null, "model", null])"),
               "tensors.\"fc_in.weight\": spec has 3 entries but the tensor has rank 2");
  expect_error(with_tensors(R"("fc_in.weight": [null, 3])"),
               "tensors.\"fc_in.weight\": spec entry 1 is 3; expected null, an axis name, a list of axis names or "
               "{\"axes\": [...], \"open\": true}");
  expect_error(with_tensors(R"("fc_in.weight": "model")"),
               "tensors.\"fc_in.weight\": expected a partition spec (a list with one entry per dimension) or an "
               "object with \"spec\" (got \"model\")");
  expect_error(with_tensors(R"("h": {"spec": [null, null], "priority": "high"})"),
               "tensors.\"h\": priority must be an integer (got \"high\")");
  expect_error(
      with_tensors(R"("h": {"spec": [null, null], "sepc": 1})"),
      "tensors.\"h\": unknown key 'sepc' (expected spec, hlo, sbp, unreduced, partial, reduction, priority, open)");
  expect_error(with_tensors(R"("h": {"spec": [null, null], "open": 1})"),
               "tensors.\"h\": \"open\" must be true or false (got 1)");
  expect_error(with_tensors(R"("h": [{"axes": "data", "opne": true}, null])"),
               "tensors.\"h\": unknown key 'opne' (expected axes, open)");
  expect_error(with_tensors(R"("h": [{"axes": ["data"], "open": true}, "data"])"),
               "tensors.\"h\": mesh axis 'data' is used twice");
  expect_error(with_tensors(R"("h": {"spec": [null, null], "unreduced": ["data"], "reduction": "mean"})"),
               "tensors.\"h\": reduction must be \"sum\", \"max\", \"min\" or \"prod\" (got \"mean\")");
  expect_error(write(R"({"mesh": {"shape": [2, 0], "axes": ["data", "model"]}})"),
               "mesh.shape: sizes must be positive integers (entry 1 is 0)");
  expect_error(write(R"({"mesh": {"shape": [2, -2], "axes": ["data", "model"]}})"),
               "mesh.shape: sizes must be positive integers (entry 1 is -2)");
  expect_error(write(R"({"mesh": {"shape": [2, 2], "axes": ["data", "data"]}})"),
               "mesh.axes: axis name 'data' appears twice");
  expect_error(write(R"({"mesh": {"shape": [2, 2, 2], "axes": ["data", "model"]}})"),
               "mesh: shape has 3 entries but axes has 2");
  expect_error(write(R"({"mesh": {"shape": [2]}, "tensor": {}})"),
               "unknown key 'tensor' (expected version, mesh, tensors, rules)");
  expect_error(write(R"([1, 2])"), "expected a JSON object with \"mesh\" and \"tensors\"");
  expect_error(write(std::string("{") + kMesh + R"(, "rules": [{"match": "(", "spec": [null]}]})"),
               "rules[0].match: invalid regular expression \"(\": missing ): (");
  expect_error(write(std::string("{") + kMesh + R"(, "rules": [{"match": "^x$", "spec": [null]}]})"),
               "rules[0]: spec has 1 entries but 'x' (matched by \"^x$\") has rank 2");
  expect_error(write(std::string("{") + kMesh + R"(, "rules": [{"spec": [null]}]})"),
               "rules[0]: needs \"match\": a regular expression");
  expect_error(write(R"({"version": 2})"), "version: unsupported version 2 (this tool reads version 1)");
}

TEST_F(ShardingFile, OpenDimsAndOpenAnnotations) {
  auto f = with_tensors(R"("x": [{"axes": ["data"], "open": true}, null], "h": [{"open": true}, "model"],
                           "fc_in.weight": {"spec": [null, "model"], "open": true}, "y": ["data", null])");
  Annotations a = read_sharding_file(f, g_, nullptr);
  const Annotation& x = a.by_value.at(g_.at("x"));
  EXPECT_EQ(x.sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));
  EXPECT_FALSE(x.open);
  EXPECT_TRUE(x.dim_open(0));
  EXPECT_FALSE(x.dim_open(1));
  const Annotation& h = a.by_value.at(g_.at("h"));
  EXPECT_EQ(h.sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_TRUE(h.dim_open(0));
  const Annotation& w = a.by_value.at(g_.at("fc_in.weight"));
  EXPECT_TRUE(w.open);
  EXPECT_TRUE(w.dim_open(1));
  const Annotation& y = a.by_value.at(g_.at("y"));  // closed: no open dims recorded
  EXPECT_FALSE(y.open);
  EXPECT_TRUE(y.open_dims.empty());
}

TEST_F(ShardingFile, MissingAndMalformed) {
  const std::string missing = dir_.file("none.json");
  expect_input_error([&] { read_sharding_file(missing, g_, nullptr); }, missing + ": cannot open file");
  auto f = write(std::string("{") + kMesh + ",\n  \"tensors\": {\"x\": [null,}}");
  expect_error(f,
               "malformed JSON: parse error at line 2, column 26: syntax error while parsing value - unexpected '}'; "
               "expected '[', '{', or a literal");
  // A number past a double's range (nlohmann's out_of_range, not a parse_error: an internal error until the
  // sharding-file fuzzer found it).
  expect_error(write(std::string("{") + kMesh + R"(, "version": 1E6212})"),
               "malformed JSON: number overflow parsing '1E6212'");
}

TEST_F(ShardingFile, WriteReadRoundTrip) {
  DeviceMesh mesh{{2, 2}, {"data", "model"}};
  std::vector<TensorSharding> s(g_.values.size());
  for (size_t v = 0; v < g_.values.size(); ++v)
    s[v] = TensorSharding::replicated(static_cast<int>(g_.values[v].shape.size()));
  s[g_.at("x")].dims = {{0}, {}};
  s[g_.at("fc_in.weight")].dims = {{}, {1}};
  s[g_.at("h")].dims = {{0, 1}, {}};
  s[g_.at("y")].dims = {{0}, {}};
  s[g_.at("y")].unreduced = {1};
  s[g_.at("h_relu")].unreduced = {0, 1};
  s[g_.at("h_relu")].reduction = ReductionKind::kMax;
  const std::string p = dir_.file("out.sharding.json");
  write_sharding_file(p, g_, mesh, s);
  Annotations a = read_sharding_file(p, g_, nullptr);
  EXPECT_EQ(a.mesh.shape, mesh.shape);
  EXPECT_EQ(a.mesh.axes, mesh.axes);
  ASSERT_EQ(a.by_value.size(), g_.values.size());
  for (size_t v = 0; v < g_.values.size(); ++v)
    EXPECT_EQ(a.by_value.at(static_cast<int>(v)).sharding, s[v]) << g_.values[v].name;
}

TEST_F(ShardingFile, SubAxes) {
  // "model:(1)2" is the major half of model (size 4): the mesh is refined into model:(1)2 x model:(2)2, and a whole
  // "model" becomes both parts.
  const std::string f = write(R"({"mesh": {"shape": [2, 4], "axes": ["data", "model"]}, "tensors": {
      "h": ["model:(1)2", "model:(2)2"], "x": [["data", "model"], null]}})");
  Annotations a = read_sharding_file(f, g_, nullptr);
  EXPECT_EQ(a.mesh.shape, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(a.mesh.axes, (std::vector<std::string>{"data", "model:(1)2", "model:(2)2"}));
  EXPECT_EQ(a.mesh.str(), "{data=2, model=4}");
  EXPECT_EQ(a.by_value.at(g_.at("h")).sharding.dims, (std::vector<std::vector<int>>{{1}, {2}}));
  EXPECT_EQ(a.by_value.at(g_.at("x")).sharding.dims, (std::vector<std::vector<int>>{{0, 1, 2}, {}}));
  EXPECT_EQ(a.by_value.at(g_.at("x")).sharding.to_partition_spec(a.mesh), R"([["data", "model"], null])");
  // written back on the user's mesh, with the sub-axes where no whole axis is used
  std::vector<TensorSharding> s(g_.values.size());
  for (size_t v = 0; v < g_.values.size(); ++v)
    s[v] = TensorSharding::replicated(static_cast<int>(g_.values[v].shape.size()));
  s[g_.at("h")] = a.by_value.at(g_.at("h")).sharding;
  s[g_.at("x")] = a.by_value.at(g_.at("x")).sharding;
  const std::string p = dir_.file("sub.sharding.json");
  write_sharding_file(p, g_, a.mesh, s);
  std::stringstream ss;
  ss << std::ifstream(p).rdbuf();
  const std::string text = ss.str();
  EXPECT_NE(text.find(R"("mesh": {"shape":[2,4],"axes":["data","model"]})"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("h": ["model:(1)2","model:(2)2"])"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("x": [["data","model"],null])"), std::string::npos) << text;
  Annotations b = read_sharding_file(p, g_, nullptr);
  EXPECT_EQ(b.mesh.axes, a.mesh.axes);
  for (size_t v = 0; v < g_.values.size(); ++v)
    EXPECT_EQ(b.by_value.at(static_cast<int>(v)).sharding, s[v]) << g_.values[v].name;
  // errors
  expect_error(
      write(R"({"mesh": {"shape": [2, 4], "axes": ["data", "model"]}, "tensors": {"h": ["model:(3)2", null]}})"),
      "sub-axis 'model:(3)2' does not fit axis 'model' of size 4");
  expect_error(
      write(R"({"mesh": {"shape": [2, 4], "axes": ["data", "model"]}, "tensors": {"h": ["model:(1)2", "model"]}})"),
      "tensors.\"h\": mesh axis 'model:(1)2' is used twice");
}

TEST_F(ShardingFile, HloAndSbpNotations) {
  auto f = write(std::string("{") + kMesh + R"j(, "tensors": {
      "x": {"hlo": "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"},
      "fc_in.weight": {"sbp": ["B", "S(1)"], "priority": 1},
      "h": {"hlo": "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dims={unreduced}}", "reduction": "max", "priority": 2},
      "y": {"sbp": ["P", "S(0)"], "open": true}},
    "rules": [{"match": "weight$", "sbp": ["S(0)", "B"]}, {"match": ".*", "hlo": "{replicated}"}]})j");
  Annotations a = read_sharding_file(f, g_, nullptr);
  EXPECT_EQ(a.by_value.at(g_.at("x")).sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));
  const Annotation& w = a.by_value.at(g_.at("fc_in.weight"));
  EXPECT_EQ(w.sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_EQ(w.priority, 1);
  const Annotation& h = a.by_value.at(g_.at("h"));  // <=[2,2]T(1,0): tiles 0,2,1,3; model splits dim 1
  EXPECT_EQ(h.sharding.dims, (std::vector<std::vector<int>>{{}, {1}}));
  EXPECT_EQ(h.sharding.unreduced, (std::vector<int>{0}));
  EXPECT_EQ(h.sharding.reduction, ReductionKind::kMax);
  EXPECT_EQ(h.priority, 2);
  const Annotation& y = a.by_value.at(g_.at("y"));
  EXPECT_EQ(y.sharding.dims, (std::vector<std::vector<int>>{{1}, {}}));  // padded to the tensor's rank
  EXPECT_EQ(y.sharding.unreduced, (std::vector<int>{0}));
  EXPECT_TRUE(y.open);
  EXPECT_FALSE(h.open);
  const Annotation& w2 = a.by_value.at(g_.at("fc_out.weight"));  // rule 0
  EXPECT_EQ(w2.sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));
  EXPECT_EQ(w2.source, f + ": rules[0] (\"weight$\")");
  EXPECT_TRUE(a.by_value.at(g_.at("h_relu")).sharding.is_replicated());  // rule 1: any rank
  EXPECT_EQ(a.by_value.at(g_.at("h_relu")).sharding.rank(), 2);
}

TEST_F(ShardingFile, NotationErrors) {
  expect_error(with_tensors(R"("x": {"hlo": "{devices=[2,1,1,2]0,1,2,3 last_tile_dim_replicate}"})"),
               "tensors.\"x\": hlo: the tile assignment has 3 tensor dims but the tensor has rank 2");
  expect_error(with_tensors(R"("x": {"hlo": "{maximal device=0}"})"),
               "tensors.\"x\": hlo: {maximal device=N} is not supported (one device holding the whole tensor): use "
               "{replicated} or a tiled sharding");
  expect_error(with_tensors(R"("x": {"hlo": "{devices=[4,1]0,3,1,2}"})"),
               "tensors.\"x\": hlo: {devices=[4,1]0,3,1,2} cannot be expressed on mesh {data=2, model=2}: along tile "
               "dim 0, device 3 follows device 0 but they differ on more than one mesh axis");
  expect_error(with_tensors(R"("x": {"hlo": 3})"), "tensors.\"x\": \"hlo\" must be a string of XLA HLO sharding text");
  expect_error(with_tensors(R"("x": {"hlo": "{replicated}", "unreduced": ["data"]})"),
               "tensors.\"x\": unknown key 'unreduced' (expected hlo, reduction, priority, open)");
  expect_error(with_tensors(R"("x": {"hlo": "{replicated}", "sbp": ["B", "B"]})"),
               "tensors.\"x\": give one of \"spec\", \"hlo\" or \"sbp\"");
  expect_error(with_tensors(R"j("x": {"sbp": ["B", "S(2)"]})j"),
               "tensors.\"x\": sbp: S(2) splits dim 2 but the tensor has rank 2");
  expect_error(with_tensors(R"j("x": {"sbp": ["S(0)"]})j"),
               "tensors.\"x\": sbp: has 1 entries but the mesh has 2 axes (data, model)");
  expect_error(with_tensors(R"j("x": {"sbp": "S(0)"})j"),
               "tensors.\"x\": \"sbp\" must be a list with one entry per mesh axis, like [\"S(0)\", \"B\"]");
  expect_error(with_tensors(R"("x": {"sbp": ["B", "B"], "reduction": "max"})"),
               "tensors.\"x\": unknown key 'reduction' (expected sbp, priority, open)");
  expect_error(with_tensors(R"("x": {"priority": 1})"),
               "tensors.\"x\": the object form needs \"spec\", \"hlo\" or \"sbp\"");
  expect_error(write(std::string("{") + kMesh + R"j(, "rules": [{"match": "^x$", "sbp": ["S(2)", "B"]}]})j"),
               "rules[0]: sbp: S(2) splits dim 2 but 'x' (matched by \"^x$\") has rank 2");
  expect_error(write(std::string("{") + kMesh + R"(, "rules": [{"match": "^x$", "hlo": "{devices=[4]<=[4]}"}]})"),
               "rules[0]: hlo: the tile assignment has 1 tensor dims but 'x' (matched by \"^x$\") has rank 2");
  expect_error(write(std::string("{") + kMesh + R"(, "rules": [{"match": "^x$"}]})"),
               "rules[0]: needs \"spec\": a partition spec (or \"hlo\" or \"sbp\")");
}

TEST_F(ShardingFile, DeviceOrder) {
  auto f = write(R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"], "devices": [0, 2, 1, 3]},
      "tensors": {"x": {"hlo": "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"}, "h": ["data", null]}})");
  Annotations a = read_sharding_file(f, g_, nullptr);
  EXPECT_EQ(a.mesh.devices, (std::vector<int64_t>{0, 2, 1, 3}));
  // device 2 sits at mesh position 1 = (data 0, model 1): the HLO tiles go along model
  EXPECT_EQ(a.by_value.at(g_.at("x")).sharding.dims, (std::vector<std::vector<int>>{{1}, {}}));
  EXPECT_EQ(a.by_value.at(g_.at("h")).sharding.dims, (std::vector<std::vector<int>>{{0}, {}}));
  // --mesh gives the sizes; an identity order is no order
  const DeviceMesh cli{{2, 2}, {"x", "y"}};
  auto iota = write(R"({"mesh": {"axes": ["data", "model"], "devices": [0, 1, 2, 3]}})");
  EXPECT_TRUE(read_sharding_file(iota, g_, &cli).mesh.devices.empty());
  auto with_devices = [&](const std::string& devices) {
    return write(R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"], "devices": )" + devices + "}}");
  };
  expect_error(with_devices("[0, 1, 2]"), "mesh.devices: has 3 entries but the mesh {data=2, model=2} has 4 devices");
  expect_error(with_devices("[0, 1, 1, 3]"), "mesh.devices: device 1 appears twice");
  expect_error(with_devices("[0, 1, 2, 9]"), "mesh.devices: entry 3 is 9, not a device id 0..3");
  expect_error(with_devices("[0, \"1\", 2, 3]"), "mesh.devices: entry 1 is \"1\", not a device id");
  expect_error(with_devices("\"0123\""),
               "mesh.devices: expected a list of device ids, one per mesh position (row-major over shape)");
  const DeviceMesh cli8{{2, 4}, {"x", "y"}};
  expect_error(with_devices("[3, 2, 1, 0]"), "mesh.devices: has 4 entries but --mesh 2x4 has 8 devices", &cli8);
  expect_error(write(R"({"mesh": {"shape": [2, 2], "device": [0, 1, 2, 3]}})"),
               "mesh: unknown key 'device' (expected shape, axes, devices)");
}

std::string file_text(const std::string& path) {
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  return ss.str();
}

// Written in any notation, a plan reads back to the same shardings: on a plain mesh, with a device order, and on a
// mesh with sub-axes (which SBP cannot write: those values fall back to a spec).
TEST_F(ShardingFile, EveryNotationReadsBack) {
  auto replicated = [&] {
    std::vector<TensorSharding> s(g_.values.size());
    for (size_t v = 0; v < g_.values.size(); ++v)
      s[v] = TensorSharding::replicated(static_cast<int>(g_.values[v].shape.size()));
    return s;
  };
  struct Case {
    DeviceMesh mesh;
    std::vector<TensorSharding> s;
  };
  std::vector<Case> cases;
  for (std::vector<int64_t> devices : {std::vector<int64_t>{}, std::vector<int64_t>{3, 0, 2, 1}}) {
    Case c{DeviceMesh{{2, 2}, {"data", "model"}, devices}, replicated()};
    c.s[g_.at("x")].dims = {{0}, {}};
    c.s[g_.at("fc_in.weight")].dims = {{}, {1}};
    c.s[g_.at("h")].dims = {{1, 0}, {}};  // not in mesh-axis order: a spec in SBP
    c.s[g_.at("y")].dims = {{0}, {}};
    c.s[g_.at("y")].unreduced = {1};
    c.s[g_.at("h_relu")].unreduced = {0, 1};
    c.s[g_.at("h_relu")].reduction = ReductionKind::kMax;
    cases.push_back(c);
  }
  Case sub{DeviceMesh{{2, 4}, {"data", "model"}, {}}.refine({{}, {2}}), replicated()};  // data, model:(1)2, model:(2)2
  sub.s[g_.at("x")].dims = {{1}, {0}};
  sub.s[g_.at("fc_in.weight")].dims = {{2}, {1}};
  sub.s[g_.at("h")].dims = {{1, 2}, {}};  // the whole of model
  sub.s[g_.at("y")].unreduced = {2};
  cases.push_back(sub);
  Case unit{DeviceMesh{{1, 4}, {"data", "model"}}, replicated()};  // HLO cannot name an axis of size 1: a spec
  unit.s[g_.at("x")].dims = {{0}, {1}};
  unit.s[g_.at("h")].unreduced = {0};
  unit.s[g_.at("y")].dims = {{1}, {}};
  cases.push_back(unit);
  for (const Case& c : cases) {
    for (auto [notation, word] : {std::pair{ShardingNotation::kSpec, "spec"}, std::pair{ShardingNotation::kHlo, "hlo"},
                                  std::pair{ShardingNotation::kSbp, "sbp"}}) {
      const std::string p = dir_.file(std::string(word) + ".sharding.json");
      write_sharding_file(p, g_, c.mesh, c.s, notation);
      const std::string text = file_text(p);
      Annotations a = read_sharding_file(p, g_, nullptr);
      EXPECT_EQ(a.mesh.axes, c.mesh.axes) << text;
      EXPECT_EQ(a.mesh.devices, c.mesh.devices) << text;
      ASSERT_EQ(a.by_value.size(), g_.values.size());
      for (size_t v = 0; v < g_.values.size(); ++v)
        EXPECT_EQ(a.by_value.at(static_cast<int>(v)).sharding, c.s[v]) << word << " " << g_.values[v].name << "\n"
                                                                       << text;
      const bool unit_axis = c.mesh.shape[0] == 1;
      if (notation == ShardingNotation::kHlo && unit_axis) {
        EXPECT_NE(text.find(R"("x": ["data","model"])"), std::string::npos) << text;
        EXPECT_NE(text.find(R"("h": {"spec":[null,null],"unreduced":["data"]})"), std::string::npos) << text;
        EXPECT_NE(text.find(R"("y": {"hlo":"{devices=[4,1]<=[4]}"})"), std::string::npos) << text;
      }
      if (notation == ShardingNotation::kHlo && !unit_axis) {
        EXPECT_EQ(text.find("\"spec\""), std::string::npos) << text;
        EXPECT_NE(text.find(R"("h_relu": {"hlo":)"), std::string::npos) << text;
      }
      if (notation == ShardingNotation::kHlo && !c.mesh.is_refined() && !unit_axis) {
        EXPECT_NE(text.find(R"("reduction":"max")"), std::string::npos) << text;
      }
      if (notation == ShardingNotation::kSbp && unit_axis) {
        EXPECT_NE(text.find(R"j("x": {"sbp":["S(0)","S(1)"]})j"), std::string::npos) << text;
      }
      if (notation == ShardingNotation::kSbp && !c.mesh.is_refined() && !unit_axis) {
        EXPECT_NE(text.find(R"j("h_relu": {"sbp":["P(max)","P(max)"]})j"), std::string::npos) << text;
        EXPECT_NE(text.find(R"("h": [["model","data"],null])"), std::string::npos) << text;
      }
      if (notation == ShardingNotation::kSbp && c.mesh.is_refined()) {
        EXPECT_NE(text.find(R"j("h": {"sbp":["B","S(0)"]})j"), std::string::npos) << text;
        EXPECT_NE(text.find(R"("x": ["model:(1)2","data"])"), std::string::npos) << text;
      }
    }
  }
  // the exact text of a few entries
  const std::string p = dir_.file("hlo.sharding.json");
  write_sharding_file(p, g_, cases[1].mesh, cases[1].s, ShardingNotation::kHlo);
  const std::string ordered = file_text(p);
  EXPECT_NE(ordered.find(R"("mesh": {"shape":[2,2],"axes":["data","model"],"devices":[3,0,2,1]})"), std::string::npos)
      << ordered;
  EXPECT_NE(ordered.find(R"("x": {"hlo":"{devices=[2,1,2]3,0,2,1 last_tile_dim_replicate}"})"), std::string::npos)
      << ordered;
  write_sharding_file(p, g_, cases[0].mesh, cases[0].s, ShardingNotation::kHlo);
  const std::string plain = file_text(p);
  EXPECT_NE(plain.find(R"j("fc_in.weight": {"hlo":"{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}"})j"),
            std::string::npos)
      << plain;
}

}  // namespace
}  // namespace gspmd
