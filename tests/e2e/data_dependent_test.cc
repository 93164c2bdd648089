// Data-dependent dims through the CLI (docs/shapes.md step 6): testdata/data_dependent/model.onnx is a detector's
// post-processing in miniature (NonZero on a score threshold, NonMaxSuppression, TopK with a computed k), exported
// by torch; its three test sets keep no box, fewer than k and more than k per image. Each runs exact against
// torch's outputs unpartitioned, with the batch over 2 and with the anchors over 2, and from one partition's device
// files; the counts are never split, and the summary, explain and a sharding file that splits one say so.
#include <gtest/gtest.h>

#include <fstream>

#include "e2e_util.h"

using namespace e2e;

namespace {

const std::string kDir = "testdata/data_dependent/";
const std::string kModel = kDir + "model.onnx";

std::string set(int k) { return kDir + "test_data_set_" + std::to_string(k); }

TEST(DataDependentCli, RunsExactAtEveryCountUnderEveryPlan) {
  for (const std::string plan : {"", "dp2", "row2"}) {
    const std::string mesh = plan.empty() ? " --mesh 1" : " --mesh 2 --shardings " + kDir + plan + ".plan.json --check";
    for (int k = 0; k < 3; ++k) {
      const CmdResult r =
          cli("run " + kModel + mesh + " --inputs " + set(k) + " --expected " + set(k), "data_dependent_run");
      EXPECT_EQ(r.code, 0) << plan << " set " << k << ": " << r.err << r.out;
      EXPECT_NE(r.out.find("expected  passed against"), std::string::npos) << r.out;
      if (!plan.empty()) EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
    }
  }
}

TEST(DataDependentCli, OnePartitionServesEveryCount) {
  const fs::path d = scratch("data_dependent_cli") / "dp2";
  const std::string plan = " --mesh 2 --shardings " + kDir + "dp2.plan.json";
  CmdResult r = cli("partition " + kModel + plan + " -o " + d.string(), "data_dependent_partition");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json report = read_json(d / "report.json");
  EXPECT_EQ(report["data_dependent_dims"]["nonzero_0"],
            (nlohmann::json{{"bound", 50},
                            {"bound_from", "the op"},
                            {"counts", "the count of non-zeros of '/Greater_output_0'"},
                            {"node", "/NonZero"}}));
  EXPECT_EQ(report["data_dependent_dims"].size(), 4u);
  for (int k = 0; k < 3; ++k) {
    r = cli("run " + kModel + plan + " --program " + d.string() + " --inputs " + set(k) + " --expected " + set(k),
            "data_dependent_program");
    EXPECT_EQ(r.code, 0) << "set " << k << ": " << r.err << r.out;
    EXPECT_NE(r.out.find("expected  passed against"), std::string::npos) << r.out;
  }
}

TEST(DataDependentCli, TheCountsAreNeverSplitAndTheToolSaysWhy) {
  const std::string plan = " --mesh 2 --shardings " + kDir + "dp2.plan.json";
  CmdResult r = cli("run " + kModel + plan + " --inputs " + set(1), "data_dependent_summary");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("dims      data-dependent, known at run time and never split; sizes and times below at their "
                       "bounds: nms_1 <= 50 (the count of selected boxes of '/Unsqueeze_output_0'), nms_3 <= 50 (the "
                       "count of selected boxes of '/Unsqueeze_3_output_0'), nonzero_0 <= 50 (the count of non-zeros "
                       "of '/Greater_output_0'), nonzero_2 <= 50 (the count of non-zeros of '/Greater_1_output_0')\n"),
            std::string::npos)
      << r.out;
  r = cli("explain " + kModel + plan + " --value scores_0", "data_dependent_explain");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("scores_0 float32 [min(4, nms_1)]\n  sharding  [null]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  dim 0     min(4, nms_1) reads nms_1, the count of selected boxes of '/Unsqueeze_output_0' "
                       "(node '/NonMaxSuppression', at most 50): known only at run time, so never split\n"),
            std::string::npos)
      << r.out;
  const fs::path bad = scratch("data_dependent_cli") / "split_count.json";
  std::ofstream(bad) << R"({"mesh": {"shape": [2], "axes": ["data"]}, "tensors": {"scores_0": ["data"]}})";
  r = cli("run " + kModel + " --mesh 2 --shardings " + bad.string() + " --inputs " + set(1), "data_dependent_split");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + bad.string() +
                       ": tensors.\"scores_0\": sharding of 'scores_0': dim 0 (min(4, nms_1)) is data-dependent, known "
                       "only when node '/NonMaxSuppression' runs: it cannot be split\n");
}

