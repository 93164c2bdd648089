// gspmd-conformance: runs the ONNX backend test suite (libonnx-testdata) through the real pipeline, unsharded and
// sharded, checks the expected-pass set and writes docs/conformance.md. Usage: docs/testing.md ("Conformance").
//
// Each test runs in a forked child (a crash or a hang fails that test, not the run); the parent only forks and
// collects JSON results, so it never initialises the kernels' thread pools before forking.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "tests/conformance/conformance.h"

namespace fs = std::filesystem;
using namespace gspmd::conformance;

namespace {

const char* kUsage = R"(usage: gspmd-conformance [options]
  --data DIR          the suite's data folder (default: $GSPMD_ONNX_TESTDATA, else )" GSPMD_ONNX_TESTDATA R"()
  --folders A,B       folders of DIR to run (default: node,pytorch-converted,pytorch-operator,simple)
  --filter S          only tests whose "folder/name" contains S (repeatable)
  --expected FILE     fail (exit 1) when a test listed in FILE does not pass any more, naming it
  --update-expected   rewrite FILE with what passes now (entries of tests not run are kept)
  --table FILE        write the markdown table (docs/conformance.md)
  --json FILE         write every result as JSON
  --seed N            seed of the random input shardings (default 1)
  --jobs N            tests run in parallel (default 1)
  --timeout S         per-test limit in seconds (default 120)
  --verbose           print every test's result, not only the ones that do not pass
exit codes: 0 ok, 1 regression against --expected, 2 bad usage or no test data)";

struct Options {
  std::string data;
  std::vector<std::string> folders{"node", "pytorch-converted", "pytorch-operator", "simple"};
  std::vector<std::string> filters;
  std::string expected, table, json;
  bool update_expected = false, verbose = false;
  uint64_t seed = 1;
  int jobs = 1, timeout = 120;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

// ------------------------------------------------------------------------------------------------------------------
// Running tests in children.

struct Child {
  pid_t pid = -1;
  int fd = -1;
  std::string out;
  size_t index = 0;
};

std::string signal_text(int sig) {
  const char* d = strsignal(sig);
  return fmt::format("signal {} ({})", sig, d ? d : "?");
}

/// The last complete JSON line the child sent, if any.
std::optional<TestResult> last_result(const std::string& out) {
  std::optional<TestResult> r;
  size_t begin = 0;
  for (size_t nl; (nl = out.find('\n', begin)) != std::string::npos; begin = nl + 1) {
    try {
      r = result_from_json(nlohmann::json::parse(out.substr(begin, nl - begin)));
    } catch (const std::exception&) {
    }
  }
  return r;
}

TestResult finish(Child& c, const std::string& dir, int timeout) {
  int status = 0;
  waitpid(c.pid, &status, 0);
  close(c.fd);
  std::optional<TestResult> got = last_result(c.out);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (ok && got) return *got;
  std::string why = WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? fmt::format("timed out after {} s", timeout)
                    : WIFSIGNALED(status) ? fmt::format("crashed with {}", signal_text(WTERMSIG(status)))
                                          : fmt::format("runner child exited with status {}", WEXITSTATUS(status));
  if (got) {  // the single mode finished; the sharded run died
    got->sharded = {Status::kFail, fmt::format("{} in the sharded run ({})", why, got->sharded.message)};
    return *got;
  }
  TestResult r;
  const fs::path d(dir);
  r.name = d.filename().string();
  r.folder = d.parent_path().filename().string();
  r.single = r.sharded = {Status::kFail, why};
  return r;
}

std::vector<TestResult> run_all(const std::vector<std::string>& dirs, const Options& o,
                                const std::function<void(const TestResult&)>& report) {
  std::vector<TestResult> results(dirs.size());
  std::vector<Child> running;
  size_t next = 0;
  while (next < dirs.size() || !running.empty()) {
    while (next < dirs.size() && static_cast<int>(running.size()) < o.jobs) {
      int p[2];
      if (pipe(p) != 0) throw std::runtime_error("pipe failed");
      std::fflush(stdout);
      pid_t pid = fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        close(p[0]);
        alarm(static_cast<unsigned>(o.timeout));
        // One JSON line after the single mode, then the full result: the parent keeps the last complete line.
        auto send = [&](const TestResult& r) {
          const std::string s = to_json(r).dump() + "\n";
          size_t off = 0;
          while (off < s.size()) {
            ssize_t w = write(p[1], s.data() + off, s.size() - off);
            if (w <= 0) _exit(4);
            off += static_cast<size_t>(w);
          }
        };
        try {
          send(run_test(dirs[next], o.seed, send));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: %s\n", dirs[next].c_str(), e.what());
          _exit(3);
        }
        _exit(0);
      }
      close(p[1]);
      running.push_back({pid, p[0], "", next});
      ++next;
    }
    std::vector<pollfd> fds;
    for (const Child& c : running) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    for (size_t i = fds.size(); i-- > 0;) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = read(running[i].fd, buf, sizeof buf);
      if (n > 0) {
        running[i].out.append(buf, static_cast<size_t>(n));
        continue;
      }
      Child c = running[i];
      running.erase(running.begin() + static_cast<long>(i));
      results[c.index] = finish(c, dirs[c.index], o.timeout);
      report(results[c.index]);
    }
  }
  return results;
}

