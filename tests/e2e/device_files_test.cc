// Device programs other tools can read (issue 16): every device model `partition` writes passes onnx's checker and
// strict shape inference with the gspmd schemas, in C++ and with tools/gspmd_onnx_schemas.py, and a corrupted
// collective is rejected with the expected message; `--collectives ort` writes ONNX Runtime's com.microsoft
// collectives that ORT's own schemas (encoded below from its contrib-op definitions, docs/collectives.md) accept;
// and the device files of both formats, run standalone one thread per device, equal the unpartitioned run.
#include <gtest/gtest.h>

#include "tests/frontend/onnx_headers.h"  // before onnx's other headers (ONNX_ML)

#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "backend/pod/collective_executor.h"
#include "backend/pod/pod.h"
#include "cli/wiring.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/rules/rule.h"
#include "e2e_util.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/gspmd_schemas.h"

using namespace e2e;

namespace gspmd {
namespace {

// ---- models and plans ----------------------------------------------------------------------------------------

/// A small model whose plan on a 2x2 mesh (x, y) has every collective: all-to-all and all-gather over one axis and
/// over both (in and out of device order), a reduce-scatter, relayout and halo collective-permutes (devices at the
/// edge get zeros), max and sum all-reduces over one axis (split Softmax) and a sum all-reduce over all devices.
const fs::path& collectives_model() {
  static const fs::path dir = [] {
    fs::path d = scratch("collectives_model");
    std::ofstream(d / "gen.py") << R"(import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(0)
def w(name, shape): return nh.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)
nodes = [h.make_node("Relu", ["a"], ["b"], name="relu_b"), h.make_node("Relu", ["b"], ["c"], name="relu_c"),
         h.make_node("Relu", ["c"], ["e"], name="relu_e"), h.make_node("MatMul", ["e", "w1"], ["d"], name="mm_d"),
         h.make_node("Relu", ["d"], ["f"], name="relu_f"), h.make_node("Relu", ["f"], ["g"], name="relu_g"),
         h.make_node("MatMul", ["g", "w2"], ["hh"], name="mm_h"),
         h.make_node("Softmax", ["hh"], ["out"], name="softmax", axis=1),
         h.make_node("Conv", ["img", "k"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
         h.make_node("Relu", ["a"], ["q"], name="relu_q"), h.make_node("MatMul", ["q", "w3"], ["r"], name="mm_r"),
         h.make_node("Relu", ["r"], ["s"], name="relu_s"), h.make_node("Relu", ["s"], ["u"], name="relu_u")]
io = lambda n, s: h.make_tensor_value_info(n, T.FLOAT, s)
g = h.make_graph(nodes, "collectives", [io("a", [8, 8]), io("img", [1, 2, 8, 8])],
                 [io("out", [8, 8]), io("conv", [1, 2, 8, 8]), io("u", [8, 8]), io("r", [8, 8])],
                 [w("w1", [8, 8]), w("w2", [8, 8]), w("k", [2, 2, 3, 3]), w("w3", [8, 8])])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
onnx.checker.check_model(m, full_check=True)
onnx.save(m, sys.argv[1] + "/collectives.onnx")
)";
    std::ofstream(d / "collectives.sharding.json") << R"({"mesh": {"shape": [2, 2], "axes": ["x", "y"]},
 "tensors": {"a": ["x", null], "b": [null, "x"], "c": [null, null], "e": [null, "y"], "w1": ["y", null],
  "d": ["y", null], "f": [["x", "y"], null], "g": [["y", "x"], null], "hh": [null, "x"],
  "img": [null, null, "x", null], "conv": [null, null, "x", null],
  "q": [null, ["x", "y"]], "w3": [["x", "y"], null], "r": [null, null], "s": [["x", "y"], null],
  "u": [null, ["x", "y"]]}}
)";
    CmdResult r = sh(debian_python() + " -I " + (d / "gen.py").string() + " " + d.string(), "collectives_gen");
    EXPECT_EQ(r.code, 0) << r.err;
    return d;
  }();
  return dir;
}

/// A model partitioned in-process, as `partition` does.
struct Planned {
  Graph g;
  SpmdProgram p;
};

