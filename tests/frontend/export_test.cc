// export_device: a hand-built SPMD program on a 2-device mesh, exported and parsed back with ONNX.
#include <cmath>
#include <fstream>
#include <sstream>

#include "tests/frontend/frontend_test_util.h"
#include "tests/frontend/onnx_headers.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using test::TempDir;

int add(Graph& g, const std::string& name, DType t, Shape s, bool init = false) {
  Value v;
  v.name = name;
  v.dtype = t;
  v.shape = std::move(s);
  v.is_initializer = init;
  return g.add_value(std::move(v));
}

int node(Graph& g, const std::string& name, const std::string& op, std::vector<int> in, std::vector<int> out,
         std::map<std::string, AttrValue> attrs = {}, const std::string& domain = "") {
  Node n;
  n.name = name;
  n.op_type = op;
  n.domain = domain;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attrs = std::move(attrs);
  return g.add_node(std::move(n));
}

struct Fixture {
  Graph global;
  SpmdProgram p;
  Fixture() {
    std::vector<float> wv(16);
    for (int i = 0; i < 16; ++i) wv[i] = static_cast<float>(i);
    int gx = add(global, "x", DType::kFloat32, {3, 4});
    int gw = add(global, "w", DType::kFloat32, {4, 4}, true);
    global.values[gw].data = std::make_shared<const Tensor>(Tensor::from_floats({4, 4}, wv));
    int gy = add(global, "y", DType::kFloat32, {3, 4});
    node(global, "mm", "MatMul", {gx, gw}, {gy});
    global.inputs = {gx};
    global.outputs = {gy};
    global.name = "tiny";

    p.mesh = DeviceMesh{{2}, {"x"}};
    Graph& g = p.program;
    g.name = "tiny";
    const auto F = DType::kFloat32;
    const std::vector<int64_t> ax0{0};
    int x = add(g, "x", F, {3, 4});
    int w = add(g, "w", F, {2, 4}, true);
    int xs = add(g, "x/shard", F, {3, 2});
    int part = add(g, "y/partial", F, {3, 4});
    int y = add(g, "y", F, {3, 4});
    int rows = add(g, "x/rows", F, {2, 4});
    int masked = add(g, "x/rows/masked", F, {2, 4});
    int off = add(g, "offset", DType::kInt64, {});
    int perm = add(g, "x/rows/permuted", F, {2, 4});
    node(g, "mm/shard_x", "ShardSlice", {x}, {xs},
         {{"axis", int64_t{1}}, {"mesh_axes", ax0}, {"shard_size", int64_t{2}}}, kGspmdDomain);
    node(g, "mm", "MatMul", {xs, w}, {part});
    node(g, "mm/all_reduce", "AllReduce", {part}, {y}, {{"mesh_axes", ax0}, {"reduction", std::string("sum")}},
         kGspmdDomain);
    node(g, "rows", "ShardSlice", {x}, {rows}, {{"axis", int64_t{0}}, {"mesh_axes", ax0}, {"shard_size", int64_t{2}}},
         kGspmdDomain);
    node(g, "mask", "MaskPad", {rows}, {masked},
         {{"axis", int64_t{0}}, {"mesh_axes", ax0}, {"full_size", int64_t{3}}, {"value", -INFINITY}}, kGspmdDomain);
    node(g, "offset", "PartitionOffset", {}, {off}, {{"mesh_axes", ax0}, {"shard_size", int64_t{2}}}, kGspmdDomain);
    node(g, "permute", "CollectivePermute", {masked}, {perm}, {{"mesh_axes", ax0}, {"shift", int64_t{1}}},
         kGspmdDomain);
    g.inputs = {x};
    g.outputs = {y, perm, off};
    p.inputs = {ProgramBinding{x, gx, TensorSharding::replicated(2)}};
    TensorSharding ws = TensorSharding::replicated(2);
    ws.dims[0] = {0};
    p.params = {ProgramBinding{w, gw, ws}};
    g.verify();
  }
};

