// backend/pod executor speed paths (docs/executor.md): matmul epilogue fusion (bias, GELU, residual, batched with
// broadcast operands) against a plain C++ reference and against the unfused run, accounting unchanged by fusion,
// one oneDNN primitive per shape whatever the number of devices, concurrent devices, in-place kernels on donated
// inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "backend/kernels/kernels.h"
#include "backend/kernels/onednn.h"
#include "backend/pod/pod.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::compare_tensors;
using testing::GraphBuilder;
using testing::rand_f;
using testing::V;

/// ExecutorOptions with fusion off / stacking off / `k` concurrent devices (the other settings at their defaults).
ExecutorOptions no_fusion() {
  ExecutorOptions o;
  o.fuse = false;
  return o;
}
ExecutorOptions threads(int k, bool stack = true) {
  ExecutorOptions o;
  o.device_threads = k;
  o.stack = stack;
  return o;
}

int out(const GraphBuilder& b, int node) { return b.g.nodes[static_cast<size_t>(node)].outputs[0]; }

/// Transformer MLP block: y = x + (gelu(x W1 + b1) W2 + b2), GELU written as ONNX exports it
/// (0.5 x (1 + erf(x / sqrt2))). x [B, S, D], W1 [D, F], W2 [F, D].
struct MlpBlock {
  GraphBuilder b;
  Tensor x, w1, b1, w2, b2;
  int64_t B = 2, S = 8, D = 16, F = 64;

  explicit MlpBlock(bool form_b = false) {
    x = rand_f({B, S, D}, 1);
    w1 = rand_f({D, F}, 2, -.3f, .3f);
    b1 = rand_f({F}, 3);
    w2 = rand_f({F, D}, 4, -.3f, .3f);
    b2 = rand_f({D}, 5);
    const int xi = b.input("x", {B, S, D});
    const int w1i = b.constant("w1", w1), b1i = b.constant("b1", b1), w2i = b.constant("w2", w2),
              b2i = b.constant("b2", b2);
    const int half = b.constant("half", Tensor::from_floats({}, {.5f}));
    const int sqrt2 = b.constant("sqrt2", Tensor::from_floats({}, {std::sqrt(2.f)}));
    const int one = b.constant("one", Tensor::from_floats({}, {1.f}));
    const Shape h{B, S, F}, o{B, S, D};
    const int mm1 = out(b, b.node("MatMul", {xi, w1i}, h));
    const int a1 = out(b, b.node("Add", {mm1, b1i}, h));
    int g;
    if (!form_b) {  // 0.5 x first, then (1 + erf) and the product
      const int hx = out(b, b.node("Mul", {a1, half}, h));
      const int dv = out(b, b.node("Div", {a1, sqrt2}, h));
      const int er = out(b, b.node("Erf", {dv}, h));
      const int p1 = out(b, b.node("Add", {er, one}, h));
      g = out(b, b.node("Mul", {hx, p1}, h));
    } else {  // torch's order: x * (erf(x / sqrt2) + 1) * 0.5
      const int dv = out(b, b.node("Div", {a1, sqrt2}, h));
      const int er = out(b, b.node("Erf", {dv}, h));
      const int p1 = out(b, b.node("Add", {one, er}, h));
      const int xp = out(b, b.node("Mul", {a1, p1}, h));
      g = out(b, b.node("Mul", {xp, half}, h));
    }
    const int mm2 = out(b, b.node("MatMul", {g, w2i}, o));
    const int a2 = out(b, b.node("Add", {mm2, b2i}, o));
    const int y = out(b, b.node("Add", {xi, a2}, o));
    b.g.outputs = {y};
  }