// ------------------------------------------------------------------------------------------------------------------
// Grouping node tests by operator.

std::string squash(const std::string& s) {
  std::string o;
  for (char c : s)
    if (c != '_') o += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

bool is_expanded(const std::string& name) { return name.find("_expanded") != std::string::npos; }

/// The operator a node test is about: for "_expanded" tests, the op of the sibling test without the suffix; else
/// the longest op type of the model whose lower-case name starts the test name ("test_reduce_sum_..." ->
/// ReduceSum); else the first op that is not Constant.
std::map<std::string, std::string> op_of_tests(const std::vector<TestResult>& rs) {
  std::map<std::string, std::string> by_name;
  auto direct = [](const TestResult& r) -> std::string {
    const std::string key = squash(r.name.substr(r.name.rfind("test_", 0) == 0 ? 5 : 0));
    std::string best;
    for (const std::string& op : r.op_types) {
      std::string bare = op.substr(op.find(':') == std::string::npos ? 0 : op.find(':') + 1);
      if (key.rfind(squash(bare), 0) == 0 && bare.size() > best.size()) best = op;
    }
    if (!best.empty()) return best;
    for (const std::string& op : r.op_types)
      if (op != "Constant") return op;
    return r.op_types.empty() ? "(none)" : r.op_types[0];
  };
  std::map<std::string, const TestResult*> node_tests;
  for (const TestResult& r : rs)
    if (r.folder == "node") node_tests[r.name] = &r;
  for (const auto& [name, r] : node_tests) {
    if (is_expanded(name)) {
      std::string base = name.substr(0, name.find("_expanded"));
      auto it = node_tests.find(base);
      if (it != node_tests.end()) {
        by_name[name] = direct(*it->second);
        continue;
      }
    }
    by_name[name] = direct(*r);
  }
  return by_name;
}

// ------------------------------------------------------------------------------------------------------------------
// The markdown table.

std::string cell(std::string s, size_t max = 400) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  if (s.size() > max) s = s.substr(0, max) + " ...";
  std::string o;
  for (char c : s) {
    if (c == '|')
      o += "\\|";
    else if (c == '`')
      o += "'";
    else
      o += c;
  }
  return o;
}

struct Counts {
  int total = 0, single = 0, sharded = 0, skipped = 0, failed = 0;
  void add(const TestResult& r) {
    ++total;
    single += r.single.status == Status::kPass;
    sharded += r.sharded.status == Status::kPass;
    skipped += r.single.status == Status::kSkip;
    failed += r.single.status == Status::kFail || r.sharded.status == Status::kFail;
  }
};

