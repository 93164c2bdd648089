// End-to-end on models beyond the bundled GPT: a BERT-style encoder, and GPTs exported at other sizes during the
// test (fresh torch exports, shapes that do not divide the mesh evenly).
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace e2e;

namespace {

void expect_run_check(const std::string& args, const std::string& tag) {
  fs::path dir = scratch(tag);
  const auto [r, rep] = cli_report("run " + args + " --check", dir, tag);
  ASSERT_FALSE(rep.is_null());
  EXPECT_TRUE(rep["check"]["passed"].get<bool>()) << r.out;
}

TEST(Bert, MegatronEqualsUnpartitionedOnEveryExport) {
  for (std::string m : {"bert_opset13", "bert_opset17", "bert_opset13_nofold"}) {
    expect_run_check("testdata/bert/" + m +
                         ".onnx --mesh 2x2 --shardings testdata/bert/bert.megatron.sharding.json "
                         "--inputs testdata/bert/test_data_set_0",
                     "bert_" + m);
  }
}

TEST(Bert, MegatronCollectives) {
  fs::path dir = scratch("bert_collectives");
  CmdResult r =
      cli("partition testdata/bert/bert_opset17.onnx --mesh 2x2 --shardings "
          "testdata/bert/bert.megatron.sharding.json -o " +
              (dir / "out").string(),
          "bert_collectives");
  ASSERT_EQ(r.code, 0) << r.err;
  auto rep = read_json(dir / "out" / "report.json");
  // 2 layers x (attention output + MLP output) + the vocab-parallel embedding.
  EXPECT_EQ(count_collectives(rep, "all-reduce"), 5) << rep["collectives"].dump(1);
  EXPECT_EQ(count_collectives(rep, "all-gather"), 0) << rep["collectives"].dump(1);
}

/// Exports a GPT of another size with testdata/gpt/export_gpt.py (Debian's torch) into a scratch dir.
fs::path export_gpt(const std::string& tag, const std::string& args) {
  fs::path dir = scratch(tag);
  CmdResult r = sh(debian_python() + " testdata/gpt/export_gpt.py " + args +
                       " --opsets 17 --nofold-opsets --max-mb 64 --out " + dir.string(),
                   tag + "_export");
  if (r.code != 0) ADD_FAILURE() << "export failed: " << r.out << r.err;
  return dir;
}

TEST(FreshExports, GptOtherSizeWithUnevenVocabAndHeads) {
  // 3 heads and vocab 301 do not divide the model axis (2): the partitioner must fall back or pad, and stay exact.
  fs::path d = export_gpt("gpt_uneven", "--layers 3 --d-model 96 --heads 3 --vocab 301 --batch 4 --seq 32");
  expect_run_check((d / "gpt_opset17.onnx").string() + " --mesh 2x2 --shardings " +
                       (d / "gpt.megatron.sharding.json").string() + " --inputs " + (d / "test_data_set_0").string(),
                   "gpt_uneven_run");
  expect_run_check(
      (d / "gpt_opset17.onnx").string() + " --mesh 4x4 --shardings " + (d / "gpt.2d.sharding.json").string(),
      "gpt_uneven_run_4x4");
}

TEST(FreshExports, GptWiderOn4x4) {
  fs::path d = export_gpt("gpt_wide", "--layers 2 --d-model 256 --heads 8 --vocab 1024 --batch 8 --seq 32");
  expect_run_check((d / "gpt_opset17.onnx").string() + " --mesh 4x4 --shardings " +
                       (d / "gpt.2d.sharding.json").string() + " --inputs " + (d / "test_data_set_0").string(),
                   "gpt_wide_run");
}

}  // namespace