onnx::ModelProto parse(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(ss.str())) << path;
  return m;
}

const onnx::NodeProto* find_node(const onnx::ModelProto& m, const std::string& op) {
  for (const auto& n : m.graph().node())
    if (n.op_type() == op) return &n;
  return nullptr;
}

const onnx::AttributeProto* attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

std::vector<int64_t> ints(const onnx::AttributeProto* a) {
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : std::vector<int64_t>{-999};
}

const onnx::TensorProto* init(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return &t;
  return nullptr;
}

TEST(Export, TwoDeviceProgram) {
  Fixture f;
  TempDir d;
  for (int64_t dev = 0; dev < 2; ++dev) {
    SCOPED_TRACE("device " + std::to_string(dev));
    const std::string path = d.file("device_" + std::to_string(dev) + ".onnx");
    export_device(f.p, f.global, dev, path);
    onnx::ModelProto m = parse(path);
    EXPECT_EQ(m.ir_version(), 8);
    std::map<std::string, int64_t> opsets;
    for (const auto& o : m.opset_import()) opsets[o.domain()] = o.version();
    EXPECT_EQ(opsets[""], 17);
    EXPECT_EQ(opsets["gspmd"], 1);
    EXPECT_NO_THROW(onnx::checker::check_model(m));

    // Inputs / outputs with local shapes.
    ASSERT_EQ(m.graph().input_size(), 1);
    EXPECT_EQ(m.graph().input(0).name(), "x");
    EXPECT_EQ(m.graph().input(0).type().tensor_type().shape().dim(1).dim_value(), 4);
    ASSERT_EQ(m.graph().output_size(), 3);
    EXPECT_EQ(m.graph().output(0).name(), "y");
    EXPECT_EQ(m.graph().output(2).type().tensor_type().elem_type(), onnx::TensorProto::INT64);

    // The device's weight slice: rows [2*dev, 2*dev+2) of w.
    const onnx::TensorProto* w = init(m, "w");
    ASSERT_TRUE(w);
    ASSERT_EQ(w->raw_data().size(), 8 * sizeof(float));
    float w0;
    std::memcpy(&w0, w->raw_data().data(), 4);
    EXPECT_EQ(w0, static_cast<float>(8 * dev));

    // Collectives keep domain gspmd and get replica groups.
    const onnx::NodeProto* ar = find_node(m, "AllReduce");
    ASSERT_TRUE(ar);
    EXPECT_EQ(ar->domain(), "gspmd");
    EXPECT_EQ(ints(attr(*ar, "replica_groups")), (std::vector<int64_t>{0, 1}));
    ASSERT_TRUE(attr(*ar, "group_size"));
    EXPECT_EQ(attr(*ar, "group_size")->i(), 2);
    EXPECT_EQ(ints(attr(*ar, "mesh_axes")), (std::vector<int64_t>{0}));
    EXPECT_EQ(attr(*ar, "reduction")->s(), "sum");
    const onnx::NodeProto* cp = find_node(m, "CollectivePermute");
    ASSERT_TRUE(cp);
    EXPECT_EQ(ints(attr(*cp, "source_target_pairs")), (std::vector<int64_t>{0, 1}));

    // No gspmd op other than collectives survives.
    for (const auto& n : m.graph().node()) {
      if (n.domain() == "gspmd") {
        EXPECT_TRUE(n.op_type() == "AllReduce" || n.op_type() == "CollectivePermute") << n.op_type();
      }
    }

    // PartitionOffset -> Constant 2*dev.
    const onnx::NodeProto* c = find_node(m, "Constant");
    ASSERT_TRUE(c);
    EXPECT_EQ(c->output(0), "offset");
    int64_t off;
    std::memcpy(&off, attr(*c, "value")->t().raw_data().data(), 8);
    EXPECT_EQ(off, 2 * dev);

    int slices = 0, pads = 0, identities = 0;
    for (const auto& n : m.graph().node()) {
      slices += n.op_type() == "Slice";
      pads += n.op_type() == "Pad";
      identities += n.op_type() == "Identity";
    }
    if (dev == 0) {
      // x/shard: Slice cols 0..2; rows: Slice 0..2; mask: nothing to mask -> Identity.
      EXPECT_EQ(slices, 2);
      EXPECT_EQ(pads, 0);
      EXPECT_EQ(identities, 1);
    } else {
      // x/shard: Slice cols 2..4; rows: Slice 2..3 + Pad 1; mask: Slice 0..1 + Pad 1 with -inf.
      EXPECT_EQ(slices, 3);
      EXPECT_EQ(pads, 2);
      EXPECT_EQ(identities, 0);
      bool found_neg_inf = false;
      for (const auto& t : m.graph().initializer()) {
        if (t.name().find("mask/pad_value") == std::string::npos) continue;
        float v;
        std::memcpy(&v, t.raw_data().data(), 4);
        found_neg_inf = std::isinf(v) && v < 0;
      }
      EXPECT_TRUE(found_neg_inf);
    }
    // Every node output has a type (value_info, or graph output).
    std::set<std::string> typed;
    for (const auto& vi : m.graph().value_info()) typed.insert(vi.name());
    for (const auto& vi : m.graph().output()) typed.insert(vi.name());
    for (const auto& n : m.graph().node())
      for (const auto& o : n.output()) EXPECT_TRUE(typed.count(o)) << o;
  }
}

