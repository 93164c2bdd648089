// Training steps against torch and numpy references: SGD gradients, Adam, Adafactor, variables, bfloat16 (the
// optimizers of core/autodiff/optimizers.cc).
#include "tests/e2e/training_test_util.h"

namespace e2e {
namespace {

// torch autograd and torch.optim on the same small GPT (2 layers, d 32, 2 heads, vocab 64), exported by
// testdata/training/torch_reference.py: the loss and every updated weight (for sgd: the gradient it implies) within
// 1e-4 normwise, partitioned Megatron 2x2 and 2D 4x4 (uneven: 2 heads over 4 devices).
class TorchReference : public ::testing::Test {
 protected:
  static fs::path make(const std::string& name, const std::string& args) {
    fs::path d = scratch("torch_ref_" + name);
    CmdResult r = sh(debian_python() + " testdata/training/torch_reference.py make " + d.string() + args,
                     "torch_ref_make_" + name);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return d;
  }
  static void run_and_compare(const fs::path& d, const std::string& args, const std::string& tag,
                              const std::string& verdict = "within 0.0001") {
    const fs::path out = d / ("out_" + tag);
    CmdResult r = cli("run " + (d / "model.onnx").string() + kTrain + " --inputs " + (d / "inputs").string() +
                          " --outputs " + out.string() + args,
                      "torch_ref_run_" + tag);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    CmdResult c =
        sh(debian_python() + " testdata/training/torch_reference.py compare " + d.string() + " " + out.string(),
           "torch_ref_cmp_" + tag);
    EXPECT_EQ(c.code, 0) << c.out << c.err;
    EXPECT_NE(c.out.find(verdict), std::string::npos) << c.out;
  }
};

TEST_F(TorchReference, SgdGradientsMatchTorchAutograd) {
  const fs::path d = make("sgd", " --opset 13");  // no folding: Slice, Concat, Pow, ReduceMean, Sqrt, the wpe Gather
  run_and_compare(d, " --mesh 2x2" + plan("megatron") + " --lr 1", "sgd_megatron");
  run_and_compare(d, " --mesh 4x4" + plan("2d") + " --lr 1", "sgd_2d");
}

TEST_F(TorchReference, AdamStepMatchesTorchOptim) {
  const fs::path d = make("adam", " --opset 17 --fold --optimizer adam --lr 0.01");  // LayerNormalization
  run_and_compare(d, " --mesh 2x2" + plan("paper2d") + " --optimizer adam --lr 0.01", "adam_paper2d");
}

// Variables (--trainable selecting graph inputs; docs/training.md): the same GPT with its parameters as graph
// inputs, fed the exported values, trains like torch (SGD under Megatron, Adam under the paper's 2D plan, whose
// m and v become inputs fed zeros). Integer inputs that match are named as not trained. Partitioned, each device
// file takes the variables and their state as inputs without data, paired with their updated outputs.
TEST_F(TorchReference, VariablesTrainLikeTorch) {
  const std::string vars = " --trainable '\\.(weight|bias)$'";
  const fs::path sgd = make("vars_sgd", " --opset 13 --variables");
  run_and_compare(sgd, " --mesh 2x2" + plan("megatron") + vars + " --lr 1", "vars_sgd_megatron");
  const fs::path adam = make("vars_adam", " --opset 17 --fold --variables --optimizer adam --lr 0.01");
  run_and_compare(adam, " --mesh 2x2" + plan("paper2d") + vars + " --optimizer adam --lr 0.01", "vars_adam_paper2d");

  const std::string model = (sgd / "model.onnx").string();
  CmdResult r = cli("simulate " + model + " --mesh 2x2" + plan("megatron") + kTrain + " --trainable 'weight|bias|ids'",
                    "vars_ignored");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(", 37 weights (116.5 KiB); not trained, not floating point: input_ids\n"), std::string::npos)
      << r.out;
  const fs::path out = scratch("vars_export") / "out";
  r = cli("partition " + model + " --mesh 2x2" + plan("megatron") + kTrain + vars + " --optimizer momentum -o " +
              out.string(),
          "vars_export");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  CmdResult py = inspect_device_file(out / "device_3.onnx",
                                     "print(ins[:2], len(ins), len(inits & set(ins)), 'wte.weight.momentum' in ins)\n"
                                     "print(sum(i + '.updated' in outs for i in ins))",
                                     "vars_export_inspect");
  ASSERT_EQ(py.code, 0) << py.out << py.err;
  // input_ids, the 37 weights, labels and the weights' momentum (no data: the caller feeds them); each weight and
  // state paired with its updated output
  EXPECT_EQ(py.out, "['input_ids', 'wte.weight'] 76 0 True\n74\n");
}

// bfloat16 steps against torch (issue 29): --precision autocast against torch.autocast's step, --precision mixed
// against torch's step of a bfloat16 copy of the model updating its float32 parameters (every activation bfloat16,
// float32 masters), SGD under Megatron 2x2 and 2D 4x4, and autocast with Adam under the paper's 2D plan. Each value
// (the loss, each implied gradient, each Adam step) is within run --check's rule for a 16-bit step: 4 units of
// bfloat16 or twice torch's own distance from its float32 step (torch_reference.py saves both). Before the kernels
// rounded to bfloat16 to nearest even (an opset-17 model truncated at every rounding), mixed's gradients were up to
// 4.4% from torch's, over the 3.1% of that rule.
TEST_F(TorchReference, BFloat16StepsMatchTorch) {
  for (const std::string precision : {"autocast", "mixed"}) {
    const fs::path d = make("bf16_" + precision, " --opset 17 --fold --lr 1 --precision " + precision);
    for (const auto& [p, mesh] : {std::pair{"megatron", "2x2"}, {"2d", "4x4"}}) {
      const std::string tag = precision + "_" + p;
      run_and_compare(d, " --mesh " + std::string(mesh) + plan(p) + " --lr 1 --precision " + precision, tag,
                      "37/37 within 0.015625 or twice torch's " + precision + " distance from float32");
    }
  }
  const fs::path adam = make("bf16_adam", " --opset 17 --fold --optimizer adam --lr 0.01 --precision autocast");
  run_and_compare(adam, " --mesh 2x2" + plan("paper2d") + " --optimizer adam --lr 0.01 --precision autocast",
                  "autocast_adam", "37/37 within 0.015625 or twice torch's autocast distance from float32");
}

// Adafactor against the numpy transcription of HF transformers' Adafactor (torch 1.13 has none; torch autograd's
// gradients), partitioned by the GSPMD paper's 2D plan. Clipping is active for most matrices (RMS of the update
// 1.01 - 1.13) and not for the embeddings (0.65, 0.95).
TEST_F(TorchReference, AdafactorStepMatchesNumpyReference) {
  const fs::path d = make("adafactor", " --opset 17 --fold --optimizer adafactor --lr 0.01");
  run_and_compare(d, " --mesh 2x2" + plan("paper2d") + " --optimizer adafactor --lr 0.01", "adafactor_paper2d");
}

// Adafactor's factored accumulators take their weight's sharding without the dim they average over: fc_in.weight
// [128, 512] is [null, model] under Megatron, so its row accumulator [128] is replicated and its column accumulator
// [512] split over model; a bias's unfactored accumulator is sharded like the bias. With --shard-update data each
// accumulator is also split over data by its own shape, and the step still equals the unpartitioned one.
TEST(Training, AdafactorStateFollowsTheWeightWithoutTheAveragedDim) {
  const std::string adafactor = kTrain + " --optimizer adafactor";
  const std::string megatron = "explain " + kGpt + " --mesh 2x2" + plan("megatron") + adafactor + " --value ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"h.0.mlp.fc_in.weight.adafactor_row", "[null]"},
      {"h.0.mlp.fc_in.weight.adafactor_col.updated", "[\"model\"]"},
      {"h.0.mlp.fc_out.weight.adafactor_row.updated", "[\"model\"]"},  // [512, 128] is [model, null]
      {"h.0.mlp.fc_in.bias.adafactor_v", "[\"model\"]"}};
  for (size_t k = 0; k < cases.size(); ++k) {
    CmdResult r = cli(megatron + cases[k].first, "train_adafactor_explain_" + std::to_string(k));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find(cases[k].first + " float32 "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("  sharding  " + cases[k].second + " "), std::string::npos) << cases[k].first << "\n" << r.out;
  }
  fs::path d = scratch("train_adafactor_shard_update");
  {
    std::ofstream f(d / "dp4.json");
    f << R"({"mesh": {"shape": [4], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]}})";
  }
  const std::string dp4 = " --mesh 4 --shardings " + (d / "dp4.json").string() + adafactor + " --shard-update data";
  CmdResult r = cli("explain " + kGpt + dp4 + " --value h.0.mlp.fc_in.weight.adafactor_row", "train_adafactor_su_x");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("  sharding  [\"data\"] "), std::string::npos) << r.out;
  r = cli("run " + kGpt + dp4 + " --eps 1e-6 --check", "train_adafactor_su");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
}

