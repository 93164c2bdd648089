// End-to-end on torchvision CNNs (issue 3): resnet18 and mobilenet_v2 (random init, batch 16, 64x64), exported
// during the test by testdata/cnn/export_cnn.py (the .onnx files are not committed: resnet18 is ~45 MB), run on the
// emulated pod under every committed sharding file (data / channel / spatial parallel, 4 and 16 devices, uneven
// splits over 3), checked against the unpartitioned run and against torch's own output. Plus the halo exchange of a
// spatially partitioned 3x3 convolution.
//
// Needs Debian's /usr/bin/python3 with torch and torchvision (apt package python3-torchvision): without them the
// tests FAIL with the script's message, they are not skipped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <vector>

#include "cnn_export.h"
#include "e2e_util.h"
#include "onnx_frontend/frontend.h"

using namespace e2e;

namespace {

/// Max |a-b| <= atol + rtol*|b| over all elements (b: torch's reference).
void expect_close(const gspmd::Tensor& a, const gspmd::Tensor& b, double rtol, double atol) {
  ASSERT_EQ(a.shape, b.shape);
  ASSERT_EQ(a.dtype, gspmd::DType::kFloat32);
  ASSERT_EQ(b.dtype, gspmd::DType::kFloat32);
  int64_t bad = 0, first_bad = -1;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.data<float>()[i], y = b.data<float>()[i];
    double err = std::fabs(x - y);
    if (!(err <= atol + rtol * std::fabs(y))) {
      if (bad++ == 0) first_bad = i;
    }
    worst = std::max(worst, err);
  }
  EXPECT_EQ(bad, 0) << "worst abs error " << worst << "; first bad element " << first_bad << " of " << a.numel();
}

/// "4x4" from the sidecar's mesh.shape.
std::string mesh_of(const fs::path& sidecar) {
  auto j = read_json(sidecar);
  std::string m;
  for (const auto& s : j["mesh"]["shape"]) m += (m.empty() ? "" : "x") + std::to_string(s.get<int64_t>());
  return m;
}

