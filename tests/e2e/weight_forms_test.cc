// End-to-end on models that list their weights in the other forms real ONNX files use (issue 3: "including models
// that list their weights as ConstantOfShape outputs or as IR-3 graph inputs"):
//   - IR 3: every initializer is also a graph input, ir_version 3;
//   - initializers as inputs at the model's own IR version (torch's keep_initializers_as_inputs=True);
//   - ConstantOfShape: weights whose elements are all equal are the outputs of ConstantOfShape nodes.
// The forms are generated at test time by testdata/tools/weight_forms.py from the bundled GPT
// (testdata/gpt/gpt_opset17.onnx) and from torchvision's mobilenet_v2 (exported by testdata/cnn/export_cnn.py, shared
// with cnn_test.cc), into build/e2e-scratch/weight_forms/. Every form is run with `gspmd-onnx run --check` under
// Megatron / 2D / data / channel / spatial / uneven sharding files on 4, 6, 9 and 16 devices, whose annotations name
// weights that are now graph inputs or ConstantOfShape outputs. Each run must pass its check AND agree with the same
// run of the model with plain initializers: bit-identical outputs and the identical list of collectives.
//
// The GPT's exporter randomises biases and LayerNorm gains on purpose, so it has no uniform weight: the tool first
// overwrites them with uniform values that are not an identity (biases 0.03, gains 1.25; a dropped or
// double-counted bias still changes the output), and the ConstantOfShape form is compared with the model that has
// the same overrides as initializers. mobilenet_v2's classifier bias is zero by torchvision's init (a genuinely
// uniform weight); a few conv biases are overwritten with 0.05 for the same reason.
//
// Needs Debian's /usr/bin/python3 with onnx and numpy (and torch + torchvision for mobilenet_v2).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cnn_export.h"
#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

const fs::path kGptDir = fs::path(GSPMD_SOURCE_DIR) / "testdata" / "gpt";
const std::string kTool = "testdata/tools/weight_forms.py";

// The GPT overrides: every bias (q/k/v/proj/fc_in/fc_out, the LayerNorm shifts) and every LayerNorm gain.
const std::string kGptUniform =
    "--set-uniform '\\.bias$=0.03' --set-uniform '^(h\\.[0-9]+\\.ln_[0-9]|ln_f)\\.weight$=1.25'";
// mobilenet_v2: the biases (folded BatchNorm shifts) of blocks 1, 17 and 18; classifier.1.bias is already 0.
const std::string kMobilenetUniform = "--set-uniform '^features\\.(1|17|18)\\..*\\.bias$=0.05'";

fs::path work_dir() {
  static fs::path d = [] {
    fs::path p = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "weight_forms";
    fs::create_directories(p);
    return p;
  }();
  return d;
}

/// What an .onnx file really holds, read back independently of the tool (python + onnx).
struct Inspect {
  int64_t ir_version = -1;
  std::vector<std::string> constant_of_shape;  // outputs of ConstantOfShape nodes
  std::set<std::string> inputs, initializers;
};

Inspect inspect(const fs::path& model) {
  // Per process (ctest may run the tests in parallel); not "inspect.py", which would shadow python's own module.
  fs::path script = work_dir() / ("wf_inspect_" + std::to_string(getpid()) + ".py");
  std::ofstream(script) << "import json, sys, onnx\n"
                           "m = onnx.load(sys.argv[1])\n"
                           "print(json.dumps({'ir_version': m.ir_version,\n"
                           "  'cos': [n.output[0] for n in m.graph.node if n.op_type == 'ConstantOfShape'],\n"
                           "  'inputs': [i.name for i in m.graph.input],\n"
                           "  'inits': [t.name for t in m.graph.initializer]}))\n";
  CmdResult r =
      sh(debian_python() + " -I " + script.string() + " " + model.string(), "wf_inspect_" + model.stem().string());
  Inspect in;
  if (r.code != 0) {
    ADD_FAILURE() << "inspect " << model << ": " << r.out << r.err;
    return in;
  }
  auto j = nlohmann::json::parse(r.out);
  in.ir_version = j["ir_version"].get<int64_t>();
  in.constant_of_shape = j["cos"].get<std::vector<std::string>>();
  for (const auto& s : j["inputs"]) in.inputs.insert(s.get<std::string>());
  for (const auto& s : j["inits"]) in.initializers.insert(s.get<std::string>());
  return in;
}

