// Bad input through the real CLI: one exact line on stderr, exit code 2, nothing written.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

const std::string kModel = "testdata/gpt/gpt_opset13.onnx";

/// Writes `json` as a sharding file in a scratch dir and runs `partition` with it.
CmdResult partition_with(const std::string& tag, const std::string& json, fs::path* file_out = nullptr) {
  fs::path dir = scratch("bad_" + tag);
  fs::path file = dir / "bad.sharding.json";
  std::ofstream(file) << json;
  if (file_out) *file_out = file;
  CmdResult r =
      cli("partition " + kModel + " --mesh 2x2 --shardings " + file.string() + " -o " + (dir / "out").string(),
          "bad_" + tag);
  EXPECT_FALSE(fs::exists(dir / "out")) << "partition wrote output for bad input " << tag;
  return r;
}

const char* kMesh = R"("mesh": {"shape": [2, 2], "axes": ["data", "model"]})";

struct BadFile {
  std::string tag;
  std::string tensors;  // the "tensors" object body, or a whole file when it starts with '!'
  std::string message;  // expected stderr after "error: FILE: "
};

void PrintTo(const BadFile& b, std::ostream* os) { *os << b.tag; }

class BadShardingFile : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadShardingFile, OneLineErrorAndExit2) {
  const BadFile& b = GetParam();
  std::string json =
      b.tensors[0] == '!' ? b.tensors.substr(1) : std::string("{") + kMesh + R"(, "tensors": {)" + b.tensors + "}}";
  fs::path file;
  CmdResult r = partition_with(b.tag, json, &file);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + file.string() + ": " + b.message + "\n");
  EXPECT_EQ(r.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Cli, BadShardingFile,
    ::testing::Values(
        BadFile{"unknown_tensor", R"("h.0.mlp.fc_in.wieght": [null, "model"])",
                R"(tensors."h.0.mlp.fc_in.wieght": no value named 'h.0.mlp.fc_in.wieght' in the model)"},
        BadFile{"unknown_axis", R"("h.0.mlp.fc_in.weight": [null, "modle"])",
                R"(tensors."h.0.mlp.fc_in.weight": unknown mesh axis 'modle' (mesh axes: data, model))"},
        BadFile{"wrong_rank", R"("h.0.mlp.fc_in.weight": [null, "model", null])",
                R"(tensors."h.0.mlp.fc_in.weight": spec has 3 entries but the tensor has rank 2)"},
        BadFile{"axis_twice", R"("h.0.mlp.fc_in.weight": ["model", "model"])",
                R"(tensors."h.0.mlp.fc_in.weight": mesh axis 'model' is used twice)"},
        BadFile{"deep_json",
                "!{" + std::string(kMesh) + R"(, "tensors": {"input_ids": )" + std::string(40000, '[') +
                    std::string(40000, ']') + "}}",
                "JSON nested deeper than 64 levels"},
        BadFile{"malformed_json",
                R"(!{"mesh": {"shape": [2, 2], "axes": ["data", "model"]}, "tensors": {"input_ids": ["data", null],}})",
                "malformed JSON: parse error at line 1, column 96: syntax error while parsing object key - "
                "unexpected '}'; expected string literal"}),
    [](const auto& info) { return info.param.tag; });

TEST(BadInput, MissingShardingFile) {
  CmdResult r = cli("partition " + kModel + " --mesh 2x2 --shardings /nonexistent/x.json -o /tmp/never", "missing_sf");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: /nonexistent/x.json: cannot open file\n");
}

TEST(BadInput, MissingModel) {
  CmdResult r = cli("run /nonexistent/model.onnx --mesh 2x2", "missing_model");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: /nonexistent/model.onnx: cannot open file\n");
}

TEST(BadInput, TruncatedModel) {
  fs::path dir = scratch("truncated");
  std::string bytes = read_file(fs::path(GSPMD_SOURCE_DIR) / kModel);
  std::ofstream(dir / "t.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
  CmdResult r = cli("run " + (dir / "t.onnx").string() + " --mesh 2", "truncated");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: " + (dir / "t.onnx").string() + ": not a valid ONNX model (truncated or malformed protobuf)\n");
}

TEST(BadInput, ImpossibleMeshes) {
  for (std::string mesh : {"0x2", "abc", "2x-1", ""}) {
    CmdResult r = cli("explain " + kModel + " --mesh '" + mesh + "'", "mesh_" + std::to_string(mesh.size()));
    EXPECT_EQ(r.code, 2) << mesh;
    EXPECT_EQ(r.err, "error: --mesh: '" + mesh + "' is not a mesh shape like 4x4\n");
  }
  // The sharding file names 2 axes; a 3-axis --mesh cannot override it.
  CmdResult r =
      cli("explain " + kModel + " --mesh 2x2x2 --shardings testdata/gpt/gpt.megatron.sharding.json", "mesh_rank");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: testdata/gpt/gpt.megatron.sharding.json: mesh: --mesh 2x2x2 has 3 axes but the file's "
            "mesh has 2 (data, model)\n");
}