  /// Plain double-precision reference.
  Tensor reference() const {
    Tensor y(DType::kFloat32, {B, S, D});
    std::vector<double> hid(static_cast<size_t>(F));
    for (int64_t r = 0; r < B * S; ++r) {
      const float* xr = x.data<float>() + r * D;
      for (int64_t f = 0; f < F; ++f) {
        double acc = b1.data<float>()[f];
        for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(xr[d]) * w1.data<float>()[d * F + f];
        hid[static_cast<size_t>(f)] = 0.5 * acc * (1.0 + std::erf(acc / std::sqrt(2.0)));
      }
      for (int64_t d = 0; d < D; ++d) {
        double acc = b2.data<float>()[d];
        for (int64_t f = 0; f < F; ++f) acc += hid[static_cast<size_t>(f)] * w2.data<float>()[f * D + d];
        y.data<float>()[r * D + d] = static_cast<float>(xr[d] + acc);
      }
    }
    return y;
  }
};

const OpProfile* find_profile(const PodRun& r, const std::string& op) {
  for (const OpProfile& p : r.profile)
    if (p.op == op) return &p;
  return nullptr;
}

TEST(ExecutorFusion, MlpBlockFusesBiasGeluAndResidual) {
  for (bool form_b : {false, true}) {
    MlpBlock m(form_b);
    PodRun fused = run_single(m.b.g, {m.x});
    EXPECT_EQ(compare_tensors(fused.outputs.at(0), m.reference()), "") << "form " << (form_b ? "B" : "A");
    // the two groups ran, and nothing else
    const OpProfile* g1 = find_profile(fused, "MatMul+Add+Gelu");
    const OpProfile* g2 = find_profile(fused, "MatMul+Add+Add");
    ASSERT_NE(g1, nullptr);
    ASSERT_NE(g2, nullptr);
    EXPECT_EQ(g1->nodes, 1);
    EXPECT_EQ(g2->nodes, 1);
    EXPECT_EQ(find_profile(fused, "Erf"), nullptr);
    EXPECT_EQ(find_profile(fused, "Add"), nullptr);

    PodRun plain = run_single(m.b.g, {m.x}, {}, no_fusion());
    EXPECT_EQ(compare_tensors(fused.outputs.at(0), plain.outputs.at(0)), "");
    ASSERT_NE(find_profile(plain, "Erf"), nullptr);
    // the accounting and the FLOPs follow the program, not how the host ran it
    EXPECT_EQ(fused.devices.at(0).peak_memory_bytes, plain.devices.at(0).peak_memory_bytes);
    EXPECT_EQ(fused.host_flops, plain.host_flops);
  }
}

TEST(ExecutorFusion, NotFusedWhenAnIntermediateIsReadElsewhere) {
  MlpBlock m;
  // make the first bias Add's result a second graph output: the GELU chain must not swallow it
  Graph g = m.b.g;
  const int a1 = g.nodes[1].outputs[0];
  g.outputs.push_back(a1);
  Tensor x = m.x;
  PodRun r = run_single(g, {x});
  ASSERT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(compare_tensors(r.outputs[0], m.reference()), "");
  EXPECT_EQ(find_profile(r, "MatMul+Add+Gelu"), nullptr);
  ASSERT_NE(find_profile(r, "MatMul+Add"), nullptr);  // the bias still fuses: its result is stored
  ASSERT_NE(find_profile(r, "Erf"), nullptr);
  PodRun plain = run_single(g, {x}, {}, no_fusion());
  EXPECT_EQ(compare_tensors(r.outputs[1], plain.outputs[1]), "");
  EXPECT_EQ(r.devices.at(0).peak_memory_bytes, plain.devices.at(0).peak_memory_bytes);
}

// Attention scores: a batched 4-D MatMul, then Div by a scalar, Sub of a [1,1,S,S] mask and Mul by a per-row
// [B,H,S,1] operand (broadcast operands on the batch, row and column dims). Whatever fuses, the result matches
// the unfused run.
class BatchedScale : public ::testing::TestWithParam<bool> {};

