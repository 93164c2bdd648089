// Sequence inputs and outputs through the CLI (docs/sequences.md): `run --inputs` reads a SequenceProto, the
// flattened elements take their shardings from the sharding file by element name ("xs[1]"), --check passes and
// `--outputs` writes the output sequence back as a SequenceProto; without --inputs the sequence input is refused.
#include <gtest/gtest.h>

#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

gspmd::OnnxValue sequence_of(int n) {
  gspmd::OnnxValue v;
  v.structure = {gspmd::ValueKind::kSequence, true, false, gspmd::DType::kFloat32};
  for (int i = 0; i < n; ++i) {
    std::vector<float> x(4);
    for (int k = 0; k < 4; ++k) x[k] = static_cast<float>(10 * i + k);
    v.tensors.push_back(gspmd::Tensor::from_floats({4}, x));
  }
  return v;
}

TEST(SequencesCli, RunShardedElementsAndWriteTheOutputSequence) {
  const fs::path dir = scratch("sequences_run");
  fs::create_directories(dir / "in");
  gspmd::write_value_pb((dir / "in" / "input_0.pb").string(), sequence_of(3), "xs");
  gspmd::write_tensor_pb((dir / "in" / "input_1.pb").string(), gspmd::Tensor::from_floats({4}, {1, 2, 3, 4}), "b");
  std::ofstream(dir / "plan.json")
      << R"({"mesh": {"shape": [2], "axes": ["x"]}, "tensors": {"xs[0]": ["x"], "xs[1]": ["x"], "xs[2]": ["x"]}})";
  CmdResult r = cli("run testdata/frontend/seq_io.onnx --mesh 2 --shardings " + (dir / "plan.json").string() +
                        " --inputs " + (dir / "in").string() + " --check --outputs " + (dir / "out").string() +
                        " --report " + (dir / "report.json").string(),
                    "sequences_run");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  const gspmd::OnnxValue ys = gspmd::read_value_pb((dir / "out" / "output_0.pb").string(), gspmd::ValueKind::kSequence);
  ASSERT_EQ(ys.tensors.size(), 3u);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(ys.tensors[i].data<float>()[k], static_cast<float>(10 * i + k + k + 1)) << i << "," << k;
  // The elements are split over x on both devices: the adds need no collective.
  EXPECT_EQ(read_json(dir / "report.json")["collectives"].size(), 0u);
}

TEST(SequencesCli, SequenceInputWithoutInputsIsRefused) {
  CmdResult r = cli("partition testdata/frontend/seq_io.onnx --mesh 2 --dim N=4 -o " +
                        (scratch("sequences_refused") / "out").string(),
                    "sequences_refused");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: testdata/frontend/seq_io.onnx: input 'xs' is a sequence: its structure (length, element shapes) "
            "must be known at load; give its value (--inputs DIR)\n");
  EXPECT_FALSE(fs::exists(scratch("sequences_refused") / "out"));
}

}  // namespace
