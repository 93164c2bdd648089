// `partition --annotated-model FILE` and annotated models as input (docs/cli.md, docs/sharding-file.md "Annotated
// models"): the annotated model gives the same SPMD program as the sharding file it came from, whether read as MODEL
// or with --shardings; onnx 1.12's Python loads it and keeps the annotations; the CLI's errors.
#include <gtest/gtest.h>

#include "e2e_util.h"

using namespace e2e;

namespace {

/// gspmd.program_fingerprint of DIR/device_0.onnx (identifies the SPMD program; docs/collectives.md).
std::string fingerprint(const fs::path& dir) {
  CmdResult r = sh(debian_python() +
                       " -c \"import onnx,sys; m = onnx.load(sys.argv[1]); print({p.key: p.value for p in "
                       "m.metadata_props}['gspmd.program_fingerprint'])\" " +
                       (dir / "device_0.onnx").string(),
                   "am_fingerprint");
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out;
}

TEST(AnnotatedModelCli, GivesTheSameProgramAsItsShardingFile) {
  const fs::path d = scratch("annotated_model_cli");
  const fs::path annotated = d / "gpt.annotated.onnx";
  CmdResult r = cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " -o " + (d / "ref").string() +
                        " --annotated-model " + annotated.string(),
                    "am_write");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("report.json, " + annotated.string() + "\n"), std::string::npos) << r.out;
  const std::string want = fingerprint(d / "ref");
  ASSERT_EQ(want.size(), 17u);  // 16 hex digits and a newline

  // As MODEL (its own annotations), and as --shardings for the original model.
  r = cli("partition " + annotated.string() + " --mesh 2x2 -o " + (d / "as_model").string(), "am_as_model");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fingerprint(d / "as_model"), want);
  EXPECT_EQ(read_json(d / "as_model" / "report.json")["sharding_file"], annotated.string());
  r = cli("partition " + kGpt + " --mesh 2x2 --shardings " + annotated.string() + " -o " + (d / "as_flag").string(),
          "am_as_flag");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(fingerprint(d / "as_flag"), want);
  // `run --check` from the annotated model alone.
  r = cli("run " + annotated.string() + " --mesh 2x2 --inputs testdata/gpt/test_data_set_0 --check", "am_run");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;

  // onnx 1.12 (Python) loads it, passes its checker, and writes it back byte for byte: the annotations survive as
  // unknown fields.
  CmdResult py = sh(debian_python() +
                        " -c \"import onnx,sys\n"
                        "m = onnx.load(sys.argv[1])\n"
                        "onnx.checker.check_model(m)\n"
                        "print(m.SerializeToString() == open(sys.argv[1], 'rb').read(), len(m.graph.node))\" " +
                        annotated.string(),
                    "am_python");
  ASSERT_EQ(py.code, 0) << py.err;
  EXPECT_EQ(py.out.substr(0, 5), "True ") << py.out;
}

TEST(AnnotatedModelCli, Errors) {
  const fs::path d = scratch("annotated_model_cli_errors");
  const fs::path annotated = d / "gpt.onnx";
  ASSERT_EQ(cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " -o " + (d / "ref").string() +
                    " --annotated-model " + annotated.string(),
                "am_err_write")
                .code,
            0);
  // A sibling sharding file as well: which one is meant?
  fs::copy_file("testdata/gpt/gpt.megatron.sharding.json", d / "gpt.sharding.json");
  CmdResult r = cli("partition " + annotated.string() + " --mesh 2x2 -o " + (d / "never").string(), "am_err_sibling");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + annotated.string() + ": carries sharding annotations and has a sibling " +
                       (d / "gpt.sharding.json").string() + ": choose one with --shardings\n");
  // --shardings chooses (here the sidecar: the same plan).
  r = cli("partition " + annotated.string() + " --mesh 2x2 --shardings " + (d / "gpt.sharding.json").string() + " -o " +
              (d / "chosen").string(),
          "am_err_chosen");
  EXPECT_EQ(r.code, 0) << r.err;
  // The annotations list the devices of a 2x2 mesh.
  r = cli("explain " + kGpt + " --mesh 4 --shardings " + annotated.string(), "am_err_mesh");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + annotated.string() +
                       ": --mesh 4 does not match the annotated model's mesh 2x2 (its sharding specs list that mesh's "
                       "devices)\n");
  // A model without annotations given as --shardings.
  r = cli("explain " + kGpt + " --mesh 2x2 --shardings " + kGpt, "am_err_none");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + kGpt +
                       ": carries no sharding annotations (NodeProto.device_configurations); write one with partition "
                       "--annotated-model\n");
  // The annotated model may not go inside the output directory, which is replaced as a whole.
  r = cli("partition " + kGpt + " --mesh 2x2 " + kMegatron + " -o " + (d / "out").string() + " --annotated-model " +
              (d / "out" / "a.onnx").string(),
          "am_err_inside");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --annotated-model: " + (d / "out" / "a.onnx").string() + " is inside the output directory " +
                       (d / "out").string() + "; write it elsewhere\n");
  EXPECT_FALSE(fs::exists(d / "out"));
  // Nor over its input (issue 31: it used to overwrite the model), found as the same file by any path.
  fs::copy_file(kGpt, d / "in.onnx", fs::copy_options::overwrite_existing);
  const std::string before = e2e::read_file(d / "in.onnx");
  r = cli("partition " + (d / "in.onnx").string() + " --mesh 2x2 " + kMegatron + " -o " + (d / "out").string() +
              " --annotated-model " + (d / "." / "in.onnx").string(),
          "am_err_input");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --annotated-model: " + (d / "." / "in.onnx").string() +
                       " is the input model; write it "
                       "elsewhere\n");
  EXPECT_EQ(e2e::read_file(d / "in.onnx"), before);
  r = cli("partition " + kGpt + " --mesh 2x2 -o " + (d / "out").string() + " --shardings " + (d / "in.onnx").string() +
              " --annotated-model " + (d / "in.onnx").string(),
          "am_err_shardings");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --annotated-model: " + (d / "in.onnx").string() +
                       " is the sharding file read; write it "
                       "elsewhere\n");
  EXPECT_FALSE(fs::exists(d / "out"));
}

}  // namespace
