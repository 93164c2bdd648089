// Sequences and optionals (docs/sequences.md): what the loader lowers them to, the unrolled Loop and SequenceMap,
// sequence graph inputs and outputs (flattened), the errors, and single / sharded runs against hand-computed values.
#include <algorithm>

#include "backend/pod/pod.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using test::frontend_data;
using test::load_opts;

int count_op(const Graph& g, const std::string& op) {
  return static_cast<int>(
      std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op_type == op; }));
}

bool has_structured_op(const Graph& g) {
  for (const Node& n : g.nodes)
    if (n.op_type.find("Sequence") != std::string::npos || n.op_type.rfind("Optional", 0) == 0 || n.op_type == "Loop")
      return true;
  return false;
}

std::vector<float> floats(const Tensor& t) { return {t.data<float>(), t.data<float>() + t.numel()}; }

std::vector<float> iota(int64_t n, float from = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = from + static_cast<float>(i);
  return v;
}

// The model's outputs on one device and sharded over a mesh of 2 (first graph input split along dim 0).
std::pair<std::vector<Tensor>, std::vector<Tensor>> run_both(const Graph& g, const std::vector<Tensor>& inputs) {
  Annotations ann;
  ann.mesh = DeviceMesh{{2}, {"x"}};
  TensorSharding s = TensorSharding::replicated(static_cast<int>(g.values[g.inputs[0]].shape.size()));
  s.dims[0].push_back(0);
  ann.by_value[g.inputs[0]].sharding = s;
  const SpmdProgram p = partition(g, propagate(g, ann), ann.mesh);
  return {run_single(g, inputs).outputs, run_spmd(p, g, inputs).outputs};
}

TEST(Sequences, SplitInsertConcatAtLength) {
  LoadReport rep;
  Graph g = load_model(frontend_data("seq_split_concat.onnx"), load_opts(), &rep);
  EXPECT_FALSE(has_structured_op(g));
  EXPECT_EQ(count_op(g, "Slice"), 3);   // SplitToSequence: one per piece
  EXPECT_EQ(count_op(g, "Gather"), 1);  // SequenceAt at a run-time position
  ASSERT_EQ(g.outputs.size(), 3u);
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{4, 4, 2}));
  EXPECT_EQ(g.values[g.outputs[1]].shape, (Shape{4, 2}));
  const Value& n = g.values[g.outputs[2]];  // SequenceLength: a constant
  ASSERT_TRUE(n.is_initializer && n.data);
  EXPECT_EQ(n.data->as_int64s(), (std::vector<int64_t>{4}));

  const std::vector<float> x = iota(24), y = iota(8, 100);
  // seq = [y, x[:, 0:2], x[:, 2:4], x[:, 4:6]]
  auto element = [&](int64_t j, int64_t r, int64_t c) { return j == 0 ? y[r * 2 + c] : x[r * 6 + (j - 1) * 2 + c]; };
  for (int64_t k : {2, -1}) {
    const int64_t j = k < 0 ? k + 4 : k;
    const auto [single, sharded] =
        run_both(g, {Tensor::from_floats({4, 6}, x), Tensor::from_floats({4, 2}, y), Tensor::from_int64s({k}, true)});
    std::vector<float> stacked, picked;
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t e = 0; e < 4; ++e)
        for (int64_t c = 0; c < 2; ++c) stacked.push_back(element(e, r, c));
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t c = 0; c < 2; ++c) picked.push_back(element(j, r, c));
    for (const std::vector<Tensor>* out : {&single, &sharded}) {
      EXPECT_EQ(floats((*out)[0]), stacked) << "k=" << k;
      EXPECT_EQ(floats((*out)[1]), picked) << "k=" << k;
    }
  }
}

TEST(Sequences, LoopCarryingASequenceIsUnrolled) {
  LoadReport rep;
  Graph g = load_model(frontend_data("seq_loop.onnx"), load_opts(), &rep);
  EXPECT_FALSE(has_structured_op(g));
  EXPECT_NE(std::find(rep.rewrites.begin(), rep.rewrites.end(),
                      "node 'loop' (Loop): unrolled, 3 iterations (it carries sequences or optionals)"),
            rep.rewrites.end());
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{6, 3}));
  const std::vector<float> x = iota(6, 1);
  std::vector<float> want;
  for (int i = 0; i < 3; ++i)
    for (float v : x) want.push_back(v * static_cast<float>(i));
  const auto [single, sharded] = run_both(g, {Tensor::from_floats({2, 3}, x)});
  EXPECT_EQ(floats(single[0]), want);
  EXPECT_EQ(floats(sharded[0]), want);
}

