// run --expected DIR (docs/cli.md): the bundled GPT against its torch outputs, a corrupted reference (exit 1 with
// the exact message), bad directories (exit 2, nothing written); and progress lines of partition and --auto on a
// terminal only.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

namespace {

using namespace e2e;

const std::string kTestData = "testdata/gpt/test_data_set_0";

std::string run_args(const std::string& extra) {
  return "run " + kGpt + " --mesh 2x2 " + kMegatron + " --inputs " + kTestData + " " + extra;
}

TEST(Expected, BundledGptMatchesTorchOutputs) {
  fs::path d = scratch("expected_ok");
  CmdResult r = cli(run_args("--expected " + kTestData + " --report " + (d / "r.json").string()), "expected_ok");
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("expected  passed against " + kTestData + "\n  output_0.pb    logits "), std::string::npos)
      << r.out;
  nlohmann::json rep = read_json(d / "r.json");
  const auto& e = rep["expected"];
  EXPECT_EQ(e["dir"], kTestData);
  EXPECT_TRUE(e["passed"].get<bool>());
  EXPECT_FALSE(e.contains("worst"));
  ASSERT_EQ(e["outputs"].size(), 1u);
  EXPECT_EQ(e["outputs"][0]["name"], "logits");
  EXPECT_EQ(e["outputs"][0]["file"], kTestData + "/output_0.pb");
  EXPECT_TRUE(e["outputs"][0]["passed"].get<bool>());
  // torch and the partitioned run differ by float rounding only (about 3e-6 on logits of magnitude up to 3.8)
  EXPECT_LT(e["outputs"][0]["max_abs_error"].get<double>(), 1e-4);
  EXPECT_LT(e["outputs"][0]["max_rel_error"].get<double>(), 1e-5);
}

TEST(Expected, CorruptedReferenceFailsWithTheElement) {
  fs::path d = scratch("expected_bad");
  fs::create_directories(d / "ref");
  gspmd::Tensor ref = gspmd::read_tensor_pb(kTestData + "/output_0.pb");
  ref.data<float>()[4242] = 100.0f;
  gspmd::write_tensor_pb((d / "ref" / "output_0.pb").string(), ref, "logits");
  CmdResult r = cli(run_args("--expected " + (d / "ref").string() + " --outputs " + (d / "out").string() +
                             " --report " + (d / "r.json").string()),
                    "expected_bad");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err, "");
  // The run's own value of that element, as --outputs wrote it.
  const float got = gspmd::read_tensor_pb((d / "out" / "output_0.pb").string()).data<float>()[4242];
  const std::string worst = fmt::format("output 'logits' element 4242: {} vs expected 100", static_cast<double>(got));
  EXPECT_NE(r.out.find("expected  FAILED against " + (d / "ref").string() + ": " + worst + "\n"), std::string::npos)
      << r.out;
  nlohmann::json rep = read_json(d / "r.json");
  EXPECT_FALSE(rep["expected"]["passed"].get<bool>());
  EXPECT_EQ(rep["expected"]["worst"], worst);
  EXPECT_FALSE(rep["expected"]["outputs"][0]["passed"].get<bool>());
  EXPECT_NEAR(rep["expected"]["outputs"][0]["max_abs_error"].get<double>(), 100.0 - got, 1e-4);
  // A looser tolerance does not hide it; the outputs were still written.
  CmdResult loose =
      cli(run_args("--expected " + (d / "ref").string() + " --rtol 0.01 --atol 0.01"), "expected_bad_loose");
  EXPECT_EQ(loose.code, 1);
  EXPECT_TRUE(fs::exists(d / "out" / "output_0.pb"));
}

TEST(Expected, MissingOrExtraFilesAreBadInput) {
  fs::path d = scratch("expected_input");
  fs::create_directories(d / "empty");
  fs::create_directories(d / "extra");
  fs::copy_file(kTestData + "/output_0.pb", d / "extra" / "output_0.pb");
  fs::copy_file(kTestData + "/output_0.pb", d / "extra" / "output_1.pb");
  const std::string out = " --outputs " + (d / "out").string();
  CmdResult none = cli(run_args("--expected " + (d / "nope").string() + out), "expected_none");
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.err, "error: " + (d / "nope").string() + ": no such directory (--expected)\n");
  CmdResult empty = cli(run_args("--expected " + (d / "empty").string() + out), "expected_empty");
  EXPECT_EQ(empty.code, 2);
  EXPECT_EQ(empty.err, "error: " + (d / "empty" / "output_0.pb").string() +
                           ": no such file (--expected: the model has 1 output)\n");
  CmdResult extra = cli(run_args("--expected " + (d / "extra").string() + out), "expected_extra");
  EXPECT_EQ(extra.code, 2);
  EXPECT_EQ(extra.err, "error: " + (d / "extra" / "output_1.pb").string() + ": the model has 1 output, so --expected " +
                           (d / "extra").string() + " holds output_0.pb only\n");
  EXPECT_FALSE(fs::exists(d / "out"));  // checked before the run: nothing written
}

