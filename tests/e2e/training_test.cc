// Training steps (--training, docs/training.md): run --check on model families, collectives of data parallel and
// weight-update sharding, memory, --auto, device files, remat, bad flags.
#include "tests/e2e/training_test_util.h"

namespace e2e {
namespace {

// The bundled GPT's training step equals the unpartitioned step under every plan (2D 4x4 shards 4 heads and a batch
// of 8 over 4 devices per axis; paper2d holds the FFN weights sharded on both axes and all-gathers them).
TEST_P(GptTraining, RunCheckPasses) {
  const Case& c = GetParam();
  CmdResult r = cli("run " + kGpt + " --mesh " + c.mesh + plan(c.plan) + kTrain + c.extra + " --check",
                    "train_" + c.plan + std::to_string(c.extra.size()));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("training  one step: loss 'loss', "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Plans, GptTraining,
                         ::testing::Values(Case{"dp", "2x2", ""}, Case{"megatron", "2x2", ""}, Case{"2d", "4x4", ""},
                                           Case{"paper2d", "2x2", ""},
                                           Case{"megatron", "2x2", " --optimizer momentum --lr 0.1"},
                                           // Adam divides by sqrt(v): with a tiny eps, rounding noise in a gradient
                                           // near 0 (attention's key bias is 0 exactly) becomes a step of lr
                                           Case{"paper2d", "2x2", " --optimizer adam --lr 0.001 --eps 1e-3"},
                                           // Adafactor too (g / sqrt(g^2 + eps)): eps 1e-6 keeps the noise small
                                           Case{"paper2d", "2x2", " --optimizer adafactor --lr 0.01 --eps 1e-6"}),
                         [](const auto& info) {
                           std::string n = info.param.plan + (info.param.extra.empty() ? "" : "_optimizer");
                           for (const char* o : {"adam", "adafactor"})
                             if (info.param.extra.find(std::string(" --optimizer ") + o + " ") != std::string::npos)
                               n += std::string("_") + o;
                           return n;
                         });

// docs/training.md's first example (Adam, Megatron 2x2, torch's default eps): attention's key bias has a gradient
// that is 0 in exact arithmetic, so Adam's first step g / (|g| + eps) is a sign of rounding noise there, different
// in the two runs. The check names those elements instead of failing on them (it failed before, max abs error
// 1.4e-4 on h.0.attn.k.bias.updated), states its tolerance, and compares every other element as usual.
TEST(Training, HeadlineExampleNamesTheAmplifiedWeights) {
  const fs::path rep = scratch("train_headline") / "report.json";
  CmdResult r = cli("run " + kGpt + " --mesh 2x2" + plan("megatron") + kTrain + " --optimizer adam --lr 1e-3 --check" +
                        " --report " + rep.string(),
                    "train_headline");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("; rtol 0.0001, atol 1e-05)\n"), std::string::npos) << r.out;
  const nlohmann::json c = read_json(rep)["check"];
  EXPECT_TRUE(c["passed"].get<bool>());
  std::set<std::string> amplified;
  for (const auto& a : c["amplified"]) {
    amplified.insert(a["weight"].get<std::string>());
    EXPECT_LE(a["elements"].get<int64_t>(), a["of"].get<int64_t>());
    EXPECT_LE(a["max_abs_error"].get<double>(), 2 * 1e-3 * 1.001) << a.dump();  // at most two steps of lr apart
  }
  EXPECT_TRUE(amplified.count("h.0.attn.k.bias") && amplified.count("h.1.attn.k.bias")) << c.dump();
  EXPECT_NE(r.out.find("\namplified "), std::string::npos) << r.out;
}

// Every command of docs/training.md runs (issue 29): each ```sh block, its lines joined at a trailing backslash, one
// command per line, from the source folder, with `gspmd-onnx` the built binary and /tmp/ a scratch folder. Each exits
// 0, and one with --check says its check passed. The page holds at least its three examples (the headline Adam step,
// GPT-3 175B's bf16 step with its weights as inputs, the mixed-precision Adafactor step under the paper's 2D plan).
TEST(Training, EveryCommandOfTheTrainingPageRuns) {
  const fs::path tmp = scratch("training_page");
  std::istringstream page(read_file(fs::path(GSPMD_SOURCE_DIR) / "docs/training.md"));
  std::vector<std::string> commands;
  bool in_block = false;
  std::string line, command;
  while (std::getline(page, line)) {
    if (!in_block) {
      in_block = line == "```sh";
      continue;
    }
    if (line == "```") {
      in_block = false;
      continue;
    }
    const bool more = !line.empty() && line.back() == '\\';
    command += more ? line.substr(0, line.size() - 1) : line;
    if (more) continue;
    const std::string to = tmp.string() + "/";  // (a build tree under /tmp holds "/tmp/" itself: search past it)
    for (size_t at = command.find("/tmp/"); at != std::string::npos; at = command.find("/tmp/", at + to.size()))
      command.replace(at, 5, to);
    if (command.starts_with("gspmd-onnx ")) command = std::string(GSPMD_BINARY_DIR) + "/bin/" + command;
    commands.push_back(command);
    command.clear();
  }
  ASSERT_GE(commands.size(), 4u);
  for (size_t k = 0; k < commands.size(); ++k) {
    CmdResult r = sh(commands[k], "training_page_" + std::to_string(k));
    EXPECT_EQ(r.code, 0) << commands[k] << "\n" << r.out << r.err;
    if (commands[k].find(" --check") != std::string::npos) {
      EXPECT_NE(r.out.find("\ncheck     passed"), std::string::npos) << commands[k] << "\n" << r.out;
    }
  }
}

// --precision mixed (docs/training.md, "Precision"): bfloat16 compute with float32 weights, each cast where read.
// Under data parallelism every weight gradient is all-reduced as the bfloat16 partial sum it is, before its Cast back
// to float32: each all-reduce moves exactly half the float32 step's bytes (the loss's stays float32). The step passes
// --check under the data, Megatron and 2D plans, with SGD, Adam and Adafactor (whose bfloat16 step of the Megatron-
// split h.1.attn.q.weight differs normwise by 0.0165 from the unpartitioned one's, more than 4 units of 2^-8: the check
// also runs the step in float32 and allows twice the reference's own distance from it, for every optimizer);
// --precision bf16 halves the weights too.
TEST(Training, MixedPrecisionStepsHalveTheGradientBytes) {
  const fs::path d = scratch("train_mixed");
  auto all_reduce_bytes = [&](const std::string& extra, const std::string& tag) {
    CmdResult r = cli("simulate " + kGpt + " --mesh 2x2" + plan("dp") + kTrain + extra + " --report " +
                          (d / (tag + ".json")).string(),
                      "train_mixed_" + tag);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    std::multiset<int64_t> bytes;
    const nlohmann::json rep = read_json(d / (tag + ".json"));
    for (const auto& c : rep["collectives"]) {
      EXPECT_EQ(c["kind"], "all-reduce") << c.dump();
      if (c["value"] != "loss") bytes.insert(c["bytes"].get<int64_t>());
    }
    return bytes;
  };
  const std::multiset<int64_t> f32 = all_reduce_bytes("", "f32"),
                               mixed = all_reduce_bytes(" --precision mixed", "mixed");
  std::multiset<int64_t> half;
  for (int64_t b : f32) half.insert(b / 2);
  EXPECT_EQ(f32.size(), 37u);
  EXPECT_EQ(mixed, half);
  for (const auto& [p, mesh] : {std::pair{"dp", "2x2"}, {"megatron", "2x2"}, {"2d", "4x4"}})
    for (const char* opt : {"sgd", "adam", "adafactor"}) {
      CmdResult r = cli(
          "run " + kGpt + " --mesh " + mesh + plan(p) + kTrain + " --precision mixed --optimizer " + opt + " --check",
          std::string("train_mixed_check_") + p + opt);
      EXPECT_EQ(r.code, 0) << p << " " << opt << "\n" << r.out << r.err;
      EXPECT_NE(r.out.find("precision mixed: bfloat16 compute, float32 weights"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("check     passed"), std::string::npos) << p << " " << opt << "\n" << r.out;
      EXPECT_NE(r.out.find("; the model computes in bfloat16: within 4 units of 2^-8"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("; a trained weight's step and optimizer state normwise, within that or twice the "
                           "reference's distance from a float32 run)"),
                std::string::npos)
          << r.out;
    }
  // --precision autocast (torch.autocast's policy) passes --check under the same plans.
  for (const auto& [p, mesh] : {std::pair{"dp", "2x2"}, {"megatron", "2x2"}, {"2d", "4x4"}}) {
    CmdResult r =
        cli("run " + kGpt + " --mesh " + mesh + plan(p) + kTrain + " --precision autocast --optimizer adam --check",
            std::string("train_autocast_check_") + p);
    EXPECT_EQ(r.code, 0) << p << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("precision autocast: contractions in bfloat16"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("check     passed"), std::string::npos) << p << "\n" << r.out;
  }
  // --remat full recomputes the same forward work as in the float32 step: each reader casts the float32 weight
  // itself, so the tied embedding's copy does not live from the embedding to the LM head (a shared copy left no cut:
  // 27.7% of the model FLOPs recomputed instead of 17.2%).
  auto recomputed_flops = [&](const std::string& extra, const std::string& tag) {
    CmdResult r = cli("simulate " + kGpt + " --mesh 2x2" + plan("megatron") + kTrain + " --remat full" + extra +
                          " --report " + (d / (tag + ".json")).string(),
                      "train_mixed_" + tag);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    return read_json(d / (tag + ".json"))["training"]["recomputed_flops"].get<double>();
  };
  EXPECT_EQ(recomputed_flops(" --precision mixed", "remat_mixed"), recomputed_flops("", "remat_f32"));
  CmdResult bf16 = cli("simulate " + kGpt + " --mesh 2x2" + plan("dp") + kTrain + " --precision bf16", "train_bf16");
  EXPECT_NE(bf16.out.find("37 weights (1.02 MiB)"), std::string::npos) << bf16.out;  // the float32 step's 2.04
  CmdResult bad = cli("simulate " + kGpt + " --mesh 2x2" + kTrain + " --precision fp8", "train_fp8");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "error: --precision: 'fp8' is not bf16, mixed, autocast or f32\n");
}

/// `run MODEL --mesh MESH --shardings PLAN --training --loss mean --check`: expects exit 0, `weights` weights
/// trained and the check passed; returns the report (null when the run failed).
nlohmann::json run_check_mean_loss(const fs::path& model, const std::string& mesh, const fs::path& plan, int weights,
                                   const std::string& tag) {
  const fs::path report = scratch(tag) / "report.json";
  CmdResult r = cli("run " + model.string() + " --mesh " + mesh + " --shardings " + plan.string() +
                        " --training --loss mean --check --report " + report.string(),
                    tag);
  EXPECT_EQ(r.code, 0) << tag << "\n" << r.out << r.err;
  EXPECT_NE(r.out.find("training  one step: loss 'loss', " + std::to_string(weights) + " weights"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  return r.code == 0 ? read_json(report) : nlohmann::json();
}

// Other models' training steps: BERT (Megatron plan; data parallel through the batch of its three inputs), resnet18
// (data parallel; spatial: the backward convolutions exchange halos like the forward ones; channel: the batch over
// data and every conv's output channels over model, model parallel). Mean of the output.
TEST(Training, BertAndResnet18RunCheckPasses) {
  const std::string bert = " testdata/bert/bert_opset13.onnx --mesh 2x2 --training --loss mean --check";
  CmdResult r = cli("run" + bert + " --shardings testdata/bert/bert.megatron.sharding.json", "train_bert_megatron");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  fs::path d = scratch("train_bert_dp");
  {
    std::ofstream f(d / "dp.json");
    f << R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"]},
             "tensors": {"input_ids": [["data", "model"], null], "attention_mask": [["data", "model"], null],
                         "token_type_ids": [["data", "model"], null]}})";
  }
  r = cli("run" + bert + " --shardings " + (d / "dp.json").string(), "train_bert_dp");
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  const Export& e = exported("resnet18");
  ASSERT_TRUE(e.error.empty()) << e.error;
  for (const std::string& plan : {std::string("data"), std::string("spatial"), std::string("channel")})
    run_check_mean_loss(e.dir / "resnet18.onnx", plan == "spatial" ? "4" : "2x2",
                        "testdata/cnn/resnet18." + plan + ".sharding.json", 42, "train_resnet18_" + plan);
}

// A small torchvision VisionTransformer (testdata/training/export_models.py: 32x32 images, patches 8, 2 layers, 4
// heads, hidden 64, MLP 128), data parallel over 4 and Megatron (each encoder MLP's first Linear column-, second
// row-split over model): the step equals the unpartitioned one, and under Megatron each layer's MLP output is
// all-reduced over model in the forward pass (the plan does split the MLPs).
TEST(Training, VitRunCheckPasses) {
  const Export& e = exported_for_training("vit");
  ASSERT_TRUE(e.error.empty()) << e.error;
  for (const std::string& plan : {std::string("data"), std::string("megatron")}) {
    const nlohmann::json j =
        run_check_mean_loss(e.dir / "vit.onnx", "2x2", e.dir / (plan + ".plan.json"), 32, "train_vit_" + plan);
    if (plan != "megatron" || j.is_null()) continue;
    std::set<std::string> reduced;
    for (const auto& c : j["collectives"])
      if (c["kind"] == "all-reduce" && c["axes"] == nlohmann::json{"model"})
        reduced.insert(c["value"].get<std::string>());
    for (int k = 0; k < 2; ++k)
      EXPECT_TRUE(reduced.count("/encoder/layers/encoder_layer_" + std::to_string(k) + "/mlp/mlp.3/MatMul_output_0"))
          << k;
  }
}

// testdata/corpus/gen_moe.py's GShard top-2 MoE LM, small (export_models.py: G 4, S 8, M 16, E 4, C 4), under plan
// (a): groups and experts over one axis `expert` (4), with GShard's dispatch / combine annotations; and plan (b),
// expert x data 2x2. The integer routing (ArgMax, OneHot, the capacity CumSum over masks, comparisons) carries no
// gradient; the gates do (Softmax, the combine Einsum). Under (a) the forward's two all-to-alls stay, the expert
// weights' gradients need no collective (each device holds its expert's), and every other gradient is all-reduced
// once over `expert`, with its weight's bytes, plus the loss.
TEST(Training, MoeExpertPlanRunCheckPasses) {
  const Export& e = exported_for_training("moe");
  ASSERT_TRUE(e.error.empty()) << e.error;
  for (const auto& [plan, mesh] : {std::pair<std::string, std::string>{"expert4", "4"}, {"expert_data", "2x2"}}) {
    const nlohmann::json j =
        run_check_mean_loss(e.dir / "moe.onnx", mesh, e.dir / (plan + ".plan.json"), 20, "train_moe_" + plan);
    if (plan != "expert4" || j.is_null()) continue;
    std::multiset<int64_t> dense_bytes{4}, reduced_bytes;  // 4: the loss
    for (const auto& w : j["training"]["weights"])
      if (w["name"] != "h.1.moe.wi" && w["name"] != "h.1.moe.wo") dense_bytes.insert(w["bytes"].get<int64_t>());
    ASSERT_EQ(dense_bytes.size(), 19u);
    std::set<std::string> exchanged;
    for (const auto& c : j["collectives"]) {
      EXPECT_EQ(c["axes"], nlohmann::json{"expert"}) << c.dump();
      for (const char* w : {"h.1.moe.wi", "h.1.moe.wo"})
        EXPECT_EQ(c["value"].get<std::string>().rfind(w, 0), std::string::npos) << c.dump();
      if (c["kind"] == "all-to-all") exchanged.insert(c["value"].get<std::string>());
      if (c["kind"] == "all-reduce")
        for (int k = 0; k < c["count"]; ++k) reduced_bytes.insert(c["bytes"].get<int64_t>());
    }
    EXPECT_EQ(reduced_bytes, dense_bytes);
    EXPECT_TRUE(exchanged.count("/h.1/moe/Einsum_1_output_0"));   // dispatch: G split -> E split
    EXPECT_TRUE(exchanged.count("/h.1/moe/Reshape_1_output_0"));  // expert outputs back to G split
  }
}

// Data parallel: every weight's gradient is a partial sum over the batch axes, all-reduced once where the update
// needs it (the gradient itself, or lr times it: the reduction is deferred through the linear Mul), with the weight's
// bytes; the loss (a mean over the batch) is all-reduced once (4 bytes). Nothing else.
TEST(Training, DataParallelAllReducesEachGradientOnce) {
  fs::path d = scratch("train_dp_report");
  // Adam and Adafactor read the gradient twice (m and g^2; g^2 and g times the factors): it is reduced once, at its
  // source, not once per path.
  for (const std::string optimizer : {"sgd", "adam", "adafactor"}) {
    const fs::path rep = d / (optimizer + ".json");
    CmdResult r = cli("simulate " + kGpt + " --mesh 2x2" + plan("dp") + kTrain + " --optimizer " + optimizer +
                          " --report " + rep.string(),
                      "train_dp_report");
    ASSERT_EQ(r.code, 0) << r.err;
    nlohmann::json j = read_json(rep);
    std::multiset<int64_t> weight_bytes, reduced_bytes;
    for (const auto& w : j["training"]["weights"]) weight_bytes.insert(w["bytes"].get<int64_t>());
    ASSERT_EQ(weight_bytes.size(), 37u);  // 2 layers x 16, wte, the folded position table, ln_f x 2, lm_head
    weight_bytes.insert(4);               // the loss
    for (const auto& c : j["collectives"]) {
      EXPECT_EQ(c["kind"], "all-reduce") << optimizer << c.dump();
      EXPECT_EQ(c["axes"], (nlohmann::json{"data", "model"})) << optimizer << c.dump();
      for (int k = 0; k < c["count"]; ++k) reduced_bytes.insert(c["bytes"].get<int64_t>());
    }
    EXPECT_EQ(reduced_bytes, weight_bytes) << optimizer;
  }
}

// Weight-update sharding (--shard-update data, Xu et al. 2020; ZeRO-1/2) on a data-parallel mesh of 4: per weight
// matrix exactly one reduce-scatter of its gradient and one all-gather of its updated value, each of the weight's
// bytes, per vector one all-reduce of its gradient, plus the loss's all-reduce; Adam's two state tensors per weight are
// held as shards, so the peak memory per device drops; the step still equals the unpartitioned one.
TEST(Training, ShardUpdateReduceScattersAndAllGathersEachWeight) {
  fs::path d = scratch("train_shard_update");
  {
    std::ofstream f(d / "dp4.json");
    f << R"({"mesh": {"shape": [4], "axes": ["data"]}, "tensors": {"input_ids": ["data", null]}})";
  }
  const std::string base = "run " + kGpt + " --mesh 4 --shardings " + (d / "dp4.json").string() + kTrain +
                           " --optimizer adam --eps 1e-3 --check --report ";
  CmdResult r = cli(base + (d / "sharded.json").string() + " --shard-update data", "train_shard_update");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  CmdResult plain = cli(base + (d / "plain.json").string(), "train_shard_update_plain");
  ASSERT_EQ(plain.code, 0) << plain.out << plain.err;
  nlohmann::json j = read_json(d / "sharded.json"), p = read_json(d / "plain.json");
  // Matrices: their update sharded. Vectors (biases, LayerNorm scales), not annotated, are left to propagation with
  // their updates: each gradient all-reduced.
  std::multiset<int64_t> weight_bytes, vector_bytes, scattered, gathered, reduced;
  for (const auto& w : j["training"]["weights"])
    (w["shape"].size() >= 2 ? weight_bytes : vector_bytes).insert(w["bytes"].get<int64_t>());
  ASSERT_EQ(weight_bytes.size() + vector_bytes.size(), 37u);
  ASSERT_EQ(weight_bytes.size(), 15u);  // wte, lm_head, the position table, 6 per layer
  for (const auto& c : j["collectives"]) {
    EXPECT_EQ(c["axes"], nlohmann::json{"data"}) << c.dump();
    for (int k = 0; k < c["count"]; ++k) {
      if (c["kind"] == "reduce-scatter") scattered.insert(c["bytes"].get<int64_t>());
      if (c["kind"] == "all-gather") {
        gathered.insert(c["bytes"].get<int64_t>());
        EXPECT_TRUE(c["value"].get<std::string>().ends_with(".updated")) << c.dump();
      }
      if (c["kind"] == "all-reduce") reduced.insert(c["bytes"].get<int64_t>());
    }
  }
  EXPECT_EQ(scattered, weight_bytes);
  EXPECT_EQ(gathered, weight_bytes);
  vector_bytes.insert(4);  // the loss
  EXPECT_EQ(reduced, vector_bytes);
  EXPECT_LT(j["simulated"]["per_device"][0]["peak_memory_bytes"].get<int64_t>(),
            p["simulated"]["per_device"][0]["peak_memory_bytes"].get<int64_t>());
  CmdResult bad = cli("run " + kGpt + " --mesh 4" + kTrain + " --shard-update model", "train_shard_update_bad");
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.err, "error: --shard-update: 'model' is not an axis of the mesh {x=4}\n");
}

// The memory breakdown of one decoder layer (testdata/tools/make_decoder.py: vocab 0, D 64, 4 heads, MLP 4D, batch 4,
// sequence 16, its causal mask a float initializer), data parallel over 2 devices, Adam, checked by hand. Per device:
//   trained weights P floats: q, k, v, proj 4(D^2 + D), fc_in D*4D + 4D, fc_out 4D*D + D, three LayerNorms 3*2D, the
//   mask S^2 -> 50368 floats, replicated: weights 4P bytes, gradients 4P, Adam's m and v 8P (updated in place:
//   donated); --shard-update data halves the gradients and the state of the matrices (every dim divides by 2), not
//   of the V = 15D floats of vectors (biases 4D + 4D + D, LayerNorms 6D), which are not annotated;
//   inputs: x [B/2, S, D]; saved activations, T = B/2 * S tokens: 8 [T, D] values (LN_1's output, Q, K, V, the
//   attention output before proj, the residual after attention, LN_2's output, the last residual), the softmax
//   probabilities [T, H*S], the Erf-form GELU's four [T, 4D] values (h/sqrt2, 1 + erf, h/2, its output), and the
//   three LayerNorms' Mean and InvStdDev, [T, 1] each, which their gradients read instead of recomputing.
// The peak is the sum of what is live then, and the emulator measures the same peak as the static estimate.
TEST(Training, MemoryBreakdownOfOneLayerByHand) {
  fs::path d = scratch("train_memory");
  ASSERT_TRUE(fs::exists(make_decoder(d, "l1",
                                      "--layers 1 --d-model 64 --heads 4 --vocab 0 --batch 4 --seq 16 --weights random",
                                      "train_memory_make")));
  {
    std::ofstream f(d / "dp.json");
    f << R"({"mesh": {"shape": [2], "axes": ["data"]}, "tensors": {"x": ["data", null, null]}})";
  }
  const int64_t D = 64, H = 4, S = 16, T = 2 * S;
  const int64_t P = 4 * (D * D + D) + (D * 4 * D + 4 * D) + (4 * D * D + D) + 3 * 2 * D + S * S;
  ASSERT_EQ(P, 50368);
  const int64_t V = 4 * D + 4 * D + D + 3 * 2 * D;
  const std::string base = "simulate " + (d / "l1.onnx").string() + " --mesh 2 --shardings " +
                           (d / "dp.json").string() + " --training --loss mean --optimizer adam --report ";
  for (const bool sharded : {false, true}) {
    const fs::path rep = d / (sharded ? "sharded.json" : "plain.json");
    CmdResult r = cli(base + rep.string() + (sharded ? " --shard-update data" : ""), "train_memory_simulate");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    const nlohmann::json m = read_json(rep)["simulated"]["memory"];
    EXPECT_EQ(m["total"]["weights"], 4 * P) << m.dump();
    const int64_t updated = sharded ? (P - V) / 2 + V : P;  // floats per device of each gradient-shaped tensor
    EXPECT_EQ(m["total"]["gradients"], 4 * updated) << m.dump();
    EXPECT_EQ(m["total"]["optimizer_state"], 8 * updated) << m.dump();
    EXPECT_EQ(m["total"]["inputs"], 4 * T * D) << m.dump();
    EXPECT_EQ(m["total"]["saved_activations"], 4 * T * (8 * D + H * S + 4 * 4 * D + 3 * 2)) << m.dump();
    int64_t sum = 0;
    for (const auto& [kind, bytes] : m["at_peak"].items()) sum += bytes.get<int64_t>();
    EXPECT_EQ(sum, m["peak_bytes"]) << m.dump();
    EXPECT_GE(m["at_peak"]["optimizer_state"], 8 * updated) << m.dump();  // held all step
    EXPECT_NE(r.out.find("memory    "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" per device at peak (static estimate: weights "), std::string::npos) << r.out;
  }
  // The emulator frees the donated weights and state after their last reader too: its measured peak is the same.
  const fs::path run_rep = d / "run.json";
  CmdResult r = cli("run " + (d / "l1.onnx").string() + " --mesh 2 --shardings " + (d / "dp.json").string() +
                        " --training --loss mean --optimizer adam --check --report " + run_rep.string(),
                    "train_memory_run");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json run = read_json(run_rep), sim = read_json(d / "plain.json");
  for (const auto& dev : run["simulated"]["per_device"])
    EXPECT_EQ(dev["peak_memory_bytes"], sim["simulated"]["memory"]["peak_bytes"]) << dev.dump();
}

// --auto with --training costs the training step's memory (donated weights and state, gradients, saved
// activations): under a limit that only one classical plan meets, it finds one at least as fast, and its peak is the
// report's.
TEST(Training, AutoChoosesByTrainingStepMemory) {
  fs::path d = scratch("train_auto");
  CmdResult r = cli("simulate " + kGpt + " --mesh 2x2 --training --loss mean --optimizer adam --auto --memory-limit " +
                        "7000000 --report " + (d / "r.json").string(),
                    "train_auto");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = read_json(d / "r.json");
  const int64_t chosen = j["auto"]["chosen"]["peak_memory_bytes"].get<int64_t>();
  EXPECT_LE(chosen, 7000000);
  EXPECT_EQ(chosen, j["simulated"]["memory"]["peak_bytes"]);
  // Data parallelism and Megatron do not fit; FSDP (ZeRO-3) does, and the search's plan is no slower than any
  // classical plan that fits.
  const double step = j["auto"]["chosen"]["step_time_s"].get<double>();
  std::set<std::string> fitting;
  for (const auto& b : j["auto"]["baselines"]) {
    if (!b["fits"].get<bool>()) {
      EXPECT_GT(b["peak_memory_bytes"].get<int64_t>(), 7000000) << b.dump();
      continue;
    }
    fitting.insert(b["name"].get<std::string>());
    EXPECT_LE(step, b["step_time_s"].get<double>()) << b.dump();
  }
  EXPECT_EQ(fitting, std::set<std::string>{"fsdp"});
  EXPECT_GT(j["simulated"]["memory"]["at_peak"]["optimizer_state"].get<int64_t>(), 0);
}

// partition --training writes one training-step model per device: after the data inputs, every weight slice and
// optimizer-state slice is an input (its initializer the default), paired by name with its updated output.
TEST(Training, DeviceFilesTakeWeightsAndStateAsInputs) {
  fs::path d = scratch("train_export");
  CmdResult r = cli("partition " + kGpt + " --mesh 2x2" + plan("megatron") + kTrain + " --optimizer adam --output " +
                        (d / "out").string(),
                    "train_export");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  CmdResult py = inspect_device_file(d / "out" / "device_3.onnx",
                                     "state = ins[2:]\n"
                                     "print(ins[:2], len(state), len(outs))\n"
                                     "print(sum(s + '.updated' in outs and s in inits for s in state))",
                                     "train_export_inspect");
  ASSERT_EQ(py.code, 0) << py.out << py.err;
  // 37 weights, each with Adam's m and v: 111 state inputs, all paired; outputs: the loss and 111 updated values.
  EXPECT_EQ(py.out, "['input_ids', 'labels'] 111 112\n111\n");
}

// --remat on the bundled GPT (Megatron 2x2): the step still equals the unpartitioned one; keeping only the cut
// values (full) or also the matmul outputs (dots) saves fewer activations and lowers the peak, at the price of
// recomputed FLOPs; only what the backward reads is recomputed, so no forward all-reduce is repeated.
TEST(Training, RematTradesSavedActivationsForRecompute) {
  fs::path d = scratch("train_remat");
  std::map<std::string, nlohmann::json> rep;
  for (const std::string policy : {"none", "full", "dots"}) {
    CmdResult r = cli("run " + kGpt + " --mesh 2x2" + plan("megatron") + kTrain + " --remat " + policy +
                          " --check --report " + (d / (policy + ".json")).string(),
                      "train_remat_" + policy);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("remat     ") != std::string::npos, policy != "none") << r.out;
    rep[policy] = read_json(d / (policy + ".json"));
  }
  const auto saved = [&](const std::string& p) {
    return rep[p]["simulated"]["memory"]["total"]["saved_activations"].get<int64_t>();
  };
  const auto peak = [&](const std::string& p) { return rep[p]["simulated"]["memory"]["peak_bytes"].get<int64_t>(); };
  const auto flops = [&](const std::string& p) { return rep[p]["training"]["recomputed_flops"].get<double>(); };
  EXPECT_LT(saved("full"), saved("dots"));
  EXPECT_LT(saved("dots"), saved("none"));
  EXPECT_LT(peak("full"), peak("none"));
  EXPECT_EQ(flops("none"), 0);
  EXPECT_GT(flops("full"), flops("dots"));
  EXPECT_GT(flops("dots"), 0);
  for (const std::string p : {"full", "dots"}) {
    EXPECT_EQ(rep[p]["model_flops"], rep["none"]["model_flops"]) << p;  // recomputation is not model work
    EXPECT_EQ(count_collectives(rep[p], "all-reduce"), count_collectives(rep["none"], "all-reduce")) << p;
  }
}

// Bad training flags: one line naming the flag and the problem, exit 2.
TEST(Training, BadFlagsAreOneLineErrors) {
  struct Bad {
    std::string args, message;
  };
  const std::vector<Bad> cases = {
      {" --training",
       "error: --training: output 0 'logits' is float32[8,64,512], not a scalar: choose --loss mean, sum or "
       "cross-entropy:LABELS\n"},
      {" --training --loss median", "error: --loss: 'median' is not output, mean, sum or cross-entropy:LABELS\n"},
      {kTrain + " --optimizer lamb", "error: --optimizer: 'lamb' is not sgd, momentum, adam or adafactor\n"},
      {kTrain + " --remat some", "error: --remat: 'some' is not none, full or dots\n"},
      {" --remat full", "error: --remat: only used with --training\n"},
      {kTrain + " --trainable nothing_matches",
       "error: --trainable: 'nothing_matches' matches no float initializer or graph input\n"},
      {kTrain + " --trainable '('", "error: --trainable: '(' is not a regular expression RE2 accepts: missing ): (\n"},
      {" --training --loss cross-entropy:input_ids --trainable wte",
       ""},  // input_ids is int64 [8,64]: valid labels (predict the input)
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    CmdResult r = cli("run " + kGpt + " --mesh 1" + cases[k].args, "train_bad_" + std::to_string(k));
    if (cases[k].message.empty()) {
      EXPECT_EQ(r.code, 0) << cases[k].args << r.err;
      continue;
    }
    EXPECT_EQ(r.code, 2) << cases[k].args;
    EXPECT_EQ(r.err, cases[k].message) << cases[k].args;
  }
}

// An op on the path from a weight to the loss without a gradient rule is named.
TEST(Training, OpWithoutGradientRuleIsNamed) {
  fs::path d = scratch("train_no_rule");
  const std::string py =
      "import onnx, numpy as np\n"
      "from onnx import helper as h, TensorProto as T, numpy_helper as nh\n"
      "w = nh.from_array(np.ones((4, 4), np.float32), 'w')\n"
      "n = [h.make_node('MatMul', ['x', 'w'], ['m'], name='mm'), h.make_node('Hardmax', ['m'], ['y'], name='hm')]\n"
      "g = h.make_graph(n, 'g', [h.make_tensor_value_info('x', T.FLOAT, [2, 4])],\n"
      "                 [h.make_tensor_value_info('y', T.FLOAT, [2, 4])], [w])\n"
      "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid('', 13)]), '" +
      (d / "m.onnx").string() + "')\n";
  {
    std::ofstream f(d / "make.py");
    f << py;
  }
  ASSERT_EQ(sh(debian_python() + " " + (d / "make.py").string(), "train_no_rule_py").code, 0);
  CmdResult r = cli("run " + (d / "m.onnx").string() + " --mesh 1 --training --loss sum", "train_no_rule");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --training: node 'hm' (Hardmax): no gradient rule for Hardmax\n");
}

}  // namespace
}  // namespace e2e
