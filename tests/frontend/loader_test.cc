// The loader (onnx_frontend/loader.cc): folding, symbolic and data-dependent dims, external data, shapes, sequences.
#include "tests/frontend/loader_test_util.h"

namespace gspmd {
namespace {

TEST(Loader, FoldsShapeChainIntoReshapeInitializer) {
  Graph g = load_model(frontend_data("reshape_chain.onnx"), load_opts({{"batch", 3}}));
  EXPECT_EQ(g.opset, 13);
  EXPECT_EQ(count_op(g, "Shape"), 0);
  EXPECT_EQ(count_op(g, "Gather"), 0);
  EXPECT_EQ(count_op(g, "Concat"), 0);
  EXPECT_EQ(count_op(g, "Transpose"), 0);  // weight transpose folded
  ASSERT_EQ(g.nodes.size(), 2u);
  const Node& reshape = node_named(g, "reshape");
  const Value& target = g.values[reshape.inputs[1]];
  EXPECT_TRUE(target.is_initializer);
  ASSERT_TRUE(target.data);
  EXPECT_EQ(target.data->as_int64s(), (std::vector<int64_t>{3, 4, 3, 2}));
  const Node& mm = node_named(g, "matmul");
  const Value& w = g.values[mm.inputs[1]];
  EXPECT_EQ(w.name, "w");
  EXPECT_TRUE(w.is_initializer);
  ASSERT_TRUE(w.data);
  EXPECT_EQ(w.shape, (Shape{2, 5}));
  const float* wd = w.data->data<float>();
  EXPECT_EQ(wd[0], 0.f);  // w = w_t^T, w_t = arange(10).reshape(5, 2)
  EXPECT_EQ(wd[1], 2.f);
  EXPECT_EQ(wd[5], 1.f);
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.values[g.inputs[0]].shape, (Shape{3, 4, 6}));
  ASSERT_EQ(g.outputs.size(), 1u);
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{3, 4, 3, 5}));
  expect_all_static(g);
}

TEST(Loader, ShapeChainNeedsEvaluator) {
  // ONNX 1.12's data propagation does not reach this Reshape; without an evaluator and shape functions only Shape
  // folds, so the Reshape's output shape stays unknown and loading names it.
  LoadOptions o;
  o.dims = {{"batch", 2}};
  const std::string p = frontend_data("reshape_chain.onnx");
  expect_input_error([&] { load_model(p, o); },
                     p + ": value 'x4' (output of node 'reshape' (Reshape)) has no static shape: ONNX inference "
                         "left it untyped and no shape function typed Reshape");
}

TEST(Loader, UnboundSymbolicDim) {
  const std::string p = frontend_data("reshape_chain.onnx");
  expect_input_error([&] { load_model(p, load_opts()); },
                     p + ": input 'x' dim 0 'batch' is symbolic: bind it with --dim batch=N");
}

TEST(Loader, Ir3InitializersListedAsInputs) {
  Graph g = load_model(frontend_data("ir3_inputs.onnx"), load_opts());
  EXPECT_EQ(g.opset, 9);
  ASSERT_EQ(g.inputs.size(), 1u);
  EXPECT_EQ(g.values[g.inputs[0]].name, "x");
  const Value& w = g.values[g.at("w")];
  EXPECT_TRUE(w.is_initializer);
  ASSERT_TRUE(w.data);
  EXPECT_EQ(w.shape, (Shape{3, 4}));
  EXPECT_EQ(g.values[g.at("y")].shape, (Shape{2, 4}));
  expect_all_static(g);
}

TEST(Loader, ExternalDataAndConstantNode) {
  Graph g = load_model(frontend_data("external_data.onnx"), load_opts());
  const Value& w = g.values[g.at("w")];
  ASSERT_TRUE(w.data);
  EXPECT_EQ(w.shape, (Shape{8, 16}));
  EXPECT_FLOAT_EQ(w.data->data<float>()[17], 0.17f);
  EXPECT_EQ(count_op(g, "Constant"), 0);
  const Value& c = g.values[g.at("c")];
  EXPECT_TRUE(c.is_initializer);
  ASSERT_TRUE(c.data);
  EXPECT_FLOAT_EQ(c.data->data<float>()[15], 0.5f);
  expect_all_static(g);
}

