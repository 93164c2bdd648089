// Symbolic dims (docs/shapes.md). Loading with the dim symbols kept (LoadOptions::keep_symbols): torch exports with
// dynamic axes load without --dim, every value that depends on a symbol carries its dims as expressions, and those
// expressions are the shapes that loading with any binding of the symbols gives. Partitioning such a graph
// (attach_program_symbols), its soundness check (check_symbolic_program) and the device files' dim_params.
#include <tuple>

#include <gtest/gtest.h>

#include "backend/pod/pod.h"
#include "core/partition/spmd.h"
#include "core/shapes/symbolic.h"
#include "tests/frontend/frontend_test_util.h"
#include "tests/frontend/onnx_headers.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd::test {
namespace {

std::string llama(const std::string& f = "model.onnx") {
  return std::string(GSPMD_SOURCE_DIR) + "/testdata/llama/" + f;
}

Graph load_symbolic(const std::string& model) {
  LoadOptions o = load_opts();
  o.keep_symbols = true;
  return load_model(model, o);
}

// The dims of value `name` in `g`: its expressions, or its static shape.
std::string dims_of(const Graph& g, const std::string& name) {
  const Value& v = g.values[static_cast<size_t>(g.at(name))];
  if (v.sym) return dims_str(v.sym->dims);
  return dims_str(std::vector<DimExpr>(v.shape.begin(), v.shape.end()));
}

// For every value of `sym` that `bound` (the same model loaded with the symbols bound to `b`) also has: its
// expressions at `b` are the bound graph's shape, and a constant's expressions its elements. Returns the number of
// symbolic values compared.
int expect_agrees(const Graph& sym, const Graph& bound, const DimBindings& b) {
  int compared = 0;
  for (const Value& v : sym.values) {
    const int id = bound.find(v.name);
    if (id < 0) continue;
    const Value& w = bound.values[static_cast<size_t>(id)];
    if (!v.sym) {
      EXPECT_EQ(v.shape, w.shape) << v.name << " is static in the symbolic graph";
      continue;
    }
    ++compared;
    Shape at;
    for (const DimExpr& d : v.sym->dims) at.push_back(d.eval(b));
    EXPECT_EQ(at, w.shape) << v.name << ": " << dims_str(v.sym->dims);
    if (v.sym->elems && w.data) {
      std::vector<int64_t> e;
      for (const DimExpr& x : *v.sym->elems) e.push_back(x.eval(b));
      EXPECT_EQ(e, w.data->as_int64s()) << v.name << ": elements " << dims_str(*v.sym->elems);
    }
  }
  return compared;
}

// Mesh "2" with each of the rank-2 `values` split on dim `d` over it.
Annotations split_over_2(const std::vector<int>& values, size_t d) {
  Annotations a;
  a.mesh = DeviceMesh::parse("2");
  Annotation ann;
  ann.sharding = TensorSharding::replicated(2);
  ann.sharding.dims[d] = {0};
  for (int v : values) a.by_value[v] = ann;
  return a;
}

TEST(SymbolicLoad, LlamaDecoderKeepsBatchSeqAndPast) {
  const Graph g = load_symbolic(llama());
  // hints: distinct primes from 17, in the order the inputs name the symbols
  EXPECT_EQ(g.dim_hints, (DimBindings{{"batch", 17}, {"seq", 19}, {"past", 23}}));
  EXPECT_EQ(dims_of(g, "input_ids"), "[batch, seq]");
  EXPECT_EQ(dims_of(g, "past_key_0"), "[batch, 2, past, 16]");
  EXPECT_EQ(dims_of(g, "logits"), "[batch, seq, 128]");
  EXPECT_EQ(dims_of(g, "present_key_0"), "[batch, 2, past + seq, 16]");
  EXPECT_EQ(dims_of(g, "present_value_1"), "[batch, 2, past + seq, 16]");
  EXPECT_TRUE(g.dim_guards.empty());
  // the causal mask and the rotary tables depend on the lengths: they are computed, not folded at the hints
  int symbolic = 0;
  for (const Value& v : g.values) symbolic += v.sym != nullptr;
  EXPECT_GT(symbolic, 100);
  for (const DimBindings& b :
       {DimBindings{{"batch", 2}, {"seq", 5}, {"past", 3}}, DimBindings{{"batch", 1}, {"seq", 1}, {"past", 0}},
        DimBindings{{"batch", 3}, {"seq", 4}, {"past", 9}}}) {
    SCOPED_TRACE(::testing::Message() << "batch " << b.at("batch") << " seq " << b.at("seq") << " past "
                                      << b.at("past"));
    const Graph bound = load_model(llama(), load_opts({b.begin(), b.end()}));
    EXPECT_GT(expect_agrees(g, bound, b), 30);
  }
}

// torch's slice of a learned position table (wpe[:n], 64 rows) broadcast with the sequence: the model runs only for
// seq <= 64, which loading records as a guard.
TEST(SymbolicLoad, CausalDecoderGuardsThePositionTable) {
  const Graph g = load_symbolic(llama("decoder_causal_dyn_op17.onnx"));
  EXPECT_EQ(g.dim_hints, (DimBindings{{"batch", 17}, {"seq", 19}}));
  EXPECT_EQ(dims_of(g, "logits"), "[batch, seq, 100]");
  ASSERT_EQ(g.dim_guards.size(), 1u);
  EXPECT_EQ(g.dim_guards[0].first.str() + " == " + g.dim_guards[0].second.str(), "seq == min(64, seq)");
  for (const DimBindings& b : {DimBindings{{"batch", 2}, {"seq", 5}}, DimBindings{{"batch", 1}, {"seq", 64}}}) {
    const Graph bound = load_model(llama("decoder_causal_dyn_op17.onnx"), load_opts({b.begin(), b.end()}));
    EXPECT_GT(expect_agrees(g, bound, b), 10);
  }
}

// Without keep_symbols, a symbolic dim still needs --dim (partition's error today).
TEST(SymbolicLoad, WithoutKeepSymbolsADimMustBeBound) {
  try {
    load_model(llama(), load_opts());
    FAIL() << "loaded";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              llama() + ": input 'input_ids' dim 0 'batch' is symbolic: bind it with --dim batch=N");
  }
}

