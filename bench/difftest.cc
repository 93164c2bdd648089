// gspmd-difftest: differential testing of the partitioner on random graphs (docs/testing.md).
//
//   gspmd-difftest [--cases N] [--seed S | --random-seed] [--max-devices D] [--verbose] [--no-reduce]
//                  [--max-reports K] [--coverage] [--stress] [--extra-ops] [--max-nodes M] [--max-numel E]
//
// Runs cases S .. S+N-1 (each case's graph, annotations, mesh and inputs depend only on its seed), checks
// run_spmd(partition(propagate)) against run_single and prints, per failure, the seed, the reason, a dump of the graph
// and annotations and (unless --no-reduce) a greedily reduced reproduction. Ends with "N passed, M failed" and exits
// 1 if any case failed (2 on bad arguments).
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "tests/difftest/random_graph.h"

using namespace gspmd::difftest;

namespace {

int usage(const char* why) {
  std::cerr << "error: " << why
            << "\nusage: gspmd-difftest [--cases N] [--seed S | --random-seed] [--max-devices D] [--verbose]"
               " [--no-reduce] [--max-reports K] [--coverage]\n"
               "                      [--stress] [--extra-ops] [--max-nodes M] [--max-numel E]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int cases = 1000;
  uint64_t seed = 1;
  bool random_seed = false, seed_given = false, verbose = false, reduce = true, coverage = false;
  int max_reports = 20;
  GenOptions opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    try {
      if (a == "--cases") {
        const char* v = next();
        if (!v) return usage("--cases needs a value");
        cases = std::stoi(v);
      } else if (a == "--seed") {
        const char* v = next();
        if (!v) return usage("--seed needs a value");
        seed = std::stoull(v);
        seed_given = true;
      } else if (a == "--random-seed") {
        random_seed = true;
      } else if (a == "--max-devices") {
        const char* v = next();
        if (!v) return usage("--max-devices needs a value");
        opt.max_devices = std::stoll(v);
      } else if (a == "--max-reports") {
        const char* v = next();
        if (!v) return usage("--max-reports needs a value");
        max_reports = std::stoi(v);
      } else if (a == "--verbose" || a == "-v") {
        verbose = true;
      } else if (a == "--no-reduce") {
        reduce = false;
      } else if (a == "--stress") {
        opt.stress = true;
      } else if (a == "--extra-ops") {
        opt.extra_ops = true;
      } else if (a == "--max-nodes") {
        const char* v = next();
        if (!v) return usage("--max-nodes needs a value");
        opt.max_nodes = std::stoi(v);
      } else if (a == "--max-numel") {
        const char* v = next();
        if (!v) return usage("--max-numel needs a value");
        opt.max_numel = std::stoll(v);
      } else if (a == "--coverage") {
        coverage = true;
      } else if (a == "--help" || a == "-h") {
        usage("help");
        return 0;
      } else {
        return usage(("unknown argument '" + a + "'").c_str());
      }
    } catch (const std::exception&) {
      return usage(("bad value for " + a).c_str());
    }
  }
  if (random_seed && seed_given) return usage("--seed and --random-seed are exclusive");
  if (cases < 0 || opt.max_devices < 1) return usage("--cases must be >= 0 and --max-devices >= 1");
  if (opt.max_nodes < opt.min_nodes) opt.min_nodes = std::max(1, opt.max_nodes);
  if (random_seed) seed = std::random_device{}() * 4294967296ull + std::random_device{}();
  std::cout << "gspmd-difftest: " << cases << " cases from seed " << seed << ", meshes of up to " << opt.max_devices
            << " devices\n";

  auto on_case = [&](uint64_t s, const CheckResult& r) {
    if (verbose) {
      const char* st = r.status == CheckResult::kPass   ? "pass"
                       : r.status == CheckResult::kFail ? "FAIL"
                                                        : "unsupported";
      std::cout << "seed " << s << ": " << st << (r.why.empty() ? "" : " (" + r.why + ")") << "\n";
      if (r.status != CheckResult::kPass || cases == 1) {
        RandomCase c = generate_case(s, opt);
        std::cout << dump(c.g, c.ann);
      }
    }
  };
  RunSummary sum = run_cases(seed, cases, opt, reduce, max_reports, on_case);
  for (const auto& rep : sum.reports) std::cout << "\nFAIL " << rep;
  if (sum.failed > static_cast<int>(sum.reports.size()))
    std::cout << "\n(" << sum.failed - static_cast<int>(sum.reports.size()) << " more failures not shown)\n";
  if (coverage) std::cout << "\ncoverage (cases containing each op/variant):\n" << coverage_str(sum.coverage) << "\n";
  if (!sum.failing_seeds.empty()) {
    std::cout << "failing seeds:";
    for (uint64_t s : sum.failing_seeds) std::cout << " " << s;
    std::cout << "\n";
  }
  std::cout << sum.passed << " passed, " << sum.failed << " failed";
  if (sum.unsupported) std::cout << " (" << sum.unsupported << " unsupported, not counted)";
  std::cout << " in " << sum.seconds << " s; " << sum.with_collectives << " passing programs had collectives ("
            << sum.collectives << " in all)\n";
  return sum.failed ? 1 : 0;
}
