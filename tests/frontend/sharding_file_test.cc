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
  expect_error(with_tensors(R"("h": {"spec": [null, null], "sepc": 1})"),
               "tensors.\"h\": unknown key 'sepc' (expected spec, unreduced, partial, reduction, priority, open)");
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
               "rules[0].match: invalid regular expression \"(\": Mismatched '(' and ')' in regular expression");
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

}  // namespace
}  // namespace gspmd