// The Llama decoder partitioned with its tp<n> plan at the hints.
SpmdProgram partition_llama(const Graph& g, int n) {
  const Annotations a = read_sharding_file(llama("tp" + std::to_string(n) + ".plan.json"), g, nullptr);
  return partition(g, propagate(g, a), a.mesh);
}

std::string unsupported_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  return "(no error)";
}

// Tensor parallelism splits heads and d_ff, never batch, seq or past: the program keeps them as expressions, and
// the check at other dims passes; a shape constant whose expression is dropped (a literal the hints froze) is caught.
// The symbolic rules a detector's box and mask heads need (ONNX operator specs): RoiAlign gives one pooled map per
// roi ([num_rois, C, output_height, output_width]), ScatterElements its data's dims, GatherElements its indices'.
TEST(SymbolicRules, DetectorHeadOps) {
  const DimExpr u = DimExpr::symbol("nms_0");
  const DimBindings hints{{"nms_0", 5}};
  const TensorType x{DType::kFloat32, {2, 256, 40, 40}}, rois{DType::kFloat32, {5, 4}}, idx{DType::kInt64, {5}};
  const SymbolicValue rois_sym{{u, 4}, std::nullopt}, idx_sym{{u}, std::nullopt};
  const Node roi = testing::make_node("RoiAlign", {{"output_height", int64_t{7}}, {"output_width", int64_t{7}}});
  SymbolicResult r =
      infer_symbolic(roi, {{&x, nullptr, nullptr}, {&rois, nullptr, &rois_sym}, {&idx, nullptr, &idx_sym}},
                     {{DType::kFloat32, {5, 256, 7, 7}}}, 16, hints);
  EXPECT_EQ(dims_str(r.outputs.at(0).dims), "[nms_0, 256, 7, 7]");
  const TensorType data{DType::kFloat32, {5, 4}}, upd{DType::kFloat32, {5, 1}}, ind{DType::kInt64, {5, 1}};
  const SymbolicValue col{{u, 1}, std::nullopt};
  r = infer_symbolic(testing::make_node("ScatterElements"),
                     {{&data, nullptr, &rois_sym}, {&ind, nullptr, &col}, {&upd, nullptr, &col}}, {data}, 16, hints);
  EXPECT_EQ(dims_str(r.outputs.at(0).dims), "[nms_0, 4]");
  r = infer_symbolic(testing::make_node("GatherElements"), {{&data, nullptr, &rois_sym}, {&ind, nullptr, &col}}, {ind},
                     16, hints);
  EXPECT_EQ(dims_str(r.outputs.at(0).dims), "[nms_0, 1]");
}