Planned plan(const std::string& model, const std::string& sharding_file, const std::string& mesh) {
  Planned r;
  r.g = load_model(model, cli::kernel_load_options());
  const DeviceMesh cli_mesh = DeviceMesh::parse(mesh);
  Annotations a = read_sharding_file(sharding_file, r.g, &cli_mesh);
  RuleTable rules(r.g);
  a = refine_for_reshapes(r.g, a, &rules);
  r.p = partition(r.g, propagate(r.g, a, &rules), a.mesh, Target::load("tpu-v3"), &rules);
  return r;
}

/// Deterministic float inputs for the global graph.
std::vector<Tensor> inputs_of(const Graph& g) {
  std::vector<Tensor> in;
  for (int v : g.inputs) {
    Tensor t(g.values[v].dtype, g.values[v].shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(std::sin(0.7 * i + v));
    in.push_back(std::move(t));
  }
  return in;
}

const onnx::AttributeProto* attr(const onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

/// check_onnx_model's message for `p`, "" when it passes.
std::string check_error(const fs::path& p) {
  try {
    check_onnx_model(p.string());
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

void expect_close(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape, b.shape) << what;
  ASSERT_EQ(a.dtype, DType::kFloat32) << what;
  int bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    bad += !(std::fabs(x - y) <= 1e-5 + 1e-4 * std::fabs(y));
  }
  EXPECT_EQ(bad, 0) << what;
}

// ---- running device files: one thread per device ----------------------------------------------------------------

/// Loads dir/device_<k>.onnx for every device, runs them in one thread each and assembles the global outputs.
std::vector<Tensor> run_device_files(const Planned& pl, const fs::path& dir, const std::vector<Tensor>& inputs) {
  std::vector<Graph> graphs;
  for (int64_t k = 0; k < pl.p.mesh.num_devices(); ++k)
    graphs.push_back(
        load_model((dir / ("device_" + std::to_string(k) + ".onnx")).string(), cli::kernel_load_options()));
  return run_device_graphs(pl.p, pl.g, graphs, inputs).outputs;
}

/// Exports every device of `pl` into `dir` with `options`.
void export_all(const Planned& pl, const fs::path& dir, const ExportOptions& options = {}) {
  fs::create_directories(dir);
  for (int64_t k = 0; k < pl.p.mesh.num_devices(); ++k)
    export_device(pl.p, pl.g, k, (dir / ("device_" + std::to_string(k) + ".onnx")).string(), options);
}

// ---- the gspmd form ------------------------------------------------------------------------------------------

TEST(DeviceFiles, GspmdFilesPassTheCheckersAndRunStandalone) {
  const fs::path src = collectives_model();
  const Planned pl = plan((src / "collectives.onnx").string(), (src / "collectives.sharding.json").string(), "2x2");
  std::set<Collective> kinds;
  for (const CollectiveRecord& c : pl.p.collectives) kinds.insert(c.kind);
  EXPECT_EQ(kinds.size(), 5u);  // every collective
  const fs::path dir = scratch("device_files_gspmd");
  export_all(pl, dir);
  for (int k = 0; k < 4; ++k)
    EXPECT_NO_THROW(check_onnx_model((dir / ("device_" + std::to_string(k) + ".onnx")).string()));
  CmdResult py = sh(debian_python() + " tools/gspmd_onnx_schemas.py " + dir.string(), "device_files_gspmd_py");
  EXPECT_EQ(py.code, 0) << py.out << py.err;
  std::string ok;
  for (int k = 0; k < 4; ++k) ok += (dir / ("device_" + std::to_string(k) + ".onnx")).string() + ": ok\n";
  EXPECT_EQ(py.out, ok);

  const std::vector<Tensor> in = inputs_of(pl.g);
  const std::vector<Tensor> want = run_single(pl.g, in).outputs;
  const std::vector<Tensor> got = run_device_files(pl, dir, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < got.size(); ++o) expect_close(got[o], want[o], "output " + std::to_string(o));
}

/// The first gspmd node `op` of `m`.
onnx::NodeProto* find_gspmd(onnx::ModelProto& m, const std::string& op) {
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.domain() == "gspmd" && n.op_type() == op) return &n;
  return nullptr;
}

// A circular pipeline's files (docs/pipeline.md): the cyclic shifts are CollectivePermutes with wrap = 1 whose
// source_target_pairs close the ring (stage 1 -> stage 0); both checkers pass every file.
TEST(DeviceFiles, CircularPipelineShiftsCloseTheRing) {
  const fs::path dir = scratch("device_files_pipeline");
  const fs::path dec = e2e::make_decoder(dir, "d4",
                                         "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 2 --seq 8 "
                                         "--weights random",
                                         "df_pipeline_make");
  CmdResult r =
      e2e::cli("partition " + dec.string() + " --mesh 2 --pipeline x --schedule circular -o " + (dir / "out").string(),
               "df_pipeline");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int k = 0; k < 2; ++k) EXPECT_EQ(check_error(dir / "out" / ("device_" + std::to_string(k) + ".onnx")), "");
  CmdResult py = sh(debian_python() + " tools/gspmd_onnx_schemas.py " + (dir / "out").string(), "df_pipeline_py");
  EXPECT_EQ(py.code, 0) << py.out << py.err;
  const onnx::ModelProto m = test::read_onnx_model((dir / "out" / "device_0.onnx").string());
  int cyclic = 0, plain = 0;
  for (const auto& n : m.graph().node()) {
    if (n.domain() != "gspmd" || n.op_type() != "CollectivePermute") continue;
    bool wrap = false;
    std::vector<int64_t> pairs;
    for (const auto& a : n.attribute()) {
      if (a.name() == "wrap") wrap = a.i() == 1;
      if (a.name() == "source_target_pairs") pairs.assign(a.ints().begin(), a.ints().end());
    }
    (wrap ? cyclic : plain) += 1;
    EXPECT_EQ(pairs, wrap ? (std::vector<int64_t>{1, 0, 0, 1}) : (std::vector<int64_t>{0, 1})) << n.name();
  }
  EXPECT_EQ(cyclic, 2);  // iterations 2 and 3 of 2 microbatches x 2 rounds
  EXPECT_EQ(plain, 2);   // iterations 1 and 4 (iteration 0 shifts zeros)
}

