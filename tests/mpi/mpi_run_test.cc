// `run --backend mpi` under mpirun (docs/mpi.md): 4-rank runs of the GPT (Megatron, 2x2) and of resnet18 (spatial,
// 4 devices; 3 devices for uneven shards) match the emulator's outputs; the program-files mode (--program) runs the
// partition's device_<rank>.onnx; bad setups give an error on every rank and a non-zero exit, never a hang.
// Every mpirun is wrapped in `timeout`, and ctest has a TIMEOUT on every test.
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

namespace {

using namespace e2e;

const std::string kBin = std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx";
const std::string kGpt = "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.megatron.sharding.json";

/// mpirun as the tests (and docs/mpi.md) run it: as root, 4 ranks on 2 cores, one OpenMP thread per rank.
std::string mpirun(int np, const std::string& extra = "") {
  return std::string("timeout -k 5 240 ") + GSPMD_MPIRUN +
         " --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 " + extra + " -np " +
         std::to_string(np) + " ";
}

CmdResult mpi_run(int np, const std::string& args, const std::string& tag, const std::string& extra = "") {
  return sh(mpirun(np, extra) + kBin + " run " + args + " --backend mpi", tag);
}

/// Every output_<i>.pb of `got` equals `want`'s within |a-b| <= atol + rtol*|b| (same dtype and shape).
void expect_same_outputs(const fs::path& got, const fs::path& want, double rtol = 1e-4, double atol = 1e-5) {
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
void print_comparison(const std::string& what, const nlohmann::json& r) {
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
void expect_measured(const nlohmann::json& r, int ranks) {
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
void expect_every_rank(const CmdResult& r, int ranks, F line) {
  for (int k = 0; k < ranks; ++k) EXPECT_NE(r.err.find(line(k)), std::string::npos) << line(k) << "\n" << r.err;
}

TEST(MpiRun, GptMegatronFourRanksMatchesEmulator) {
  fs::path d = scratch("mpi_gpt");
  CmdResult pod =
      cli("run " + kGpt + " --inputs testdata/gpt/test_data_set_0 --outputs " + (d / "pod").string(), "mpi_gpt_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r = mpi_run(4,
                        kGpt + " --inputs testdata/gpt/test_data_set_0 --check --repeat 3 --outputs " +
                            (d / "mpi").string() + " --report " + (d / "report.json").string(),
                        "mpi_gpt");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mpi       4 ranks"), std::string::npos) << r.out;
  expect_same_outputs(d / "mpi", d / "pod");
  // and the torch reference of the test data
  expect_same_outputs(d / "mpi", fs::path(GSPMD_SOURCE_DIR) / "testdata/gpt/test_data_set_0", 1e-3, 1e-4);
  nlohmann::json rep = read_json(d / "report.json");
  expect_measured(rep, 4);
  EXPECT_EQ(count_collectives(rep, "all-reduce"), 5);
  EXPECT_GT(rep["measured"]["per_rank"][0]["communication_s"].get<double>(), 0);
  // --repeat 3: three measured steps; the report describes the median one, and its step is its slowest rank's
  const auto& m = rep["measured"];
  EXPECT_EQ(m["measured_runs"], 3);
  std::vector<double> steps = m["steps_s"].get<std::vector<double>>();
  ASSERT_EQ(steps.size(), 3u);
  const int median = m["median_run"].get<int>();
  ASSERT_GE(median, 0);
  ASSERT_LT(median, 3);
  EXPECT_EQ(m["step_time_s"].get<double>(), steps[static_cast<size_t>(median)]);
  double slowest = 0;
  for (const auto& pr : m["per_rank"]) slowest = std::max(slowest, pr["step_s"].get<double>());
  EXPECT_EQ(m["step_time_s"].get<double>(), slowest);
  std::sort(steps.begin(), steps.end());
  EXPECT_EQ(m["step_time_s"].get<double>(), steps[1]);
  print_comparison("gpt megatron 2x2, 4 ranks", rep);
}

// One training step (docs/training.md) as 4 ranks: the loss and every updated weight equal the emulator's, and
// --check (against the unpartitioned step) passes on rank 0.
TEST(MpiRun, GptTrainingStepFourRanksMatchesEmulator) {
  fs::path d = scratch("mpi_gpt_training");
  const std::string train = " --training --loss cross-entropy:labels --optimizer momentum --lr 0.1 --outputs ";
  CmdResult pod = cli("run " + kGpt + train + (d / "pod").string(), "mpi_gpt_training_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r = mpi_run(4, kGpt + train + (d / "mpi").string() + " --check", "mpi_gpt_training");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  // the loss, 37 updated weights, 37 momentum buffers
  EXPECT_TRUE(fs::exists(d / "mpi" / "output_74.pb"));
  EXPECT_FALSE(fs::exists(d / "mpi" / "output_75.pb"));
  expect_same_outputs(d / "mpi", d / "pod");
}

// The pipelined GPT (docs/pipeline.md: 2 stages x Megatron 2, circular) as 4 ranks: the collective-permutes of the
// shifts are MPI sendrecvs; the outputs equal the emulator's and --check (against the model as loaded) passes.
TEST(MpiRun, GptPipelineFourRanksMatchesEmulator) {
  fs::path d = scratch("mpi_gpt_pipeline");
  const std::string pipe =
      "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings testdata/gpt/gpt.pipeline.sharding.json --pipeline stage "
      "--microbatches 4 --schedule circular --inputs testdata/gpt/test_data_set_0 --outputs ";
  CmdResult pod = cli("run " + pipe + (d / "pod").string(), "mpi_gpt_pipeline_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r = mpi_run(4, pipe + (d / "mpi").string() + " --check", "mpi_gpt_pipeline");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pipeline  circular over stage"), std::string::npos) << r.out;
  expect_same_outputs(d / "mpi", d / "pod");
  expect_same_outputs(d / "mpi", fs::path(GSPMD_SOURCE_DIR) / "testdata/gpt/test_data_set_0", 1e-3, 1e-4);
  // A 4-layer decoder over 4 ranks on one stage axis, circular with 2 rounds: the cyclic shifts (the last stage back
  // to the first) are sendrecvs too.
  const fs::path dec = make_decoder(
      d, "d4", "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 4 --seq 8 --weights random", "mpi_pipeline_make");
  const std::string ring = dec.string() + " --mesh 2 --pipeline x --microbatches 2 --schedule circular --outputs ";
  CmdResult pod2 = cli("run " + ring + (d / "pod2").string(), "mpi_pipeline_ring_pod");
  ASSERT_EQ(pod2.code, 0) << pod2.err;
  CmdResult r2 = mpi_run(2, ring + (d / "mpi2").string() + " --check", "mpi_pipeline_ring");
  ASSERT_EQ(r2.code, 0) << r2.out << r2.err;
  EXPECT_NE(r2.out.find("check     passed"), std::string::npos) << r2.out;
  expect_same_outputs(d / "mpi2", d / "pod2");
}

TEST(MpiRun, GptFromDeviceFilesMatchesEmulator) {
  fs::path d = scratch("mpi_gpt_files");
  CmdResult part = cli("partition " + kGpt + " -o " + (d / "prog").string(), "mpi_gpt_files_partition");
  ASSERT_EQ(part.code, 0) << part.err;
  CmdResult pod = cli("run " + kGpt + " --inputs testdata/gpt/test_data_set_0 --outputs " + (d / "pod").string(),
                      "mpi_gpt_files_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r =
      mpi_run(4,
              kGpt + " --program " + (d / "prog").string() + " --inputs testdata/gpt/test_data_set_0 --outputs " +
                  (d / "mpi").string() + " --report " + (d / "report.json").string(),
              "mpi_gpt_files");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  expect_same_outputs(d / "mpi", d / "pod");
  nlohmann::json rep = read_json(d / "report.json");
  expect_measured(rep, 4);
  EXPECT_EQ(rep["measured"]["program"], "device files");
}

TEST(MpiRun, TraceHasEveryRanksMeasuredStepsAndExpectedOutputsPass) {
  // GSPMD_FUSION=0: one measured step per program node, so every rank's steps name the program's nodes one by one.
  fs::path d = scratch("mpi_gpt_trace");
  CmdResult r = mpi_run(4,
                        kGpt + " --inputs testdata/gpt/test_data_set_0 --expected testdata/gpt/test_data_set_0" +
                            " --warmup 0 --trace " + (d / "trace.json").string(),
                        "mpi_gpt_trace", "-x GSPMD_FUSION=0");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("expected  passed against testdata/gpt/test_data_set_0"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("run: rank 0 of 4 ranks"), std::string::npos) << "progress without a terminal:\n" << r.err;
  nlohmann::json t = read_json(d / "trace.json");
  std::vector<std::string> program;                          // the simulated track of device 0: the program's nodes
  std::map<int, std::string> tracks;                         // measured: tid -> track name
  std::map<int, std::vector<std::string>> measured;          // measured: tid -> its steps' nodes, in order
  std::map<int, std::vector<std::pair<double, double>>> at;  // measured: tid -> its steps' (start, duration)
  std::string process;
  for (const auto& e : t["traceEvents"]) {
    if (e["pid"] == 0 && e["ph"] == "X" && e["tid"] == 0) program.push_back(e["name"].get<std::string>());
    if (e["pid"] != 1) continue;
    if (e["ph"] == "M" && e["name"] == "process_name") process = e["args"]["name"].get<std::string>();
    if (e["ph"] == "M" && e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] != "X") continue;
    EXPECT_EQ(e["cat"], "measured");
    for (const auto& n : e["args"]["nodes"]) measured[e["tid"].get<int>()].push_back(n.get<std::string>());
    at[e["tid"].get<int>()].emplace_back(e["ts"].get<double>(), e["dur"].get<double>());
  }
  EXPECT_EQ(process, "measured: MPI ranks (wall time)");
  ASSERT_EQ(tracks.size(), 4u);
  ASSERT_GT(program.size(), 50u);
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(tracks[k], "rank " + std::to_string(k));
    EXPECT_EQ(measured[k], program);
    ASSERT_EQ(at[k].size(), program.size());
    for (size_t i = 0; i < at[k].size(); ++i) {
      EXPECT_GE(at[k][i].second, 0);
      if (i > 0) {  // in order, no overlap
        EXPECT_GE(at[k][i].first + 1e-3, at[k][i - 1].first + at[k][i - 1].second);
      }
    }
  }
}

TEST(MpiRun, ProgressOnRankZeroWhenMpirunIsOnATerminal) {
  // Under `script`, mpirun's stderr is a terminal (the ranks' are pipes to it): rank 0 shows its progress.
  CmdResult r = sh("GSPMD_PROGRESS_DELAY_MS=0 script -qec '" + mpirun(4) + kBin + " run " + kGpt +
                       " --backend mpi --warmup 0 >/dev/null' /dev/null",
                   "mpi_progress_tty");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("\rrun: rank 0 of 4 ranks, node "), std::string::npos) << r.out;
  for (int k = 1; k < 4; ++k) EXPECT_EQ(r.out.find("rank " + std::to_string(k) + " of"), std::string::npos) << r.out;
}

// A permuted device order (docs/sharding-file.md): rank k runs device k, which sits elsewhere on the mesh. The ranks'
// communicators follow the order's replica groups and each rank runs its exported device_<k>.onnx (its own slices).
TEST(MpiRun, GptDeviceOrderFromDeviceFilesMatchesEmulator) {
  fs::path d = scratch("mpi_gpt_order");
  nlohmann::json plan = read_json(std::string(GSPMD_SOURCE_DIR) + "/testdata/gpt/gpt.megatron.sharding.json");
  plan["mesh"]["devices"] = {3, 1, 2, 0};
  const std::string file = (d / "ordered.sharding.json").string();
  std::ofstream(file) << plan.dump(1);
  const std::string args = "testdata/gpt/gpt_opset17.onnx --mesh 2x2 --shardings " + file;
  CmdResult part = cli("partition " + args + " -o " + (d / "prog").string(), "mpi_gpt_order_partition");
  ASSERT_EQ(part.code, 0) << part.err;
  CmdResult pod = cli("run " + kGpt + " --inputs testdata/gpt/test_data_set_0 --outputs " + (d / "pod").string(),
                      "mpi_gpt_order_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r =
      mpi_run(4,
              args + " --program " + (d / "prog").string() +
                  " --inputs testdata/gpt/test_data_set_0 --check --warmup 0 --outputs " + (d / "mpi").string(),
              "mpi_gpt_order");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  expect_same_outputs(d / "mpi", d / "pod");
}

// resnet18 with its input split spatially: halo exchanges (collective-permute) and, deeper in the network,
// feature maps smaller than the device count (uneven shards with padding).
void cnn_case(const std::string& kind, int ranks) {
  const Export& e = exported("resnet18");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const std::string tag = "mpi_resnet18_" + kind;
  fs::path d = scratch(tag);
  const std::string args = (e.dir / "resnet18.onnx").string() + " --mesh " + std::to_string(ranks) +
                           " --shardings testdata/cnn/resnet18." + kind + ".sharding.json --inputs " +
                           (e.dir / "test_data_set_0").string();
  CmdResult pod = cli("run " + args + " --outputs " + (d / "pod").string(), tag + "_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  // --warmup 0: equivalence only (the timing comparison is MpiTiming's)
  CmdResult r = mpi_run(
      ranks, args + " --warmup 0 --outputs " + (d / "mpi").string() + " --report " + (d / "report.json").string(), tag);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  expect_same_outputs(d / "mpi", d / "pod");
  expect_same_outputs(d / "mpi", e.dir / "test_data_set_0", 1e-3, 1e-3);
  nlohmann::json rep = read_json(d / "report.json");
  expect_measured(rep, ranks);
  EXPECT_GT(count_collectives(rep, "collective-permute"), 0) << "no halo exchange";
  EXPECT_EQ(rep["measured"]["warmup_runs"], 0);
}

TEST(MpiRun, Resnet18SpatialFourRanksMatchesEmulator) { cnn_case("spatial", 4); }
TEST(MpiRun, Resnet18UnevenSpatialThreeRanksMatchesEmulator) { cnn_case("uneven_spatial", 3); }

// ------------------------------------------------------------------------------- two hosts (network namespaces)

/// Two hosts on this machine, as docs/mpi.md's two-host command line sees them: network namespaces with their own
/// hostnames (UTS namespaces), joined by a bridge on 10.77.N.0/24, each running its own Open MPI daemon, which
/// mpirun starts through an rsh agent script (`ip netns exec` + `unshare --uts`) in place of ssh. Ranks on different
/// hosts talk TCP over the bridge, ranks on one host shared memory. Made by the constructor, removed by the
/// destructor; `error` says why when the machine refuses (no root, no CAP_NET_ADMIN).
struct TwoHosts {
  std::string tag, subnet, hostfile, agent, error;
  std::string names[2];
  TwoHosts() {
    const int id = static_cast<int>(::getpid() % 100000);
    tag = "gs" + std::to_string(id);
    const std::string net = "10.77." + std::to_string(id % 250 + 1) + ".";
    subnet = net + "0/24";
    fs::path d = scratch("mpi_two_hosts");
    hostfile = (d / "hosts").string();
    agent = (d / "nsrsh").string();
    std::string setup = "set -e; ip link add " + tag + "br type bridge; ip addr add " + net + "254/24 dev " + tag +
                        "br; ip link set " + tag + "br up";
    std::string hosts, cases;
    for (int h = 0; h < 2; ++h) {
      const std::string ns = tag + "h" + std::to_string(h), ip = net + std::to_string(h + 1);
      names[h] = tag + "-host" + std::to_string(h);
      setup += "; ip netns add " + ns + "; ip link add " + ns + "v type veth peer name eth0 netns " + ns +
               "; ip link set " + ns + "v master " + tag + "br; ip link set " + ns + "v up; ip netns exec " + ns +
               " ip addr add " + ip + "/24 dev eth0; ip netns exec " + ns + " ip link set eth0 up; ip netns exec " +
               ns + " ip link set lo up";
      hosts += ip + " slots=2\n";
      cases += "  " + ip + ") exec ip netns exec " + ns + " unshare --uts sh -c \"hostname " + names[h] + "; $*\" ;;\n";
    }
    std::ofstream(hostfile) << hosts;
    std::ofstream(agent) << "#!/bin/sh\n# rsh agent: runs the command as host $1\nhost=$1; shift\ncase \"$host\" in\n"
                         << cases << "esac\necho \"no host $host\" >&2; exit 1\n";
    fs::permissions(agent, fs::perms::owner_all, fs::perm_options::add);
    CmdResult r = sh(setup, "mpi_two_hosts_setup");
    if (r.code != 0) error = "cannot make network namespaces here: " + r.err;
  }
  ~TwoHosts() {
    sh("ip netns del " + tag + "h0; ip netns del " + tag + "h1; ip link del " + tag + "br", "mpi_two_hosts_teardown");
  }
  /// mpirun over both hosts, ranks dealt round-robin (rank r on host r % 2).
  std::string mpirun(int np) const {
    return std::string("timeout -k 5 240 ") + GSPMD_MPIRUN + " --allow-run-as-root --hostfile " + hostfile +
           " --mca plm_rsh_agent " + agent + " --mca oob_tcp_if_include " + subnet + " --mca btl_tcp_if_include " +
           subnet + " --map-by node --bind-to none -x OMP_NUM_THREADS=1 -np " + std::to_string(np) + " ";
  }
};

/// The GPT on 4 ranks over two hosts: each all-reduce over `model` joins devices 2k and 2k+1, which sit on different
/// hosts, so every collective crosses the (namespace) network. Outputs equal the emulator's.
TEST(MpiTwoHosts, GptMegatronAcrossTwoHostsMatchesEmulator) {
  TwoHosts hosts;
  if (!hosts.error.empty()) GTEST_SKIP() << hosts.error;
  fs::path d = scratch("mpi_two_hosts_gpt");
  CmdResult pod = cli("run " + kGpt + " --inputs testdata/gpt/test_data_set_0 --outputs " + (d / "pod").string(),
                      "mpi_two_hosts_pod");
  ASSERT_EQ(pod.code, 0) << pod.err;
  CmdResult r = sh(hosts.mpirun(4) + kBin + " run " + kGpt + " --inputs testdata/gpt/test_data_set_0 --backend mpi " +
                       "--check --outputs " + (d / "mpi").string() + " --report " + (d / "report.json").string(),
                   "mpi_two_hosts_gpt");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
  expect_same_outputs(d / "mpi", d / "pod");
  nlohmann::json rep = read_json(d / "report.json");
  expect_measured(rep, 4);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(rep["measured"]["per_rank"][k]["host"], hosts.names[k % 2]) << "rank " << k;
  EXPECT_EQ(count_collectives(rep, "all-reduce"), 5);
}

// ------------------------------------------------------------------------------------------ calibration

/// A benchmark, not part of the suite (timings do not belong in tests): `bash bench/mpi.sh` runs it. The `host`
/// target (this machine and the program's ops measured on rank 0, scaled by the ranks sharing each core) predicts the
/// 4-rank MPI runs: the simulated step is within 25% of the measured one (the slowest rank's step, the median of five
/// measured executions after one warm-up). Each run compares its own prediction with its own measurement; of five
/// runs the median ratio counts, since both sides are measured on a noisy machine. Prints the median run per rank,
/// and every ratio.
TEST(MpiTiming, DISABLED_HostTargetPredictsFourRankSteps) {
  const Export& e = exported("resnet18");
  ASSERT_TRUE(e.error.empty()) << e.error;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"gpt megatron 2x2", kGpt + " --inputs testdata/gpt/test_data_set_0"},
      {"resnet18 spatial 4", (e.dir / "resnet18.onnx").string() +
                                 " --mesh 4 --shardings testdata/cnn/resnet18.spatial.sharding.json --inputs " +
                                 (e.dir / "test_data_set_0").string()}};
  fs::path d = scratch("mpi_timing");
  constexpr int kRuns = 5;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].first);
    std::vector<std::pair<double, nlohmann::json>> runs;  // (simulated / measured step, report)
    for (int run = 0; run < kRuns; ++run) {
      const fs::path rep_path = d / ("report_" + std::to_string(i) + "_" + std::to_string(run) + ".json");
      CmdResult r = mpi_run(4, cases[i].second + " --target host --repeat 5 --report " + rep_path.string(),
                            "mpi_timing_" + std::to_string(i) + "_" + std::to_string(run));
      ASSERT_EQ(r.code, 0) << r.err;
      nlohmann::json rep = read_json(rep_path);
      const double ratio = rep["simulated"]["step_time_s"].get<double>() / rep["measured"]["step_time_s"].get<double>();
      runs.emplace_back(ratio, std::move(rep));
    }
    std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const auto& [ratio, median] = runs[kRuns / 2];
    print_comparison(cases[i].first + ", 4 ranks, the median of " + std::to_string(kRuns) + " runs", median);
    std::string all;
    for (const auto& r : runs) {
      char b[16];
      std::snprintf(b, sizeof b, " %.2f", r.first);
      all += b;
    }
    std::printf("[ timing   ]   simulated / measured step, every run:%s; median %.2f\n", all.c_str(), ratio);
    EXPECT_GE(ratio, 0.75) << "simulated " << median["simulated"]["step_time_s"] << " s, measured "
                           << median["measured"]["step_time_s"] << " s";
    EXPECT_LE(ratio, 1.25) << "simulated " << median["simulated"]["step_time_s"] << " s, measured "
                           << median["measured"]["step_time_s"] << " s";
  }
}

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

