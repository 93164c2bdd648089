// The `gspmd` domain's schemas in onnx's registry (onnx_frontend/gspmd_schemas.h): one node per op, checked by
// onnx's checker and strict shape inference; every rule's message.
#include "onnx_frontend/gspmd_schemas.h"

#include <sys/wait.h>

#include <cstdio>

#include "tests/frontend/onnx_headers.h"  // before onnx's other headers (ONNX_ML)

#include <onnx/defs/attr_proto_util.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "core/program/program_ops.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using Attr = onnx::AttributeProto;

Attr int_attr(const std::string& name, int64_t v) { return onnx::MakeAttribute(name, v); }
Attr ints_attr(const std::string& name, const std::vector<int64_t>& v) { return onnx::MakeAttribute(name, v); }
Attr string_attr(const std::string& name, const std::string& v) { return onnx::MakeAttribute(name, v); }
Attr float_attr(const std::string& name, float v) { return onnx::MakeAttribute(name, v); }

void set_type(onnx::ValueInfoProto* vi, const std::string& name, int32_t elem, const std::vector<int64_t>& shape) {
  vi->set_name(name);
  auto* t = vi->mutable_type()->mutable_tensor_type();
  t->set_elem_type(elem);
  auto* s = t->mutable_shape();
  for (int64_t d : shape) s->add_dim()->set_dim_value(d);
}

/// x [float, x_shape] -> gspmd `op` -> y -> Identity -> out. `y_shape` (when given) is declared as y's value_info
/// and the output's type; without it the output is declared with x's rank and unknown dims.
onnx::ModelProto one_op(const std::string& op, const std::vector<Attr>& attrs, const std::vector<int64_t>& x_shape,
                        std::optional<std::vector<int64_t>> y_shape = std::nullopt,
                        int32_t y_elem = onnx::TensorProto::FLOAT) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_version(17);
  o = m.add_opset_import();
  o->set_domain("gspmd");
  o->set_version(1);
  auto* g = m.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_name("n");
  n->set_op_type(op);
  n->set_domain("gspmd");
  if (op != "PartitionOffset") {
    n->add_input("x");
    set_type(g->add_input(), "x", onnx::TensorProto::FLOAT, x_shape);
  }
  n->add_output("y");
  for (const Attr& a : attrs) *n->add_attribute() = a;
  auto* id = g->add_node();
  id->set_name("id");
  id->set_op_type("Identity");
  id->add_input("y");
  id->add_output("out");
  if (y_shape) {
    set_type(g->add_value_info(), "y", y_elem, *y_shape);
    set_type(g->add_output(), "out", y_elem, *y_shape);
  } else {  // the output's rank as x's, its dims unknown
    auto* out = g->add_output();
    out->set_name("out");
    auto* t = out->mutable_type()->mutable_tensor_type();
    t->set_elem_type(y_elem);
    t->mutable_shape();
    if (op != "PartitionOffset")
      for (size_t k = 0; k < x_shape.size(); ++k) t->mutable_shape()->add_dim();
  }
  return m;
}

/// validate_model's message, "" when the model passes.
std::string error_of(onnx::ModelProto m) {
  try {
    frontend::validate_model(m, "m.onnx");
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

/// y's inferred type as "INT64[2,?]" ("?" for a dim without value; "<no shape>").
std::string inferred(onnx::ModelProto m) {
  register_gspmd_schemas();
  onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), onnx::ShapeInferenceOptions(true, 1, true));
  for (const auto& vi : m.graph().value_info()) {
    if (vi.name() != "y") continue;
    const auto& t = vi.type().tensor_type();
    std::string s = onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t.elem_type()));
    if (!t.has_shape()) return s + "<no shape>";
    s += "[";
    for (int k = 0; k < t.shape().dim_size(); ++k)
      s += (k ? "," : "") + (t.shape().dim(k).has_dim_value() ? std::to_string(t.shape().dim(k).dim_value()) : "?");
    return s + "]";
  }
  return "<not inferred>";
}

const Attr kAxes = ints_attr("mesh_axes", {0});