TEST(Expected, SequenceOutputsCompareElementByElement) {
  // An ONNX backend test whose output is a sequence of 4 int64 tensors (SequenceProto).
  const fs::path t = "/usr/share/libonnx-testdata/data/node/test_sequence_insert_at_back";
  if (!fs::exists(t / "model.onnx")) GTEST_SKIP() << "libonnx-testdata is not installed";
  const std::string data = (t / "test_data_set_0").string();
  const std::string run = "run " + (t / "model.onnx").string() + " --mesh 1 --inputs " + data + " --expected ";
  CmdResult ok = cli(run + data, "expected_seq");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("expected  passed against " + data + "\n"), std::string::npos) << ok.out;

  fs::path d = scratch("expected_seq");
  fs::create_directories(d / "short");
  fs::create_directories(d / "changed");
  gspmd::OnnxValue v = gspmd::read_value_pb(data + "/output_0.pb", gspmd::ValueKind::kSequence);
  ASSERT_EQ(v.tensors.size(), 4u);
  gspmd::OnnxValue shorter = v;
  shorter.tensors.pop_back();
  gspmd::write_value_pb((d / "short" / "output_0.pb").string(), shorter, "output_sequence");
  CmdResult count = cli(run + (d / "short").string(), "expected_seq_short");
  EXPECT_EQ(count.code, 1) << count.err;
  EXPECT_NE(count.out.find("expected  FAILED against " + (d / "short").string() +
                           ": output 'output_sequence': 4 tensors vs expected 3\n"),
            std::string::npos)
      << count.out;
  const int64_t was = v.tensors[1].data<int64_t>()[0];
  v.tensors[1].data<int64_t>()[0] = was + 1;
  gspmd::write_value_pb((d / "changed" / "output_0.pb").string(), v, "output_sequence");
  CmdResult changed = cli(run + (d / "changed").string(), "expected_seq_changed");
  EXPECT_EQ(changed.code, 1) << changed.err;
  EXPECT_NE(changed.out.find(fmt::format("output 'output_sequence[1]' element 0: {} vs expected {}\n",
                                         static_cast<double>(was), static_cast<double>(was + 1))),
            std::string::npos)
      << changed.out;
}

TEST(Progress, PartitionAndAutoOnlyOnATerminal) {
  // Under `script` stderr is a terminal: with the delay at 0 the search's and the export's lines appear.
  fs::path d = scratch("progress_partition");
  const std::string cmd = std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx partition " + kGpt +
                          " --mesh 2x2 --auto -o " + (d / "out").string();
  CmdResult tty = sh("GSPMD_PROGRESS_DELAY_MS=0 script -qec '" + cmd + " >/dev/null' /dev/null", "progress_part_tty");
  ASSERT_EQ(tty.code, 0) << tty.out;
  // (later updates come at most every 100 ms: only the first line of each is certain)
  EXPECT_NE(tty.out.find("\rauto: 1 plan, costing the seeds, "), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("\rpartition: writing device_0.onnx (1/4)"), std::string::npos) << tty.out;
  // Redirected, stderr stays empty.
  CmdResult file = sh("GSPMD_PROGRESS_DELAY_MS=0 " + cmd, "progress_part_file");
  ASSERT_EQ(file.code, 0) << file.err;
  EXPECT_EQ(file.err, "");
}

// A run whose outputs hold NaN says so: --check passes (both runs compute the same NaN), the summary warns.
TEST(Expected, NonFiniteOutputsAreWarnedAbout) {
  const fs::path d = scratch("nonfinite");
  const fs::path model = d / "sqrt.onnx";
  CmdResult make = sh(debian_python() +
                          " -c \"import onnx; from onnx import helper as h, TensorProto as T; "
                          "g = h.make_graph([h.make_node('Sqrt', ['x'], ['y'])], 'g', "
                          "[h.make_tensor_value_info('x', T.FLOAT, [8])], "
                          "[h.make_tensor_value_info('y', T.FLOAT, [8])]); "
                          "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 17)]), '" +
                          model.string() + "')\"",
                      "nonfinite_make");
  ASSERT_EQ(make.code, 0) << make.err;
  CmdResult r = cli("run " + model.string() + " --mesh 2 --check", "nonfinite_run");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  // The inputs are pseudo-random N(0, 1) from seed 0: some are negative.
  EXPECT_NE(r.out.find("warning   output 'y' holds "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" NaN and 0 infinite values of 8\n"), std::string::npos) << r.out;
}

}  // namespace
