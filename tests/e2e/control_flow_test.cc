// Control flow through the real CLI: an If fed by a sharded value runs replicated (the partitioner's fallback), its
// outputs equal the unpartitioned run, and explain names the reason.
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

const std::string kModel = "testdata/frontend/if_sharded.onnx";  // h = x @ w; y = If(sum(h) > 0): Relu(h) / Neg(h)
const std::string kShardings = "testdata/frontend/if_sharded.sharding.json";  // x: ["x", null] on mesh 2
const std::string kReason = "node 'branch' (If): control flow (If): its body is computed replicated";

fs::path if_inputs(const std::string& tag, float sign) {
  fs::path dir = scratch(tag);
  gspmd::Tensor x(gspmd::DType::kFloat32, {4, 6});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = sign * static_cast<float>(i % 5 + 1);
  gspmd::write_tensor_pb((dir / "input_0.pb").string(), x, "x");
  return dir;
}

TEST(ControlFlow, ShardedInputFeedingIfRunsReplicatedAndChecks) {
  for (float sign : {1.f, -1.f}) {
    SCOPED_TRACE(sign);
    const std::string tag = sign > 0 ? "control_if_pos" : "control_if_neg";
    const fs::path in = if_inputs(tag, sign);
    CmdResult r = cli("run " + kModel + " --mesh 2 --shardings " + kShardings + " --inputs " + in.string() +
                          " --check --report " + (in / "report.json").string(),
                      tag);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(kReason), std::string::npos) << r.out;
    const auto report = read_json(in / "report.json");
    EXPECT_GE(count_collectives(report, "all-gather"), 1);  // h is gathered for the If
  }
}

TEST(ControlFlow, ExplainNamesTheReplicatedFallback) {
  CmdResult r = cli("explain " + kModel + " --mesh 2 --shardings " + kShardings, "control_if_explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("warning: " + kReason + ": computed replicated on every device (all-gather of its operands)"),
            std::string::npos)
      << r.out;
}

}  // namespace
