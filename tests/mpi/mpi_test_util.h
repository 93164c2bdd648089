// The MPI tests' helpers (tests/mpi/mpi_*_test.cc): mpirun launches and the emulator's reference runs.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../e2e/cnn_export.h"
#include "../e2e/e2e_util.h"
#include "onnx_frontend/frontend.h"

namespace mpi_test {

using namespace e2e;

const std::string kBin = std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx";
const std::string kGpt = "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json";

/// mpirun as the tests (and docs/mpi.md) run it: as root, 4 ranks on 2 cores, one OpenMP thread per rank.
inline std::string mpirun(int np, const std::string& extra = "") {
  return std::string("timeout -k 5 240 ") + GSPMD_MPIRUN +
         " --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 " + extra + " -np " +
         std::to_string(np) + " ";
}

inline CmdResult mpi_run(int np, const std::string& args, const std::string& tag, const std::string& extra = "") {
  return sh(mpirun(np, extra) + kBin + " run " + args + " --backend mpi", tag);
}

/// Every output_<i>.pb of `got` equals `want`'s within |a-b| <= atol + rtol*|b| (same dtype and shape).
inline void expect_same_outputs(const fs::path& got, const fs::path& want, double rtol = 1e-4, double atol = 1e-5) {
  int n = 0;
  for (int i = 0; fs::exists(want / ("output_" + std::to_string(i) + ".pb")); ++i, ++n) {
    SCOPED_TRACE("output " + std::to_string(i));
    const std::string f = "output_" + std::to_string(i) + ".pb";
    ASSERT_TRUE(fs::exists(got / f)) << (got / f);
    gspmd::Tensor a = gspmd::read_tensor_pb((got / f).string()), b = gspmd::read_tensor_pb((want / f).string());
    ASSERT_EQ(a.dtype, b.dtype);
    ASSERT_EQ(a.shape, b.shape);
    if (a.dtype != gspmd::DType::kFloat32) {
      EXPECT_EQ(a.bytes, b.bytes);
      continue;
    }
    double worst = 0;
    for (int64_t k = 0; k < a.numel(); ++k) {
      const double x = a.data<float>()[k], y = b.data<float>()[k];
      worst = std::max(worst, std::abs(x - y));
      ASSERT_LE(std::abs(x - y), atol + rtol * std::abs(y)) << "element " << k;
    }
    std::printf("[ compare  ] %s: %lld elements, max abs difference %.3g\n", f.c_str(),
                static_cast<long long>(a.numel()), worst);
  }
  EXPECT_GT(n, 0) << "no outputs in " << want;
}

/// Prints simulated vs measured per-rank times of an MPI run report (the calibration table of docs/mpi.md).
inline void print_comparison(const std::string& what, const nlohmann::json& r) {
  const auto& s = r["simulated"];
  const auto& m = r["measured"];
  std::printf(
      "[ timing   ] %s, target %s: simulated step %.3f ms (compute %.3f, communication %.3f); measured "
      "step %.3f ms (compute %.3f, communication %.3f, mean over ranks; slowest rank's step %.3f ms)\n",
      what.c_str(), r["target"].get<std::string>().c_str(), 1e3 * s["step_time_s"].get<double>(),
      1e3 * s["compute_time_s"].get<double>(), 1e3 * s["communication_time_s"].get<double>(),
      1e3 * (m["compute_time_s"].get<double>() + m["communication_time_s"].get<double>()),
      1e3 * m["compute_time_s"].get<double>(), 1e3 * m["communication_time_s"].get<double>(),
      1e3 * m["step_time_s"].get<double>());
  for (const auto& pr : m["per_rank"]) {
    int rk = pr["rank"].get<int>();
    const auto& sd = s["per_device"][rk];
    std::printf(
        "[ timing   ]   rank %d: compute %.3f ms (simulated %.3f), communication %.3f ms (simulated %.3f), "
        "step %.3f ms, CPU %.3f ms\n",
        rk, 1e3 * pr["compute_s"].get<double>(), 1e3 * sd["compute_s"].get<double>(),
        1e3 * pr["communication_s"].get<double>(), 1e3 * sd["communication_s"].get<double>(),
        1e3 * pr["step_s"].get<double>(), 1e3 * pr["cpu_s"].get<double>());
  }
}

/// The report of an MPI run has the measured per-rank times next to the simulated ones.
inline void expect_measured(const nlohmann::json& r, int ranks) {
  EXPECT_EQ(r["backend"], "mpi");
  ASSERT_TRUE(r.contains("measured"));
  ASSERT_EQ(r["measured"]["per_rank"].size(), static_cast<size_t>(ranks));
  ASSERT_EQ(r["simulated"]["per_device"].size(), static_cast<size_t>(ranks));
  for (int k = 0; k < ranks; ++k) {
    const auto& pr = r["measured"]["per_rank"][k];
    EXPECT_EQ(pr["rank"], k);
    EXPECT_GT(pr["compute_s"].get<double>(), 0);
    EXPECT_GE(pr["communication_s"].get<double>(), 0);
    EXPECT_GE(pr["step_s"].get<double>(), pr["compute_s"].get<double>());
    EXPECT_GE(pr["wall_s"].get<double>(), pr["step_s"].get<double>());
    // CPU time over the measured execution: some, and at most every core of the host for the whole of it
    EXPECT_GT(pr["cpu_s"].get<double>(), 0);
    EXPECT_LE(pr["cpu_s"].get<double>(), std::thread::hardware_concurrency() * pr["wall_s"].get<double>() + 1e-3);
    EXPECT_GT(pr["peak_memory_bytes"].get<int64_t>(), 0);
  }
}

/// Every rank printed `line(k)` on stderr.
template <class F>
inline void expect_every_rank(const CmdResult& r, int ranks, F line) {
  for (int k = 0; k < ranks; ++k) EXPECT_NE(r.err.find(line(k)), std::string::npos) << line(k) << "\n" << r.err;
}

}  // namespace mpi_test