TEST(GspmdSchemas, RegisteredOnceWithInference) {
  register_gspmd_schemas();
  register_gspmd_schemas();  // idempotent
  for (GspmdOp op : kAllGspmdOps) {
    SCOPED_TRACE(std::string(op_name(op)));
    const onnx::OpSchema* s = onnx::OpSchemaRegistry::Schema(std::string(op_name(op)), 1, "gspmd");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->SinceVersion(), 1);
    EXPECT_TRUE(s->has_type_and_shape_inference_function());
    EXPECT_EQ(s->attributes().at("mesh_axes").required, true);
  }
  int count = 0;
  for (const auto& s : onnx::OpSchemaRegistry::get_all_schemas_with_history()) count += s.domain() == "gspmd";
  EXPECT_EQ(count, 8);
  const auto& range = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at("gspmd");
  EXPECT_EQ(range, std::make_pair(1, 1));
}

TEST(GspmdSchemas, InferShapesAsTheProgramDoes) {
  const Attr n4 = int_attr("group_size", 4), n2 = int_attr("group_size", 2);
  EXPECT_EQ(inferred(one_op("AllGather", {kAxes, int_attr("axis", 1), n4}, {2, 3})), "FLOAT[2,12]");
  EXPECT_EQ(inferred(one_op("AllGather", {kAxes, int_attr("axis", -2), n4}, {2, 3})), "FLOAT[8,3]");
  // The program's form has no group_size: the gathered dim is unknown.
  EXPECT_EQ(inferred(one_op("AllGather", {kAxes, int_attr("axis", 1)}, {2, 3})), "FLOAT[2,?]");
  EXPECT_EQ(inferred(one_op("ReduceScatter", {kAxes, int_attr("axis", 0), n2}, {4, 3})), "FLOAT[2,3]");
  EXPECT_EQ(inferred(one_op("AllToAll", {kAxes, int_attr("split_axis", 0), int_attr("concat_axis", 1), n2}, {4, 3})),
            "FLOAT[2,6]");
  EXPECT_EQ(inferred(one_op("AllToAll", {kAxes, int_attr("split_axis", 1), int_attr("concat_axis", 1), n2}, {4, 6})),
            "FLOAT[4,6]");
  EXPECT_EQ(inferred(one_op("AllReduce", {kAxes, string_attr("reduction", "max"), n2}, {4, 3})), "FLOAT[4,3]");
  EXPECT_EQ(inferred(one_op("CollectivePermute", {kAxes, int_attr("shift", 1), n2}, {4, 3})), "FLOAT[4,3]");
  EXPECT_EQ(inferred(one_op("ShardSlice", {kAxes, int_attr("axis", 1), int_attr("shard_size", 2)}, {4, 5})),
            "FLOAT[4,2]");
  EXPECT_EQ(
      inferred(one_op(
          "ShardSlice",
          {kAxes, int_attr("axis", 1), int_attr("shard_size", 2), int_attr("size", 4), int_attr("base", -1)}, {4, 5})),
      "FLOAT[4,4]");
  EXPECT_EQ(inferred(one_op("MaskPad", {kAxes, int_attr("axis", 0), int_attr("full_size", 7), float_attr("value", 0.f)},
                            {4, 5})),
            "FLOAT[4,5]");
  EXPECT_EQ(inferred(one_op("PartitionOffset", {kAxes, int_attr("shard_size", 3)}, {}, std::nullopt,
                            onnx::TensorProto::INT64)),
            "INT64[]");
}

TEST(GspmdSchemas, ValidModelsPass) {
  EXPECT_EQ(
      error_of(one_op("AllGather",
                      {kAxes, int_attr("axis", 1), int_attr("group_size", 2), ints_attr("replica_groups", {0, 1})},
                      {2, 3}, std::vector<int64_t>{2, 6})),
      "");
  EXPECT_EQ(error_of(one_op("CollectivePermute",
                            {ints_attr("mesh_axes", {0, 1}), ints_attr("target_axes", {1, 0}),
                             ints_attr("source_target_pairs", {0, 0, 2, 1, 1, 2, 3, 3})},
                            {2, 3}, std::vector<int64_t>{2, 3})),
            "");
}

struct Case {
  onnx::ModelProto model;
  std::string message;  // validate_model's, for the file "m.onnx"
};

