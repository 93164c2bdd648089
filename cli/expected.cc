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

/// The index i of a file named "<kind>_<i>.pb", or -1.
int64_t file_index(const std::string& file, std::string_view kind) {
  constexpr std::string_view kSuffix = ".pb";
  if (file.size() <= kind.size() + 1 + kSuffix.size() || !file.starts_with(kind) || file[kind.size()] != '_' ||
      !file.ends_with(kSuffix))
    return -1;
  const std::string digits = file.substr(kind.size() + 1, file.size() - kind.size() - 1 - kSuffix.size());
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

/// "1 output", "2 inputs".
std::string counted(size_t n, std::string_view noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

}  // namespace

void check_no_extra_files(const std::string& dir, std::string_view kind, size_t n, std::string_view flag) {
  int64_t extra = std::numeric_limits<int64_t>::max();
  for (const auto& e : fs::directory_iterator(dir)) {
    const int64_t i = file_index(e.path().filename().string(), kind);
    if (i >= static_cast<int64_t>(n)) extra = std::min(extra, i);
  }
  if (extra == std::numeric_limits<int64_t>::max()) return;
  throw InputError(
      n == 0 ? fmt::format("{}: the model has no {}s, so {} {} holds no {}_<i>.pb",
                           (fs::path(dir) / fmt::format("{}_{}.pb", kind, extra)).string(), kind, flag, dir, kind)
             : fmt::format("{}: the model has {}, so {} {} holds {}_0.pb{} only",
                           (fs::path(dir) / fmt::format("{}_{}.pb", kind, extra)).string(), counted(n, kind), flag, dir,
                           kind, n == 1 ? "" : fmt::format(" .. {}_{}.pb", kind, n - 1)));
}

std::vector<OnnxValue> read_expected_outputs(const std::string& dir, const LoadReport& signature) {
  if (!fs::is_directory(dir)) throw InputError(fmt::format("{}: no such directory (--expected)", dir));
  const size_t n = signature.outputs.size();
  check_no_extra_files(dir, "output", n, "--expected");
  std::vector<OnnxValue> values;
  for (size_t i = 0; i < n; ++i) {
    const std::string path = (fs::path(dir) / fmt::format("output_{}.pb", i)).string();
    if (!fs::exists(path))
      throw InputError(fmt::format("{}: no such file (--expected: the model has {})", path, counted(n, "output")));
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