TEST(BadInput, UnknownValueForExplainAndBadInputsDir) {
  CmdResult r = cli("explain " + kModel + " --mesh 2 --value nope", "explain_nope");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --value: no value named 'nope' in the model\n");
  CmdResult in = cli("run " + kModel + " --mesh 2 --inputs testdata/bert/test_data_set_0", "bad_inputs");
  EXPECT_EQ(in.code, 2);
  EXPECT_EQ(in.err,
            "error: testdata/bert/test_data_set_0/input_0.pb: int64 [4,32] but input 'input_ids' is int64 [8,64]\n");
}

TEST(BadInput, UsageErrorsExit2) {
  CmdResult r = cli("partition " + kModel, "usage");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("error: usage: ", 0), 0u) << r.err;
}

// Flags the run would misuse silently are usage errors: a negative seed, a negative or NaN tolerance (every
// comparison failed: "check FAILED" between equal values), a --dim the model does not have, given twice or too large,
// and an input file beyond the model's inputs.
TEST(BadInput, FlagsTheRunWouldMisuseAreOneLineErrors) {
  struct Case {
    std::string args, err;
  };
  fs::path dir = scratch("extra_input");
  fs::copy_file(fs::path(GSPMD_SOURCE_DIR) / "testdata/gpt/test_data_set_0/input_0.pb", dir / "input_0.pb");
  fs::copy_file(dir / "input_0.pb", dir / "input_1.pb");
  const std::string dyn = "testdata/gpt/gpt_opset17.onnx";
  const std::vector<Case> cases = {
      {"run " + kModel + " --mesh 1 --seed -1",
       "error: usage: --seed: '-1' is not a whole number >= 0 (see gspmd-onnx --help)"},
      {"run " + kModel + " --mesh 1 --check --rtol -1",
       "error: usage: --rtol: '-1' is not a finite number >= 0 (see gspmd-onnx --help)"},
      {"run " + kModel + " --mesh 1 --check --atol nan",
       "error: usage: --atol: 'nan' is not a finite number >= 0 (see gspmd-onnx --help)"},
      {"simulate " + kModel + " --mesh 1 --dim seq=3",
       "error: " + kModel + ": --dim seq=3: the model's inputs have no dim named 'seq' (their dims are all static)"},
      {"simulate " + dyn + " --mesh 1 --dim batch=4 --dim batch=6", "error: --dim: 'batch' is given twice (4 and 6)"},
      {"simulate " + dyn + " --mesh 1 --dim batch=1099511627776",
       "error: --dim: 'batch=1099511627776' is more than the 2147483647 a dim may be (docs/cli.md#limits)"},
      {"run " + kModel + " --mesh 1 --inputs " + dir.string(), "error: " + (dir / "input_1.pb").string() +
                                                                   ": the model has 1 input, so --inputs " +
                                                                   dir.string() + " holds input_0.pb only"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CmdResult r = cli(cases[i].args, "flags_" + std::to_string(i));
    EXPECT_EQ(r.code, 2) << cases[i].args;
    EXPECT_EQ(r.err, cases[i].err + "\n") << cases[i].args;
  }
}

// An output path that cannot be written is one line, found before the work is done; nothing is left behind.
TEST(BadInput, OutputPathsThatCannotBeWrittenAreOneLineErrors) {
  fs::path dir = scratch("bad_outputs");
  std::ofstream(dir / "a_file") << "x";
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);  // writing a report there would wait for a reader forever
  struct Case {
    std::string args, err;
  };
  const std::vector<Case> cases = {
      {"partition " + kModel + " --mesh 2 -o ''", "error: -o: '' is not a directory name"},
      {"run " + kModel + " --mesh 1 --outputs " + (dir / "a_file").string(),
       "error: --outputs: " + (dir / "a_file").string() + ": exists and is not a directory"},
      {"partition " + kModel + " --mesh 2 -o " + (dir / "out").string() + " --annotated-model " +
           (dir / "missing" / "a.onnx").string(),
       "error: --annotated-model: " + (dir / "missing").string() + ": no such directory"},
      {"simulate " + kModel + " --mesh 2 --report " + (dir / "fifo").string(),
       "error: --report: " + (dir / "fifo").string() + ": exists and is not a regular file"},
      // checked before anything is written: no report left behind by a trace that cannot be written
      {"run " + kModel + " --mesh 1 --report " + (dir / "r.json").string() + " --trace " +
           (dir / "missing" / "t.json").string(),
       "error: --trace: " + (dir / "missing" / "t.json").string() + ": no such directory"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    CmdResult r = cli(cases[i].args, "bad_outputs_" + std::to_string(i));
    EXPECT_EQ(r.code, 2) << cases[i].args;
    EXPECT_EQ(r.err, cases[i].err + "\n") << cases[i].args;
  }
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"a_file", "fifo"}));
}