TEST(SymbolicPartition, TensorParallelKeepsTheSymbolsAndTheCheckCatchesAFrozenShape) {
  const Graph g = load_symbolic(llama());
  for (int n : {2, 4}) {
    SpmdProgram p = partition_llama(g, n);
    EXPECT_EQ(p.program.dim_hints, g.dim_hints);
    EXPECT_EQ(dims_of(p.program, "logits"), "[batch, seq, 128]");
    // the 2 KV heads: one per device over 2, replicated over 4
    EXPECT_EQ(dims_of(p.program, "present_key_0"),
              n == 2 ? "[batch, 1, past + seq, 16]" : "[batch, 2, past + seq, 16]");
    for (const DimBindings& at :
         {DimBindings{{"batch", 101}, {"past", 103}, {"seq", 105}}, DimBindings{{"batch", 1}, {"past", 0}, {"seq", 1}}})
      EXPECT_EQ(unsupported_message([&] { check_symbolic_program(p, g, at); }), "(no error)");
    ASSERT_FALSE(p.shape_of.empty());
    // freeze the first shape constant over the symbols at its hint values
    auto frozen = std::find_if(p.shape_of.begin(), p.shape_of.end(),
                               [&](const auto& cv) { return p.program.values[static_cast<size_t>(cv.first)].sym; });
    ASSERT_NE(frozen, p.shape_of.end());
    Value& c = p.program.values[static_cast<size_t>(frozen->first)];
    c.sym = nullptr;
    const std::string msg = unsupported_message([&] {
      check_symbolic_program(p, g, {{"batch", 101}, {"past", 103}, {"seq", 105}});
    });
    EXPECT_EQ(
        msg.rfind("node '/layers.0/self_attn/Reshape' (Reshape) fails: node '/layers.0/self_attn/Reshape' (Reshape): "
                  "cannot reshape [101,105,",
                  0),
        0u)
        << msg;
    EXPECT_NE(msg.find("with the dims at batch=101, past=103, seq=105: the program depends on the dims in a way it "
                       "does not express (a literal size): bind them with --dim"),
              std::string::npos)
        << msg;
  }
}

// Data x model: the batch is split over `data` (uneven at every size but even ones): its shards are ceil(batch / 2)
// rows, the masks and slices that drop the padding carry batch as an expression, and the device files read the
// global batch from their gspmd_dims input.
TEST(SymbolicPartition, ASplitSymbolicDimIsCeilOfItsShards) {
  const Graph g = load_symbolic(llama());
  const Annotations a = read_sharding_file(llama("dp2tp2.plan.json"), g, nullptr);
  const SpmdProgram p = partition(g, propagate(g, a), a.mesh);
  EXPECT_EQ(dims_of(p.program, "input_ids"), "[ceil(batch / 2), seq]");
  EXPECT_EQ(dims_of(p.program, "logits"), "[ceil(batch / 2), seq, 128]");
  for (const DimBindings& at :
       {DimBindings{{"batch", 101}, {"past", 103}, {"seq", 105}}, DimBindings{{"batch", 1}, {"past", 0}, {"seq", 1}}})
    EXPECT_EQ(unsupported_message([&] { check_symbolic_program(p, g, at); }), "(no error)");
  TempDir dir;
  export_device(p, g, 3, dir.file("device_3.onnx"));
  const ModelInfo info = read_model_info(dir.file("device_3.onnx"));
  ASSERT_EQ(info.inputs.size(), 6u);
  EXPECT_EQ(info.inputs.back(), "gspmd_dims");
  EXPECT_EQ(info.input_shapes.back(), (std::vector<int64_t>{3}));  // batch, past, seq
  EXPECT_EQ(info.input_dim_params[0], (std::vector<std::string>{"ceil(batch / 2)", "seq"}));
}

