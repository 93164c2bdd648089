// Helpers shared by the frontend tests: paths, temp dirs, a constant evaluator.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "backend/kernels/kernels.h"
#include "cli/wiring.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::test {

inline std::string frontend_data(const std::string& name) {
  return std::string(GSPMD_SOURCE_DIR) + "/testdata/frontend/" + name;
}

/// A fresh directory under the system temp dir, removed with the object.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        std::string("gspmd_frontend_") + (info ? info->test_suite_name() + std::string("_") + info->name() : "t");
    path = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
};

/// The CLI's wiring (kernels as evaluator and shape functions), with strict shape cross-checks.
inline LoadOptions load_opts(std::map<std::string, int64_t> dims = {}, bool load_data = true) {
  LoadOptions o = cli::kernel_load_options();
  o.dims = std::move(dims);
  o.load_data = load_data;
  o.strict_shapes = true;
  return o;
}

/// Debian's ONNX backend test data (libonnx-testdata) and the folders the suites read.
inline const char* const kBackendTestData = "/usr/share/libonnx-testdata/data";

/// Every test directory (with a model.onnx) of the backend test folders node, pytorch-converted, pytorch-operator and
/// simple, sorted; empty when the data is not installed.
inline std::vector<std::filesystem::path> backend_test_dirs() {
  std::vector<std::filesystem::path> dirs;
  if (!std::filesystem::is_directory(kBackendTestData)) return dirs;
  for (const char* folder : {"node", "pytorch-converted", "pytorch-operator", "simple"})
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(kBackendTestData) / folder))
      if (std::filesystem::exists(e.path() / "model.onnx")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

/// An ONNX backend test's model summary and its test_data_set_0 input tensors (throws as read_model_info /
/// read_tensor_pb: a test whose inputs are not all tensors throws).
inline void read_backend_test(const std::filesystem::path& dir, ModelInfo& info, std::vector<Tensor>& data) {
  info = read_model_info((dir / "model.onnx").string());
  for (size_t i = 0; i < info.inputs.size(); ++i)
    data.push_back(read_tensor_pb((dir / "test_data_set_0" / ("input_" + std::to_string(i) + ".pb")).string()));
}

/// Loads `model` with `lo`; when that fails (a shape depends on input values), again with inputs `names` frozen to
/// `data`. nullopt when neither loads.
inline std::optional<Graph> load_freezing(const std::string& model, LoadOptions lo,
                                          const std::vector<std::string>& names, const std::vector<Tensor>& data) {
  try {
    return load_model(model, lo);
  } catch (const std::exception&) {
  }
  for (size_t i = 0; i < names.size() && i < data.size(); ++i) lo.frozen_inputs[names[i]] = data[i];
  try {
    return load_model(model, lo);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// Expects `f` to throw InputError with exactly `msg`.
template <class F>
void expect_input_error(F&& f, const std::string& msg) {
  try {
    f();
    ADD_FAILURE() << "expected InputError: " << msg;
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
  }
}

}  // namespace gspmd::test
