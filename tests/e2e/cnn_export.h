// Torchvision CNNs exported on demand by testdata/cnn/export_cnn.py, shared by the e2e tests that need them
// (cnn_test.cc, weight_forms_test.cc).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "e2e_util.h"

namespace e2e {

inline const fs::path kCnnDir = fs::path(GSPMD_SOURCE_DIR) / "testdata" / "cnn";

struct Export {
  fs::path dir;       // holds <model>.onnx, test_data_set_0/, <model>.<kind>.sharding.json
  std::string error;  // empty on success
};

/// Exports `model` (resnet18 | mobilenet_v2 | conv3x3) with the script's default sizes, at most once per test
/// binary run. ctest runs every test in its own process (possibly in parallel), so the export is also shared
/// between processes: it goes to build/e2e-scratch/cnn-export/<model>-<hash of the scripts>/, written into a
/// private temporary directory and renamed into place when complete; a process that finds the directory reuses it.
/// A failed export is remembered, so every test that needs the model fails with the script's message.
inline const Export& exported(const std::string& model) {
  static std::map<std::string, Export> cache;
  auto it = cache.find(model);
  if (it != cache.end()) return it->second;
  Export e;
  size_t h = std::hash<std::string>{}(read_file(kCnnDir / "export_cnn.py") + read_file(kCnnDir / "np_cnn_eval.py"));
  char key[32];
  std::snprintf(key, sizeof key, "%016zx", h);
  fs::path root = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "cnn-export";
  e.dir = root / (model + "-" + key);
  if (!fs::exists(e.dir / "DONE")) {
    std::string tag = "cnn_export_" + model + "_" + std::to_string(getpid());
    fs::path tmp = root / (model + "-" + key + ".tmp" + std::to_string(getpid()));
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    auto t0 = std::chrono::steady_clock::now();
    CmdResult r = sh(debian_python() + " testdata/cnn/export_cnn.py --model " + model + " --out " + tmp.string(), tag);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.code != 0) {
      e.error = "testdata/cnn/export_cnn.py --model " + model + " failed (exit " + std::to_string(r.code) +
                "). It needs Debian's /usr/bin/python3 with torch 1.13, onnx and torchvision (apt-get install -y "
                "python3-torchvision).\nstdout:\n" +
                r.out + "\nstderr:\n" + r.err;
    } else if (!fs::exists(tmp / (model + ".onnx")) || !fs::exists(tmp / "test_data_set_0" / "output_0.pb")) {
      e.error = "export_cnn.py exited 0 but did not write " + (tmp / (model + ".onnx")).string() + "\n" + r.out;
    } else {
      std::printf("[ export   ] %s: %.1f s\n", model.c_str(), secs);
      std::ofstream(tmp / "DONE") << r.out;
      std::error_code ec;
      fs::rename(tmp, e.dir, ec);  // fails if another process got there first: use theirs
    }
    fs::remove_all(tmp);
    if (e.error.empty() && !fs::exists(e.dir / "DONE")) e.error = "no complete export in " + e.dir.string();
  }
  return cache.emplace(model, std::move(e)).first->second;
}

}  // namespace e2e
