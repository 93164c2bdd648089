// Helpers for end-to-end tests: run the gspmd-onnx binary and read what it wrote.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/ir/ir.h"

namespace e2e {

namespace fs = std::filesystem;

/// The bundled GPT (opset 17) and its Megatron sidecar as a --shardings flag (mesh 2x2).
inline const std::string kGpt = "testdata/gpt/gpt_opset17.onnx";
inline const std::string kMegatron = "--shardings testdata/gpt/gpt.megatron.sharding.json";

/// Exit code, stdout and stderr of one command.
struct CmdResult {
  int code = -1;
  std::string out, err;
};

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// A fresh empty directory under the build tree, unique per test name.
inline fs::path scratch(const std::string& name) {
  fs::path d = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Runs a shell command line; stdout/stderr are captured through files.
inline CmdResult sh(const std::string& cmd, const std::string& tag) {
  fs::path d = fs::path(GSPMD_BINARY_DIR) / "e2e-scratch" / "logs";
  fs::create_directories(d);
  fs::path o = d / (tag + ".out"), e = d / (tag + ".err");
  std::string full = "cd " + std::string(GSPMD_SOURCE_DIR) + " && " + cmd + " >" + o.string() + " 2>" + e.string();
  int status = std::system(full.c_str());
  CmdResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(o);
  r.err = read_file(e);
  return r;
}

/// Runs gspmd-onnx with `args` (relative paths are relative to the source tree).
inline CmdResult cli(const std::string& args, const std::string& tag) {
  return sh(std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx " + args, tag);
}

inline nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_file(p)); }

/// A command and the report it wrote.
struct Reported {
  CmdResult r;
  nlohmann::json report;  // null when the command failed
};

/// Runs gspmd-onnx with `args --report <dir>/<tag>.json` and reads the report back. A non-zero exit is a test
/// failure (printing the command's output) and leaves `report` null: callers ASSERT_FALSE(report.is_null()).
inline Reported cli_report(const std::string& args, const fs::path& dir, const std::string& tag) {
  const fs::path file = dir / (tag + ".json");
  Reported x{cli(args + " --report " + file.string(), tag), nullptr};
  EXPECT_EQ(x.r.code, 0) << args << "\n" << x.r.out << x.r.err;
  if (x.r.code == 0) x.report = read_json(file);
  return x;
}

/// Number of collectives of `kind` in a report (summing counts).
inline int count_collectives(const nlohmann::json& report, const std::string& kind) {
  int n = 0;
  for (const auto& c : report["collectives"])
    if (c["kind"] == kind) n += c["count"].get<int>();
  return n;
}

/// Deterministic inputs for `g`: int64 values 0/1 (valid token ids, token types and masks, with some zeros), float32
/// values in [0, 1).
inline std::vector<gspmd::Tensor> small_inputs(const gspmd::Graph& g) {
  std::vector<gspmd::Tensor> inputs;
  for (int v : g.inputs) {
    const gspmd::Value& val = g.values[static_cast<size_t>(v)];
    gspmd::Tensor t(val.dtype, val.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (val.dtype == gspmd::DType::kInt64) t.data<int64_t>()[i] = (i * 7) % 5 == 0 ? 0 : (i * 7) % 2;
      if (val.dtype == gspmd::DType::kFloat32) t.data<float>()[i] = static_cast<float>((i * 13) % 17) / 17.f;
    }
    inputs.push_back(std::move(t));
  }
  return inputs;
}

/// Debian's python3 (torch, onnx, numpy from apt), for exports and cross-checks.
inline std::string debian_python() { return "/usr/bin/python3"; }

/// Runs the benchmark `script` (under bench/, with `args`) against the built binary, writing its rows with --json into
/// a scratch directory named `tag`, and returns the rows. The script's failure fails the calling test (its output
/// is printed) and returns an empty array.
inline nlohmann::json bench_rows(const std::string& script, const std::string& args, const std::string& tag) {
  const fs::path rows = scratch(tag) / "rows.json";
  CmdResult r = sh(debian_python() + " bench/" + script + " " + args + " --json " + rows.string() + " --bin " +
                       std::string(GSPMD_BINARY_DIR) + "/bin/gspmd-onnx",
                   tag);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return r.code == 0 ? read_json(rows) : nlohmann::json::array();
}

/// Runs testdata/tools/make_decoder.py with `flags` (sizes, --weights, --mesh) into `out` as `<name>.onnx` plus its
/// sharding sidecars, tagged `tag`; returns the model's path. A failure is reported (EXPECT) and leaves no model.
inline fs::path make_decoder(const fs::path& out, const std::string& name, const std::string& flags,
                             const std::string& tag) {
  CmdResult r = sh(
      debian_python() + " testdata/tools/make_decoder.py " + flags + " --name " + name + " --out " + out.string(), tag);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  return out / (name + ".onnx");
}

}  // namespace e2e