/// Models that break one rule each, with the message.
std::vector<Case> rejection_cases() {
  const Attr n2 = int_attr("group_size", 2);
  const std::vector<int64_t> s23{2, 3}, s33{3, 3};
  // An inference rule's failure, as onnx's strict InferShapes reports it.
  auto rule = [](const std::string& op, const std::string& why) {
    return "m.onnx: [ShapeInferenceError] Shape inference error(s): (op_type:" + op +
           ", node name: n): [ShapeInferenceError] " + why;
  };
  auto bad_node = [](const std::string& op, const std::string& why) {
    return "m.onnx: " + why + " ==> Context: Bad node spec for node. Name: n OpType: " + op;
  };
  return {
      {one_op("AllGather", {kAxes, int_attr("axis", 2), n2}, s23, s23),
       rule("AllGather", "axis 2 is out of range for rank 2")},
      {one_op("AllGather", {kAxes, int_attr("axis", 1), n2}, s23, s23),
       "m.onnx: [ShapeInferenceError] (op_type:AllGather, node name: n): [ShapeInferenceError] Inferred shape and "
       "existing shape differ in dimension 1: (6) vs (3)"},
      {one_op("AllGather", {kAxes, int_attr("axis", 1), n2}, s23, std::vector<int64_t>{2, 6}, onnx::TensorProto::INT64),
       "m.onnx: [ShapeInferenceError] (op_type:AllGather, node name: n): [TypeInferenceError] Inferred elem type "
       "differs from existing elem type: (FLOAT) vs (INT64)"},
      {one_op("ReduceScatter", {kAxes, int_attr("axis", 0), n2}, s33, s33),
       rule("ReduceScatter", "dim 0 of the input (3) is not divisible by group_size 2")},
      {one_op("AllToAll", {kAxes, int_attr("split_axis", 0), int_attr("concat_axis", 1), n2}, s33, s33),
       rule("AllToAll", "dim 0 of the input (3) is not divisible by group_size 2")},
      {one_op("AllReduce", {kAxes, string_attr("reduction", "mean")}, s33, s33),
       rule("AllReduce", "reduction 'mean' is not sum, max, min or prod")},
      {one_op("AllReduce", {ints_attr("mesh_axes", {1, 1})}, s33, s33),
       rule("AllReduce", "mesh_axes lists mesh axis 1 twice")},
      {one_op("AllReduce", {ints_attr("mesh_axes", {-1})}, s33, s33),
       rule("AllReduce", "mesh_axes has the negative mesh axis -1")},
      {one_op("AllReduce", {kAxes, n2, ints_attr("replica_groups", {0, 1, 1, 2})}, s33, s33),
       rule("AllReduce", "replica_groups lists device 1 twice")},
      {one_op("AllReduce", {kAxes, n2, ints_attr("replica_groups", {0, 1, 2})}, s33, s33),
       rule("AllReduce", "replica_groups has 3 entries, not a positive multiple of group_size 2")},
      {one_op("AllReduce", {kAxes, n2, ints_attr("replica_groups", {0, 5})}, s33, s33),
       rule("AllReduce", "replica_groups lists device 5 but there are 2 devices")},
      {one_op("AllReduce", {kAxes, ints_attr("replica_groups", {0, 1})}, s33, s33),
       rule("AllReduce", "replica_groups is given without group_size")},
      {one_op("AllReduce", {kAxes, int_attr("group_size", 0)}, s33, s33),
       rule("AllReduce", "group_size 0 is not positive")},
      {one_op("CollectivePermute", {kAxes, int_attr("shift", 1), ints_attr("target_axes", {0})}, s33, s33),
       rule("CollectivePermute", "needs exactly one of 'shift' and 'target_axes'")},
      {one_op("CollectivePermute", {kAxes, ints_attr("target_axes", {1})}, s33, s33),
       rule("CollectivePermute", "target_axes [1] is not a permutation of mesh_axes [0]")},
      {one_op("CollectivePermute", {kAxes, int_attr("shift", 1), ints_attr("source_target_pairs", {0, 1, 1})}, s33,
              s33),
       rule("CollectivePermute", "source_target_pairs has an odd number of entries (3)")},
      {one_op("ShardSlice", {kAxes, int_attr("axis", 0), int_attr("shard_size", -1)}, s33, s33),
       rule("ShardSlice", "shard_size -1 is negative")},
      {one_op("MaskPad", {kAxes, int_attr("axis", -3), int_attr("full_size", 3), float_attr("value", 0.f)}, s33, s33),
       rule("MaskPad", "axis -3 is out of range for rank 2")},
      // the checker: the op, attribute names, types and presence
      {one_op("AllGather", {kAxes, n2}, s23, s23), bad_node("AllGather", "Required attribute 'axis' is missing.")},
      {one_op("AllGather", {kAxes, int_attr("axis", 0), int_attr("dim", 0)}, s23, s23),
       bad_node("AllGather", "Unrecognized attribute: dim for operator AllGather")},
      {one_op("AllGather", {kAxes, string_attr("axis", "0")}, s23, s23),
       bad_node("AllGather", "Mismatched attribute type in 'n : axis'")},
      {one_op("AllReduce", {ints_attr("mesh_axes", {})}, s33, s33),
       bad_node("AllReduce", "Attribute 'mesh_axes' is expected to have field 'ints'")},
      {one_op("Broadcast", {kAxes}, s23, s23),
       bad_node("Broadcast", "No Op registered for Broadcast with domain_version of 1")},
  };
}