TEST(Sequences, SequenceInputNeedsItsStructure) {
  const std::string path = frontend_data("seq_io.onnx");
  test::expect_input_error(
      [&] {
        load_model(path, load_opts({{"N", 4}}));
      },
      path +
          ": input 'xs' is a sequence: its structure (length, element shapes) must be known "
          "at load; give its value (--inputs DIR)");
  LoadOptions o = load_opts({{"N", 4}});
  o.structured_inputs["xs"] = OnnxValue::of(Tensor::from_floats({4}, iota(4)));
  test::expect_input_error([&] { load_model(path, o); },
                           path + ": input 'xs' is a sequence but the given value is a tensor");
}

TEST(Sequences, SequenceInputAndOutputAreFlattened) {
  LoadOptions o = load_opts({{"N", 4}});
  OnnxValue xs;
  xs.structure = {ValueKind::kSequence, true, false, DType::kFloat32};
  for (int i = 0; i < 3; ++i) xs.tensors.push_back(Tensor::from_floats({4}, iota(4, 10.f * static_cast<float>(i))));
  o.structured_inputs["xs"] = xs;
  LoadReport rep;
  const Graph g = load_model(frontend_data("seq_io.onnx"), o, &rep);
  EXPECT_FALSE(has_structured_op(g));
  std::vector<std::string> ins, outs;
  for (int v : g.inputs) ins.push_back(g.values[v].name);
  for (int v : g.outputs) outs.push_back(g.values[v].name);
  EXPECT_EQ(ins, (std::vector<std::string>{"xs[0]", "xs[1]", "xs[2]", "b"}));
  EXPECT_EQ(outs, (std::vector<std::string>{"ys[0]", "ys[1]", "ys[2]"}));
  EXPECT_EQ(count_op(g, "Add"), 3);
  EXPECT_NE(
      std::find(rep.rewrites.begin(), rep.rewrites.end(), "node 'map' (SequenceMap): body unrolled over 3 elements"),
      rep.rewrites.end());
  ASSERT_EQ(rep.inputs.size(), 2u);
  EXPECT_EQ(rep.inputs[0].name, "xs");
  EXPECT_EQ(rep.inputs[0].values.size(), 3u);
  ASSERT_EQ(rep.outputs.size(), 1u);
  EXPECT_EQ(rep.outputs[0].structure.kind, ValueKind::kSequence);

  const std::vector<Tensor> flat = flatten_inputs(g, rep, {xs, OnnxValue::of(Tensor::from_floats({4}, {1, 2, 3, 4}))});
  const std::vector<OnnxValue> ys = unflatten_outputs(g, rep, run_single(g, flat).outputs);
  ASSERT_EQ(ys.size(), 1u);
  ASSERT_EQ(ys[0].tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    std::vector<float> want = iota(4, 10.f * static_cast<float>(i));
    for (size_t k = 0; k < 4; ++k) want[k] += static_cast<float>(k + 1);
    EXPECT_EQ(floats(ys[0].tensors[i]), want);
  }
}

TEST(Sequences, PositionIntoDifferentlyTypedElementsIsDataDependent) {
  const std::string path = frontend_data("seq_at_ragged.onnx");
  test::expect_input_error(
      [&] { load_model(path, load_opts()); },
      path +
          ": value 'y' (output of node 'at' (SequenceAt)) has a data-dependent shape: the position 'k' into a "
          "sequence of differently typed tensors must be known at load (a sequence is a static list of tensors), "
          "graph input 'k', which is known only at run time; make 'k' a constant (an initializer) to bind it");
  LoadOptions o = load_opts();
  o.frozen_inputs["k"] = Tensor::from_int64s({1}, true);
  const Graph g = load_model(path, o);
  EXPECT_EQ(g.values[g.outputs[0]].shape, (Shape{3}));
  EXPECT_EQ(floats(run_single(g, {Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({3}, {3, 4, 5})}).outputs[0]),
            (std::vector<float>{3, 4, 5}));
}

}  // namespace
}  // namespace gspmd