// Adam and Adafactor on float16 weights keep their state and arithmetic in float32 (mixed precision's optimizer):
// in float16 their default epsilons are 0, and a zero gradient's update was 0/0. The step is finite, its state
// float32, its weights float16 and moved; and the sharded step equals the single-device one (--check).
TEST(Training, AdaptiveOptimizersOnFloat16WeightsStayFinite) {
  for (const char* opt : {"adam", "adafactor"}) {
    SCOPED_TRACE(opt);
    const fs::path out = scratch(std::string("train_fp16_") + opt);
    fs::remove_all(out);
    CmdResult r = cli(std::string("run testdata/frontend/mlp_float16.onnx --mesh 2 --training --loss "
                                  "mean --check --optimizer ") +
                          opt + " --outputs " + out.string(),
                      "train_fp16");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
    // The step's outputs: the loss, the 5 updated weights, then the updated optimizer state (docs/training.md).
    int weights = 0, states = 0;
    for (int k = 0; fs::exists(out / fmt::format("output_{}.pb", k)); ++k) {
      const gspmd::Tensor t = gspmd::read_tensor_pb((out / fmt::format("output_{}.pb", k)).string());
      for (int64_t i = 0; i < t.numel(); ++i) {
        const double x =
            t.dtype == gspmd::DType::kFloat16 ? gspmd::half_to_float(t.data<uint16_t>()[i]) : t.data<float>()[i];
        ASSERT_TRUE(std::isfinite(x)) << "output " << k << " [" << i << "]";
      }
      // the loss is computed in float32 (docs/training.md, "Precision"), the weights stay float16
      EXPECT_EQ(t.dtype, k >= 1 && k <= 5 ? gspmd::DType::kFloat16 : gspmd::DType::kFloat32) << "output " << k;
      if (k >= 1 && k <= 5) ++weights;
      if (k > 5) ++states;
    }
    EXPECT_EQ(weights, 5);
    EXPECT_GE(states, 5);
  }
}

}  // namespace
}  // namespace e2e