// A token id past the vocabulary is refused in one line naming the file, the same under every plan: the vocab-parallel
// (Megatron) lookup masked it to zeros and exited 0, while one device stopped with an internal error.
TEST(BadInput, IndexInputsOutOfRangeAreRefusedUnderEveryPlan) {
  fs::path dir = scratch("oob_ids");
  gspmd::Tensor ids = gspmd::read_tensor_pb(GSPMD_SOURCE_DIR "/testdata/gpt/test_data_set_0/input_0.pb");
  ids.data<int64_t>()[3] = 512;  // the vocabulary has 512 entries
  gspmd::write_tensor_pb((dir / "input_0.pb").string(), ids, "input_ids");
  const std::string want = "error: " + (dir / "input_0.pb").string() +
                           ": input 'input_ids' holds index 512 (element 3), out of range for Gather '/wte/Gather' "
                           "(axis 0 of size 512)\n";
  for (const std::string plan : {"--mesh 1", "--mesh 2x2 --shardings testdata/gpt/gpt.dp.sharding.json",
                                 "--mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json"}) {
    CmdResult r = cli("run testdata/gpt/gpt_opset17.onnx " + plan + " --inputs " + dir.string(), "oob_ids");
    EXPECT_EQ(r.code, 2) << plan;
    EXPECT_EQ(r.err, want) << plan;
  }
}

// An index the model computes (ids + 1) out of range: the one-device run and the vocab-parallel lookup (which masks
// ids outside its shard) give the same one-line error, exit 2: a partitioned run never masks what the model's own
// Gather refuses.
TEST(BadInput, ComputedIndicesOutOfRangeAreRefusedUnderEveryPlan) {
  const fs::path dir = scratch("oob_computed");
  std::ofstream(dir / "gen.py") << R"(import sys, os, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
d = sys.argv[1]
table = nh.from_array(np.arange(32, dtype=np.float32).reshape(8, 4), "table")
one = nh.from_array(np.array(1, dtype=np.int64), "one")
g = h.make_graph([h.make_node("Add", ["ids", "one"], ["ids2"], name="shift"),
                  h.make_node("Gather", ["table", "ids2"], ["y"], name="lookup")], "g",
                 [h.make_tensor_value_info("ids", T.INT64, [4])], [h.make_tensor_value_info("y", T.FLOAT, [4, 4])],
                 [table, one])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), d + "/m.onnx")
os.makedirs(d + "/in", exist_ok=True)
open(d + "/in/input_0.pb", "wb").write(nh.from_array(np.array([0, 1, 2, 7], dtype=np.int64), "ids").SerializeToString())
)";
  std::ofstream(dir / "vp.json")
      << R"({"mesh": {"shape": [2], "axes": ["model"]}, "tensors": {"table": ["model", null]}})";
  ASSERT_EQ(sh(debian_python() + " -I " + (dir / "gen.py").string() + " " + dir.string(), "oob_computed_gen").code, 0);
  for (const std::string& plan :
       std::vector<std::string>{"--mesh 1", "--mesh 2 --shardings " + (dir / "vp.json").string()}) {
    CmdResult r =
        cli("run " + (dir / "m.onnx").string() + " " + plan + " --inputs " + (dir / "in").string(), "oob_computed");
    EXPECT_EQ(r.code, 2) << plan;
    EXPECT_EQ(r.err, "error: node 'lookup' (Gather): index 8 out of range for axis 0 of size 8\n") << plan;
  }
}

