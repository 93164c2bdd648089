// float16 / bfloat16 through kernels without a 16-bit path: computed on float32 copies, each output rounded once to
// the type its shape function gives (run_kernel).
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"

namespace gspmd {
namespace {

Tensor half_tensor(DType t, const Shape& s, const std::vector<float>& v) {
  Tensor r(t, s);
  for (size_t i = 0; i < v.size(); ++i)
    r.data<uint16_t>()[i] = t == DType::kFloat16 ? float_to_half(v[i]) : float_to_bf16(v[i]);
  return r;
}

float at(const Tensor& t, int64_t i) {
  return t.dtype == DType::kFloat16 ? half_to_float(t.data<uint16_t>()[i]) : bf16_to_float(t.data<uint16_t>()[i]);
}

Node node(const std::string& op, int n_in, int n_out = 1) {
  Node n;
  n.name = "n";
  n.op_type = op;
  for (int i = 0; i < n_in; ++i) n.inputs.push_back(i);
  for (int i = 0; i < n_out; ++i) n.outputs.push_back(n_in + i);
  return n;
}

class HalfKernels : public ::testing::TestWithParam<DType> {};

TEST_P(HalfKernels, MatMulKeepsTheTypeAndRoundsOnce) {
  const DType t = GetParam();
  const Tensor a = half_tensor(t, {2, 3}, {1, 2, 3, 4, 5, 6}), b = half_tensor(t, {3, 1}, {0.5f, 0.25f, 0.125f});
  const std::vector<Tensor> out = run_kernel(node("MatMul", 2), {&a, &b}, 17);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype, t);
  EXPECT_EQ(out[0].shape, (Shape{2, 1}));
  EXPECT_EQ(at(out[0], 0), 1.375f);  // 0.5 + 0.5 + 0.375, exact in both types
  EXPECT_EQ(at(out[0], 1), 4.f);     // 2 + 1.25 + 0.75
  // The result rounds to nearest even at any opset (an opset-17 model's bfloat16 MatMul once truncated, as that
  // opset's own Cast does): 1 + 3 * 2^-9 is 1 + 2^-7 in bfloat16, 1 + 3 * 2^-9 in float16.
  const Tensor c = half_tensor(t, {1, 2}, {1, 1}), d = half_tensor(t, {2, 1}, {1, 0.005859375f});
  EXPECT_EQ(at(run_kernel(node("MatMul", 2), {&c, &d}, 13)[0], 0), t == DType::kBFloat16 ? 1.0078125f : 1.005859375f);
}

// A donated 16-bit input is not consumed by the first attempt (the kernel may move it before it rejects the dtype).
TEST_P(HalfKernels, DonatedInputSurvivesTheRetry) {
  const DType t = GetParam();
  Tensor x = half_tensor(t, {4}, {-1, 2, -3, 4});
  const std::vector<Tensor> out = run_kernel(node("Relu", 1), {&x}, 17, {&x});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype, t);
  EXPECT_EQ(at(out[0], 0), 0.f);
  EXPECT_EQ(at(out[0], 3), 4.f);
}

// ArgMax of a 16-bit tensor gives int64, not the input type.
TEST_P(HalfKernels, ArgMaxStaysInt64) {
  const DType t = GetParam();
  const Tensor x = half_tensor(t, {1, 3}, {0.5f, 3, -1});
  Node n = node("ArgMax", 1);
  n.attrs["axis"] = int64_t{1};
  const std::vector<Tensor> out = run_kernel(n, {&x}, 17);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].dtype, DType::kInt64);
  EXPECT_EQ(out[0].data<int64_t>()[0], 1);
}

INSTANTIATE_TEST_SUITE_P(Types, HalfKernels, ::testing::Values(DType::kFloat16, DType::kBFloat16));

}  // namespace
}  // namespace gspmd
