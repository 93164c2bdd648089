// Control flow (If, Loop, Scan; ir.h, docs/control-flow.md): loading with captured outer values, a constant-condition
// If inlined, bodies run by the interpreter kernels (nested too), and device export writing the bodies back.
#include <fstream>
#include <sstream>

#include "backend/pod/pod.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "tests/frontend/frontend_test_util.h"
#include "tests/frontend/onnx_headers.h"

namespace gspmd {
namespace {

using test::frontend_data;
using test::load_opts;

const Node* find_op(const Graph& g, const std::string& op) {
  for (const Node& n : g.nodes)
    if (n.op_type == op) return &n;
  return nullptr;
}

std::vector<float> floats(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs) { return run_single(g, inputs).outputs; }

TEST(ControlFlow, ConstantIfIsInlined) {
  LoadReport rep;
  Graph g = load_model(frontend_data("if_const.onnx"), load_opts(), &rep);
  EXPECT_EQ(find_op(g, "If"), nullptr);
  ASSERT_EQ(rep.rewrites.size(), 1u);
  EXPECT_EQ(rep.rewrites[0], "node 'choose' (If): condition is constant true, then_branch inlined");
  const Node* add = find_op(g, "Add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->name, "choose/then_body_add");
  const std::vector<Tensor> out = run(g, {Tensor::from_floats({2, 3}, {0, 1, 2, 3, 4, 5})});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(ControlFlow, ComputedIfRunsEitherBranch) {
  Graph g = load_model(frontend_data("if_computed.onnx"), load_opts());
  const Node* n = find_op(g, "If");
  ASSERT_NE(n, nullptr);
  // x, one and two are read by the branches: captured, after the condition.
  EXPECT_EQ(n->captures(), 3);
  ASSERT_EQ(n->inputs.size(), 4u);
  EXPECT_EQ(n->g("then_branch")->inputs.size(), 3u);
  EXPECT_EQ(n->g("else_branch")->inputs.size(), 3u);
  EXPECT_EQ(floats(run(g, {Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6})})[0]),
            (std::vector<float>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(floats(run(g, {Tensor::from_floats({2, 3}, {-1, -2, -3, -4, -5, -6})})[0]),
            (std::vector<float>{-2, -4, -6, -8, -10, -12}));
}

TEST(ControlFlow, LoopCapturesOuterValueAndStacksScanOutputs) {
  Graph g = load_model(frontend_data("loop_scan.onnx"), load_opts());
  const Node* n = find_op(g, "Loop");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->captures(), 1);  // step
  EXPECT_EQ(g.values[n->inputs.back()].name, "step");
  EXPECT_EQ(g.values[g.outputs[1]].shape, (Shape{4, 3}));
  const std::vector<Tensor> out = run(g, {Tensor::from_floats({3}, {1, 2, 3}), Tensor::from_floats({3}, {10, 20, 30})});
  std::vector<float> acc{1, 2, 3}, squares;
  const std::vector<float> step{10, 20, 30};
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 3; ++k) {
      acc[k] += step[k] + static_cast<float>(i);
      squares.push_back(acc[k] * acc[k]);
    }
  EXPECT_EQ(floats(out[0]), acc);
  EXPECT_EQ(out[1].shape, (Shape{4, 3}));
  EXPECT_EQ(floats(out[1]), squares);
}

// A trip count from a graph input: the scan output's length is a data-dependent dim (loop_0, the number of
// iterations, unbounded) that each run binds; frozen, it is static.
TEST(ControlFlow, TripCountFromAnInputIsDataDependentUntilFrozen) {
  const std::string path = frontend_data("loop_dynamic.onnx");
  const Graph dynamic = load_model(path, load_opts());
  const Value& squares = dynamic.values[dynamic.outputs[1]];
  ASSERT_TRUE(squares.sym);
  EXPECT_EQ(dims_str(squares.sym->dims), "[loop_0, 3]");
  EXPECT_EQ(dynamic.runtime_dims.at("loop_0").bound, -1);
  // acc = x + step + i per iteration i; squares = acc^2 per iteration
  for (int64_t m : {0, 2, 5}) {
    const std::vector<Tensor> out =
        run(dynamic, {Tensor::from_floats({3}, {0, 1, 2}), Tensor::from_floats({3}, {1, 1, 1}),
                      Tensor::from_int64s({m}, /*scalar=*/true)});
    EXPECT_EQ(out[1].shape, (Shape{m, 3})) << m;
    float acc = 0;
    for (int64_t i = 0; i < m; ++i) acc += 1.0F + static_cast<float>(i);
    EXPECT_EQ(floats(out[0])[0], acc) << m;
  }
  LoadOptions o = load_opts();
  o.frozen_inputs["M"] = Tensor::from_int64s({2}, /*scalar=*/true);
  Graph g = load_model(path, o);
  EXPECT_EQ(g.values[g.outputs[1]].shape, (Shape{2, 3}));
}

// Branches of different sizes: each output dim on which they may differ is a data-dependent dim of the If, bound by
// the larger branch (docs/shapes.md step 6), bound when the If runs.
TEST(ControlFlow, IfBranchesOfDifferentShapesGetDataDependentDims) {
  const Graph g = load_model(frontend_data("if_shapes_differ.onnx"), load_opts());
  const Value& y = g.values[g.at("y")];
  ASSERT_TRUE(y.sym);
  EXPECT_EQ(dims_str(y.sym->dims), "[if_0, if_1]");
  EXPECT_EQ(y.shape, (Shape{2, 3}));  // at the bounds
  EXPECT_EQ(g.runtime_dims.at("if_0").bound, 2);
  EXPECT_EQ(g.runtime_dims.at("if_1").bound, 3);
  EXPECT_EQ(g.runtime_dims.at("if_1").node, "branch");
  EXPECT_EQ(g.runtime_dims.at("if_1").what, "the dim 1 size of output 0 of the branch that runs (on 'positive')");
  std::vector<Tensor> out = run(g, {Tensor::from_floats({2, 3}, {0, 1, 2, 3, 4, 5})});
  EXPECT_EQ(out[0].shape, (Shape{2, 3}));
  EXPECT_EQ(floats(out[0]), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  out = run(g, {Tensor::from_floats({2, 3}, {0, -1, -2, -3, -4, -5})});
  EXPECT_EQ(out[0].shape, (Shape{1, 1}));
  EXPECT_EQ(floats(out[0]), (std::vector<float>{-15}));
}

// Without data-dependent dims (a training step) the If's output is refused in one line.
TEST(ControlFlow, IfBranchesOfDifferentShapesNeedTheConditionWithoutDataDependentDims) {
  const std::string path = frontend_data("if_shapes_differ.onnx");
  LoadOptions o = load_opts();
  o.data_dependent_dims = false;
  test::expect_input_error(
      [&] { load_model(path, o); },
      path +
          ": value 'y' (output of node 'branch' (If)) has a data-dependent shape: output types depend on which "
          "branch runs: then_branch gives (float32[2,3]), else_branch (float32[1,1]), 'positive', computed at run "
          "time from graph input 'x'; make it a constant (an initializer) to bind it");
}

// many_counts.onnx (make_models.py): a Concat of 70 data-dependent counts, past what one dim expression holds, gets
// one fresh data-dependent symbol, shared by the Concat of the same counts; the If around a NonZero in one branch
// (torchvision's batched NMS) gets another. Runs with no count, some and all, against the counts computed here.
TEST(ControlFlow, ConcatOfManyCountsAndABranchOfACount) {
  const Graph g = load_model(frontend_data("many_counts.onnx"), load_opts());
  ASSERT_EQ(g.runtime_dims.size(), 72u);
  const Graph::RuntimeDim& sum = g.runtime_dims.at("concat_70");
  EXPECT_EQ(sum.node, "concat_idx");
  EXPECT_EQ(sum.what, "the sum of the dim 1 sizes of its 70 inputs");
  EXPECT_EQ(sum.bound, 70 * 8);
  EXPECT_EQ(dims_str(g.values[g.at("idx")].sym->dims), "[1, concat_70]");
  EXPECT_EQ(dims_str(g.values[g.at("fidx")].sym->dims), "[1, concat_70]");
  EXPECT_EQ(g.runtime_dims.at("if_71").bound, 8);
  EXPECT_EQ(dims_str(g.values[g.at("keep")].sym->dims), "[if_71]");
  for (const float base : {-1.0F, 0.3F, 2.0F}) {
    std::vector<float> x(8);
    for (size_t i = 0; i < x.size(); ++i) x[i] = base + 0.1F * static_cast<float>(i) * (base > 0 && base < 1);
    std::vector<int64_t> idx, keep;
    for (int t = 0; t < 70; ++t)
      for (size_t i = 0; i < x.size(); ++i)
        if (x[i] > static_cast<float>(t / 70.0)) idx.push_back(static_cast<int64_t>(i));
    for (size_t i = 0; i < x.size() && !idx.empty(); ++i)
      if (x[i] > 0.5F) keep.push_back(static_cast<int64_t>(i));
    const std::vector<Tensor> out = run(g, {Tensor::from_floats({8}, x)});
    EXPECT_EQ(out[0].shape, (Shape{1, static_cast<int64_t>(idx.size())})) << base;
    EXPECT_EQ(out[0].as_int64s(), idx) << base;
    EXPECT_EQ(out[1].shape, out[0].shape) << base;
    EXPECT_EQ(out[2].as_int64s(), keep) << base;
  }
}

// growing_loop.onnx (make_models.py): a Loop over a data-dependent count whose carried value grows, its body untyped
// at load (torchvision's paste-masks loop): each of its output's dims is a fresh data-dependent symbol, unbounded,
// known when the Loop runs; the NonZero whose count is the trip count stays though only that count is read.
TEST(ControlFlow, LoopOverADataDependentCount) {
  const Graph g = load_model(frontend_data("growing_loop.onnx"), load_opts());
  const Value& res = g.values[g.at("res")];
  ASSERT_TRUE(res.sym);
  EXPECT_EQ(dims_str(res.sym->dims), "[loop_1, loop_2]");
  EXPECT_EQ(g.runtime_dims.at("loop_2").bound, -1);
  EXPECT_EQ(g.runtime_dims.at("loop_2").what, "a dim of output 0, which its body computes");
  EXPECT_EQ(res.shape, (Shape{1, kUnboundedDimHint}));
  ASSERT_NE(find_op(g, "NonZero"), nullptr);
  // n = 3 (x > 0); iteration i appends the positions of x > i: {0, 2, 3}, {2, 3}, {3}
  const std::vector<Tensor> out = run(g, {Tensor::from_floats({4}, {0.5F, -1, 2, 3})});
  EXPECT_EQ(out[0].shape, (Shape{1, 6}));
  EXPECT_EQ(floats(out[0]), (std::vector<float>{0, 2, 3, 2, 3, 3}));
}

TEST(ControlFlow, NestedIfInsideLoop) {
  Graph g = load_model(frontend_data("nested_if_loop.onnx"), load_opts());
  const Node* loop = find_op(g, "Loop");
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->captures(), 2);  // limit (an initializer) and step (read by the If two scopes down)
  const Node* inner = find_op(*loop->g("body"), "If");
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(inner->captures(), 2);  // acc (the Loop body's input) and step (the Loop body's captured input)
  // sum 2 <= 4: +step; sum 6 > 4: -step; sum 2: +step.
  const std::vector<Tensor> out = run(g, {Tensor::from_floats({2}, {1, 1}), Tensor::from_floats({2}, {2, 2})});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{3, 3}));
  EXPECT_EQ(floats(out[1]), (std::vector<float>{-3, -3, -1, -1, -3, -3}));
}

