// tests/conformance: the ONNX backend test suite (Debian's libonnx-testdata) run through the real pipeline
// (load_model -> propagate -> partition -> run_spmd, and run_single), unsharded and sharded. The driver is
// conformance_main.cc (`gspmd-conformance`); docs/testing.md and docs/conformance.md describe the workflow.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ir/ir.h"

namespace gspmd::conformance {

/// Tolerances of the ONNX backend test runner (onnx/backend/test/runner: np.testing.assert_allclose).
inline constexpr double kRtol = 1e-3;
inline constexpr double kAtol = 1e-7;

/// Outcome of one mode (single device, or sharded) of one test.
enum class Status { kPass, kFail, kSkip };
/// "pass", "fail", "skip".
const char* status_name(Status s);

/// Result of one mode: its status and, unless it passed, why (the exception message or the first mismatch).
struct ModeResult {
  Status status = Status::kFail;
  std::string message;
};

/// Everything the runner learns about one test directory (`<folder>/<name>/model.onnx` + `test_data_set_*`).
struct TestResult {
  std::string folder;                  // "node", "pytorch-converted", "pytorch-operator", "simple"
  std::string name;                    // "test_abs"
  std::vector<std::string> op_types;   // op types of the model's nodes, in file order, unique
  std::vector<std::string> frozen;     // graph inputs frozen as constants (their values fix output shapes)
  std::vector<std::string> fallbacks;  // partitioner warnings (ops computed replicated), from the sharded runs
  ModeResult single;                   // run_single against the expected outputs
  ModeResult sharded;                  // run_spmd on meshes {2} and {2x2} with random input shardings
  double seconds = 0;                  // wall time of this test (both modes, all data sets)

  /// "node/test_abs".
  std::string id() const { return folder + "/" + name; }
};

nlohmann::json to_json(const TestResult& r);
TestResult result_from_json(const nlohmann::json& j);

/// Compares `got` with the suite's `want`. Floats (float16/bfloat16/float32/float64) pass elementwise when
/// |got - want| <= atol + rtol * |want|, NaN matching NaN and infinities matching exactly; integers and bools must
/// be equal. Returns "" when they match, else the first difference ("dtype int64 vs int32", "shape [2] vs [3]",
/// "element 5 (flat): 0.25 vs 0.5").
std::string compare(const Tensor& got, const Tensor& want, double rtol = kRtol, double atol = kAtol);

/// Runs one test directory `dir` (folder/name taken from its last two path components) in both modes.
/// `seed` picks the random shardings: each graph input gets, per mesh axis, a dim chosen uniformly among its dims and
/// "none" (an axis may land on a dim that already has one). Never throws: every error becomes the mode's message.
/// `after_single`, when set, receives the result once the single mode is known and again before each sharded run
/// (its `sharded` is then a failure naming the mesh and input shardings about to run), so that a crash in a sharded
/// run keeps the single result and names the sharding.
TestResult run_test(const std::string& dir, uint64_t seed,
                    const std::function<void(const TestResult&)>& after_single = {});

}  // namespace gspmd::conformance
