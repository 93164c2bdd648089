// run --expected DIR: the run's outputs against reference outputs in the ONNX test-data layout (docs/cli.md).
#include <cmath>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "cli/report.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::cli {

namespace fs = std::filesystem;

namespace {

/// The index i of a file named "output_<i>.pb", or -1.
int64_t output_index(const std::string& file) {
  constexpr std::string_view kPrefix = "output_", kSuffix = ".pb";
  if (file.size() <= kPrefix.size() + kSuffix.size() || !file.starts_with(kPrefix) || !file.ends_with(kSuffix))
    return -1;
  const std::string digits = file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string outputs_str(size_t n) { return fmt::format("{} output{}", n, n == 1 ? "" : "s"); }

}  // namespace

std::vector<OnnxValue> read_expected_outputs(const std::string& dir, const LoadReport& signature) {
  if (!fs::is_directory(dir)) throw InputError(fmt::format("{}: no such directory (--expected)", dir));
  const size_t n = signature.outputs.size();
  int64_t extra = std::numeric_limits<int64_t>::max();
  for (const auto& e : fs::directory_iterator(dir)) {
    const int64_t i = output_index(e.path().filename().string());
    if (i >= static_cast<int64_t>(n)) extra = std::min(extra, i);
  }
  if (extra != std::numeric_limits<int64_t>::max())
    throw InputError(fmt::format("{}: the model has {}, so --expected {} holds output_0.pb .. output_{}.pb only",
                                 (fs::path(dir) / fmt::format("output_{}.pb", extra)).string(), outputs_str(n), dir,
                                 static_cast<int64_t>(n) - 1));
  std::vector<OnnxValue> values;
  for (size_t i = 0; i < n; ++i) {
    const std::string path = (fs::path(dir) / fmt::format("output_{}.pb", i)).string();
    if (!fs::exists(path))
      throw InputError(fmt::format("{}: no such file (--expected: the model has {})", path, outputs_str(n)));
    values.push_back(read_value_pb(path, signature.outputs[i].structure.kind));
  }
  return values;
}

ExpectedResult compare_expected(const Graph& g, const LoadReport& signature, const std::vector<Tensor>& outputs,
                                const std::vector<OnnxValue>& expected, const std::string& dir, double rtol,
                                double atol) {
  const std::vector<OnnxValue> got = unflatten_outputs(g, signature, outputs);
  ExpectedResult r;
  r.dir = dir;
  for (size_t i = 0; i < got.size() && i < expected.size(); ++i) {
    ExpectedResult::Output o;
    o.name = signature.outputs[i].name;
    o.file = (fs::path(dir) / fmt::format("output_{}.pb", i)).string();
    const std::vector<Tensor>& a = got[i].tensors;
    const std::vector<Tensor>& b = expected[i].tensors;
    if (a.size() != b.size()) {
      o.check.passed = false;
      o.check.max_abs_error = o.check.max_rel_error = INFINITY;
      o.check.worst =
          fmt::format("output '{}': {} tensor{} vs expected {}", o.name, a.size(), a.size() == 1 ? "" : "s", b.size());
    }
    const bool elements = got[i].structure.kind == ValueKind::kSequence || got[i].structure.of_sequence;
    for (size_t k = 0; k < a.size() && a.size() == b.size(); ++k)
      compare_tensor(a[k], b[k], rtol, atol, elements ? fmt::format("{}[{}]", o.name, k) : o.name, "expected", o.check);
    if (!o.check.passed && r.passed) r.worst = o.check.worst;
    r.passed = r.passed && o.check.passed;
    r.outputs.push_back(std::move(o));
  }
  return r;
}

}  // namespace gspmd::cli
