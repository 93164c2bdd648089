// The MPI backend refusing bad setups in one line (docs/mpi.md): rank counts, device files, models, weights, a
// rank that dies.
#include "tests/mpi/mpi_test_util.h"

namespace mpi_test {
namespace {

// ---------------------------------------------------------------------------------------------- bad setups

TEST(MpiBadSetup, RankCountDiffersFromMesh) {
  auto t0 = std::chrono::steady_clock::now();
  CmdResult r = mpi_run(3, kGpt, "mpi_bad_np");
  EXPECT_NE(r.code, 0);
  expect_every_rank(r, 3, [](int k) {
    return "error: rank " + std::to_string(k) +
           ": --mesh 2x2 has 4 devices but this MPI job has 3 ranks: start it with mpirun -np 4\n";
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 120);
}

TEST(MpiBadSetup, MissingDeviceFile) {
  fs::path d = scratch("mpi_bad_missing");
  ASSERT_EQ(cli("partition " + kGpt + " -o " + (d / "prog").string(), "mpi_bad_missing_partition").code, 0);
  fs::remove(d / "prog" / "device_2.onnx");
  const std::string file = (d / "prog" / "device_2.onnx").string();
  CmdResult r = mpi_run(4, kGpt + " --program " + (d / "prog").string(), "mpi_bad_missing");
  EXPECT_EQ(r.code, 2) << r.err;
  const std::string why = file + ": no such file (every device needs its device_<k>.onnx from `partition -o " +
                          (d / "prog").string() + "`)\n";
  expect_every_rank(r, 4, [&](int k) {
    return k == 2 ? "error: rank 2: " + why : "error: rank " + std::to_string(k) + ": rank 2 failed: " + why;
  });
}

TEST(MpiBadSetup, DeviceFileFromAnotherPartition) {
  fs::path d = scratch("mpi_bad_stale");
  ASSERT_EQ(cli("partition " + kGpt + " -o " + (d / "prog").string(), "mpi_bad_stale_partition").code, 0);
  ASSERT_EQ(cli("partition testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.dp.sharding.json -o " +
                    (d / "other").string(),
                "mpi_bad_stale_partition2")
                .code,
            0);
  fs::copy_file(d / "other" / "device_1.onnx", d / "prog" / "device_1.onnx", fs::copy_options::overwrite_existing);
  CmdResult r = mpi_run(4, kGpt + " --program " + (d / "prog").string(), "mpi_bad_stale");
  EXPECT_EQ(r.code, 2) << r.err;
  const std::string file = (d / "prog" / "device_1.onnx").string();
  EXPECT_NE(r.err.find("error: rank 1: " + file +
                       ": partitioned from another model, sharding, mesh or target than "
                       "this run (program fingerprint "),
            std::string::npos)
      << r.err;
  expect_every_rank(r, 4, [&](int k) {
    return k == 1 ? std::string("error: rank 1: ") + file
                  : "error: rank " + std::to_string(k) + ": rank 1 failed: " + file + ": partitioned from another";
  });
}

TEST(MpiBadSetup, RanksGivenDifferentModels) {
  // MPMD launch: ranks 0-1 get the opset-17 export, ranks 2-3 the opset-13 one (the same GPT, another program).
  const std::string other =
      "testdata/gpt/gpt_opset13.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json";
  CmdResult r =
      sh(mpirun(2) + kBin + " run " + kGpt + " --backend mpi : -np 2 " + kBin + " run " + other + " --backend mpi",
         "mpi_bad_models");
  EXPECT_EQ(r.code, 2) << r.err;
  expect_every_rank(r, 4, [](int k) {
    return "error: rank " + std::to_string(k) + ": ranks were given different models: rank 2 has program fingerprint ";
  });
}

TEST(MpiBadSetup, RanksGivenDifferentWeights) {
  // The same GPT with one weight changed: the same program, other weights (the fingerprint covers the weights).
  fs::path d = scratch("mpi_bad_weights");
  const std::string other = (d / "gpt_other.onnx").string();
  CmdResult py = sh(debian_python() +
                        " -c \"import onnx, numpy as np; from onnx import numpy_helper as nh; "
                        "m = onnx.load('testdata/gpt/gpt_opset17.onnx'); "
                        "t = [i for i in m.graph.initializer if i.name == 'h.0.attn.q.weight'][0]; "
                        "a = nh.to_array(t) + np.float32(1); t.CopyFrom(nh.from_array(a, t.name)); "
                        "onnx.save(m, '" +
                        other + "')\"",
                    "mpi_bad_weights_py");
  ASSERT_EQ(py.code, 0) << py.err;
  const std::string rest = " --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json --backend mpi";
  CmdResult r =
      sh(mpirun(3) + kBin + " run testdata/gpt/gpt_opset17.onnx" + rest + " : -np 1 " + kBin + " run " + other + rest,
         "mpi_bad_weights");
  EXPECT_EQ(r.code, 2) << r.err;
  expect_every_rank(r, 4, [](int k) {
    return "error: rank " + std::to_string(k) + ": ranks were given different models: rank 3 has program fingerprint ";
  });
}

TEST(MpiBadSetup, RankDiesMidRun) {
  fs::path d = scratch("mpi_bad_die");
  auto t0 = std::chrono::steady_clock::now();
  CmdResult r = mpi_run(4, kGpt + " --outputs " + (d / "out").string(), "mpi_bad_die", "-x GSPMD_MPI_TEST_DIE_RANK=1");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 124) << "timed out: the surviving ranks hung";
  EXPECT_LT(secs, 120);
  EXPECT_NE(r.err.find("error: rank 1: GSPMD_MPI_TEST_DIE_RANK: dying at node "), std::string::npos) << r.err;
  for (int k : {0, 2, 3})
    EXPECT_NE(r.err.find("error: rank " + std::to_string(k) +
                         ": terminated by mpirun (another rank failed or was killed; see its message)"),
              std::string::npos)
        << r.err;
  EXPECT_FALSE(fs::exists(d / "out" / "output_0.pb"));
}

TEST(MpiBadSetup, MissingInputsOnRankZero) {
  CmdResult r = mpi_run(4, kGpt + " --inputs /nonexistent", "mpi_bad_inputs");
  EXPECT_EQ(r.code, 2) << r.err;
  expect_every_rank(r, 4, [](int k) {
    return k == 0 ? std::string("error: rank 0: /nonexistent/input_0.pb: cannot open file\n")
                  : "error: rank " + std::to_string(k) + ": rank 0 failed: /nonexistent/input_0.pb: cannot open file\n";
  });
  EXPECT_EQ(r.err.find("terminated by mpirun"), std::string::npos) << r.err;
}

// --program runs on the emulator too (one thread per device): a missing folder is the missing file's error.
TEST(MpiBadSetup, MpiOnlyFlagsNeedMpiBackend) {
  CmdResult r = cli("run " + kGpt + " --program /nonexistent", "mpi_program_pod");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "error: /nonexistent/device_0.onnx: no such file (every device needs its device_<k>.onnx from "
            "`partition -o /nonexistent`)\n");
  r = cli("run " + kGpt + " --warmup 3", "mpi_warmup_pod");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --warmup: needs --backend mpi (the emulator executes once)\n");
  r = cli("run " + kGpt + " --repeat 5", "mpi_repeat_pod");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --repeat: needs --backend mpi (the emulator executes once)\n");
  r = cli("run " + kGpt + " --backend mpi --repeat 0", "mpi_repeat_zero");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--repeat"), std::string::npos) << r.err;
}

TEST(MpiBadSetup, WithoutMpirunIsOneRank) {
  CmdResult r = cli("run " + kGpt + " --backend mpi", "mpi_singleton");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: rank 0: --mesh 2x2 has 4 devices but this MPI job has 1 rank: start it with "
                       "mpirun -np 4\n"),
            std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace mpi_test