void write_table(const std::string& path, const std::vector<TestResult>& rs, const Options& o, double wall) {
  std::ostringstream md;
  md << "# ONNX backend test suite: conformance\n\n"
        "Generated by `gspmd-conformance` (tests/conformance/). Do not edit by hand: regenerate with\n\n"
        "    ninja -C build gspmd-conformance\n"
        "    OMP_NUM_THREADS=1 build/bin/gspmd-conformance --jobs 2 --table docs/conformance.md \\\n"
        "        --expected tests/conformance/expected_pass.txt --update-expected\n\n"
        "Every test of Debian's `libonnx-testdata` (folders `node`, `pytorch-converted`, `pytorch-operator`, "
        "`simple`)\nruns through the real pipeline: `load_model` + `read_value_pb` (tensors, sequences, optionals), "
        "then\n"
        "- **single**: `run_single` on one device;\n"
        "- **sharded**: `propagate` + `partition` + `run_spmd` on a mesh of 2 and on a 2x2 mesh, each graph input "
        "getting a\n  random sharding (per mesh axis: one of its dims, or none; seed "
     << o.seed
     << ", mixed with the test name). Sharded passes when both meshes pass.\n\n"
        "Outputs are compared with the suite's expected outputs with its tolerances (rtol 1e-3, atol 1e-7; ints "
        "and bools exactly).\n"
        "A test is **skipped** when the executor or the frontend does not support something it uses (the reason "
        "is the exception\nmessage); every other error or mismatch is a **failure** and is listed below. When an "
        "output shape depends on input\nvalues (Reshape's shape, TopK's K), those small inputs are frozen as "
        "constants (column \"frozen\" in the lists).\n"
        "`tests/conformance/expected_pass.txt` holds what passes; the ctest test `conformance` fails when one of "
        "them stops passing.\n\n";

  std::map<std::string, Counts> per_folder;
  for (const TestResult& r : rs) per_folder[r.folder].add(r), per_folder["total"].add(r);
  md << "## Summary\n\n| folder | tests | single pass | sharded pass | skipped | failed "
        "|\n|---|---:|---:|---:|---:|---:|\n";
  for (const std::string& f : o.folders)
    if (per_folder.count(f)) {
      const Counts& c = per_folder[f];
      md << fmt::format("| {} | {} | {} | {} | {} | {} |\n", f, c.total, c.single, c.sharded, c.skipped, c.failed);
    }
  {
    const Counts& c = per_folder["total"];
    md << fmt::format("| **total** | {} | {} | {} | {} | {} |\n\n", c.total, c.single, c.sharded, c.skipped, c.failed);
  }
  md << fmt::format("The whole run took {:.0f} s wall with --jobs {} on this host.\n\n", wall, o.jobs);

  const auto ops = op_of_tests(rs);
  std::map<std::string, Counts> per_op;
  std::map<std::string, std::set<std::string>> fallback_ops;
  for (const TestResult& r : rs)
    if (r.folder == "node") per_op[ops.at(r.name)].add(r);
  if (!per_op.empty()) {
    md << "## node: per operator\n\n\"tests\" counts the op's tests including `_expanded` ones (the op written as a "
          "function of other ops).\n\n"
          "| op | tests | single pass | sharded pass | skipped | failed |\n|---|---:|---:|---:|---:|---:|\n";
    for (const auto& [op, c] : per_op)
      md << fmt::format("| {} | {} | {} | {} | {} | {} |\n", op, c.total, c.single, c.sharded, c.skipped, c.failed);
    md << "\n";
  }
  for (const std::string& f : o.folders) {
    if (f == "node" || !per_folder.count(f)) continue;
    md << fmt::format("## {}\n\n| test | ops | single | sharded |\n|---|---|---|---|\n", f);
    for (const TestResult& r : rs) {
      if (r.folder != f) continue;
      std::string ops_list;
      for (const std::string& op : r.op_types) ops_list += (ops_list.empty() ? "" : ", ") + op;
      md << fmt::format("| {} | {} | {} | {} |\n", r.name, cell(ops_list, 200), status_name(r.single.status),
                        status_name(r.sharded.status));
    }
    md << "\n";
  }

  md << "## Failures\n\n| test | mode | frozen | message |\n|---|---|---|---|\n";
  for (const TestResult& r : rs) {
    std::string frozen;
    for (const std::string& f : r.frozen) frozen += (frozen.empty() ? "" : ", ") + f;
    if (r.single.status == Status::kFail)
      md << fmt::format("| {} | single | {} | {} |\n", r.id(), cell(frozen), cell(r.single.message));
    if (r.sharded.status == Status::kFail)
      md << fmt::format("| {} | sharded | {} | {} |\n", r.id(), cell(frozen), cell(r.sharded.message));
  }
  md << "\n## Skipped (unsupported)\n\n| test | reason |\n|---|---|\n";
  for (const TestResult& r : rs) {
    if (r.single.status == Status::kSkip)
      md << fmt::format("| {} | {} |\n", r.id(), cell(r.single.message));
    else if (r.sharded.status == Status::kSkip)
      md << fmt::format("| {} | sharded only: {} |\n", r.id(), cell(r.sharded.message));
  }
  for (const TestResult& r : rs)
    for (const std::string& w : r.fallbacks) {
      // Warnings name the node and op: "node 'n' (Op) ...": keep the op.
      auto a = w.find('('), b = w.find(')');
      fallback_ops[a != std::string::npos && b > a ? w.substr(a + 1, b - a - 1) : w].insert(r.id());
    }
  md << "\n## Replicated fallbacks\n\nOps the partitioner computed replicated (no sharding rule, or the rule did not "
        "apply) in the sharded runs, with the number of tests where it happened.\n\n| op | tests |\n|---|---:|\n";
  for (const auto& [op, tests] : fallback_ops) md << fmt::format("| {} | {} |\n", cell(op, 80), tests.size());
  std::ofstream(path) << md.str();
}