TEST_P(BatchedScale, BatchedMatmulWithBroadcastOperands) {
  const bool mul = GetParam();  // the scale as Mul(., 0.5) (an output scale) or Div(., 2) (a binary post-op)
  const int64_t B = 2, H = 3, S = 8, Dh = 4;
  GraphBuilder b;
  const int q = b.input("q", {B, H, S, Dh});
  const int k = b.input("k", {B, H, Dh, S});
  const int scale = b.constant("scale", Tensor::from_floats({}, {mul ? .5f : 2.f}));
  const int mask = b.constant("mask", rand_f({1, 1, S, S}, 7));
  const int rows = b.constant("rows", rand_f({B, H, S, 1}, 8));
  const Shape s{B, H, S, S};
  const int mm = out(b, b.node("MatMul", {q, k}, s));
  const int dv = out(b, b.node(mul ? "Mul" : "Div", {mm, scale}, s));
  const int sb = out(b, b.node("Sub", {dv, mask}, s));
  const int y = out(b, b.node("Mul", {rows, sb}, s));
  b.g.outputs = {y};
  const Tensor qt = rand_f({B, H, S, Dh}, 9), kt = rand_f({B, H, Dh, S}, 10);
  PodRun fused = run_single(b.g, {qt, kt});
  // reference by hand
  Tensor ref(DType::kFloat32, s);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) {
        float acc = 0;
        for (int64_t d = 0; d < Dh; ++d)
          acc += qt.data<float>()[(bh * S + i) * Dh + d] * kt.data<float>()[(bh * Dh + d) * S + j];
        const float row = b.g.values[rows].data->data<float>()[bh * S + i];
        const float mk = b.g.values[mask].data->data<float>()[i * S + j];
        ref.data<float>()[(bh * S + i) * S + j] = row * (acc / 2.f - mk);
      }
  EXPECT_EQ(compare_tensors(fused.outputs.at(0), ref), "");
  PodRun plain = run_single(b.g, {qt, kt}, {}, no_fusion());
  EXPECT_EQ(compare_tensors(fused.outputs.at(0), plain.outputs.at(0)), "");
  EXPECT_EQ(fused.devices.at(0).peak_memory_bytes, plain.devices.at(0).peak_memory_bytes);
}

INSTANTIATE_TEST_SUITE_P(ExecutorFusion, BatchedScale, ::testing::Bool());

TEST(ExecutorFusion, FusedMatmulKernelMatchesSeparateOps) {
  // dnn::matmul_fused directly: bias [1,1,N], residual [batch,M,N], then GELU, on a folded 2-D product
  const int64_t batch = 3, M = 5, K = 7, N = 6;
  const Tensor a = rand_f({batch, M, K}, 11), w = rand_f({K, N}, 12), bias = rand_f({N}, 13),
               res = rand_f({batch, M, N}, 14);
  std::vector<dnn::PostOp> post{{dnn::PostOp::Kind::kBinary, dnn::Binary::kAdd, {1, 1, N}},
                                {dnn::PostOp::Kind::kBinary, dnn::Binary::kAdd, {batch, M, N}},
                                {dnn::PostOp::Kind::kGeluErf, dnn::Binary::kAdd, {}}};
  Tensor c(DType::kFloat32, {batch, M, N});
  ASSERT_TRUE(dnn::matmul_fused(a.data<float>(), w.data<float>(), c.data<float>(), batch, 1, M, K, N, post,
                                {bias.data<float>(), res.data<float>(), nullptr}));
  for (int64_t r = 0; r < batch * M; ++r)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < K; ++p)
        acc += static_cast<double>(a.data<float>()[r * K + p]) * w.data<float>()[p * N + j];
      acc += bias.data<float>()[j] + res.data<float>()[r * N + j];
      const double want = 0.5 * acc * (1.0 + std::erf(acc / std::sqrt(2.0)));
      EXPECT_NEAR(c.data<float>()[r * N + j], want, 1e-5 + 1e-4 * std::fabs(want)) << r << "," << j;
    }
}

