// core/pipeline's layer blocks (find_layer_blocks) on models no test here built to pass: the torch-exported GPT and
// BERT, and make_decoder's graphs of other depths; and the one-line refusals.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/pod/pod.h"
#include "core/pipeline/blocks.h"
#include "core/pipeline/schedule.h"
#include "core/pipeline/vectorize.h"
#include "tests/e2e/e2e_util.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using e2e::make_decoder;
using e2e::scratch;
namespace fs = std::filesystem;

std::vector<std::string> names(const Graph& g, const std::vector<int>& values) {
  std::vector<std::string> out;
  for (int v : values) out.push_back(g.values[static_cast<size_t>(v)].name);
  return out;
}

std::string g_name(const Graph& g, int node) { return g.nodes[static_cast<size_t>(node)].name; }

std::string error_of(const Graph& g, const std::string& layers = "") {
  try {
    find_layer_blocks(g, layers);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The bundled GPT (torch export, 2 layers): the embedding is the prefix, each h.<i> a block of the same nodes whose
// stream is the residual, the final LayerNorm and the head the suffix.
TEST(PipelineBlocks, TorchGptHasTwoAlikeLayers) {
  const Graph g = load_model("testdata/gpt/gpt_opset17.onnx", test::load_opts({}, false));
  const LayerBlocks b = find_layer_blocks(g);
  ASSERT_EQ(b.blocks.size(), 2u);
  EXPECT_EQ(b.blocks[0].layer, 0);
  EXPECT_EQ(b.blocks[1].layer, 1);
  EXPECT_EQ(b.blocks[0].nodes.size(), b.blocks[1].nodes.size());
  EXPECT_EQ(b.prefix.size() + 2 * b.blocks[0].nodes.size() + b.suffix.size(), g.nodes.size());
  std::vector<std::string> prefix, suffix;
  for (int k : b.prefix) prefix.push_back(g.nodes[static_cast<size_t>(k)].op_type);
  for (int k : b.suffix) suffix.push_back(g.nodes[static_cast<size_t>(k)].op_type);
  EXPECT_EQ(prefix, (std::vector<std::string>{"Gather", "Add"})) << testing::PrintToString(prefix);
  EXPECT_EQ(suffix, (std::vector<std::string>{"LayerNormalization", "MatMul"})) << testing::PrintToString(suffix);
  EXPECT_EQ(g.nodes[static_cast<size_t>(b.blocks[1].nodes.front())].name, "/h.1/ln_1/LayerNormalization");
  EXPECT_EQ(g.values[static_cast<size_t>(b.blocks[0].input)].name, "/Add_output_0");  // token + position embedding
  EXPECT_EQ(b.blocks[1].input, b.blocks[0].output);
  // Each block's 16 weights, in the order the block reads them, tied by name.
  ASSERT_EQ(b.blocks[0].weights.size(), 16u) << testing::PrintToString(names(g, b.blocks[0].weights));
  EXPECT_EQ(names(g, b.blocks[0].weights)[0], "h.0.ln_1.weight");
  EXPECT_EQ(names(g, b.blocks[1].weights)[0], "h.1.ln_1.weight");
  for (size_t w = 0; w < 16; ++w) {
    std::string n0 = names(g, b.blocks[0].weights)[w], n1 = names(g, b.blocks[1].weights)[w];
    EXPECT_EQ(n0.replace(0, 3, "h.#"), n1.replace(0, 3, "h.#"));
  }
  // Each layer reads its own folded copy of the causal mask and of the attention scale: equal constants, so no
  // side input is shared.
  EXPECT_TRUE(b.side_inputs.empty()) << testing::PrintToString(names(g, b.side_inputs));
  const Node& last = g.nodes[static_cast<size_t>(b.suffix.back())];
  EXPECT_EQ(g.values[static_cast<size_t>(last.outputs[0])].name, "logits");
}

// The torch-exported BERT encoder and make_decoder at 5 layers (a count no stage number divides evenly).
TEST(PipelineBlocks, BertAndAFiveLayerDecoder) {
  const Graph bert = load_model("testdata/bert/bert_opset17.onnx", test::load_opts({}, false));
  const LayerBlocks b = find_layer_blocks(bert);
  ASSERT_EQ(b.blocks.size(), 2u);
  EXPECT_EQ(b.blocks[0].nodes.size(), b.blocks[1].nodes.size());
  // The attention mask, computed from the input mask after the embedding's LayerNorm, is computed once before the
  // blocks (hoisted out of layer 0's nodes), and both layers read it.
  bool mask_in_prefix = false;
  for (int k : b.prefix) mask_in_prefix |= g_name(bert, k) == "/Mul";
  EXPECT_TRUE(mask_in_prefix);
  ASSERT_EQ(b.side_inputs.size(), 1u);
  EXPECT_EQ(bert.values[static_cast<size_t>(b.side_inputs[0])].name, "/Mul_output_0");

  const fs::path d = scratch("pipeline_blocks");
  const fs::path model = make_decoder(d, "d5",
                                      "--layers 5 --d-model 64 --heads 4 --vocab 128 --batch 2 --seq 8 "
                                      "--weights absent",
                                      "pipeline_blocks_make");
  const Graph g = load_model(model.string(), test::load_opts({}, false));
  const LayerBlocks five = find_layer_blocks(g);
  ASSERT_EQ(five.blocks.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(five.blocks[i].layer, static_cast<int64_t>(i));
  for (size_t i = 1; i < 5; ++i) EXPECT_EQ(five.blocks[i].input, five.blocks[i - 1].output);
  // The causal mask and the shape and scalar constants every layer reads.
  EXPECT_EQ(names(g, five.side_inputs),
            (std::vector<std::string>{"shape_bshd", "attn_scale", "attn_mask", "shape_bsa", "half", "sqrt2", "one"}));
  // --layers names the index explicitly; a regex without a capture group is refused.
  EXPECT_EQ(find_layer_blocks(g, "^h\\.(\\d+)\\.").blocks.size(), 5u);
  EXPECT_EQ(error_of(g, "^h\\."), "--layers: '^h\\.' has no capture group for the layer index");
  EXPECT_EQ(error_of(g, "(["), "--layers: '([' is not a regular expression RE2 accepts: missing ]: [");
}

// --auto's layered costing (docs/auto.md, "Scale"): a 5-layer decoder whose weights are graph inputs (variables) has
// 5 blocks when graph inputs count as weights, none when they do not; cut to its first k blocks it is the model
// make_decoder builds with k layers, with the same names, and the later layers' weight inputs are gone.
TEST(PipelineBlocks, FirstLayersOfAStepThatTakesItsWeights) {
  const fs::path d = scratch("pipeline_blocks_first");
  const std::string flags = "--heads 4 --vocab 128 --batch 2 --seq 8 --weights inputs";
  const Graph g = load_model(make_decoder(d, "v5", "--layers 5 --d-model 64 " + flags, "first_make5").string(),
                             test::load_opts({}, false));
  EXPECT_NE(error_of(g), "");
  const LayerBlocks b = find_layer_blocks(g, "", /*variables=*/true);
  ASSERT_EQ(b.blocks.size(), 5u);
  for (size_t k : {size_t{1}, size_t{2}}) {
    SCOPED_TRACE(k);
    const Graph cut = keep_first_layers(g, b, k);
    const Graph ref =
        load_model(make_decoder(d, "v" + std::to_string(k), "--layers " + std::to_string(k) + " --d-model 64 " + flags,
                                "first_make" + std::to_string(k))
                       .string(),
                   test::load_opts({}, false));
    EXPECT_EQ(cut.nodes.size(), ref.nodes.size());
    EXPECT_EQ(names(cut, cut.inputs), names(ref, ref.inputs));
    EXPECT_EQ(names(cut, cut.outputs), names(ref, ref.outputs));
    for (size_t n = 0; n < cut.nodes.size() && n < ref.nodes.size(); ++n)
      EXPECT_EQ(cut.nodes[n].op_type, ref.nodes[n].op_type);
    EXPECT_NO_THROW(cut.verify());
  }
  EXPECT_THROW(keep_first_layers(g, b, 0), std::invalid_argument);
  EXPECT_EQ(keep_first_layers(g, b, 5).nodes.size(), g.nodes.size());
}

// A step whose layer weights are graph inputs, some named by layer (l.1.b) and some not (torch's onnx::MatMul_N):
// the unnamed ones are each read by one layer alone, so they are that layer's weights, not one side input the layers
// share (two graph inputs are two tensors, however alike their types; an earlier rule took them for one and the
// stacker then failed on an internal error). --pipeline stacks both kinds into graph inputs.
TEST(PipelineBlocks, UnnamedWeightInputsAreEachLayersOwn) {
  Graph g;
  auto value = [&](const std::string& name, Shape shape) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = std::move(shape);
    return g.add_value(std::move(v));
  };
  auto node = [&](const std::string& op, std::vector<int> in, int out) {
    Node n;
    n.name = "/l" + std::to_string(g.nodes.size()) + "/" + op;
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.add_node(std::move(n));
  };
  int x = value("x", {4, 8});
  g.inputs = {x};
  for (int l = 0; l < 3; ++l) {
    const int w = value("onnx::MatMul_" + std::to_string(80 + l), {8, 8}), b = value(fmt::format("l.{}.b", l), {8});
    g.inputs.push_back(w);
    g.inputs.push_back(b);
    const int m = value(fmt::format("m{}", l), {4, 8}), a = value(fmt::format("a{}", l), {4, 8}),
              y = value(fmt::format("y{}", l), {4, 8});
    node("MatMul", {x, w}, m);
    node("Add", {m, b}, a);
    node("Add", {x, a}, y);
    x = y;
  }
  g.outputs = {x};
  ASSERT_NO_THROW(g.verify());
  EXPECT_TRUE(layer_weights_are_inputs(g));
  const LayerBlocks b = find_layer_blocks(g, "", /*variables=*/true);
  ASSERT_EQ(b.blocks.size(), 3u);
  EXPECT_TRUE(b.side_inputs.empty()) << names(g, b.side_inputs)[0];
  for (size_t k = 0; k < 3; ++k)
    EXPECT_EQ(names(g, b.blocks[k].weights),
              (std::vector<std::string>{"onnx::MatMul_" + std::to_string(80 + k), fmt::format("l.{}.b", k)}));
  // The pipelined graph takes them stacked, in place of the per-layer inputs.
  PipelineOptions o;
  o.stages = 3;
  o.microbatches = 2;
  const PipelinedGraph p = pipeline_graph(g, o, test::load_opts({}, false).shape_function);
  std::vector<std::string> inputs = names(p.graph, p.graph.inputs);
  EXPECT_EQ(inputs, (std::vector<std::string>{"x", "onnx::MatMul_80@stacked", "l.#.b"}));
  EXPECT_EQ(p.graph.values[static_cast<size_t>(p.graph.at("l.#.b"))].shape, (Shape{3, 8}));
  EXPECT_FALSE(p.graph.values[static_cast<size_t>(p.graph.at("l.#.b"))].is_initializer);
}

// Models without two alike layers are refused in one line that says why.
TEST(PipelineBlocks, RefusalsNameTheProblem) {
  // An MLP's weights carry no layer numbers that layers share: nothing to pipeline.
  const Graph mlp = load_model("testdata/frontend/mlp.onnx", test::load_opts({{"batch", 2}}, false));
  EXPECT_EQ(error_of(mlp),
            "--pipeline: the model has 0 layer blocks (layers are found by the whole numbers in the weights' names, or "
            "by --layers REGEX): nothing to pipeline");
  // The GPT with its layer 1 made different: one attribute changed.
  Graph g = load_model("testdata/gpt/gpt_opset17.onnx", test::load_opts({}, false));
  const LayerBlocks b = find_layer_blocks(g);
  for (int k : b.blocks[1].nodes) {
    Node& n = g.nodes[static_cast<size_t>(k)];
    if (n.op_type == "LayerNormalization") {
      n.attrs["epsilon"] = 1e-3f;
      break;
    }
  }
  EXPECT_EQ(error_of(g),
            "--pipeline: layer 1 differs from layer 0 at node '/h.1/ln_1/LayerNormalization' (LayerNormalization): "
            "other attributes");
}

// Two layers stacked over a stage dim (GSPMD §3.3's vectorized layer) compute, stage by stage, what the two layers
// compute in the model: the torch GPT's and BERT's layers, run on the emulator against the unpartitioned model's own
// block inputs and outputs.
TEST(PipelineBlocks, StackedLayersComputeWhatEachLayerComputes) {
  const fs::path d = scratch("pipeline_stack");
  const fs::path dec = make_decoder(d, "d4",
                                    "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 2 --seq 8 "
                                    "--weights random",
                                    "pipeline_stack_make");
  for (const std::string& path :
       std::vector<std::string>{"testdata/gpt/gpt_opset17.onnx", "testdata/bert/bert_opset17.onnx", dec.string()}) {
    SCOPED_TRACE(path);
    Graph g = load_model(path, test::load_opts());
    const LayerBlocks b = find_layer_blocks(g);
    // Two layers: the decoder's layers 1 and 3 (strided, as GPipe's slots; its shared shape constants and causal
    // mask are side inputs), the others' 0 and 1.
    const bool decoder = b.blocks.size() == 4;
    const std::vector<size_t> which = decoder ? std::vector<size_t>{1, 3} : std::vector<size_t>{0, 1};
    ASSERT_EQ(b.blocks.size(), decoder ? 4u : 2u);
    // The reference: the model itself, with its block boundaries as outputs.
    const std::vector<Tensor> inputs = e2e::small_inputs(g);
    Graph ref = g;
    ref.outputs = {b.blocks[which[0]].input, b.blocks[which[1]].input, b.blocks[which[0]].output,
                   b.blocks[which[1]].output};
    const PodRun want = run_single(ref, inputs);
    // The two layers as one stacked layer, fed both layers' inputs.
    const Graph stacked = stack_blocks(g, b, which, test::load_opts().shape_function);
    // Computed side inputs (BERT's mask) are inputs of the stacked layer; constant ones (the decoder's) are copied.
    std::vector<int> computed;
    for (int v : b.side_inputs)
      if (!g.values[static_cast<size_t>(v)].is_initializer) computed.push_back(v);
    ASSERT_EQ(stacked.inputs.size(), 1u + computed.size());
    const Tensor& x0 = want.outputs[0];
    const Tensor& x1 = want.outputs[1];
    Shape ss{2};
    ss.insert(ss.end(), x0.shape.begin(), x0.shape.end());
    Tensor state(x0.dtype, ss);
    std::memcpy(state.bytes.data(), x0.bytes.data(), x0.bytes.size());
    std::memcpy(state.bytes.data() + x0.bytes.size(), x1.bytes.data(), x1.bytes.size());
    std::vector<Tensor> stacked_inputs{state};
    const PodRun side = [&] {
      Graph s = g;
      s.outputs = computed;
      return computed.empty() ? PodRun{} : run_single(s, inputs);
    }();
    for (const Tensor& t : side.outputs) stacked_inputs.push_back(t);
    const PodRun got = run_single(stacked, stacked_inputs);
    ASSERT_EQ(got.outputs.size(), 1u);
    const Tensor& y = got.outputs[0];
    const Tensor& y0 = want.outputs[2];
    const Tensor& y1 = want.outputs[3];
    ASSERT_EQ(y.numel(), y0.numel() + y1.numel());
    double worst = 0;
    for (int64_t i = 0; i < y0.numel(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(y.data<float>()[i] - y0.data<float>()[i])));
      worst = std::max(worst, std::fabs(static_cast<double>(y.data<float>()[y0.numel() + i] - y1.data<float>()[i])));
    }
    EXPECT_LT(worst, 1e-4);
  }
}

}  // namespace
}  // namespace gspmd