// ------------------------------------------------------------------------------------------------------------------
// The expected-pass set: lines "folder/test mode" (mode single | sharded); '#' starts a comment.

std::set<std::pair<std::string, std::string>> read_expected(const std::string& path) {
  std::set<std::pair<std::string, std::string>> s;
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open file", path));
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (auto h = line.find('#'); h != std::string::npos) line.resize(h);
    std::vector<std::string> f = split(line, ' ');
    if (f.empty()) continue;
    if (f.size() != 2 || (f[1] != "single" && f[1] != "sharded"))
      throw std::runtime_error(fmt::format("{}:{}: expected 'folder/test single|sharded'", path, no));
    s.insert({f[0], f[1]});
  }
  return s;
}

void write_expected(const std::string& path, const std::set<std::pair<std::string, std::string>>& s) {
  std::ofstream out(path);
  out << "# Tests of the ONNX backend suite that pass (gspmd-conformance --expected): one 'folder/test mode' per "
         "line.\n"
         "# The ctest test 'conformance' fails when one of them stops passing. Regenerate with --update-expected\n"
         "# (docs/testing.md); only add lines, unless a test is removed on purpose.\n";
  for (const auto& [id, mode] : s) out << id << ' ' << mode << '\n';
}

}  // namespace

/// Reads the command line into `o`; returns the exit code when the program should stop (0 after --help, 2 on a bad
/// option), else -1.
int parse_args(int argc, char** argv, Options& o) {
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--data")
        o.data = value();
      else if (a == "--folders")
        o.folders = split(value(), ',');
      else if (a == "--filter")
        o.filters.push_back(value());
      else if (a == "--expected")
        o.expected = value();
      else if (a == "--update-expected")
        o.update_expected = true;
      else if (a == "--table")
        o.table = value();
      else if (a == "--json")
        o.json = value();
      else if (a == "--seed")
        o.seed = std::stoull(value());
      else if (a == "--jobs")
        o.jobs = std::max(1, std::stoi(value()));
      else if (a == "--timeout")
        o.timeout = std::max(1, std::stoi(value()));
      else if (a == "--verbose")
        o.verbose = true;
      else if (a == "-h" || a == "--help") {
        std::puts(kUsage);
        return 0;
      } else {
        throw std::invalid_argument("unknown option " + a);
      }
    }
    if (o.update_expected && o.expected.empty()) throw std::invalid_argument("--update-expected needs --expected");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n%s\n", e.what(), kUsage);
    return 2;
  }
  return -1;
}

/// The test folders of o.folders under o.data that hold a model.onnx and match o.filters, sorted per folder, into
/// `dirs`; returns 2 (after printing why) when a folder is missing or nothing matches, else 0.
int find_tests(const Options& o, std::vector<std::string>& dirs) {
  for (const std::string& f : o.folders) {
    const fs::path folder = fs::path(o.data) / f;
    if (!fs::is_directory(folder)) {
      std::fprintf(stderr, "error: %s: no such folder (install libonnx-testdata, or pass --data)\n",
                   folder.string().c_str());
      return 2;
    }
    std::vector<std::string> here;
    for (const auto& e : fs::directory_iterator(folder)) {
      if (!fs::exists(e.path() / "model.onnx")) continue;
      const std::string id = f + "/" + e.path().filename().string();
      bool keep = o.filters.empty();
      for (const std::string& s : o.filters) keep = keep || id.find(s) != std::string::npos;
      if (keep) here.push_back(e.path().string());
    }
    std::sort(here.begin(), here.end());
    dirs.insert(dirs.end(), here.begin(), here.end());
  }
  if (dirs.empty()) {
    std::fprintf(stderr, "error: no test matches\n");
    return 2;
  }
  return 0;
}

