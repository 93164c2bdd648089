// load_model's typing-and-folding pass (docs/loading.md): inference rewrites, full folding with its cap, symbolic dims
// bound by the given inputs, and what the LoadReport says.
#include <algorithm>
#include <chrono>

#include "backend/pod/pod.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using test::expect_input_error;
using test::frontend_data;
using test::load_opts;

std::vector<std::string> op_types(const Graph& g) {
  std::vector<std::string> ops;
  for (const Node& n : g.nodes) ops.push_back(n.op_type);
  return ops;
}

// IR 3 / opset 7: the Dropout's mask is untyped by ONNX and read by nothing: it is dropped, and the Dropout (not in
// training at opset 7) runs as an Identity.
TEST(LoadInference, OldOpsetDropoutMaskIsDroppedAndDropoutIsIdentity) {
  LoadReport r;
  Graph g = load_model(frontend_data("old_opset_dropout.onnx"), load_opts(), &r);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Conv", "BatchNormalization", "Identity", "Upsample"}));
  EXPECT_EQ(r.rewrites, (std::vector<std::string>{"node 'dropout' (Dropout): unused output 'mask' dropped",
                                                  "node 'dropout' (Dropout): inference (not training), an Identity"}));
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{2, 4, 8, 8}));
  EXPECT_TRUE(r.shape_disagreements.empty());
  Tensor x(DType::kFloat32, {2, 3, 4, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 7) - 3.f;
  PodRun run = run_single(g, {x});
  ASSERT_EQ(run.outputs.size(), 1u);
  EXPECT_EQ(run.outputs[0].shape, (Shape{2, 4, 8, 8}));
}

// ViT's class-token chain (ConstantOfShape -> Mul -> Equal -> Where -> Expand) folds away once batch is bound: only
// the Concat with the patches is left.
TEST(LoadInference, ClassTokenChainFoldsToOneConcat) {
  LoadReport r;
  Graph g = load_model(frontend_data("class_token.onnx"), load_opts({{"batch", 2}}), &r);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Concat"}));
  EXPECT_EQ(r.folded.size(), 9u);
  const Node& concat = g.nodes[0];
  const Value& cls = g.values[concat.inputs[0]];
  ASSERT_TRUE(cls.data);
  EXPECT_EQ(cls.shape, (Shape{2, 1, 8}));
  EXPECT_EQ(cls.data->data<float>()[8 + 3], 3.f);  // row 1 is the class token again
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{2, 5, 8}));
  auto expand = std::find_if(r.folded.begin(), r.folded.end(), [](const auto& f) { return f.op_type == "Expand"; });
  ASSERT_NE(expand, r.folded.end());
  EXPECT_EQ(expand->node, "expand");
  EXPECT_EQ(expand->outputs, (std::vector<std::string>{"cls_b"}));
  EXPECT_EQ(expand->bytes, 2 * 8 * 4);
}

// A constant node whose outputs would exceed the folding cap (and its inputs) stays a node, and the report says so.
TEST(LoadInference, FoldingCapKeepsBigConstantANode) {
  LoadReport r;
  Graph g = load_model(frontend_data("big_constant.onnx"), load_opts(), &r);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"ConstantOfShape", "ReduceSum", "Add"}));
  EXPECT_EQ(r.not_folded, (std::vector<std::string>{"node 'fill' (ConstantOfShape): 128.0 MiB of outputs from 0.0 MiB "
                                                    "of constants, over the 64.0 MiB folding cap: it runs as a node"}));
  EXPECT_EQ(g.values[g.at("big")].shape, (Shape{4096, 4096, 2}));
}

// A Loop on constants whose body would write more than the cap over its iterations (2^20 times 16 MiB: an hour of
// folding, found by the model fuzzer) stays a node, typed by its shape function; loading takes no time.
TEST(LoadInference, FoldingCapKeepsAHeavyLoopANode) {
  LoadReport r;
  const auto t0 = std::chrono::steady_clock::now();
  Graph g = load_model(frontend_data("heavy_loop.onnx"), load_opts(), &r);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"Loop", "Add"}));
  EXPECT_EQ(r.not_folded, (std::vector<std::string>{"node 'loop' (Loop): its body writes 16777728.0 MiB over its "
                                                    "iterations, over the 256.0 MiB folding cap: it runs as a node"}));
  EXPECT_EQ(g.values[g.at("v_final")].shape, Shape{});
}