// `partition`'s files for the GPT Megatron plan pass both checkers; a collective with a wrong output shape, and one
// with a wrong axis, are rejected by both with onnx's message naming the node.
TEST(DeviceFiles, GptFilesPassAndCorruptedCollectivesAreRejected) {
  const fs::path dir = scratch("device_files_gpt");
  CmdResult r = e2e::cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " -o " + (dir / "out").string(), "df_gpt");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int k = 0; k < 4; ++k) EXPECT_EQ(check_error(dir / "out" / ("device_" + std::to_string(k) + ".onnx")), "");
  CmdResult py = sh(debian_python() + " tools/gspmd_onnx_schemas.py " + (dir / "out").string(), "df_gpt_py");
  EXPECT_EQ(py.code, 0) << py.out << py.err;

  // 1. The output of device 2's first all-reduce declared [4,64,64] instead of [4,64,128].
  onnx::ModelProto m = test::read_onnx_model((dir / "out" / "device_2.onnx").string());
  const onnx::NodeProto* ar = find_gspmd(m, "AllReduce");
  ASSERT_TRUE(ar);
  bool found = false;
  for (auto& vi : *m.mutable_graph()->mutable_value_info()) {
    if (vi.name() != ar->output(0)) continue;
    ASSERT_EQ(vi.type().tensor_type().shape().dim(2).dim_value(), 128);
    vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(2)->set_dim_value(64);
    found = true;
  }
  ASSERT_TRUE(found);
  const fs::path shape_bad = dir / "shape_bad.onnx";
  test::write_onnx_model(m, shape_bad.string());
  const std::string shape_why = "[ShapeInferenceError] (op_type:AllReduce, node name: " + ar->name() +
                                "): [ShapeInferenceError] Inferred shape and existing shape differ in dimension 2: "
                                "(128) vs (64)";
  EXPECT_EQ(check_error(shape_bad), shape_bad.string() + ": " + shape_why);

  // 2. An all-gather of [8,4] along axis 1 (to [8,8]) told to gather along axis 0.
  const fs::path src = collectives_model();
  CmdResult c = e2e::cli("partition " + (src / "collectives.onnx").string() + " --mesh 2x2 --shardings " +
                             (src / "collectives.sharding.json").string() + " -o " + (dir / "coll").string(),
                         "df_coll");
  ASSERT_EQ(c.code, 0) << c.err;
  onnx::ModelProto mc = test::read_onnx_model((dir / "coll" / "device_0.onnx").string());
  onnx::NodeProto* ag = find_gspmd(mc, "AllGather");
  ASSERT_TRUE(ag);
  onnx::AttributeProto* axis = nullptr;
  for (auto& a : *ag->mutable_attribute())
    if (a.name() == "axis") axis = &a;
  ASSERT_TRUE(axis);
  ASSERT_EQ(axis->i(), 1);
  axis->set_i(0);
  const fs::path axis_bad = dir / "axis_bad.onnx";
  test::write_onnx_model(mc, axis_bad.string());
  const std::string axis_why = "[ShapeInferenceError] (op_type:AllGather, node name: " + ag->name() +
                               "): [ShapeInferenceError] Inferred shape and existing shape differ in dimension 0: "
                               "(16) vs (8)";
  EXPECT_EQ(check_error(axis_bad), axis_bad.string() + ": " + axis_why);

  // The Python module, which checks the gspmd nodes itself, gives the same verdicts.
  py = sh(debian_python() + " tools/gspmd_onnx_schemas.py " + shape_bad.string() + " " + axis_bad.string(),
          "df_gpt_py_bad");
  EXPECT_EQ(py.code, 1) << py.err;
  EXPECT_EQ(py.out, shape_bad.string() + ": " + shape_why + "\n" + axis_bad.string() + ": " + axis_why + "\n");
}

