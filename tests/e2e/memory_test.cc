// Memory of the emulated pod (issue: replicated immutable tensors stored once on the host; per-device peak memory
// reflects shard sizes). An MLP with 32 MiB of float32 weights runs on 16 devices, data-parallel (weights
// replicated) and Megatron (weights split 16 ways); the report's per-device peak and the process's peak RSS are
// checked against the weights' size.
#include <gtest/gtest.h>

#include <iostream>

#include "e2e_util.h"

namespace {

using namespace e2e;

constexpr int64_t kWeights = 2 * 1024 * 4096 * 4;  // two float32 matrices [1024,4096] and [4096,1024]: 32 MiB

/// Writes mlp.onnx (x[16,1024] -> MatMul w1 -> Relu -> MatMul w2 -> y) and two sharding files into `d`.
void write_model(const fs::path& d) {
  const std::string py = R"(
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
d = sys.argv[1]
rng = np.random.default_rng(0)
w1 = numpy_helper.from_array((rng.standard_normal((1024, 4096)) * 0.03).astype(np.float32), 'w1')
w2 = numpy_helper.from_array((rng.standard_normal((4096, 1024)) * 0.03).astype(np.float32), 'w2')
g = helper.make_graph([helper.make_node('MatMul', ['x', 'w1'], ['h']), helper.make_node('Relu', ['h'], ['r']),
                       helper.make_node('MatMul', ['r', 'w2'], ['y'])], 'mlp',
                      [helper.make_tensor_value_info('x', TensorProto.FLOAT, [16, 1024])],
                      [helper.make_tensor_value_info('y', TensorProto.FLOAT, [16, 1024])], [w1, w2])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid('', 17)]), d + '/mlp.onnx')
open(d + '/dp.json', 'w').write('{"mesh": {"axes": ["d"]}, "tensors": {"x": ["d", null]}}')
open(d + '/megatron.json', 'w').write('{"mesh": {"axes": ["d"]}, "tensors": {"w1": [null, "d"], "w2": ["d", null]}}')
)";
  std::ofstream(d / "make.py") << py;
  CmdResult r = sh(debian_python() + " " + (d / "make.py").string() + " " + d.string(), "memory_make");
  ASSERT_EQ(r.code, 0) << r.err;
}

/// Runs gspmd-onnx with `args` under a python wrapper that prints the child's peak RSS (KiB) on its last line.
int64_t run_rss_kib(const std::string& args, const std::string& tag) {
  CmdResult r = sh(debian_python() +
                       " -c \"import resource, subprocess, sys; c = subprocess.run(sys.argv[1:]).returncode; "
                       "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(c)\" " +
                       std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx " + args,
                   tag);
  EXPECT_EQ(r.code, 0) << r.err;
  const auto nl = r.out.find_last_of('\n', r.out.size() - 2);
  return std::stoll(r.out.substr(nl == std::string::npos ? 0 : nl + 1));
}

TEST(Memory, ReplicatedWeightsAreStoredOnceAndSplitOnesCostTheirShard) {
  fs::path d = scratch("memory");
  write_model(d);
  const std::string model = (d / "mlp.onnx").string();
  // one device: the weights once (plus the loaded model and the libraries)
  const int64_t rss1 = run_rss_kib("run " + model + " --mesh 1 --report " + (d / "one.json").string(), "memory_1");
  // 16 devices, weights replicated: if each device held a copy that would be 15 x 32 MiB more
  const int64_t rss_dp = run_rss_kib("run " + model + " --mesh 16 --shardings " + (d / "dp.json").string() +
                                         " --report " + (d / "dp.report.json").string(),
                                     "memory_dp");
  EXPECT_LT(rss_dp - rss1, 48 * 1024) << "RSS " << rss1 << " KiB on 1 device, " << rss_dp << " KiB on 16";
  // Megatron over 16: every device holds a 1/16 slice of each weight; the slices add up to one copy
  const int64_t rss_mt = run_rss_kib("run " + model + " --mesh 16 --shardings " + (d / "megatron.json").string() +
                                         " --report " + (d / "mt.report.json").string(),
                                     "memory_mt");
  EXPECT_LT(rss_mt - rss1, 64 * 1024) << "RSS " << rss1 << " KiB on 1 device, " << rss_mt << " KiB Megatron";

  std::cout << "[memory] peak RSS: 1 device " << rss1 << " KiB, 16 data-parallel " << rss_dp << " KiB, 16 Megatron "
            << rss_mt << " KiB (weights " << kWeights / 1024 << " KiB)\n";
  // The report counts what each device holds: all the weights when replicated, 1/16 of them when split.
  auto peak = [&](const std::string& f) {
    nlohmann::json r = read_json(d / f);
    int64_t hi = 0;
    for (const auto& dev : r["simulated"]["per_device"]) hi = std::max(hi, dev["peak_memory_bytes"].get<int64_t>());
    return hi;
  };
  const int64_t act = 16 * 4096 * 4;  // the largest activation [16, 4096] float32: 256 KiB
  EXPECT_GE(peak("one.json"), kWeights);
  EXPECT_LE(peak("one.json"), kWeights + 2 * act);
  EXPECT_GE(peak("dp.report.json"), kWeights);
  EXPECT_LE(peak("dp.report.json"), kWeights + 2 * act);
  EXPECT_GE(peak("mt.report.json"), kWeights / 16);
  EXPECT_LE(peak("mt.report.json"), kWeights / 16 + 2 * act);
}

}  // namespace