TEST(Loader, ShapesOnlyStillFoldsShapeChains) {
  Graph g = load_model(frontend_data("external_chain.onnx"), load_opts({{"batch", 5}}, /*load_data=*/false));
  const Value& w = g.values[g.at("w")];
  EXPECT_TRUE(w.is_initializer);
  EXPECT_FALSE(w.data);  // 80 KiB: not read
  EXPECT_EQ(count_op(g, "Shape"), 0);
  EXPECT_EQ(count_op(g, "Slice"), 0);
  EXPECT_EQ(count_op(g, "Concat"), 0);
  EXPECT_EQ(count_op(g, "Neg"), 1);  // reads weight data: cannot fold without it
  const Node& reshape = node_named(g, "reshape");
  ASSERT_TRUE(g.values[reshape.inputs[1]].data);
  EXPECT_EQ(g.values[reshape.inputs[1]].data->as_int64s(), (std::vector<int64_t>{-1, 128}));
  EXPECT_EQ(g.values[g.at("y")].shape, (Shape{5, 128}));
  expect_all_static(g);

  Graph full = load_model(frontend_data("external_chain.onnx"), load_opts({{"batch", 5}}));
  ASSERT_TRUE(full.values[full.at("w")].data);
  EXPECT_EQ(count_op(full, "Neg"), 0);  // weight-only computation folded with data
  EXPECT_EQ(count_op(full, "ReduceSum"), 0);
  ASSERT_TRUE(full.values[full.at("col")].data);
  EXPECT_EQ(full.values[full.at("col")].shape, (Shape{128}));
  expect_all_static(full);
}

// A NonZero on a graph input: its count is a data-dependent dim symbol (docs/shapes.md step 6), typed at its bound.
TEST(Loader, DataDependentOutputGetsASymbol) {
  const Graph g = load_model(frontend_data("unknown_shape.onnx"), load_opts());
  ASSERT_EQ(g.runtime_dims.size(), 1u);
  const Graph::RuntimeDim& d = g.runtime_dims.at("nonzero_0");
  EXPECT_EQ(d.node, "nonzero");
  EXPECT_EQ(d.what, "the count of non-zeros of 'x'");
  EXPECT_EQ(d.bound, 4);
  EXPECT_EQ(g.dim_hints, (DimBindings{{"nonzero_0", 4}}));
  const Value& nz = g.values[static_cast<size_t>(g.at("nz"))];
  EXPECT_EQ(nz.shape, (Shape{1, 4}));
  ASSERT_TRUE(nz.sym);
  EXPECT_EQ(dims_str(nz.sym->dims), "[1, nonzero_0]");
  EXPECT_EQ(runtime_dims_of(g, g.at("nz")), (std::vector<char>{0, 1}));
  EXPECT_TRUE(runtime_dims_of(g, g.at("x")).empty());
}

// Range on graph inputs: its length has no bound in the input dims, so it is typed (and costed) at kUnboundedDimHint.
TEST(Loader, UnboundedDataDependentDim) {
  const std::string model = "/usr/share/libonnx-testdata/data/node/test_range_float_type_positive_delta/model.onnx";
  if (!std::filesystem::exists(model)) GTEST_SKIP() << "libonnx-testdata not installed";
  const Graph g = load_model(model, load_opts());
  ASSERT_EQ(g.runtime_dims.size(), 1u);
  EXPECT_EQ(g.runtime_dims.at("range_0").bound, -1);
  EXPECT_EQ(g.runtime_dims.at("range_0").what, "the length of 'limit'");
  EXPECT_EQ(g.dim_hints.at("range_0"), kUnboundedDimHint);
  EXPECT_EQ(g.values[static_cast<size_t>(g.outputs.at(0))].shape, (Shape{kUnboundedDimHint}));
}

// The expanded Range: a Loop whose trip count is computed from the inputs' values. Its scan output is
// [loop_0, per-iteration dims], loop_0 the number of iterations, unbounded; the test's data runs exact.
TEST(Loader, LoopWithAComputedTripCount) {
  const std::string dir = "/usr/share/libonnx-testdata/data/node/test_range_float_type_positive_delta_expanded/";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "libonnx-testdata not installed";
  const Graph g = load_model(dir + "model.onnx", load_opts());
  ASSERT_EQ(g.runtime_dims.size(), 1u);
  EXPECT_EQ(g.runtime_dims.at("loop_0").what, "the number of iterations");
  EXPECT_EQ(g.runtime_dims.at("loop_0").bound, -1);
  const Value& out = g.values[static_cast<size_t>(g.outputs.at(0))];
  ASSERT_TRUE(out.sym);
  EXPECT_EQ(dims_str(out.sym->dims), "[loop_0]");
  std::vector<Tensor> in;
  for (int k = 0; k < 3; ++k) in.push_back(read_tensor_pb(dir + "test_data_set_0/input_" + std::to_string(k) + ".pb"));
  const Tensor want = read_tensor_pb(dir + "test_data_set_0/output_0.pb");
  const Tensor got = run_single(g, in).outputs.at(0);
  EXPECT_EQ(got.shape, want.shape);
  EXPECT_EQ(got.bytes, want.bytes);
}

// Without data-dependent symbols (the training step builder, pipeline stages) such an output is refused in one line.
TEST(Loader, UnknownShapeNamesTheValue) {
  const std::string p = frontend_data("unknown_shape.onnx");
  LoadOptions lo = load_opts();
  lo.data_dependent_dims = false;
  expect_input_error([&] { load_model(p, lo); },
                     p + ": value 'nz' (output of node 'nonzero' (NonZero)) has a data-dependent shape: output "
                         "shape depends on the values of input 0 (the non-zero count), graph input 'x', which is "
                         "known only at run time; make 'x' a constant (an initializer) to bind it");
}