// `partition --collectives ort` on the CLI; an unknown format is a usage error.
TEST(DeviceFiles, PartitionCollectivesFlag) {
  const fs::path dir = scratch("device_files_flag");
  CmdResult r = e2e::cli(
      "partition " + kGpt + " --mesh 2x2 " + kMegatron + " --collectives ort -o " + (dir / "out").string(), "df_flag");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int k = 0; k < 4; ++k) {
    onnx::ModelProto m = test::read_onnx_model((dir / "out" / ("device_" + std::to_string(k) + ".onnx")).string());
    std::map<std::string, int> ops;
    for (const auto& n : m.graph().node())
      if (!n.domain().empty()) ++ops[n.domain() + "." + n.op_type()];
    // Megatron's all-reduces run over `model`, two devices of four: ORT's collectives have no groups, so each is an
    // all-gather over all devices and a sum over the group's rows.
    EXPECT_EQ(ops, (std::map<std::string, int>{{"com.microsoft.AllGather", 5}}));
  }
  CmdResult bad =
      e2e::cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " --collectives nccl -o " + (dir / "never").string(),
               "df_flag_bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "error: usage: --collectives: nccl not in {gspmd,ort} (see gspmd-onnx --help)\n");
  EXPECT_FALSE(fs::exists(dir / "never"));
}

// ---- the ONNX Runtime form ----------------------------------------------------------------------------------

