// Models exported on demand by a torch script, shared by the e2e tests that need them: the torchvision CNNs of
// testdata/cnn/export_cnn.py (cnn_test.cc, weight_forms_test.cc, ...) and the small ViT and MoE LM of
// testdata/training/export_models.py (training_test.cc).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace e2e {

inline const fs::path kCnnDir = fs::path(GSPMD_SOURCE_DIR) / "testdata" / "cnn";

struct Export {
  fs::path dir;       // holds <model>.onnx, test_data_set_0/, the sharding files the script writes
  std::string error;  // empty on success
};

/// Runs `command` (a script of the source tree, given `--out DIR` appended) at most once per test binary run and
/// returns its output directory. ctest runs every test in its own process (possibly in parallel), so the export is
/// also shared between processes: it goes to build/e2e-scratch/<family>/<model>-<hash of `scripts`>/, written into a
/// private temporary directory and renamed into place when complete (it must contain `files`); a process that finds
/// the directory reuses it. A failed export is remembered, so every test that needs the model fails with the
/// script's message.
inline const Export& shared_export(const std::string& family, const std::string& model,
                                   const std::vector<fs::path>& scripts, const std::string& command,
                                   const std::vector<std::string>& files) {
  static std::map<std::string, Export> cache;
  auto it = cache.find(family + "/" + model);
  if (it != cache.end()) return it->second;
  Export e;
  std::string text;
  for (const fs::path& s : scripts) text += read_file(s);
  char key[32];
  std::snprintf(key, sizeof key, "%016zx", std::hash<std::string>{}(text));
  fs::path root = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / family;
  e.dir = root / (model + "-" + key);
  if (!fs::exists(e.dir / "DONE")) {
    std::string tag = family + "_" + model + "_" + std::to_string(getpid());
    fs::path tmp = root / (model + "-" + key + ".tmp" + std::to_string(getpid()));
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    auto t0 = std::chrono::steady_clock::now();
    CmdResult r = sh(debian_python() + " " + command + " --out " + tmp.string(), tag);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.code != 0) {
      e.error = command + " failed (exit " + std::to_string(r.code) +
                "). It needs Debian's /usr/bin/python3 with torch 1.13, onnx and torchvision (apt-get install -y "
                "python3-torchvision).\nstdout:\n" +
                r.out + "\nstderr:\n" + r.err;
    }
    for (const std::string& f : files)
      if (e.error.empty() && !fs::exists(tmp / f))
        e.error = command + " exited 0 but did not write " + (tmp / f).string() + "\n" + r.out;
    if (e.error.empty()) {
      std::printf("[ export   ] %s: %.1f s\n", model.c_str(), secs);
      std::ofstream(tmp / "DONE") << r.out;
      std::error_code ec;
      fs::rename(tmp, e.dir, ec);  // fails if another process got there first: use theirs
    }
    fs::remove_all(tmp);
    if (e.error.empty() && !fs::exists(e.dir / "DONE")) e.error = "no complete export in " + e.dir.string();
  }
  return cache.emplace(family + "/" + model, std::move(e)).first->second;
}

/// Exports `model` (resnet18 | mobilenet_v2 | conv3x3) with testdata/cnn/export_cnn.py's default sizes, once
/// (shared_export, under build/e2e-scratch/cnn-export/).
inline const Export& exported(const std::string& model) {
  return shared_export("cnn-export", model, {kCnnDir / "export_cnn.py", kCnnDir / "np_cnn_eval.py"},
                       "testdata/cnn/export_cnn.py --model " + model, {model + ".onnx", "test_data_set_0/output_0.pb"});
}

/// Exports the small training-test model `model` (vit | moe: testdata/training/export_models.py; the MoE is
/// testdata/corpus/gen_moe.py's model) with its sharding files, once (shared_export, under
/// build/e2e-scratch/training-export/).
inline const Export& exported_for_training(const std::string& model) {
  const fs::path t = fs::path(GSPMD_SOURCE_DIR) / "testdata";
  return shared_export("training-export", model,
                       {t / "training" / "export_models.py", t / "corpus" / "gen_moe.py", t / "corpus" / "common.py"},
                       "testdata/training/export_models.py --model " + model, {model + ".onnx"});
}

/// docs/tutorial.md's MLP (testdata/tools/export_tutorial_mlp.py: torch-renamed weights, a dynamic batch, four
/// alike blocks whose first input is the graph input), exported once (shared_export, under
/// build/e2e-scratch/tutorial-export/). A failed export fails the calling test.
inline const fs::path& tutorial_mlp() {
  static const fs::path model = [] {
    const Export& e =
        shared_export("tutorial-export", "mlp", {fs::path(GSPMD_SOURCE_DIR) / "testdata/tools/export_tutorial_mlp.py"},
                      "testdata/tools/export_tutorial_mlp.py", {"mlp.onnx"});
    if (!e.error.empty()) ADD_FAILURE() << e.error;
    return e.dir / "mlp.onnx";
  }();
  return model;
}

}  // namespace e2e