// The sequence split over 2 (uneven at the hints): ceil(seq / 2) rows per device, and the check passes.
TEST(SymbolicPartition, ASplitSequenceIsCheckedToo) {
  const Graph g = load_symbolic(llama());
  Annotations a = read_sharding_file(llama("tp2.plan.json"), g, nullptr);
  a.by_value.clear();
  Annotation ann;
  ann.sharding = TensorSharding::replicated(2);
  ann.sharding.dims[1] = {0};  // input_ids' seq over model
  a.by_value[g.at("input_ids")] = ann;
  const SpmdProgram p = partition(g, propagate(g, a), a.mesh);
  EXPECT_EQ(dims_of(p.program, "input_ids"), "[batch, ceil(seq / 2)]");
  EXPECT_EQ(unsupported_message([&] {
              check_symbolic_program(p, g, {{"batch", 101}, {"past", 103}, {"seq", 105}});
            }),
            "(no error)");
}

// A mean over a split symbolic dim n: each device averages its ceil(n / 2) rows (the padding masked to zeros), and
// the partial means are scaled by ceil(n / 2) / n, computed from n at run time (two int64 constants over the
// symbols) instead of a literal; the check at other sizes passes, and the program run at n = 17 (the hint, uneven)
// is the unpartitioned mean.
TEST(SymbolicPartition, AMeanOverASplitSymbolicDimScalesByTheRunsSizes) {
  // over the rows, keeping them ([1, 8]), and over everything to a scalar (the scale reshaped to a scalar)
  for (const auto& [axes, keepdims, shape] :
       {std::tuple<std::vector<int64_t>, int64_t, Shape>{{0}, 1, {1, 8}}, {{0, 1}, 0, {}}}) {
    gspmd::testing::GraphBuilder b;
    const int x = b.input("x", {17, 8});
    b.g.values[static_cast<size_t>(x)].sym =
        std::make_shared<const SymbolicValue>(SymbolicValue{{DimExpr::symbol("n"), 8}, std::nullopt});
    b.g.dim_hints = {{"n", 17}};
    const int mean = b.node("ReduceMean", {x}, shape, {{"axes", axes}, {"keepdims", keepdims}});
    b.g.outputs = {b.g.nodes[static_cast<size_t>(mean)].outputs[0]};
    const Annotations a = split_over_2({x}, 0);
    const SpmdProgram p = partition(b.g, propagate(b.g, a), a.mesh);
    std::vector<std::string> counts;
    for (const Value& v : p.program.values)
      if (v.sym && v.sym->elems) counts.push_back(dims_str(*v.sym->elems));
    std::sort(counts.begin(), counts.end());
    // the split factor's counts: each device's rows and all of them (the unsplit columns divide out)
    EXPECT_EQ(counts, (std::vector<std::string>{"[ceil(n / 2)]", "[n]"})) << keepdims;
    for (int64_t n : {1, 2, 5, 30})
      EXPECT_EQ(unsupported_message([&] { check_symbolic_program(p, b.g, {{"n", n}}); }), "(no error)") << n;
    std::vector<float> data(17 * 8);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 13) - 4.0F;
    const Tensor in = Tensor::from_floats({17, 8}, data);
    const Tensor want = run_single(b.g, {in}).outputs.at(0);
    const Tensor got = run_spmd(p, b.g, {in}).outputs.at(0);
    ASSERT_EQ(got.shape, want.shape);
    for (int64_t k = 0; k < want.numel(); ++k) EXPECT_NEAR(got.data<float>()[k], want.data<float>()[k], 1e-5) << k;
  }
}