// Sizes are checked before anything is allocated or written (docs/cli.md#limits): a mesh has at most 2^20 devices
// (simulate still costs one that large), partition and run at most 16384.
TEST(BadInput, MeshesOverTheLimitsAreRefusedFirst) {
  CmdResult r = cli("simulate " + kModel + " --mesh 65536x65536", "mesh_huge");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --mesh: '65536x65536' has 4294967296 devices, more than the 1048576 a mesh may have\n");
  r = cli("simulate " + kModel + " --mesh 1024x1024", "mesh_2_20");
  EXPECT_EQ(r.code, 0) << r.err;
  fs::path dir = scratch("mesh_files");
  r = cli("partition " + kModel + " --mesh 256x256 -o " + (dir / "out").string(), "mesh_files");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: partition: the mesh 256x256 has 65536 devices; partition writes one file per device for at most "
            "16384 (simulate costs meshes of up to 1048576 devices)\n");
  EXPECT_TRUE(fs::is_empty(dir));
  r = cli("run " + kModel + " --mesh 256x256", "mesh_run");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: run: the mesh 256x256 has 65536 devices; run emulates every device in this process for at most "
            "16384 (simulate costs meshes of up to 1048576 devices)\n");
}

// A partition stopped by SIGINT or SIGTERM while it writes its device files removes its temporary folder and dies of
// the signal; nothing is left behind.
TEST(BadInput, InterruptedPartitionLeavesNothing) {
  for (const char* sig : {"INT", "TERM"}) {
    fs::path dir = scratch(std::string("interrupted_") + sig);
    const std::string cmd = "cd " + dir.string() + " && (" + GSPMD_BINARY_DIR + "/bin/gspmd-onnx partition " +
                            (fs::path(GSPMD_SOURCE_DIR) / kModel).string() +
                            " --mesh 64x64 -o out >/dev/null 2>&1 & pid=$!; "
                            "for i in $(seq 400); do ls -a | grep -q '^.out.tmp-' && break; sleep 0.05; done; "
                            "kill -" +
                            sig + " $pid; wait $pid; echo $? > rc)";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    EXPECT_EQ(read_file(dir / "rc"), std::string(sig) == "INT" ? "130\n" : "143\n");
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename() != "rc") left.push_back(e.path().filename().string());
    EXPECT_TRUE(left.empty()) << left.front();
  }
}

// Users' regular expressions are RE2's (docs/sharding-file.md#rules): a backtracking pattern is one linear scan (it
// hung std::regex), and what RE2 refuses (backreferences, lookaround, a program over its memory bound) is one line.
TEST(BadInput, UserRegexesAreLinearTimeRe2Patterns) {
  const std::string rules = std::string("{") + kMesh + R"(, "rules": [)";
  fs::path dir = scratch("regex_ok");
  std::ofstream(dir / "s.json") << rules << R"({"match": "^(.*.*)*X$", "spec": [null, "model"]},
                                      {"match": "fc_in\\.weight$", "spec": [null, "model"]}]})";
  CmdResult ok = cli(
      "partition " + kModel + " --mesh 2x2 --shardings " + (dir / "s.json").string() + " -o " + (dir / "out").string(),
      "regex_ok");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(dir / "out" / "device_3.onnx"));

  fs::path file;
  CmdResult r = partition_with("regex_backref", rules + R"({"match": "(a)\\1", "spec": [null, "model"]}]})", &file);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + file.string() +
                       R"(: rules[0].match: invalid regular expression "(a)\\1": invalid escape sequence: \1)" + "\n");
  r = partition_with("regex_too_large", rules + R"({"match": "\\pL{1000}", "spec": [null, "model"]}]})", &file);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: " + file.string() +
                R"(: rules[0].match: invalid regular expression "\\pL{1000}": pattern too large - compile failed)" +
                "\n");
  r = cli("simulate " + kModel + R"( --mesh 2x2 --training --trainable '(a)\1')", "regex_trainable");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, R"(error: --trainable: '(a)\1' is not a regular expression RE2 accepts: invalid escape sequence: \1)"
                   "\n");
  r = cli("simulate " + kModel + " --mesh 2x2 --pipeline x --layers '(?=h)'", "regex_layers");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --layers: '(?=h)' is not a regular expression RE2 accepts: invalid perl operator: (?=\n");
}

}  // namespace