/// Runs the tool on `src` with `args`; returns the written model (empty path after a failure).
fs::path rewrite(const fs::path& src, const std::string& name, const std::string& args) {
  fs::path out = work_dir() / (name + ".onnx");
  fs::remove(out);
  CmdResult r =
      sh(debian_python() + " " + kTool + " " + src.string() + " -o " + out.string() + " " + args, "wf_" + name);
  if (r.code != 0 || !fs::exists(out)) {
    ADD_FAILURE() << kTool << " " << args << " failed (exit " << r.code << "):\n" << r.out << r.err;
    return {};
  }
  return out;
}

struct Case {
  std::string name, mesh;
  fs::path sidecar;
};

struct Outcome {
  bool ok = false;
  nlohmann::json report;
  gspmd::Tensor output;
};

/// `run --check` with `--inputs`; fails the test unless it exits 0 and the check passed.
Outcome run_check(const fs::path& model, const Case& c, const fs::path& inputs, const std::string& tag) {
  fs::path dir = scratch("wf_" + tag);
  CmdResult r = cli("run " + model.string() + " --mesh " + c.mesh + " --shardings " + c.sidecar.string() +
                        " --inputs " + inputs.string() + " --check --report " + (dir / "report.json").string() +
                        " --outputs " + (dir / "out").string(),
                    "wf_" + tag);
  Outcome o;
  EXPECT_EQ(r.code, 0) << tag << ":\n" << r.out << r.err;
  if (r.code != 0 || !fs::exists(dir / "report.json")) return o;
  o.report = read_json(dir / "report.json");
  EXPECT_TRUE(o.report["check"]["passed"].get<bool>()) << tag << ": " << o.report["check"].dump();
  o.output = gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string());
  o.ok = o.report["check"]["passed"].get<bool>();
  return o;
}

/// Every collective of a report, one line each: kind, axes, bytes, count, node, value.
std::vector<std::string> collectives(const nlohmann::json& rep) {
  std::vector<std::string> v;
  for (const auto& c : rep["collectives"])
    v.push_back(c["kind"].get<std::string>() + " " + c["axes"].dump() + " " +
                std::to_string(c["bytes"].get<int64_t>()) + " x" + std::to_string(c["count"].get<int>()) + " at " +
                c["node"].get<std::string>() + " (" + c["value"].get<std::string>() + ")");
  return v;
}

bool bit_identical(const gspmd::Tensor& a, const gspmd::Tensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes() &&
         std::memcmp(a.bytes.data(), b.bytes.data(), a.nbytes()) == 0;
}

/// Max |a-b| <= atol + rtol*|b| (b: torch's output).
void expect_close(const gspmd::Tensor& a, const gspmd::Tensor& b, double rtol, double atol) {
  ASSERT_EQ(a.shape, b.shape);
  ASSERT_EQ(a.dtype, gspmd::DType::kFloat32);
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i], err = std::fabs(x - y);
    if (!(err <= atol + rtol * std::fabs(y))) ++bad;
    worst = std::max(worst, err);
  }
  EXPECT_EQ(bad, 0) << "worst abs error " << worst;
}

/// Runs `form` and `ref` (the same model with plain initializers) under every case: both pass --check, and the form
/// gives bit-identical outputs and the same collectives. Returns the form's outcomes, by case name.
std::map<std::string, Outcome> expect_same_as_reference(const fs::path& form, const fs::path& ref,
                                                        const std::vector<Case>& cases, const fs::path& inputs,
                                                        const std::string& tag) {
  std::map<std::string, Outcome> outcomes;
  for (const Case& c : cases) {
    SCOPED_TRACE(tag + " " + c.name + " on " + c.mesh);
    auto t0 = std::chrono::steady_clock::now();
    Outcome want = run_check(ref, c, inputs, tag + "_" + c.name + "_ref");
    Outcome got = run_check(form, c, inputs, tag + "_" + c.name);
    std::printf("[ run      ] %s %s (%s): %.2f s\n", tag.c_str(), c.name.c_str(), c.mesh.c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!want.ok || !got.ok) continue;
    EXPECT_TRUE(bit_identical(got.output, want.output)) << "outputs differ from the plain-initializer model";
    EXPECT_EQ(collectives(got.report), collectives(want.report));
    EXPECT_EQ(got.report["warnings"], want.report["warnings"]);
    outcomes[c.name] = std::move(got);
  }
  return outcomes;
}

