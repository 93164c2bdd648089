// Helpers shared by the frontend tests: paths, temp dirs, a constant evaluator.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
    std::string name = std::string("gspmd_frontend_") + (info ? info->test_suite_name() + std::string("_") + info->name() : "t");
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
