// The shape engine (core/shapes/shapes.h infer_types): every kernel has a shape function, and the functions follow the
// specs.
#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "core/shapes/shapes.h"

namespace gspmd {
namespace {

TEST(ShapeFunctions, EveryKernelHasOne) {
  std::vector<std::string> missing;
  for (const std::string& key : kernel_op_types()) {
    const auto colon = key.rfind(':');
    const std::string domain = colon == std::string::npos ? "" : key.substr(0, colon);
    const std::string op = colon == std::string::npos ? key : key.substr(colon + 1);
    if (!has_shape_function(domain, op)) missing.push_back(key);
  }
  EXPECT_TRUE(missing.empty()) << "kernels without a shape function: " << ::testing::PrintToString(missing);
}

Node make_node(const std::string& op, size_t n_in, size_t n_out = 1) {
  Node n;
  n.name = "n";
  n.op_type = op;
  for (size_t i = 0; i < n_in; ++i) n.inputs.push_back(static_cast<int>(i));
  for (size_t i = 0; i < n_out; ++i) n.outputs.push_back(static_cast<int>(n_in + i));
  return n;
}

TEST(ShapeFunctions, BroadcastAndCompare) {
  const TensorType a{DType::kFloat32, {2, 1, 4}}, b{DType::kFloat32, {3, 1}};
  EXPECT_EQ(infer_types(make_node("Add", 2), {&a, &b}, {nullptr, nullptr}, 17),
            (std::vector<TensorType>{{DType::kFloat32, {2, 3, 4}}}));
  EXPECT_EQ(infer_types(make_node("Less", 2), {&a, &b}, {nullptr, nullptr}, 17),
            (std::vector<TensorType>{{DType::kBool, {2, 3, 4}}}));
  const TensorType c{DType::kFloat32, {2, 5}};
  try {
    infer_types(make_node("Add", 2), {&a, &c}, {nullptr, nullptr}, 17);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "node 'n' (Add): shapes [2,1,4] and [2,5] cannot broadcast");
  }
}

TEST(ShapeFunctions, UnknownOpIsUnsupported) {
  const TensorType a{DType::kFloat32, {2}};
  EXPECT_THROW(infer_types(make_node("NoSuchOp", 1), {&a}, {nullptr}, 17), UnsupportedError);
}

// NonZero's output size is its kernel's result on the constant input: the evaluator computes it, and without one it is
// data-dependent even on a constant.
TEST(ShapeFunctions, KernelResultShapesNeedTheEvaluator) {
  const Tensor x = Tensor::from_int64s({0, 3, 0, 5});
  const TensorType xt{x.dtype, x.shape};
  const Node n = make_node("NonZero", 1);
  EXPECT_EQ(infer_types(n, {&xt}, {&x}, 17, &kernel_evaluator()), (std::vector<TensorType>{{DType::kInt64, {1, 2}}}));
  try {
    infer_types(n, {&xt}, {&x}, 17);
    FAIL() << "no error";
  } catch (const DataDependentError& e) {
    EXPECT_STREQ(e.what(),
                 "node 'n' (NonZero): output shape is the kernel's result on the constant inputs, and no evaluator was "
                 "given to compute it");
    EXPECT_EQ(e.input, -1);
  }
}

}  // namespace
}  // namespace gspmd