// --dim NAME=V gives a data-dependent dim's bound (docs/shapes.md step 6): the summary, report.json and explain say
// where it came from, the counts it bounds follow, and a run whose count is over it, or a name that is no dim, is a
// one-line error (exit 2).
TEST(DataDependentCli, DimGivesACountsBound) {
  const fs::path rep = scratch("data_dependent_cli") / "bound.report.json";
  CmdResult r = cli("run " + kModel + " --mesh 1 --dim nonzero_0=20 --inputs " + set(1) + " --expected " + set(1) +
                        " --report " + rep.string(),
                    "data_dependent_bound");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("nonzero_0 <= 20 from --dim (the count of non-zeros of '/Greater_output_0')"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("nms_1 <= 20 (the count of selected boxes"), std::string::npos) << r.out;
  const nlohmann::json report = read_json(rep);
  EXPECT_EQ(report["data_dependent_dims"]["nonzero_0"]["bound_from"], "--dim");
  EXPECT_EQ(report["data_dependent_dims"]["nonzero_2"]["bound_from"], "the op");
  r = cli("explain " + kModel + " --mesh 1 --dim nonzero_0=20 --value /NonZero_output_0", "data_dependent_bound_why");
  EXPECT_NE(r.out.find("(node '/NonZero', at most 20, from --dim)"), std::string::npos) << r.out;
  r = cli("run " + kModel + " --mesh 1 --dim nonzero_0=1 --inputs " + set(1), "data_dependent_bound_over");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --dim nonzero_0=1: node '/NonZero' (NonZero) gives nonzero_0 = 5 on device 0\n");
  r = cli("run " + kModel + " --mesh 1 --dim nonzero_9=1 --inputs " + set(1), "data_dependent_bound_name");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + kModel +
                       ": --dim nonzero_9=1: the model's inputs have no dim named 'nonzero_9' (their dims are all "
                       "static; its data-dependent dims: nms_1, nms_3, nonzero_0, nonzero_2)\n");
}

// A Scan over a data-dependent length (testdata/frontend/scan_count: running sums of a NonZero's picks): its length
// is the NonZero count itself (bound 6), not a fresh unbounded symbol, since its body sees static values; one
// partition's device files, with the input split over 2, run exact with some, no and all entries picked.
TEST(DataDependentCli, AScanOverACountKeepsItsLength) {
  const std::string dir = "testdata/frontend/scan_count/";
  const std::string model = "testdata/frontend/scan_count.onnx --mesh 2 --shardings " + dir + "x2.plan.json";
  const fs::path d = scratch("data_dependent_scan");
  CmdResult r = cli("partition " + model + " -o " + d.string(), "data_dependent_scan_partition");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("sizes and times below at their bounds: nonzero_0 <= 6 (the count of non-zeros of "
                       "'positive')\n"),
            std::string::npos)
      << r.out;
  for (int k = 0; k < 3; ++k) {
    const std::string set = dir + "test_data_set_" + std::to_string(k);
    r = cli("run " + model + " --program " + d.string() + " --inputs " + set + " --expected " + set,
            "data_dependent_scan_run");
    EXPECT_EQ(r.code, 0) << "set " << k << ": " << r.err << r.out;
    EXPECT_NE(r.out.find("expected  passed against"), std::string::npos) << r.out;
  }
}

}  // namespace
