// Running many cases (random_graph.h): the summary of failures and coverage.
#include "tests/difftest/generator.h"

namespace gspmd::difftest {

RunSummary run_cases(uint64_t seed_base, int n, const GenOptions& opt, bool reduce, int max_reports,
                     const std::function<void(uint64_t, const CheckResult&)>& on_case) {
  RunSummary s;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const uint64_t seed = seed_base + static_cast<uint64_t>(i);
    RandomCase c = generate_case(seed, opt);
    std::set<std::string> keys;
    for (const auto& k : coverage_keys(c)) keys.insert(k);
    for (const auto& k : keys) ++s.coverage[k];
    CheckResult r = check_case(c.g, c.ann, c.inputs);
    for (const auto& k : std::set<std::string>(r.sharded.begin(), r.sharded.end())) ++s.coverage[k];
    if (on_case) on_case(seed, r);
    if (r.status == CheckResult::kPass) {
      ++s.passed;
      s.with_collectives += r.collectives > 0;
      s.collectives += r.collectives;
    } else if (r.status == CheckResult::kUnsupported)
      ++s.unsupported;
    else {
      ++s.failed;
      s.failing_seeds.push_back(seed);
      if (static_cast<int>(s.reports.size()) < max_reports) {
        std::ostringstream os;
        os << "seed " << seed << ": " << r.why << "\n" << dump(c.g, c.ann);
        if (reduce) {
          Repro m = reduce_repro(to_repro(c), r);
          CheckResult mr = check_case(m.g, m.ann, m.inputs);
          os << " reduced (" << m.g.nodes.size() << " nodes): " << mr.why << "\n" << dump(m.g, m.ann);
        }
        s.reports.push_back(os.str());
      }
    }
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}
std::string coverage_str(const std::map<std::string, int>& cov) {
  std::ostringstream os;
  int col = 0;
  for (const auto& [k, n] : cov) {
    std::string item = k + "=" + std::to_string(n);
    if (col + item.size() > 110) os << "\n", col = 0;
    os << (col ? "  " : "  ") << item;
    col += static_cast<int>(item.size()) + 2;
  }
  return os.str();
}

}  // namespace gspmd::difftest