/// ONNX Runtime's collective schemas, as its contrib-op definitions give them (docs/collectives.md, "ONNX Runtime";
/// domain com.microsoft, version 1): AllReduce (no attribute; T float16, float, double; y has x's type and shape),
/// AllGather (axis INT default 1, group_size INT default 1; T float16, float, double, int64, bool; y's dim `axis` is
/// group_size times x's) and AllToAll (group_size INT default 1; same T; y has x's type and shape). One variadic
/// input and output each.
void register_ort_collective_schemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance();
    if (!ranges.Map().count("com.microsoft")) ranges.AddDomainToVersion("com.microsoft", 1, 1);
    const std::vector<std::string> floats = {"tensor(float16)", "tensor(float)", "tensor(double)"};
    const std::vector<std::string> more = {"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(int64)",
                                           "tensor(bool)"};
    auto schema = [](const char* name, const std::vector<std::string>& types) {
      onnx::OpSchema s(name, __FILE__, __LINE__);
      s.SetDomain("com.microsoft").SinceVersion(1);
      s.Input(0, "input", "", "T", onnx::OpSchema::Variadic);
      s.Output(0, "output", "", "T", onnx::OpSchema::Variadic);
      s.TypeConstraint("T", types, "");
      return s;
    };
    onnx::OpSchema ar = schema("AllReduce", floats);
    ar.TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    onnx::OpSchema ag = schema("AllGather", more);
    ag.Attr("axis", "", onnx::AttributeProto::INT, int64_t{1});
    ag.Attr("group_size", "", onnx::AttributeProto::INT, int64_t{1});
    ag.TypeAndShapeInferenceFunction([](onnx::InferenceContext& ctx) {
      onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
      if (!onnx::hasInputShape(ctx, 0)) return;
      onnx::TensorShapeProto shape = onnx::getInputShape(ctx, 0);
      const int axis = static_cast<int>(onnx::getAttribute(ctx, "axis", 0));
      *shape.mutable_dim(axis) = shape.dim(axis) * onnx::getAttribute(ctx, "group_size", 1);
      *ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape() = shape;
    });
    onnx::OpSchema aa = schema("AllToAll", more);
    aa.Attr("group_size", "", onnx::AttributeProto::INT, int64_t{1});
    aa.TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    for (onnx::OpSchema* s : {&ar, &ag, &aa}) onnx::RegisterSchema(*s);
  });
}

/// ORT's collectives run over the world communicator in rank order (docs/collectives.md): as gspmd collectives over
/// every mesh axis (tile = device id). AllToAll exchanges the N contiguous chunks of its input: split and concat on
/// axis 0. Rewrites `m` so that the emulator can run it.
void ort_to_gspmd(onnx::ModelProto& m, int mesh_rank, int64_t devices) {
  std::vector<int64_t> all_axes;
  for (int a = 0; a < mesh_rank; ++a) all_axes.push_back(a);
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.domain() != "com.microsoft") continue;
    n.set_domain("gspmd");
    std::vector<onnx::AttributeProto> keep;
    for (const auto& a : n.attribute()) {
      if (a.name() == "group_size")
        EXPECT_EQ(a.i(), devices) << n.name();
      else
        keep.push_back(a);
    }
    n.clear_attribute();
    for (auto& a : keep) *n.add_attribute() = a;
    auto add_int = [&](const char* name, int64_t v) {
      auto* a = n.add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    };
    auto* axes = n.add_attribute();
    axes->set_name("mesh_axes");
    axes->set_type(onnx::AttributeProto::INTS);
    for (int64_t a : all_axes) axes->add_ints(a);
    if (n.op_type() == "AllToAll") {
      add_int("split_axis", 0);
      add_int("concat_axis", 0);
    }
  }
  for (auto& o : *m.mutable_opset_import())
    if (o.domain() == "com.microsoft") o.set_domain("gspmd");
}

