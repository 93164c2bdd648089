// Shape functions of the matmul, reduce_norm, conv_pool, loss, signal, rnn, spatial, misc and training kernels
// (core/shapes/<family>.cc): exact types for the tricky ops, the kernels' own results agreeing with them, and
// DataDependentError when an output size depends on an input that is not constant.
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "tests/test_util/graph_builder.h"
#include "tests/test_util/shape_infer.h"

namespace gspmd {
namespace {

using testing::agree;
using testing::error_of;
using testing::F;
using testing::I;
using testing::infer;
using testing::make_node;
using testing::rand_f;
using Types = std::vector<TensorType>;

Tensor T(DType t, Shape s) { return Tensor(t, std::move(s)); }
const DType f32 = DType::kFloat32, i64 = DType::kInt64;

TEST(ShapeFunctionsCompute, MatMulAndGemm) {
  const Tensor a = rand_f({2, 1, 3, 4}, 1), b = rand_f({5, 4, 6}, 2), v = rand_f({4}, 3);
  EXPECT_EQ(agree(make_node("MatMul"), {&a, &b}), (Types{{f32, {2, 5, 3, 6}}}));
  EXPECT_EQ(agree(make_node("MatMul"), {&v, &b}), (Types{{f32, {5, 6}}}));
  EXPECT_EQ(agree(make_node("MatMul"), {&a, &v}), (Types{{f32, {2, 1, 3}}}));
  EXPECT_EQ(error_of(make_node("MatMul"), {&b, &a}),
            "node 'n1' (MatMul): shapes [5,4,6] and [2,1,3,4] are not aligned for matmul");
  const Tensor ga = rand_f({4, 3}, 4), gb = rand_f({5, 4}, 5), gc = rand_f({5}, 6);
  EXPECT_EQ(agree(make_node("Gemm", {{"transA", int64_t{1}}, {"transB", int64_t{1}}}), {&ga, &gb, &gc}),
            (Types{{f32, {3, 5}}}));
  EXPECT_EQ(error_of(make_node("Gemm"), {&ga, &gb}),
            "node 'n1' (Gemm): shapes [4,3] and [5,4] are not aligned (transA=false, transB=false)");
}

TEST(ShapeFunctionsCompute, ReduceAxesAsInputOrAttribute) {
  const Tensor x = rand_f({2, 3, 4}, 1), axes = I({2}, {0, -1}), none = I({0}, {});
  EXPECT_EQ(agree(make_node("ReduceSum"), {&x, &axes}, 13), (Types{{f32, {1, 3, 1}}}));
  EXPECT_EQ(agree(make_node("ReduceMax", {{"keepdims", int64_t{0}}}), {&x, &axes}, 18), (Types{{f32, {3}}}));
  EXPECT_EQ(agree(make_node("ReduceMean", {{"axes", std::vector<int64_t>{1}}}), {&x}, 13), (Types{{f32, {2, 1, 4}}}));
  EXPECT_EQ(agree(make_node("ReduceL2", {{"keepdims", int64_t{0}}}), {&x}), (Types{{f32, {}}}));
  // An empty axes input needs no value; with noop_with_empty_axes it keeps the input.
  EXPECT_EQ(infer(make_node("ReduceSum", {{"noop_with_empty_axes", int64_t{1}}}), {&x, &none}, false),
            (Types{{f32, {2, 3, 4}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("ReduceSum"), {&x, &axes}, false),
            "node 'n1' (ReduceSum): output shape depends on the values of input 1 (axes)");
  EXPECT_EQ(error_of(make_node("ReduceSum"), {&x, &none}, true), "no error");
  const Tensor bad = I({1}, {3});
  EXPECT_EQ(error_of(make_node("ReduceSum"), {&x, &bad}), "node 'n1' (ReduceSum): axis 3 out of range for rank 3");
}

TEST(ShapeFunctionsCompute, ArgMaxSoftmaxLayerNorm) {
  const Tensor x = rand_f({2, 3, 4}, 1);
  EXPECT_EQ(agree(make_node("ArgMax", {{"axis", int64_t{-1}}}), {&x}), (Types{{i64, {2, 3, 1}}}));
  EXPECT_EQ(agree(make_node("ArgMin", {{"axis", int64_t{1}}, {"keepdims", int64_t{0}}}), {&x}), (Types{{i64, {2, 4}}}));
  EXPECT_EQ(agree(make_node("Softmax", {{"axis", int64_t{3}}}), {&x}, 11), (Types{{f32, {2, 3, 4}}}));
  const Tensor s = rand_f({3, 4}, 2), b = rand_f({4}, 3);
  EXPECT_EQ(agree(make_node("LayerNormalization", {{"axis", int64_t{1}}}, 3), {&x, &s, &b}),
            (Types{{f32, {2, 3, 4}}, {f32, {2, 1, 1}}, {f32, {2, 1, 1}}}));
  EXPECT_EQ(agree(make_node("LayerNormalization", {}, 2), {&x, &b}), (Types{{f32, {2, 3, 4}}, {f32, {2, 3, 1}}}));
  EXPECT_EQ(error_of(make_node("LayerNormalization"), {&x, &s}),
            "node 'n1' (LayerNormalization): input 1 of shape [3,4] does not broadcast to [4]");
}

TEST(ShapeFunctionsCompute, ConvAndPools) {
  const Tensor x = rand_f({1, 4, 7, 9}, 1), w = rand_f({6, 2, 3, 2}, 2), b = rand_f({6}, 3);
  const std::vector<int64_t> s2{2, 2};
  EXPECT_EQ(agree(make_node("Conv", {{"group", int64_t{2}}, {"strides", s2}, {"auto_pad", std::string("SAME_UPPER")}}),
                  {&x, &w, &b}),
            (Types{{f32, {1, 6, 4, 5}}}));
  EXPECT_EQ(
      agree(make_node("Conv", {{"group", int64_t{2}}, {"pads", std::vector<int64_t>{1, 0, 1, 0}}, {"dilations", s2}}),
            {&x, &w}),
      (Types{{f32, {1, 6, 5, 7}}}));
  EXPECT_EQ(error_of(make_node("Conv"), {&x, &w}),
            "node 'n1' (Conv): X of shape [1,4,7,9] and W of shape [6,2,3,2] do not match group=1");
  const Tensor wt = rand_f({4, 3, 3, 3}, 4);
  EXPECT_EQ(
      agree(make_node("ConvTranspose", {{"strides", s2}, {"output_padding", std::vector<int64_t>{1, 0}}}), {&x, &wt}),
      (Types{{f32, {1, 3, 16, 19}}}));
  EXPECT_EQ(
      agree(make_node("ConvTranspose", {{"strides", s2}, {"output_shape", std::vector<int64_t>{15, 20}}}), {&x, &wt}),
      (Types{{f32, {1, 3, 15, 20}}}));
  const std::vector<int64_t> k3{3, 3};
  EXPECT_EQ(agree(make_node("MaxPool", {{"kernel_shape", k3}, {"strides", s2}, {"ceil_mode", int64_t{1}}}, 2), {&x}),
            (Types{{f32, {1, 4, 3, 4}}, {i64, {1, 4, 3, 4}}}));
  EXPECT_EQ(agree(make_node("AveragePool", {{"kernel_shape", k3}, {"auto_pad", std::string("VALID")}}), {&x}),
            (Types{{f32, {1, 4, 5, 7}}}));
  EXPECT_EQ(agree(make_node("LpPool", {{"kernel_shape", k3}, {"dilations", s2}}), {&x}, 18),
            (Types{{f32, {1, 4, 3, 5}}}));
  EXPECT_EQ(agree(make_node("GlobalAveragePool"), {&x}), (Types{{f32, {1, 4, 1, 1}}}));
  EXPECT_EQ(error_of(make_node("MaxPool"), {&x}), "node 'n1' (MaxPool): missing attribute 'kernel_shape'");
}

TEST(ShapeFunctionsCompute, IntegerConvAndMatMul) {
  Tensor x = T(DType::kUInt8, {1, 2, 5, 5}), w = T(DType::kInt8, {3, 2, 3, 3}), zp = T(DType::kUInt8, {});
  EXPECT_EQ(agree(make_node("ConvInteger", {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}), {&x, &w, &zp}),
            (Types{{DType::kInt32, {1, 3, 5, 5}}}));
  const Tensor xs = F({}, {0.5f}), ys = F({}, {0.25f}), wz = T(DType::kInt8, {}), yz = T(DType::kInt8, {});
  EXPECT_EQ(agree(make_node("QLinearConv"), {&x, &xs, &zp, &w, &xs, &wz, &ys, &yz}),
            (Types{{DType::kInt8, {1, 3, 3, 3}}}));
  const Tensor a = T(DType::kUInt8, {2, 3, 4}), bm = T(DType::kUInt8, {4, 5});
  EXPECT_EQ(agree(make_node("MatMulInteger"), {&a, &bm}), (Types{{DType::kInt32, {2, 3, 5}}}));
  EXPECT_EQ(agree(make_node("QLinearMatMul"), {&a, &xs, &zp, &bm, &xs, &zp, &ys, &yz}),
            (Types{{DType::kInt8, {2, 3, 5}}}));
}

TEST(ShapeFunctionsCompute, Normalizations) {
  const Tensor x = rand_f({2, 3, 4}, 1), p = rand_f({3}, 2);
  Tensor var = p;
  for (int i = 0; i < 3; ++i) var.data<float>()[i] = 1.f + static_cast<float>(i);
  EXPECT_EQ(agree(make_node("BatchNormalization"), {&x, &p, &p, &p, &var}), (Types{{f32, {2, 3, 4}}}));
  EXPECT_EQ(agree(make_node("BatchNormalization", {{"training_mode", int64_t{1}}}, 3), {&x, &p, &p, &p, &var}, 15),
            (Types{{f32, {2, 3, 4}}, {f32, {3}}, {f32, {3}}}));
  // Before opset 14 training mode has five outputs (with the saved statistics); the kernel has none of them.
  EXPECT_EQ(infer(make_node("BatchNormalization", {}, 5), {&x, &p, &p, &p, &var}, true, 9),
            (Types{{f32, {2, 3, 4}}, {f32, {3}}, {f32, {3}}, {f32, {3}}, {f32, {3}}}));
  const Tensor q = rand_f({4}, 3);
  EXPECT_EQ(error_of(make_node("BatchNormalization"), {&x, &q, &p, &p, &var}),
            "node 'n1' (BatchNormalization): input 1 of shape [4] does not match 3 channels");
  EXPECT_EQ(agree(make_node("InstanceNormalization"), {&x, &p, &p}), (Types{{f32, {2, 3, 4}}}));
  EXPECT_EQ(agree(make_node("LRN", {{"size", int64_t{3}}}), {&x}), (Types{{f32, {2, 3, 4}}}));
  EXPECT_EQ(agree(make_node("MeanVarianceNormalization", {{"axes", std::vector<int64_t>{0, 2}}}), {&x}),
            (Types{{f32, {2, 3, 4}}}));
}

TEST(ShapeFunctionsCompute, Losses) {
  const Tensor x = rand_f({3, 5, 2}, 1), t = I({3, 2}, {0, 1, 2, 3, 4, 0}), w = rand_f({5}, 2);
  EXPECT_EQ(agree(make_node("NegativeLogLikelihoodLoss", {{"reduction", std::string("none")}}), {&x, &t, &w}),
            (Types{{f32, {3, 2}}}));
  EXPECT_EQ(agree(make_node("NegativeLogLikelihoodLoss"), {&x, &t}), (Types{{f32, {}}}));
  EXPECT_EQ(agree(make_node("SoftmaxCrossEntropyLoss", {}, 2), {&x, &t}), (Types{{f32, {}}, {f32, {3, 5, 2}}}));
  const Tensor bad = I({3}, {0, 1, 2});
  EXPECT_EQ(error_of(make_node("SoftmaxCrossEntropyLoss"), {&x, &bad}),
            "node 'n1' (SoftmaxCrossEntropyLoss): target shape [3] does not match input [3,5,2] (needs [3,2])");
}

TEST(ShapeFunctionsCompute, WindowsAndQuantization) {
  const Tensor n = I({}, {10});
  EXPECT_EQ(agree(make_node("HannWindow", {{"output_datatype", int64_t{11}}}), {&n}), (Types{{DType::kFloat64, {10}}}));
  EXPECT_EQ(agree(make_node("BlackmanWindow"), {&n}), (Types{{f32, {10}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("HammingWindow"), {&n}, false),
            "node 'n1' (HammingWindow): output shape depends on the values of input 0 (window size)");
  const Tensor x = rand_f({2, 3}, 1), s = F({3}, {1, 2, 3}), z = T(DType::kInt8, {3}), s1 = F({}, {0.5f});
  EXPECT_EQ(agree(make_node("QuantizeLinear", {{"axis", int64_t{1}}}), {&x, &s, &z}), (Types{{DType::kInt8, {2, 3}}}));
  EXPECT_EQ(agree(make_node("QuantizeLinear"), {&x, &s1}), (Types{{DType::kUInt8, {2, 3}}}));
  EXPECT_EQ(error_of(make_node("QuantizeLinear", {{"axis", int64_t{0}}}), {&x, &s, &z}),
            "node 'n1' (QuantizeLinear): scale has 3 elements but axis 0 of [2,3] has 2");
  EXPECT_EQ(agree(make_node("DequantizeLinear", {{"axis", int64_t{0}}}), {&z, &s, &z}), (Types{{f32, {3}}}));
  EXPECT_EQ(agree(make_node("DynamicQuantizeLinear", {}, 3), {&x}),
            (Types{{DType::kUInt8, {2, 3}}, {f32, {}}, {DType::kUInt8, {}}}));
  const Tensor m = rand_f({2, 3, 3}, 4);
  EXPECT_EQ(agree(make_node("Det"), {&m}), (Types{{f32, {2}}}));
  const Tensor img = rand_f({2, 3, 4, 5}, 5), grid = rand_f({2, 6, 7, 2}, 6);
  EXPECT_EQ(agree(make_node("GridSample"), {&img, &grid}), (Types{{f32, {2, 3, 6, 7}}}));
}

TEST(ShapeFunctionsCompute, RecurrentLayouts) {
  const Tensor x = rand_f({5, 2, 3}, 1), w = rand_f({2, 16, 3}, 2), r = rand_f({2, 16, 4}, 3);
  const AttrValue bi = std::string("bidirectional");
  // (explicit activations: the kernel's bidirectional defaults copy the list into itself)
  const AttrValue acts = std::vector<std::string>{"Sigmoid", "Tanh", "Tanh", "Sigmoid", "Tanh", "Tanh"};
  EXPECT_EQ(agree(make_node("LSTM", {{"direction", bi}, {"hidden_size", int64_t{4}}, {"activations", acts}}, 3),
                  {&x, &w, &r}),
            (Types{{f32, {5, 2, 2, 4}}, {f32, {2, 2, 4}}, {f32, {2, 2, 4}}}));
  const Tensor wg = rand_f({1, 12, 3}, 4), rg = rand_f({1, 12, 4}, 5);
  EXPECT_EQ(agree(make_node("GRU", {{"layout", int64_t{1}}}, 2), {&x, &wg, &rg}),
            (Types{{f32, {5, 2, 1, 4}}, {f32, {5, 1, 4}}}));
  EXPECT_EQ(error_of(make_node("RNN"), {&x, &wg, &rg}),
            "node 'n1' (RNN): W [1,12,3] / R [1,12,4] do not match [1, 12, 3] / [1, 12, 12]");
}

TEST(ShapeFunctionsCompute, SpectralOps) {
  const Tensor x = rand_f({2, 8, 1}, 1), len = I({}, {6});
  EXPECT_EQ(agree(make_node("DFT"), {&x}), (Types{{f32, {2, 8, 2}}}));
  EXPECT_EQ(agree(make_node("DFT", {{"onesided", int64_t{1}}}), {&x, &len}), (Types{{f32, {2, 4, 2}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("DFT"), {&x, &len}, false),
            "node 'n1' (DFT): output shape depends on the values of input 1 (dft_length)");
  const Tensor sig = rand_f({1, 32, 1}, 2), step = I({}, {5}), win = rand_f({8}, 3);
  EXPECT_EQ(agree(make_node("STFT"), {&sig, &step, &win}), (Types{{f32, {1, 5, 5, 2}}}));
  EXPECT_EQ(agree(make_node("STFT", {{"onesided", int64_t{0}}}), {&sig, &step, nullptr, &len}),
            (Types{{f32, {1, 6, 6, 2}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("STFT"), {&sig, &step, &win}, false),
            "node 'n1' (STFT): output shape depends on the values of input 1 (frame_step)");
  const Tensor mel = I({}, {8}), dft = I({}, {64}), rate = I({}, {8000}), lo = F({}, {0.f}), hi = F({}, {4000.f});
  EXPECT_EQ(agree(make_node("MelWeightMatrix"), {&mel, &dft, &rate, &lo, &hi}), (Types{{f32, {33, 8}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("MelWeightMatrix"), {&mel, &dft, &rate, &lo, &hi}, false),
            "node 'n1' (MelWeightMatrix): output shape depends on the values of input 0 (num_mel_bins)");
}

TEST(ShapeFunctionsCompute, UnpoolRoiAlignTfIdf) {
  const Tensor x = rand_f({1, 1, 2, 2}, 1), idx = I({1, 1, 2, 2}, {0, 3, 8, 15}), os = I({4}, {1, 1, 5, 5});
  const std::vector<int64_t> k2{2, 2};
  EXPECT_EQ(agree(make_node("MaxUnpool", {{"kernel_shape", k2}, {"strides", k2}}), {&x, &idx}),
            (Types{{f32, {1, 1, 4, 4}}}));
  EXPECT_EQ(agree(make_node("MaxUnpool", {{"kernel_shape", k2}, {"strides", k2}}), {&x, &idx, &os}),
            (Types{{f32, {1, 1, 5, 5}}}));
  EXPECT_EQ(error_of<DataDependentError>(make_node("MaxUnpool", {{"kernel_shape", k2}}), {&x, &idx, &os}, false),
            "node 'n1' (MaxUnpool): output shape depends on the values of input 2 (output_shape)");
  const Tensor img = rand_f({2, 3, 8, 8}, 2), rois = F({2, 4}, {0, 0, 4, 4, 1, 1, 6, 6}), bidx = I({2}, {0, 1});
  EXPECT_EQ(
      agree(make_node("RoiAlign", {{"output_height", int64_t{3}}, {"output_width", int64_t{2}}}), {&img, &rois, &bidx}),
      (Types{{f32, {2, 3, 3, 2}}}));
  const Tensor in = I({2, 4}, {1, 2, 3, 4, 2, 3, 4, 5});
  const Node tf = make_node("TfIdfVectorizer", {{"mode", std::string("TF")},
                                                {"min_gram_length", int64_t{1}},
                                                {"max_gram_length", int64_t{2}},
                                                {"max_skip_count", int64_t{0}},
                                                {"ngram_counts", std::vector<int64_t>{0, 3}},
                                                {"ngram_indexes", std::vector<int64_t>{0, 1, 2, 3, 6}},
                                                {"pool_int64s", std::vector<int64_t>{2, 3, 4, 2, 3, 3, 4}}});
  EXPECT_EQ(agree(tf, {&in}), (Types{{f32, {2, 7}}}));
}

TEST(ShapeFunctionsCompute, Optimizers) {
  const Tensor r = F({}, {0.1f}), t = I({}, {1}), x1 = rand_f({3}, 1), x2 = rand_f({2, 2}, 2);
  Node adam = make_node("Adam", {}, 6);
  adam.domain = "ai.onnx.preview.training";
  const Types want{{f32, {3}}, {f32, {2, 2}}, {f32, {3}}, {f32, {2, 2}}, {f32, {3}}, {f32, {2, 2}}};
  EXPECT_EQ(agree(adam, {&r, &t, &x1, &x2, &x1, &x2, &x1, &x2, &x1, &x2}, 1), want);
  Node ada = make_node("Adagrad", {}, 2);
  ada.domain = "ai.onnx.preview.training";
  EXPECT_EQ(agree(ada, {&r, &t, &x1, &x1, &x1}, 1), (Types{{f32, {3}}, {f32, {3}}}));
  EXPECT_EQ(error_of(ada, {&r, &t, &x1, &x2, &x1}, true, 1),
            "node 'n1' (Adagrad): input 3 (float32 [2,2]) does not match input 2 (float32 [3])");
}

}  // namespace
}  // namespace gspmd