TEST(Export, RelayoutPermuteSpellsOutEveryPair) {
  // [x,y] -> [y,x] on 2x3: the partitioner emits one CollectivePermute with target_axes; the device file lists the
  // pairs. Device (i,j) (id 3i+j) must hold chunk 2j+i, held by device 2j+i: sources by destination 0,2,4,1,3,5.
  testing::GraphBuilder b;
  int x = b.input("x", {6, 6});
  int n = b.node("Identity", {x}, {6, 6});
  b.g.outputs = {b.g.nodes[n].outputs[0]};
  ShardingPlan plan;
  plan.shardings.assign(b.g.values.size(), TensorSharding::replicated(2));
  plan.origins.resize(b.g.values.size());
  plan.shardings[x].dims[0] = {0, 1};
  plan.shardings[b.g.outputs[0]].dims[0] = {1, 0};
  DeviceMesh mesh = DeviceMesh::parse("2x3");
  SpmdProgram p = partition(b.g, plan, mesh);
  ASSERT_EQ(p.collectives.size(), 1u);
  EXPECT_EQ(collective_name(p.collectives[0].kind), "collective-permute");
  TempDir d;
  export_device(p, b.g, 4, d.file("d.onnx"));
  onnx::ModelProto m = parse(d.file("d.onnx"));
  const onnx::NodeProto* cp = find_node(m, "CollectivePermute");
  ASSERT_TRUE(cp);
  EXPECT_EQ(ints(attr(*cp, "target_axes")), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(ints(attr(*cp, "source_target_pairs")), (std::vector<int64_t>{0, 0, 2, 1, 4, 2, 1, 3, 3, 4, 5, 5}));
}

TEST(Export, ParamWithoutDataFails) {
  Fixture f;
  f.global.values[f.global.at("w")].data.reset();
  TempDir d;
  EXPECT_THROW(export_device(f.p, f.global, 0, d.file("d.onnx")), InternalError);
  EXPECT_FALSE(std::filesystem::exists(d.file("d.onnx")));
}

// --collectives ort refuses what ONNX Runtime's collectives cannot carry, naming the node (docs/collectives.md).
TEST(Export, OrtRefusesWhatItCannotCarry) {
  for (auto [dtype, op, message] :
       {std::tuple{DType::kUInt64, "AllGather",
                   "--collectives ort: node 'c' (AllGather): ONNX Runtime's AllGather and AllToAll carry float16, "
                   "float, double, int64 or bool tensors, not uint64"},
        std::tuple{DType::kBool, "AllReduce",
                   "--collectives ort: node 'c' (AllReduce): ONNX Runtime's collectives cannot reduce bool tensors"}}) {
    Graph global;
    int gx = add(global, "x", dtype, {4});
    global.inputs = {gx};
    global.outputs = {gx};
    SpmdProgram p;
    p.mesh = DeviceMesh{{2}, {"x"}};
    Graph& g = p.program;
    int x = add(g, "x", dtype, {2});
    int y = add(g, "y", dtype, {std::string(op) == "AllGather" ? 4 : 2});
    std::map<std::string, AttrValue> attrs{{"mesh_axes", std::vector<int64_t>{0}}};
    if (std::string(op) == "AllGather") attrs["axis"] = int64_t{0};
    node(g, "c", op, {x}, {y}, attrs, kGspmdDomain);
    g.inputs = {x};
    g.outputs = {y};
    TensorSharding split = TensorSharding::replicated(1);
    split.dims[0] = {0};
    p.inputs = {ProgramBinding{x, gx, split}};
    p.outputs = {ProgramBinding{y, gx, TensorSharding::replicated(1)}};
    TempDir d;
    ExportOptions ort;
    ort.collectives = CollectiveFormat::kOrt;
    test::expect_input_error([&] { export_device(p, global, 0, d.file("d.onnx"), ort); }, message);
    EXPECT_FALSE(std::filesystem::exists(d.file("d.onnx")));
  }
}

// The ops the partitioner adds carry operands as constant inputs (Slice-10, Unsqueeze-13, ReduceSum-13); in a model
// at an older opset the device file takes them as attributes, and passes onnx's checker (export validates it).
TEST(Export, PartitionerOpsTakeTheModelOpsetsForm) {
  Graph global;
  int gx = add(global, "x", DType::kFloat32, {4, 4});
  global.inputs = {gx};
  global.outputs = {gx};
  global.opset = 9;
  SpmdProgram p;
  p.mesh = DeviceMesh{{2}, {"x"}};
  Graph& g = p.program;
  auto constant = [&](const std::string& name, std::vector<int64_t> v) {
    int c = add(g, name, DType::kInt64, {static_cast<int64_t>(v.size())}, true);
    g.values[c].data = std::make_shared<const Tensor>(Tensor::from_int64s(v));
    return c;
  };
  int x = add(g, "x", DType::kFloat32, {4, 4});
  int s = add(g, "s", DType::kFloat32, {2, 4});
  int u = add(g, "u", DType::kFloat32, {1, 2, 4});
  int r = add(g, "r", DType::kFloat32, {1, 2});
  node(g, "slice", "Slice", {x, constant("starts", {0}), constant("ends", {2}), constant("axes", {0})}, {s});
  node(g, "unsqueeze", "Unsqueeze", {s, constant("uaxes", {0})}, {u});
  node(g, "sum", "ReduceSum", {u, constant("raxes", {2})}, {r}, {{"keepdims", int64_t{0}}});
  g.inputs = {x};
  g.outputs = {r};
  p.inputs = {ProgramBinding{x, gx, TensorSharding::replicated(2)}};
  p.outputs = {ProgramBinding{r, gx, TensorSharding::replicated(2)}};
  TempDir d;
  export_device(p, global, 0, d.file("d.onnx"));
  onnx::ModelProto m = parse(d.file("d.onnx"));
  for (const auto& [op, name, want] :
       {std::tuple{"Slice", "starts", std::vector<int64_t>{0}}, std::tuple{"Slice", "ends", std::vector<int64_t>{2}},
        std::tuple{"Slice", "axes", std::vector<int64_t>{0}}, std::tuple{"Unsqueeze", "axes", std::vector<int64_t>{0}},
        std::tuple{"ReduceSum", "axes", std::vector<int64_t>{2}}}) {
    const onnx::NodeProto* n = find_node(m, op);
    ASSERT_TRUE(n) << op;
    EXPECT_EQ(n->input_size(), 1) << op;
    EXPECT_EQ(ints(attr(*n, name)), want) << op << " " << name;
  }
}

}  // namespace
}  // namespace gspmd