/// A replicated MLP block as an SPMD program on `mesh`: every device runs the whole block.
SpmdProgram replicated_program(const Graph& g, const DeviceMesh& mesh) {
  SpmdProgram p;
  p.mesh = mesh;
  p.program = g;
  for (int v : g.inputs)
    p.inputs.push_back(ProgramBinding{v, v, TensorSharding::replicated(static_cast<int>(g.values[v].shape.size()))});
  for (int v : g.outputs)
    p.outputs.push_back(ProgramBinding{v, v, TensorSharding::replicated(static_cast<int>(g.values[v].shape.size()))});
  return p;
}

TEST(ExecutorPrimitives, OnePrimitivePerShapeWhateverTheDeviceCount) {
  // The MLP block on one device, then on 16: the second run finds every primitive in the cache. Devices run one
  // after another here, so both runs use the same thread count (part of a primitive's key), and do not stack.
  const ExecutorOptions seq = threads(1, /*stack=*/false);
  MlpBlock a;
  const int64_t before1 = dnn::primitives_created();
  PodRun r1 = run_spmd(replicated_program(a.b.g, testing::mesh_of({1})), a.b.g, {a.x}, {}, seq);
  const int64_t created1 = dnn::primitives_created() - before1;
  // the same shapes again on 16 devices: everything is cached already
  const int64_t before16 = dnn::primitives_created();
  PodRun r16 = run_spmd(replicated_program(a.b.g, testing::mesh_of({4, 4})), a.b.g, {a.x}, {}, seq);
  EXPECT_EQ(dnn::primitives_created() - before16, 0);
  EXPECT_EQ(compare_tensors(r16.outputs.at(0), r1.outputs.at(0)), "");
  EXPECT_GE(created1, 0);  // 0 when an earlier test created them
  // and a fresh shape on 16 devices creates what one device would: one per distinct primitive, not per device
  GraphBuilder b;
  const int x = b.input("x", {3, 40});
  const int w = b.constant("w", rand_f({40, 24}, 21));
  const int bias = b.constant("b", rand_f({24}, 22));
  const int mm = out(b, b.node("MatMul", {x, w}, {3, 24}));
  b.g.outputs = {out(b, b.node("Add", {mm, bias}, {3, 24}))};
  const int64_t before = dnn::primitives_created();
  PodRun rf = run_spmd(replicated_program(b.g, testing::mesh_of({4, 4})), b.g, {rand_f({3, 40}, 23)}, {}, seq);
  EXPECT_EQ(dnn::primitives_created() - before, 1);  // the fused MatMul+Add, once for 16 devices
  ASSERT_NE(find_profile(rf, "MatMul+Add"), nullptr);
}

TEST(ExecutorStacking, DevicesSharingWeightsRunOneProduct) {
  // 8 devices, all holding the same weights (replicated): each MatMul group runs once over the 8 stacked inputs
  MlpBlock m;
  const DeviceMesh mesh = testing::mesh_of({2, 4});
  const int64_t before = dnn::primitives_created();
  PodRun st = run_spmd(replicated_program(m.b.g, mesh), m.b.g, {m.x}, {}, threads(1));
  const int64_t created = dnn::primitives_created() - before;
  EXPECT_EQ(compare_tensors(st.outputs.at(0), m.reference()), "");
  // at most: planning checks each post-op prefix once (Add, Add+Gelu; Add, Add+Add: 4) plus one stacked product per
  // group (2); nothing per device (8 devices x 2 groups would be 16)
  EXPECT_LE(created, 6);
  PodRun one = run_spmd(replicated_program(m.b.g, mesh), m.b.g, {m.x}, {}, threads(1, /*stack=*/false));
  EXPECT_EQ(compare_tensors(st.outputs.at(0), one.outputs.at(0)), "");
  for (size_t d = 0; d < 8; ++d) EXPECT_EQ(st.devices[d].peak_memory_bytes, one.devices[d].peak_memory_bytes);
}