struct Case {
  std::string model;  // resnet18 | mobilenet_v2
  std::string kind;   // testdata/cnn/<model>.<kind>.sharding.json
  std::string mesh;   // --mesh, must equal the file's mesh
  int devices;
  bool batch_only;  // only the batch is split: an inference CNN then needs no collective at all
  bool spatial;     // H (and W) split: halo exchanges; the 4- and 2-row stages may be gathered instead
  std::string name() const { return model + "_" + kind; }
  fs::path sidecar() const { return kCnnDir / (model + "." + kind + ".sharding.json"); }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<Case> cases() {
  std::vector<Case> v;
  for (std::string m : {"resnet18", "mobilenet_v2"}) {
    v.push_back({m, "data", "2x2", 4, true, false});      // batch over [["data","model"]]
    v.push_back({m, "data16", "16", 16, true, false});    // batch over x (16): one image per device
    v.push_back({m, "channel", "2x2", 4, false, false});  // batch over data, conv output channels over model
    v.push_back({m, "channel16", "4x4", 16, false, false});
    v.push_back({m, "spatial", "4", 4, false, true});         // H over x (4)
    v.push_back({m, "spatial16", "4x4", 16, false, true});    // H over x (4), W over y (4)
    v.push_back({m, "uneven", "3", 3, true, false});          // batch 16 over 3: shards 6, 6, 4
    v.push_back({m, "uneven_spatial", "3", 3, false, true});  // H 64 over 3: 22, 22, 20
  }
  return v;
}

class CnnRun : public ::testing::TestWithParam<Case> {};

TEST_P(CnnRun, CheckPassesAndMatchesTorch) {
  const Case& c = GetParam();
  const Export& e = exported(c.model);
  ASSERT_TRUE(e.error.empty()) << e.error;
  ASSERT_TRUE(fs::exists(c.sidecar())) << c.sidecar();
  ASSERT_EQ(mesh_of(c.sidecar()), c.mesh) << c.sidecar();

  fs::path dir = scratch("cnn_" + c.name());
  auto t0 = std::chrono::steady_clock::now();
  CmdResult r = cli("run " + (e.dir / (c.model + ".onnx")).string() + " --mesh " + c.mesh + " --shardings " +
                        c.sidecar().string() + " --inputs " + (e.dir / "test_data_set_0").string() +
                        " --check --report " + (dir / "report.json").string() + " --outputs " + (dir / "out").string(),
                    "cnn_" + c.name());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ run      ] %s: %.1f s\n", c.name().c_str(), secs);
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto rep = read_json(dir / "report.json");
  EXPECT_TRUE(rep["check"]["passed"].get<bool>()) << rep["check"].dump();
  EXPECT_EQ(rep["devices"].get<int>(), c.devices);
  // No op may fall back to replicated computation: Conv, MaxPool, GlobalAveragePool, Gemm... are all partitioned.
  // With H split, the last stages have 4 and 2 rows (64x64 input), fewer than a 3x3/stride-2 conv's halo per shard:
  // there (and only there) a conv may gather the spatial dim instead, which the report lists as a warning.
  for (const auto& w : rep["warnings"]) {
    std::string s = w.get<std::string>();
    EXPECT_EQ(s.find("computed replicated"), std::string::npos) << s;
    if (c.spatial) {
      EXPECT_NE(s.find("is gathered instead of split"), std::string::npos) << s;
    } else {
      ADD_FAILURE() << "unexpected warning: " << s;
    }
  }
  if (c.batch_only) {
    // BatchNorm is folded into the convs, so every op is independent per image: no communication.
    EXPECT_EQ(rep["collectives"].size(), 0u) << rep["collectives"].dump(1);
  }
  if (c.spatial) {
    // The early, large stages really are partitioned spatially: neighbours exchange halo rows.
    EXPECT_GT(count_collectives(rep, "collective-permute"), 0) << rep["collectives"].dump(1);
  }
  // The partitioned outputs equal torch's (tolerance for convolution sums in a different order).
  ASSERT_TRUE(fs::exists(dir / "out" / "output_0.pb"));
  gspmd::Tensor got = gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string());
  gspmd::Tensor want = gspmd::read_tensor_pb((e.dir / "test_data_set_0" / "output_0.pb").string());
  expect_close(got, want, 1e-4, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Cnn, CnnRun, ::testing::ValuesIn(cases()), [](const auto& info) { return info.param.name(); });

/// The emulator's devices run concurrently, one OpenMP thread each, when there are threads to spare
/// (GSPMD_DEVICE_THREADS, else OMP_NUM_THREADS, which the suite sets to 1). Their oneDNN convolutions, pools and
/// reorders then execute at the same time: each must use its own scratchpad (the library's is one shared buffer in
/// Debian's build), or the devices corrupt each other's results, which --check and the torch outputs catch.
TEST(CnnDevicesInParallel, ConcurrentDevicesMatchTorch) {
  for (const char* model : {"resnet18", "mobilenet_v2"})
    for (const char* kind : {"spatial", "channel"}) {
      SCOPED_TRACE(std::string(model) + " " + kind);
      const Export& e = exported(model);
      ASSERT_TRUE(e.error.empty()) << e.error;
      const fs::path sidecar = kCnnDir / (std::string(model) + "." + kind + ".sharding.json");
      const std::string name = std::string("cnn_parallel_") + model + "_" + kind;
      fs::path dir = scratch(name);
      CmdResult r = sh("GSPMD_DEVICE_THREADS=4 " + std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx run " +
                           (e.dir / (std::string(model) + ".onnx")).string() + " --mesh " + mesh_of(sidecar) +
                           " --shardings " + sidecar.string() + " --inputs " + (e.dir / "test_data_set_0").string() +
                           " --check --outputs " + (dir / "out").string(),
                       name);
      ASSERT_EQ(r.code, 0) << r.out << r.err;
      EXPECT_NE(r.out.find("check     passed"), std::string::npos) << r.out;
      expect_close(gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string()),
                   gspmd::read_tensor_pb((e.dir / "test_data_set_0" / "output_0.pb").string()), 1e-4, 1e-4);
    }
}

