// backend/profile: the measured "host" target (docs/cost-model.md, "The host preset").
#include <gtest/gtest.h>

#include <unistd.h>

#include "backend/profile/host_target.h"

namespace gspmd {
namespace {

TEST(HostTarget, MeasuredOnceWithPlausibleNumbers) {
  Target t = measure_host_target();
  EXPECT_EQ(t.name, "host");
  // Any x86-64 machine that runs this suite does between 1 GFLOP/s and 100 TFLOP/s of f32 matmul, and moves between
  // 100 MB/s and 10 TB/s: the measurement is a number of the right kind, not a placeholder.
  EXPECT_GT(t.peak_flops, 1e9);
  EXPECT_LT(t.peak_flops, 1e14);
  for (double bw : {t.hbm_bandwidth, t.link_bandwidth}) {
    EXPECT_GT(bw, 1e8);
    EXPECT_LT(bw, 1e13);
  }
  ASSERT_EQ(t.contraction_curve.size(), 5u);  // square matmuls of 64 .. 1024
  for (size_t i = 0; i < 5; ++i) {
    const double n = 64 << i;
    EXPECT_EQ(t.contraction_curve[i].first, 2 * n * n * n);
    if (i) EXPECT_GE(t.contraction_curve[i].second, t.contraction_curve[i - 1].second);
  }
  EXPECT_EQ(t.peak_flops, t.contraction_curve.back().second);
  EXPECT_GT(t.conv_efficiency, 0);
  EXPECT_LE(t.conv_efficiency, 1);
  EXPECT_GT(t.op_overhead, 1e-8);  // between 10 ns and 10 ms per executed node
  EXPECT_LT(t.op_overhead, 1e-2);
  EXPECT_EQ(t.hbm_bytes, static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(t.topology(), "ring");
  EXPECT_EQ(t.links_per_axis, 1);
  EXPECT_EQ(t.peak_for(DType::kFloat16), t.peak_flops);  // f16 kernels compute in f32 here
  // cached: the second call returns the same measurement
  Target again = measure_host_target();
  EXPECT_EQ(again.peak_flops, t.peak_flops);
  EXPECT_EQ(again.hbm_bandwidth, t.hbm_bandwidth);
}

}  // namespace
}  // namespace gspmd