// A split dim that divides at the hints but not at every size (past + seq over 2: 23 + 19 is even) is masked as an
// uneven one: a Softmax over it masks its padding before both reductions, which the hints alone would leave out.
TEST(SymbolicPartition, ADimEvenOnlyAtTheHintsIsMasked) {
  gspmd::testing::GraphBuilder b;
  const int x = b.input("x", {4, 42});
  const DimExpr keys = DimExpr::symbol("past") + DimExpr::symbol("seq");
  b.g.values[static_cast<size_t>(x)].sym =
      std::make_shared<const SymbolicValue>(SymbolicValue{{4, keys}, std::nullopt});
  b.g.dim_hints = {{"past", 23}, {"seq", 19}};
  b.g.opset = 17;
  const int softmax = b.node("Softmax", {x}, {4, 42}, {{"axis", int64_t{1}}});
  const int y = b.g.nodes[static_cast<size_t>(softmax)].outputs[0];
  b.g.values[static_cast<size_t>(y)].sym = b.g.values[static_cast<size_t>(x)].sym;
  b.g.outputs = {y};
  const Annotations a = split_over_2({x, y}, 1);
  const SpmdProgram p = partition(b.g, propagate(b.g, a), a.mesh);
  int masks = 0;
  for (const Node& n : p.program.nodes) masks += gspmd_op(n) == GspmdOp::kMaskPad;
  EXPECT_EQ(masks, 2);  // before the max and before the sum
}

// ... and gathered whole, its padding is sliced off at every size, not only where it does not divide at the hints
// (torchvision's resnet18 split by rows over a dynamic height gathered its late layers so: the check refused it).
TEST(SymbolicPartition, ADimEvenOnlyAtTheHintsIsTrimmedWhenGathered) {
  gspmd::testing::GraphBuilder b;
  const int x = b.input("x", {42, 8});
  const DimExpr keys = DimExpr::symbol("past") + DimExpr::symbol("seq");
  b.g.values[static_cast<size_t>(x)].sym =
      std::make_shared<const SymbolicValue>(SymbolicValue{{keys, 8}, std::nullopt});
  b.g.dim_hints = {{"past", 23}, {"seq", 19}};
  const int relu = b.node("Relu", {x}, {42, 8});
  const int y = b.g.nodes[static_cast<size_t>(relu)].outputs[0];
  b.g.values[static_cast<size_t>(y)].sym = b.g.values[static_cast<size_t>(x)].sym;
  b.g.outputs = {y};
  Annotations a = split_over_2({x}, 0);
  a.by_value[y].sharding = TensorSharding::replicated(2);  // the output whole
  SpmdProgram p = partition(b.g, propagate(b.g, a), a.mesh);
  for (const DimBindings& at : {DimBindings{{"past", 2}, {"seq", 1}}, DimBindings{{"past", 50}, {"seq", 51}}})
    EXPECT_EQ(unsupported_message([&] { check_symbolic_program(p, b.g, at); }), "(no error)") << bindings_str(at);
}

// The device files keep the symbols as dim_params, and load for any dims bound from their inputs.
TEST(SymbolicPartition, DeviceFilesCarryDimParams) {
  const Graph g = load_symbolic(llama());
  const SpmdProgram p = partition_llama(g, 2);
  TempDir dir;
  export_device(p, g, 1, dir.file("device_1.onnx"));
  const ModelInfo info = read_model_info(dir.file("device_1.onnx"));
  ASSERT_EQ(info.inputs.size(), 5u);
  EXPECT_EQ(info.input_dim_params[0], (std::vector<std::string>{"batch", "seq"}));
  EXPECT_EQ(info.input_dim_params[1], (std::vector<std::string>{"batch", "", "past", ""}));
  EXPECT_EQ(info.input_shapes[1], (std::vector<int64_t>{-1, 1, -1, 16}));
  EXPECT_EQ(info.metadata.at("gspmd.dim_hints"), "batch=17,past=23,seq=19");
  LoadOptions lo = load_opts();
  lo.input_shapes = {{"input_ids", {3, 2}},
                     {"past_key_0", {3, 1, 7, 16}},
                     {"past_value_0", {3, 1, 7, 16}},
                     {"past_key_1", {3, 1, 7, 16}},
                     {"past_value_1", {3, 1, 7, 16}}};
  const Graph d = load_model(dir.file("device_1.onnx"), lo);
  EXPECT_EQ(d.values[static_cast<size_t>(d.outputs[0])].shape, (Shape{3, 2, 128}));
  EXPECT_EQ(d.values[static_cast<size_t>(d.outputs[1])].shape, (Shape{3, 1, 9, 16}));
}

}  // namespace
}  // namespace gspmd::test