/// The committed sidecars are exactly what export_cnn.py writes (so the script regenerates them), and every kind
/// the script writes is committed.
TEST(CnnTestdata, CommittedShardingFilesAreTheScriptsOutput) {
  for (std::string m : {"resnet18", "mobilenet_v2", "conv3x3"}) {
    const Export& e = exported(m);
    ASSERT_TRUE(e.error.empty()) << e.error;
    int written = 0;
    for (const auto& f : fs::directory_iterator(e.dir)) {
      std::string fn = f.path().filename().string();
      if (fn.size() < 14 || fn.substr(fn.size() - 14) != ".sharding.json") continue;
      ++written;
      ASSERT_TRUE(fs::exists(kCnnDir / fn)) << fn << " is written by export_cnn.py but not in testdata/cnn";
      EXPECT_EQ(read_file(f.path()), read_file(kCnnDir / fn)) << fn;
    }
    int committed = 0;
    for (const auto& f : fs::directory_iterator(kCnnDir)) {
      std::string fn = f.path().filename().string();
      if (fn.rfind(m + ".", 0) == 0 && fn.find(".sharding.json") != std::string::npos) ++committed;
    }
    EXPECT_EQ(written, committed) << m;
    EXPECT_GT(written, 0) << m;
  }
}

/// A 3x3 convolution (stride 1, pad 1) with H split over 4 devices needs exactly one halo row from each neighbour:
/// two collective-permutes (one per direction), each of one input row (8 channels x 32 x float32 = 1024 bytes), and
/// nothing else.
TEST(CnnSpatialConv, HaloExchangeIsTwoOneRowCollectivePermutes) {
  const Export& e = exported("conv3x3");
  ASSERT_TRUE(e.error.empty()) << e.error;
  fs::path sidecar = kCnnDir / "conv3x3.spatial.sharding.json";
  ASSERT_EQ(mesh_of(sidecar), "4");
  fs::path dir = scratch("cnn_conv3x3_spatial");
  CmdResult r = cli("run " + (e.dir / "conv3x3.onnx").string() + " --mesh 4 --shardings " + sidecar.string() +
                        " --inputs " + (e.dir / "test_data_set_0").string() + " --check --report " +
                        (dir / "report.json").string() + " --outputs " + (dir / "out").string(),
                    "cnn_conv3x3_spatial");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto rep = read_json(dir / "report.json");
  EXPECT_TRUE(rep["check"]["passed"].get<bool>()) << rep["check"].dump();
  EXPECT_EQ(rep["warnings"].size(), 0u) << rep["warnings"].dump(1);
  constexpr int64_t kRowBytes = 8 * 32 * 4;  // one row of the [1, 8, 32, 32] float32 input
  EXPECT_EQ(count_collectives(rep, "collective-permute"), 2) << rep["collectives"].dump(1);
  for (const auto& col : rep["collectives"]) {
    EXPECT_EQ(col["kind"], "collective-permute") << col.dump();
    EXPECT_EQ(col["bytes"].get<int64_t>(), kRowBytes) << col.dump();
    EXPECT_EQ(col["axes"], nlohmann::json::array({"x"})) << col.dump();
  }
  gspmd::Tensor got = gspmd::read_tensor_pb((dir / "out" / "output_0.pb").string());
  gspmd::Tensor want = gspmd::read_tensor_pb((e.dir / "test_data_set_0" / "output_0.pb").string());
  expect_close(got, want, 1e-4, 1e-4);
}

}  // namespace