TEST(ExecutorThreads, ConcurrentDevicesGiveTheSameResults) {
  MlpBlock m;
  const DeviceMesh mesh = testing::mesh_of({2, 4});
  ExecutorOptions nostack;  // every device runs its own products
  nostack.stack = false;
  PodRun seq = run_spmd(replicated_program(m.b.g, mesh), m.b.g, {m.x}, {}, nostack);
  PodRun con = run_spmd(replicated_program(m.b.g, mesh), m.b.g, {m.x}, {}, threads(3, /*stack=*/false));
  EXPECT_EQ(con.outputs.at(0).bytes, seq.outputs.at(0).bytes);  // bitwise: the same primitives on every device
  ASSERT_EQ(con.devices.size(), 8u);
  for (size_t d = 0; d < 8; ++d) EXPECT_EQ(con.devices[d].peak_memory_bytes, seq.devices[d].peak_memory_bytes);
}

TEST(ExecutorThreads, ErrorOfTheLowestDeviceWins) {
  // Reshape to an impossible shape fails on every device; with concurrent devices the message still names device 0
  GraphBuilder b;
  const int x = b.input("x", {4, 6});
  const int shape = b.ints("shape", {5, 5});
  b.g.outputs = {out(b, b.node("Reshape", {x, shape}, {5, 5}))};
  try {
    run_spmd(replicated_program(b.g, testing::mesh_of({8})), b.g, {rand_f({4, 6}, 1)}, {}, threads(4));
    FAIL() << "expected an error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("on device 0"), std::string::npos) << e.what();
  }
}

TEST(ExecutorInPlace, DonatedInputsAreReused) {
  const Tensor a0 = rand_f({64, 80}, 31), b0 = rand_f({80}, 32);
  // Add (oneDNN path, >= 4096 elements) into the donated first operand
  Tensor a = a0;
  const std::byte* buf = a.bytes.data();
  Node add = testing::make_node("Add");
  std::vector<Tensor> y = run_kernel(add, {&a, &b0}, 17, {&a, nullptr});
  EXPECT_EQ(y.at(0).bytes.data(), buf);
  Tensor want = run_kernel(add, {&a0, &b0}, 17).at(0);
  EXPECT_EQ(y[0].bytes, want.bytes);
  // commutative op into the donated second operand (it has the result's shape, the first broadcasts)
  Tensor c = a0;
  const std::byte* cbuf = c.bytes.data();
  y = run_kernel(testing::make_node("Mul"), {&b0, &c}, 17, {nullptr, &c});
  EXPECT_EQ(y.at(0).bytes.data(), cbuf);
  EXPECT_EQ(y[0].bytes, run_kernel(testing::make_node("Mul"), {&b0, &a0}, 17).at(0).bytes);
  // unary loop (Erf) and Softmax in place
  for (const char* op : {"Erf", "Softmax", "Identity"}) {
    Tensor e = a0;
    const std::byte* ebuf = e.bytes.data();
    y = run_kernel(testing::make_node(op), {&e}, 17, {&e});
    EXPECT_EQ(y.at(0).bytes.data(), ebuf) << op;
    EXPECT_EQ(y[0].bytes, run_kernel(testing::make_node(op), {&a0}, 17).at(0).bytes) << op;
  }
  // Reshape is a view of the donated buffer
  Tensor r = a0;
  const std::byte* rbuf = r.bytes.data();
  const Tensor shape = Tensor::from_int64s({80, 64});
  y = run_kernel(testing::make_node("Reshape"), {&r, &shape}, 17, {&r, nullptr});
  EXPECT_EQ(y.at(0).bytes.data(), rbuf);
  EXPECT_EQ(y[0].shape, (Shape{80, 64}));
  // without donation the input is untouched
  Tensor k = a0;
  y = run_kernel(testing::make_node("Erf"), {&k}, 17);
  EXPECT_EQ(k.bytes, a0.bytes);
  EXPECT_NE(y.at(0).bytes.data(), k.bytes.data());
}

}  // namespace
}  // namespace gspmd