TEST(ControlFlow, ScanAlongAxisBackwards) {
  Graph g = load_model(frontend_data("scan_axes.onnx"), load_opts());
  EXPECT_EQ(g.values[g.outputs[1]].shape, (Shape{2, 3}));
  // Columns of x scanned from the last; the negated running sums stacked along the last axis.
  const std::vector<Tensor> out =
      run(g, {Tensor::from_floats({2}, {0, 100}), Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6})});
  EXPECT_EQ(floats(out[0]), (std::vector<float>{6, 115}));
  EXPECT_EQ(floats(out[1]), (std::vector<float>{-3, -5, -6, -106, -111, -115}));
}

TEST(ControlFlow, ExportWritesBodiesWithOuterReferences) {
  Graph g = load_model(frontend_data("nested_if_loop.onnx"), load_opts());
  Annotations ann;
  ann.mesh = DeviceMesh{{2}, {"x"}};
  const SpmdProgram p = partition(g, propagate(g, ann), ann.mesh);
  test::TempDir d;
  const std::string path = d.file("device_1.onnx");
  export_device(p, g, 1, path);
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  ASSERT_TRUE(m.ParseFromIstream(&in));
  EXPECT_NO_THROW(onnx::checker::check_model(m));
  const onnx::NodeProto* loop = nullptr;
  for (const auto& n : m.graph().node())
    if (n.op_type() == "Loop") loop = &n;
  ASSERT_NE(loop, nullptr);
  EXPECT_EQ(loop->input_size(), 3);  // M, cond, x: the captured values are outer references again
  for (const auto& a : loop->attribute()) EXPECT_NE(a.name(), "gspmd_captures");
  // The device model loads and runs like the original.
  Graph back = load_model(path, load_opts());
  const std::vector<Tensor> inputs{Tensor::from_floats({2}, {1, 1}), Tensor::from_floats({2}, {2, 2})};
  EXPECT_EQ(floats(run(back, inputs)[1]), floats(run(g, inputs)[1]));
}

}  // namespace
}  // namespace gspmd