// ---------------------------------------------------------------------------------------------------------------
// GPT (testdata/gpt/gpt_opset17.onnx: 2 layers, d 128, 4 heads, vocab 512, B 8, S 64)

std::vector<Case> gpt_cases() {
  return {
      {"megatron", "2x2", kGptDir / "gpt.megatron.sharding.json"},  // Megatron over model, batch over data
      {"2d", "4x4", kGptDir / "gpt.2d.sharding.json"},              // the same specs on 16 devices
      {"data", "2x2", kGptDir / "gpt.dp.sharding.json"},            // batch over data x model
      {"uneven", "3x3", kGptDir / "gpt.megatron.sharding.json"},    // batch 8, heads 4, d 128, vocab 512 over 3
  };
}

/// The Megatron plan of the normal export: 5 all-reduces over {model} of one [B/2, S, D] float32 activation each
/// (the vocab-parallel embedding, then attention output and MLP output of both blocks), and nothing else. The 2D
/// plan has the same 5 on [B/4, S, D].
void expect_megatron_plan(const std::map<std::string, Outcome>& outcomes) {
  const std::vector<std::string> nodes = {"/Add", "/h.0/attn/proj/Add", "/h.0/mlp/fc_out/Add", "/h.1/attn/proj/Add",
                                          "/h.1/mlp/fc_out/Add"};
  for (const auto& [name, bytes] : {std::pair<std::string, int64_t>{"megatron", 4 * 64 * 128 * 4},
                                    std::pair<std::string, int64_t>{"2d", 2 * 64 * 128 * 4}}) {
    auto it = outcomes.find(name);
    if (it == outcomes.end()) continue;  // already failed
    const auto& rep = it->second.report;
    ASSERT_EQ(rep["collectives"].size(), 5u) << name << ": " << rep["collectives"].dump(1);
    for (size_t i = 0; i < 5; ++i) {
      const auto& c = rep["collectives"][i];
      EXPECT_EQ(c["kind"], "all-reduce") << c.dump();
      EXPECT_EQ(c["axes"], nlohmann::json::array({"model"})) << c.dump();
      EXPECT_EQ(c["bytes"].get<int64_t>(), bytes) << c.dump();
      EXPECT_EQ(c["count"].get<int>(), 1) << c.dump();
      EXPECT_EQ(c["node"], nodes[i]) << c.dump();
    }
  }
  if (outcomes.count("data")) {
    EXPECT_EQ(outcomes.at("data").report["collectives"].size(), 0u);
  }
}

/// `partition -o` of `model` under the Megatron file; returns shardings.json's tensors.
nlohmann::json megatron_shardings(const fs::path& model, const std::string& tag) {
  fs::path dir = scratch("wf_" + tag + "_partition");
  CmdResult r = cli("partition " + model.string() + " --mesh 2x2 --shardings " +
                        (kGptDir / "gpt.megatron.sharding.json").string() + " -o " + (dir / "out").string(),
                    "wf_" + tag + "_partition");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  if (r.code != 0) return nlohmann::json::object();
  return read_json(dir / "out" / "shardings.json")["tensors"];
}

/// Every value of the plain model has the same sharding in `form`, and the weights that moved into another form
/// (`moved`) keep their annotation.
void expect_same_shardings(const fs::path& form, const fs::path& ref, const std::vector<std::string>& moved,
                           const std::string& tag) {
  nlohmann::json got = megatron_shardings(form, tag), want = megatron_shardings(ref, tag + "_ref");
  ASSERT_FALSE(want.empty());
  for (const auto& [name, spec] : want.items()) EXPECT_EQ(got[name], spec) << tag << ": " << name;
  for (const std::string& w : moved) {
    if (w.find("attn.q.bias") != std::string::npos || w.find("fc_in.bias") != std::string::npos) {
      EXPECT_EQ(got[w], nlohmann::json::array({"model"})) << w;  // annotated ["model"] by the Megatron file
    }
  }
}