TEST(DeviceFiles, OrtFilesMatchOrtSchemasAndRunStandalone) {
  register_ort_collective_schemas();
  const fs::path src = collectives_model();
  const Planned pl = plan((src / "collectives.onnx").string(), (src / "collectives.sharding.json").string(), "2x2");
  const fs::path dir = scratch("device_files_ort"), run_dir = dir / "as_gspmd";
  ExportOptions ort;
  ort.collectives = CollectiveFormat::kOrt;
  export_all(pl, dir, ort);
  fs::create_directories(run_dir);
  std::vector<std::string> first_sequence;
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("device " + std::to_string(k));
    const fs::path f = dir / ("device_" + std::to_string(k) + ".onnx");
    EXPECT_NO_THROW(check_onnx_model(f.string()));  // ORT's schemas: op names, attributes, types, shapes
    onnx::ModelProto m = test::read_onnx_model(f.string());
    std::map<std::string, int64_t> opsets;
    for (const auto& o : m.opset_import()) opsets[o.domain()] = o.version();
    EXPECT_EQ(opsets, (std::map<std::string, int64_t>{{"", 17}, {"com.microsoft", 1}}));
    std::vector<std::string> sequence;
    for (const auto& n : m.graph().node()) {
      EXPECT_NE(n.domain(), "gspmd") << n.name();
      if (n.domain() != "com.microsoft") continue;
      sequence.push_back(n.op_type());
      std::set<std::string> names;
      for (const auto& a : n.attribute()) names.insert(a.name());
      if (n.op_type() == "AllReduce") {
        EXPECT_TRUE(names.empty()) << n.name();
      } else if (n.op_type() == "AllGather") {
        EXPECT_EQ(names, (std::set<std::string>{"axis", "group_size"})) << n.name();
        EXPECT_EQ(attr(n, "group_size")->i(), 4);
        EXPECT_GE(attr(n, "axis")->i(), 0);  // ORT's kernel transposes for axis > 0 and reads no negative axis
      } else {
        EXPECT_EQ(n.op_type(), "AllToAll") << n.name();
        EXPECT_EQ(names, std::set<std::string>{"group_size"}) << n.name();
        EXPECT_EQ(attr(n, "group_size")->i(), 4);
      }
    }
    // Every rank calls the same collectives in the same order (a world communicator has no other matching).
    if (k == 0) first_sequence = sequence;
    EXPECT_EQ(sequence, first_sequence);
    ort_to_gspmd(m, pl.p.mesh.rank(), 4);
    test::write_onnx_model(m, (run_dir / f.filename()).string());
  }
  // docs/collectives.md's table: a float sum all-reduce or reduce-scatter over all devices is an AllReduce, an
  // all-gather or all-to-all over all devices in device order an AllGather or AllToAll; everything else goes through
  // one AllGather of every device's value.
  std::vector<std::string> want_ops;
  for (const Node& n : pl.p.program.nodes) {
    if (!is_collective(n)) continue;
    const CollectiveAttrs a = collective_attrs(n);
    const Collective kind = a.kind;
    const std::vector<int64_t> group = pl.p.mesh.replica_groups(a.mesh_axes).at(0);
    bool in_order = group.size() == 4;
    for (size_t t = 0; in_order && t < group.size(); ++t) in_order = group[t] == static_cast<int64_t>(t);
    const bool sum = group.size() == 4 && a.reduction == ReductionKind::kSum;  // all values here are float
    if ((kind == Collective::kAllReduce || kind == Collective::kReduceScatter) && sum)
      want_ops.push_back("AllReduce");
    else if (kind == Collective::kAllToAll && in_order)
      want_ops.push_back("AllToAll");
    else
      want_ops.push_back("AllGather");
  }
  EXPECT_EQ(first_sequence, want_ops);
  EXPECT_NE(std::find(want_ops.begin(), want_ops.end(), "AllReduce"), want_ops.end());  // each direct form is exercised
  EXPECT_NE(std::find(want_ops.begin(), want_ops.end(), "AllToAll"), want_ops.end());

  const std::vector<Tensor> in = inputs_of(pl.g);
  const std::vector<Tensor> want = run_single(pl.g, in).outputs;
  const std::vector<Tensor> got = run_device_files(pl, run_dir, in);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < got.size(); ++o) expect_close(got[o], want[o], "output " + std::to_string(o));
}