// The given input tensors bind symbolic dims; --dim must agree with them.
TEST(LoadInference, InputShapesBindSymbolicDims) {
  const std::string p = frontend_data("mlp.onnx");
  LoadOptions lo = load_opts();
  lo.input_shapes["x"] = {3, 8};
  Graph g = load_model(p, lo);
  EXPECT_EQ(g.values[g.at("h")].shape, (Shape{3, 16}));
  lo.dims["batch"] = 3;  // agrees
  EXPECT_EQ(load_model(p, lo).values[g.at("y")].shape, (Shape{3, 8}));
  lo.dims["batch"] = 4;
  expect_input_error([&] { load_model(p, lo); }, p + ": --dim batch=4 but the given input 'x' has 3 at dim 0");
  lo.dims.clear();
  lo.input_shapes["x"] = {3};
  expect_input_error([&] { load_model(p, lo); }, p + ": input 'x' has rank 2 but the given input tensor has shape [3]");
}

}  // namespace
}  // namespace gspmd

namespace gspmd {
namespace {

// A shape function that disagrees with ONNX inference (here a deliberately wrong one for Relu): an error with
// strict_shapes; otherwise the shape function's answer is used and the report lists the disagreement.
TEST(LoadInference, ShapeFunctionDisagreeingWithOnnxIsCaught) {
  const std::string p = frontend_data("mlp.onnx");
  LoadOptions lo = load_opts({{"batch", 2}});
  const ShapeFunction real = lo.shape_function;
  lo.shape_function = [real](const Node& n, const std::vector<const TensorType*>& t,
                             const std::vector<const Tensor*>& v, int64_t opset) {
    std::vector<TensorType> r = real(n, t, v, opset);
    if (n.op_type == "Relu") r[0].shape.back() += 1;
    return r;
  };
  expect_input_error([&] { load_model(p, lo); },
                     p + ": value 'h_relu' (node 'relu' (Relu)): shape function float32[2,17], ONNX inference "
                         "float32[2,16]");
  // Not strict, the disagreement is listed; the next MatMul's shape function then rejects [2,17] x [16,8], which
  // ONNX typed: that node breaks its spec, and is refused (its kernel would fail at run time).
  lo.strict_shapes = false;
  LoadReport r;
  expect_input_error([&] { load_model(p, lo, &r); },
                     p + ": node 'fc_out' (MatMul): shapes [2,17] and [16,8] are not aligned for matmul");
  ASSERT_EQ(r.shape_disagreements.size(), 1u);
  EXPECT_EQ(r.shape_disagreements[0],
            "value 'h_relu' (node 'relu' (Relu)): shape function float32[2,17], ONNX inference float32[2,16]");
}

}  // namespace
}  // namespace gspmd

namespace gspmd {
namespace {

// Nodes written out of topological order (some exporters do; ONNX Runtime accepts it) are sorted at load.
TEST(LoadInference, UnsortedNodesAreSorted) {
  Graph g = load_model(frontend_data("unsorted_mlp.onnx"), load_opts({{"batch", 2}}));
  EXPECT_EQ(op_types(g), (std::vector<std::string>{"MatMul", "Relu", "MatMul"}));
  EXPECT_EQ(g.nodes[0].name, "fc_in");
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{2, 8}));
  Tensor x(DType::kFloat32, {2, 8});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 3) - 1.f;
  const Graph sorted = load_model(frontend_data("mlp.onnx"), load_opts({{"batch", 2}}));
  EXPECT_EQ(run_single(g, {x}).outputs[0].bytes, run_single(sorted, {x}).outputs[0].bytes);
}

}  // namespace
}  // namespace gspmd