const std::vector<std::string>& gpt_uniform_weights() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> w;
    for (int l = 0; l < 2; ++l) {
      std::string p = "h." + std::to_string(l) + ".";
      for (std::string s : {"ln_1.weight", "ln_1.bias", "attn.q.bias", "attn.k.bias", "attn.v.bias", "attn.proj.bias",
                            "ln_2.weight", "ln_2.bias", "mlp.fc_in.bias", "mlp.fc_out.bias"})
        w.push_back(p + s);
    }
    w.push_back("ln_f.weight");
    w.push_back("ln_f.bias");
    return w;
  }();
  return v;
}

TEST(WeightForms, GptConstantOfShapeWeights) {
  fs::path ref = rewrite(kGptDir / "gpt_opset17.onnx", "gpt_uniform", kGptUniform);
  fs::path form = rewrite(kGptDir / "gpt_opset17.onnx", "gpt_cos", kGptUniform + " --constant-of-shape");
  ASSERT_FALSE(ref.empty() || form.empty());
  // The file really has the 22 biases and gains as ConstantOfShape outputs, not as initializers.
  Inspect in = inspect(form);
  EXPECT_EQ(in.constant_of_shape, gpt_uniform_weights());
  for (const std::string& w : gpt_uniform_weights()) EXPECT_FALSE(in.initializers.count(w)) << w;
  EXPECT_TRUE(in.initializers.count("h.0.attn.q.weight"));
  expect_megatron_plan(expect_same_as_reference(form, ref, gpt_cases(), kGptDir / "test_data_set_0", "gpt_cos"));
  expect_same_shardings(form, ref, gpt_uniform_weights(), "gpt_cos");
}

TEST(WeightForms, GptInitializersAsGraphInputs) {
  // torch's keep_initializers_as_inputs=True form (ir_version stays 8). Outputs equal torch's too.
  fs::path plain = kGptDir / "gpt_opset17.onnx";
  fs::path form = rewrite(plain, "gpt_inputs", "--initializers-as-inputs");
  ASSERT_FALSE(form.empty());
  Inspect in = inspect(form);
  EXPECT_EQ(in.ir_version, 8);
  EXPECT_EQ(in.inputs.size(), 1 + in.initializers.size());
  for (const std::string& w : in.initializers) EXPECT_TRUE(in.inputs.count(w)) << w;
  auto outcomes = expect_same_as_reference(form, plain, gpt_cases(), kGptDir / "test_data_set_0", "gpt_inputs");
  expect_megatron_plan(outcomes);
  gspmd::Tensor torch_out = gspmd::read_tensor_pb((kGptDir / "test_data_set_0" / "output_0.pb").string());
  for (const auto& [name, o] : outcomes) {
    SCOPED_TRACE(name);
    expect_close(o.output, torch_out, 1e-4, 1e-4);
  }
  expect_same_shardings(form, plain, {}, "gpt_inputs");
}

// IR 3, plain and combined with ConstantOfShape weights. A regression test: the committed loader (HEAD) could not
// load this file. For shape inference it turns every Constant node into a proto initializer that is not a graph input,
// and ONNX's shape inference ignores such initializers when ir_version < 4, so the GPT's rank-0 -inf Constant (the
// Where of the causal mask) had no type: "shape inference failed: ... (op_type:Where, node name: /h.0/attn/Where):
// [TypeInferenceError] Input 1 expected to have type but instead is null". The same file at ir_version 4..8 loaded.
// (The loader now hands ONNX an IR-4 proto.) The smallest reproduction is WeightFormsRepro.Ir3ConstantNodeFeedingAnOp.
TEST(WeightForms, GptIr3GraphInputs) {
  fs::path plain = kGptDir / "gpt_opset17.onnx";
  fs::path ref = rewrite(plain, "gpt_ir3_ref", kGptUniform);
  fs::path ir3 = rewrite(plain, "gpt_ir3", "--ir3");
  fs::path both = rewrite(plain, "gpt_ir3_cos", kGptUniform + " --ir3 --constant-of-shape");
  ASSERT_FALSE(ref.empty() || ir3.empty() || both.empty());
  Inspect in = inspect(ir3);
  EXPECT_EQ(in.ir_version, 3);
  for (const std::string& w : in.initializers) EXPECT_TRUE(in.inputs.count(w)) << w;
  Inspect in2 = inspect(both);
  EXPECT_EQ(in2.ir_version, 3);
  EXPECT_EQ(in2.constant_of_shape, gpt_uniform_weights());
  for (const std::string& w : in2.initializers) EXPECT_TRUE(in2.inputs.count(w)) << w;
  expect_megatron_plan(expect_same_as_reference(ir3, plain, gpt_cases(), kGptDir / "test_data_set_0", "gpt_ir3"));
  expect_megatron_plan(expect_same_as_reference(both, ref, gpt_cases(), kGptDir / "test_data_set_0", "gpt_ir3_cos"));
}