/// Compares the results with the expected-pass list o.expected (or updates it with --update-expected); returns the
/// exit code: 1 when an expected test mode stopped passing, 2 when the list cannot be read.
int check_expected(const Options& o, const std::vector<TestResult>& rs) {
  std::set<std::pair<std::string, std::string>> expected;
  try {
    if (fs::exists(o.expected) || !o.update_expected) expected = read_expected(o.expected);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  std::map<std::string, const TestResult*> by_id;
  for (const TestResult& r : rs) by_id[r.id()] = &r;
  int regressions = 0, fixed = 0;
  for (const auto& [id, mode] : expected) {
    bool selected = o.filters.empty();
    for (const std::string& s : o.filters) selected = selected || id.find(s) != std::string::npos;
    const std::string folder = id.substr(0, id.find('/'));
    if (!selected || std::find(o.folders.begin(), o.folders.end(), folder) == o.folders.end()) continue;
    auto it = by_id.find(id);
    const ModeResult* m = it == by_id.end() ? nullptr : mode == "single" ? &it->second->single : &it->second->sharded;
    if (m && m->status == Status::kPass) continue;
    ++regressions;
    std::printf("REGRESSION %s %s: %s\n", id.c_str(), mode.c_str(),
                m ? fmt::format("{}: {}", status_name(m->status), cell(m->message, 600)).c_str()
                  : "the test is missing from the data folder");
  }
  std::set<std::pair<std::string, std::string>> now = expected;
  for (const TestResult& r : rs) {
    for (const auto& [mode, m] : {std::pair{"single", &r.single}, std::pair{"sharded", &r.sharded}}) {
      if (m->status != Status::kPass) {
        if (o.update_expected) now.erase({r.id(), mode});
        continue;
      }
      if (!expected.count({r.id(), mode})) {
        ++fixed;
        now.insert({r.id(), mode});
      }
    }
  }
  if (o.update_expected) {
    write_expected(o.expected, now);
    std::printf("%s: %zu entries (%d new, %d dropped)\n", o.expected.c_str(), now.size(), fixed, regressions);
    return 0;
  }
  if (fixed)
    std::printf("%d test modes pass that %s does not list: add them with --update-expected\n", fixed,
                o.expected.c_str());
  if (regressions) {
    std::printf("FAILED: %d test modes of %s do not pass any more (listed above)\n", regressions, o.expected.c_str());
    return 1;
  }
  std::printf("OK: all %zu expected test modes pass\n", expected.size());
  return 0;
}

int main(int argc, char** argv) {
  Options o;
  if (const char* env = std::getenv("GSPMD_ONNX_TESTDATA")) o.data = env;
  if (o.data.empty()) o.data = GSPMD_ONNX_TESTDATA;
  if (const int code = parse_args(argc, argv, o); code >= 0) return code;
  std::vector<std::string> dirs;
  if (const int code = find_tests(o, dirs); code != 0) return code;

  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  std::vector<TestResult> rs = run_all(dirs, o, [&](const TestResult& r) {
    ++done;
    const bool ok = r.single.status == Status::kPass && r.sharded.status == Status::kPass;
    if (!ok || o.verbose) {
      std::printf("[%zu/%zu] %s: single %s, sharded %s (%.2f s)\n", done, dirs.size(), r.id().c_str(),
                  status_name(r.single.status), status_name(r.sharded.status), r.seconds);
      if (r.single.status != Status::kPass) std::printf("    single:  %s\n", cell(r.single.message, 600).c_str());
      if (r.sharded.status != Status::kPass) std::printf("    sharded: %s\n", cell(r.sharded.message, 600).c_str());
      std::fflush(stdout);
    }
  });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::map<std::string, Counts> per_folder;
  for (const TestResult& r : rs) per_folder[r.folder].add(r), per_folder["total"].add(r);
  std::printf("\n%-20s %6s %8s %8s %8s %8s\n", "folder", "tests", "single", "sharded", "skipped", "failed");
  for (const auto& [f, c] : per_folder)
    std::printf("%-20s %6d %8d %8d %8d %8d\n", f.c_str(), c.total, c.single, c.sharded, c.skipped, c.failed);
  std::printf("wall %.1f s\n", wall);

  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const TestResult& r : rs) j.push_back(to_json(r));
    std::ofstream(o.json) << j.dump(1) << '\n';
  }
  if (!o.table.empty()) write_table(o.table, rs, o, wall);

  if (o.expected.empty()) return 0;
  return check_expected(o, rs);
}
