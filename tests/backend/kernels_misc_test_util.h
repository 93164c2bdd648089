// The index, resize and misc kernels tests' helpers (tests/backend/kernels_{index,misc}_test.cc).
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {

using testing::B;
using testing::F;
using testing::I;
using testing::make_node;
inline Tensor I1(const std::vector<int64_t>& v) { return Tensor::from_int64s(v); }
inline Tensor S(int64_t v) { return Tensor::from_int64s({v}, true); }

using testing::rand_f;

using testing::vals;
inline std::vector<int64_t> ivals(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

inline Tensor run1(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  auto o = run_kernel(n, in, opset);
  EXPECT_EQ(o.size(), 1u);
  return std::move(o.at(0));
}

inline void expect_vals(const Tensor& got, const std::vector<float>& want, double tol = 1e-5) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data<float>()[i], want[i], tol * std::max(1.0, std::abs(static_cast<double>(want[i])))) << i;
}

using testing::unravel;

// ---------------------------------------------------------------------------------------------------------------
// Reductions.

}  // namespace gspmd