// ---------------------------------------------------------------------------------------------------------------
// mobilenet_v2 (batch 16, 64x64, opset 13; 70 Constant nodes feed its Clips)

/// Sidecars for mobilenet_v2 whose annotations name the weights that the forms move: conv biases and the classifier.
/// Written per test (`tag`): ctest may run the tests in parallel processes.
std::vector<Case> mobilenet_cases(const std::string& tag) {
  fs::path d = work_dir();
  auto write = [&](const std::string& name, const std::string& text) {
    fs::path p = d / (tag + ".mobilenet_v2." + name + ".sharding.json");
    std::ofstream(p) << text;
    return p;
  };
  const std::string conv_rule =
      R"("rules": [{"match": "^features\\..*\\.weight$", "spec": ["model", null, null, null]}])";
  return {
      // Data parallel over 4 devices; the ConstantOfShape biases are annotated replicated.
      {"data", "2x2", write("data", R"({"mesh": {"shape": [2, 2], "axes": ["data", "model"]}, "tensors": {
  "input": [["data", "model"], null, null, null], "features.18.0.bias": [null], "classifier.1.bias": [null]}})")},
      // Channel parallel over 16: conv output channels over model; the classifier column-parallel.
      {"channel16", "4x4",
       write("channel16", R"({"mesh": {"shape": [4, 4], "axes": ["data", "model"]}, "tensors": {
  "input": ["data", null, null, null], "features.18.0.bias": ["model"], "features.17.conv.1.0.bias": ["model"],
  "classifier.1.weight": ["model", null], "classifier.1.bias": ["model"]}, )" +
                              conv_rule + "}")},
      // Spatial over 16: H over x, W over y.
      {"spatial16", "4x4", write("spatial16", R"({"mesh": {"shape": [4, 4], "axes": ["x", "y"]}, "tensors": {
  "input": [null, null, "x", "y"], "features.1.conv.1.bias": [null], "classifier.1.bias": [null]}})")},
      // Uneven over 6: channels (32, 16, 96, ... and 1280) over 3; the classifier row-parallel over 1280/3, so its
      // bias must be added on one tile of the partial sums only.
      {"uneven", "2x3",
       write("uneven", R"({"mesh": {"shape": [2, 3], "axes": ["data", "model"]}, "tensors": {
  "input": ["data", null, null, null], "features.18.0.bias": ["model"], "features.1.conv.1.bias": ["model"],
  "classifier.1.weight": [null, "model"], "classifier.1.bias": [null]}, )" +
                           conv_rule + "}")},
  };
}