TEST(GspmdSchemas, RejectsWhatTheProgramCannotBe) {
  for (const Case& c : rejection_cases()) {
    SCOPED_TRACE(c.message);
    EXPECT_EQ(error_of(c.model), c.message);
  }
}

// tools/gspmd_onnx_schemas.py (Python's onnx 1.12 cannot register these schemas) gives every case the verdict and
// the message of the C++ schemas, and passes the valid models.
TEST(GspmdSchemas, PythonModuleGivesTheSameVerdicts) {
  test::TempDir d;
  std::vector<Case> cases = rejection_cases();
  cases.push_back({one_op("AllToAll",
                          {kAxes, int_attr("split_axis", 1), int_attr("concat_axis", 0), int_attr("group_size", 2),
                           ints_attr("replica_groups", {1, 0})},
                          {2, 4}, std::vector<int64_t>{4, 2}),
                   ""});
  cases.push_back({one_op("ShardSlice", {kAxes, int_attr("axis", 1), int_attr("shard_size", 2)}, {2, 4},
                          std::vector<int64_t>{2, 2}),
                   ""});
  std::string files, expected;
  for (size_t k = 0; k < cases.size(); ++k) {
    std::string bytes;
    cases[k].model.SerializeToString(&bytes);
    const std::string f = d.write("case_" + std::to_string(k) + ".onnx", bytes);
    files += " " + f;
    ASSERT_EQ(error_of(cases[k].model), cases[k].message);
    const std::string& m = cases[k].message;
    expected += f + ": " + (m.empty() ? "ok" : m.substr(std::string("m.onnx: ").size())) + "\n";
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(GSPMD_SOURCE_DIR) + "/tools/gspmd_onnx_schemas.py" + files;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, got);
  EXPECT_EQ(WEXITSTATUS(pclose(pipe)), 1);
  EXPECT_EQ(out, expected);
}

TEST(GspmdSchemas, CheckOnnxModelNamesTheFile) {
  test::TempDir d;
  const std::string path = d.file("bad.onnx");
  std::string bytes;
  one_op("AllGather", {kAxes, int_attr("axis", 2), int_attr("group_size", 2)}, {2, 3}, std::vector<int64_t>{2, 3})
      .SerializeToString(&bytes);
  d.write("bad.onnx", bytes);
  test::expect_input_error([&] { check_onnx_model(path); },
                           path +
                               ": [ShapeInferenceError] Shape inference error(s): (op_type:AllGather, node name: n): "
                               "[ShapeInferenceError] axis 2 is out of range for rank 2");
  test::expect_input_error([&] { check_onnx_model(d.write("junk.onnx", "not a model")); },
                           d.file("junk.onnx") + ": not a valid ONNX model (truncated or malformed protobuf)");
}

}  // namespace
}  // namespace gspmd