TEST(Loader, MlpShapes) {
  Graph g = load_model(frontend_data("mlp.onnx"), load_opts({{"batch", 4}}));
  EXPECT_EQ(g.values[g.at("h")].shape, (Shape{4, 16}));
  EXPECT_EQ(g.values[g.at("y")].shape, (Shape{4, 8}));
  EXPECT_EQ(g.nodes.size(), 3u);
  expect_all_static(g);
}

// The ONNX backend node tests (when libonnx-testdata is installed): every model with static inputs loads
// into a graph with static shapes, or fails with an InputError (never another exception).
TEST(Loader, OnnxBackendNodeTestsLoad) {
  const std::filesystem::path root = "/usr/share/libonnx-testdata/data/node";
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "libonnx-testdata not installed";
  int loaded = 0, rejected = 0;
  for (const auto& dir : std::filesystem::directory_iterator(root)) {
    const auto model = dir.path() / "model.onnx";
    if (!std::filesystem::exists(model)) continue;
    try {
      Graph g = load_model(model.string(), load_opts());
      for (const Value& v : g.values) ASSERT_NE(v.dtype, DType::kUndefined) << model << " " << v.name;
      g.verify();
      ++loaded;
    } catch (const InputError& e) {
      ++rejected;
      if (std::getenv("GSPMD_VERBOSE")) std::cout << "rejected: " << e.what() << "\n";
    } catch (const std::exception& e) {
      ADD_FAILURE() << model << ": " << e.what();
    }
  }
  EXPECT_GT(loaded, 600);
  std::cout << "[ onnx node tests ] loaded " << loaded << ", rejected " << rejected << "\n";
}

// Expects an InputError whose message contains `part`.
template <class F>
void expect_input_error_containing(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected InputError containing: " << part;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// The expanded HannWindow's output length is the value of its input `x`; freezing that input
// (LoadOptions::frozen_inputs, as the conformance runner does) makes it an initializer and the graph static.
TEST(Loader, FrozenInputMakesDataDependentShapeStatic) {
  const std::filesystem::path dir = "/usr/share/libonnx-testdata/data/node/test_hannwindow_expanded";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "libonnx-testdata not installed";
  const std::string model = (dir / "model.onnx").string();
  const ModelInfo info = read_model_info(model);
  ASSERT_EQ(info.inputs, (std::vector<std::string>{"x"}));
  ASSERT_EQ(info.input_dtypes, (std::vector<DType>{DType::kInt32}));
  EXPECT_EQ(info.op_types.size(), 26u) << "the expanded function's nodes, Constants included";
  EXPECT_EQ(info.op_types.front(), "Constant");
  LoadOptions refused = load_opts();  // without data-dependent dims (a training step's builder) it is refused
  refused.data_dependent_dims = false;
  expect_input_error_containing(
      [&] { load_model(model, refused); },
      "(output of node 'Range_8' (Range)) has a data-dependent shape: output shape depends on the values of input 1 "
      "(the limit), 'HannWindow_test_hannwindow_expanded_function_Periodic_Size_FP', computed at run time from graph "
      "input 'x'; make it a constant (an initializer) to bind it");
  LoadOptions lo = load_opts();
  lo.frozen_inputs["x"] = read_tensor_pb((dir / "test_data_set_0" / "input_0.pb").string());
  Graph g = load_model(model, lo);
  expect_all_static(g);
  EXPECT_TRUE(g.inputs.empty());
  const Tensor want = read_tensor_pb((dir / "test_data_set_0" / "output_0.pb").string());
  EXPECT_EQ(g.values[g.outputs[0]].shape, want.shape);
  LoadOptions bad = load_opts();
  bad.frozen_inputs["nope"] = Tensor::from_int64s({1});
  expect_input_error_containing([&] { load_model(model, bad); }, "frozen input 'nope' is not a graph input");
}

// A sequence model of the ONNX suite (SequenceConstruct, SequenceErase, SequenceAt at constant positions) loads into
// an Identity of the chosen input (docs/sequences.md) and computes the suite's output.
TEST(Loader, SequencesAreLowered) {
  const std::filesystem::path dir = "/usr/share/libonnx-testdata/data/simple/test_sequence_model2";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "libonnx-testdata not installed";
  const Graph g = load_model((dir / "model.onnx").string(), load_opts());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Identity");
  EXPECT_EQ(g.values[g.nodes[0].inputs[0]].name, "Z");  // [X, Y, Z], erase 1, at 1
  const Tensor z = read_tensor_pb((dir / "test_data_set_0" / "input_2.pb").string());
  EXPECT_EQ(z.bytes, read_tensor_pb((dir / "test_data_set_0" / "output_0.pb").string()).bytes);
}

}  // namespace
}  // namespace gspmd