TEST(WeightForms, MobilenetConstantOfShapeWeights) {
  const Export& e = exported("mobilenet_v2");
  ASSERT_TRUE(e.error.empty()) << e.error;
  fs::path src = e.dir / "mobilenet_v2.onnx";
  fs::path ref = rewrite(src, "mobilenet_uniform", kMobilenetUniform);
  fs::path form = rewrite(src, "mobilenet_cos", kMobilenetUniform + " --constant-of-shape");
  ASSERT_FALSE(ref.empty() || form.empty());
  Inspect in = inspect(form);
  EXPECT_EQ(in.constant_of_shape,
            (std::vector<std::string>{"classifier.1.bias", "features.1.conv.0.0.bias", "features.1.conv.1.bias",
                                      "features.17.conv.0.0.bias", "features.17.conv.1.0.bias",
                                      "features.17.conv.2.bias", "features.18.0.bias"}));
  auto outcomes =
      expect_same_as_reference(form, ref, mobilenet_cases("cos"), e.dir / "test_data_set_0", "mobilenet_cos");
  EXPECT_EQ(outcomes.size(), 4u);
  if (outcomes.count("data")) {
    EXPECT_EQ(outcomes.at("data").report["collectives"].size(), 0u);
  }
  if (outcomes.count("spatial16")) {
    EXPECT_GT(count_collectives(outcomes.at("spatial16").report, "collective-permute"), 0);
  }
  if (outcomes.count("channel16")) {
    EXPECT_EQ(outcomes.at("channel16").report["devices"].get<int>(), 16);
  }
}

TEST(WeightForms, MobilenetIr3GraphInputs) {
  const Export& e = exported("mobilenet_v2");
  ASSERT_TRUE(e.error.empty()) << e.error;
  fs::path src = e.dir / "mobilenet_v2.onnx";
  fs::path form = rewrite(src, "mobilenet_ir3", "--ir3");
  ASSERT_FALSE(form.empty());
  Inspect in = inspect(form);
  EXPECT_EQ(in.ir_version, 3);
  EXPECT_EQ(in.initializers.size(), 106u);
  EXPECT_EQ(in.inputs.size(), 107u);
  for (const std::string& w : in.initializers) EXPECT_TRUE(in.inputs.count(w)) << w;
  auto outcomes =
      expect_same_as_reference(form, src, mobilenet_cases("ir3"), e.dir / "test_data_set_0", "mobilenet_ir3");
  EXPECT_EQ(outcomes.size(), 4u);
  // With torch's own weights the partitioned outputs equal torch's, within convolution rounding.
  gspmd::Tensor torch_out = gspmd::read_tensor_pb((e.dir / "test_data_set_0" / "output_0.pb").string());
  for (const auto& [name, o] : outcomes) {
    SCOPED_TRACE(name);
    expect_close(o.output, torch_out, 1e-4, 1e-4);
  }
}

// The smallest reproduction of the IR-3 loader bug behind WeightForms.GptIr3GraphInputs:
// x -> Relu -> Mul(., Constant 0.5) -> Softmax -> y, opset 13. The onnx checker and ONNX's strict shape inference
// accept it at ir_version 3 and 4. The committed loader loaded it at ir_version 4 but not at 3 ("value 'm' (output of
// node 'mul' (Mul)) has no static shape after shape inference and constant folding"): it handed the Constant to ONNX
// shape inference as an initializer that is not a graph input, which IR < 4 inference does not type.
TEST(WeightFormsRepro, Ir3ConstantNodeFeedingAnOp) {
  fs::path script = work_dir() / "make_ir3_constant.py";
  std::ofstream(script) << R"(import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper, TensorProto
x = h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
y = h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
nodes = [h.make_node("Constant", [], ["c"], name="c", value=numpy_helper.from_array(np.array(0.5, np.float32))),
         h.make_node("Relu", ["x"], ["r"], name="relu"),
         h.make_node("Mul", ["r", "c"], ["m"], name="mul"),
         h.make_node("Softmax", ["m"], ["y"], name="sm", axis=-1)]
for ir in (3, 4):
    m = h.make_model(h.make_graph(nodes, "g", [x], [y]), opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = ir
    onnx.checker.check_model(m, full_check=True)
    onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    onnx.save(m, sys.argv[1] + f"/ir{ir}_constant.onnx")
)";
  fs::path dir = scratch("wf_repro_ir3_constant");
  CmdResult r = sh(debian_python() + " -I " + script.string() + " " + dir.string(), "wf_repro_make");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (int ir : {4, 3}) {
    SCOPED_TRACE("ir_version " + std::to_string(ir));
    CmdResult run = cli("run " + (dir / ("ir" + std::to_string(ir) + "_constant.onnx")).string() + " --mesh 2 --check",
                        "wf_repro_ir" + std::to_string(ir));
    EXPECT_EQ(run.code, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("check     passed"), std::string::npos) << run.out << run.err;
  }
}

}  // namespace