// Data-dependent dims (docs/shapes.md step 6) under MPI: each rank binds the counts from the tensors it computes,
// the collectives move the sizes it finds, and rank 0 gathers outputs whose sizes only the run knows. The detector's
// post-processing in miniature runs exact against torch's outputs at every count (none, fewer than k, more than k
// boxes), with the batch and with the anchors over 2 ranks, and from one partition's device files (--program).
TEST(MpiRun, DataDependentDimsRunAtEveryCount) {
  const std::string dir = "testdata/data_dependent/";
  const fs::path files = scratch("mpi_data_dependent") / "dp2";
  ASSERT_EQ(cli("partition " + dir + "model.onnx --mesh 2 --shardings " + dir + "dp2.plan.json -o " + files.string(),
                "mpi_data_dependent_partition")
                .code,
            0);
  for (const std::string plan : {"dp2", "row2", "dp2 files"})
    for (int k = 0; k < 3; ++k) {
      const std::string set = dir + "test_data_set_" + std::to_string(k);
      const std::string program = plan == "dp2 files" ? " --program " + files.string() : "";
      CmdResult r = mpi_run(2,
                            dir + "model.onnx --mesh 2 --shardings " + dir + plan.substr(0, plan.find(" ")) +
                                ".plan.json" + program + " --inputs " + set + " --expected " + set,
                            "mpi_data_dependent");
      EXPECT_EQ(r.code, 0) << plan << " set " << k << ": " << r.out << r.err;
      EXPECT_NE(r.out.find("expected  passed against " + set), std::string::npos) << r.out;
    }
}

}  // namespace