// --collectives ort over the dim symbols: the Llama decoder's data x model plan (its all-reduces over `model`, two
// devices of four, lowered onto an AllGather of every device's value) partitioned without --dim; the files pass
// ORT's schemas, their inputs keep the symbols, and, with ORT's collectives read as gspmd's over every device, they
// run exact at the test data's sizes and at others than the hints (an uneven batch of 3 over `data`).
TEST(DeviceFiles, OrtFilesKeepTheSymbolsAndRunAtOtherSizes) {
  register_ort_collective_schemas();
  const fs::path dir = scratch("device_files_ort_symbolic"), run_dir = dir / "as_gspmd";
  const std::string model = "testdata/llama/model.onnx --mesh 2x2 --shardings testdata/llama/dp2tp2.plan.json";
  CmdResult r = e2e::cli("partition " + model + " --collectives ort -o " + (dir / "ort").string(), "df_ort_sym");
  ASSERT_EQ(r.code, 0) << r.err;
  fs::create_directories(run_dir);
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("device " + std::to_string(k));
    const fs::path f = dir / "ort" / ("device_" + std::to_string(k) + ".onnx");
    EXPECT_NO_THROW(check_onnx_model(f.string()));
    onnx::ModelProto m = test::read_onnx_model(f.string());
    std::map<std::string, int> ops;
    for (const auto& n : m.graph().node())
      if (!n.domain().empty()) ++ops[n.domain() + "." + n.op_type()];
    EXPECT_EQ(ops, (std::map<std::string, int>{{"com.microsoft.AllGather", 4}}));
    EXPECT_EQ(m.graph().input(0).type().tensor_type().shape().dim(0).dim_param(), "ceil(batch / 2)");
    ort_to_gspmd(m, 2, 4);
    test::write_onnx_model(m, (run_dir / f.filename()).string());
  }
  r = e2e::cli("run " + model + " --program " + run_dir.string() +
                   " --inputs testdata/llama/test_data_set_0 --expected testdata/llama/test_data_set_0",
               "df_ort_sym_run");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("expected  passed"), std::string::npos) << r.out;
  r = e2e::cli("run " + model + " --program " + run_dir.string() + " --dim batch=3 --dim seq=2 --dim past=1 --check",
               "df_ort_sym_check");
  EXPECT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
}

TEST(DeviceFiles, OrtSchemasAreEnforced) {
  // The encoded ORT schemas reject what ORT would: an attribute AllReduce does not have, an int64 AllReduce.
  register_ort_collective_schemas();
  const fs::path dir = scratch("device_files_ort_bad");
  const Planned pl = plan("testdata/gpt/gpt_opset17.onnx", "testdata/gpt/gpt.megatron.sharding.json", "1x4");
  ExportOptions ort;
  ort.collectives = CollectiveFormat::kOrt;
  export_all(pl, dir, ort);
  onnx::ModelProto m = test::read_onnx_model((dir / "device_0.onnx").string());
  onnx::NodeProto* ar = nullptr;
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.domain() == "com.microsoft" && !ar) ar = &n;
  ASSERT_TRUE(ar);
  EXPECT_EQ(ar->op_type(), "AllReduce");  // Megatron on 1x4 sums over all devices: ORT's own AllReduce
  auto* extra = ar->add_attribute();
  extra->set_name("reduction");
  extra->set_type(onnx::AttributeProto::STRING);
  extra->set_s("sum");
  test::write_onnx_model(m, (dir / "extra.onnx").string());
  EXPECT_EQ(check_error(dir / "extra.onnx"),
            (dir / "extra.onnx").string() +
                ": Unrecognized attribute: reduction for operator AllReduce ==> Context: "
                "Bad node spec for node. Name: " +
                ar->name() + " OpType: AllReduce");

  onnx::ModelProto tiny;
  tiny.set_ir_version(8);
  tiny.add_opset_import()->set_version(17);
  auto* ms = tiny.add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  auto* g = tiny.mutable_graph();
  g->set_name("g");
  auto* n = g->add_node();
  n->set_name("ar");
  n->set_op_type("AllReduce");
  n->set_domain("com.microsoft");
  n->add_input("x");
  n->add_output("y");
  for (auto* vi : {g->add_input(), g->add_output()}) {
    vi->set_name(vi == g->mutable_input(0) ? "x" : "y");
    auto* t = vi->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::INT64);
    t->mutable_shape()->add_dim()->set_dim_value(4);
  }
  test::write_onnx_model(tiny, (dir / "int64.onnx").string());
  EXPECT_EQ(check_error(dir / "int64.onnx"), (dir / "int64.onnx").string() +
                                                 ": [ShapeInferenceError] (op_type:AllReduce, node name: ar): input "
                                                 "typestr: T, has unsupported type: tensor(int64)");
}

}  // namespace
}  // namespace gspmd
