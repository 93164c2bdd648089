// gspmd-bench-matmul: oneDNN's raw float32 matmul throughput on this host, the yardstick of bench/host.sh.
//
// For every shape M x K x N (C[M,N] = A[M,K] B[K,N], plain row-major, one primitive created up front), it runs one
// warm-up and then `--runs` timed executions and prints one JSON object per line:
//   {"m": 2048, "k": 2048, "n": 2048, "median_s": 0.084, "gflops": 204.5}
// where gflops = 2 M K N / median_s / 1e9. Threads are oneDNN's (OpenMP: OMP_NUM_THREADS).
//
// Usage: gspmd-bench-matmul [--runs N] [MxKxN ...]   (default shapes: 2048x2048x2048 and the 4-layer decoder's
// 1024x1024x1024, 1024x1024x4096, 1024x4096x1024). Bad arguments: one line "error: ..." on stderr, exit code 2.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <dnnl.hpp>

namespace {

struct Shape3 {
  int64_t m, k, n;
};

bool parse_shape(const std::string& s, Shape3& out) {
  long long m = 0, k = 0, n = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%lldx%lldx%lld%c", &m, &k, &n, &tail) != 3 || m <= 0 || k <= 0 || n <= 0) return false;
  out = {m, k, n};
  return true;
}

/// Median wall time of `runs` executions of C = A B after one warm-up (seconds).
double time_matmul(const Shape3& s, int runs) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::desc a_md({s.m, s.k}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc b_md({s.k, s.n}, memory::data_type::f32, memory::format_tag::ab);
  const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
  std::vector<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n)),
      c(static_cast<size_t>(s.m * s.n));
  std::mt19937 rng(0);
  std::normal_distribution<float> d(0.f, 1.f);
  for (float& x : a) x = d(rng);
  for (float& x : b) x = d(rng);
  dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng));
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  auto once = [&] {
    prim.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    strm.wait();
  };
  once();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    once();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  std::vector<Shape3> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
      if (runs <= 0) {
        std::fprintf(stderr, "error: --runs: expected a positive integer, got '%s'\n", argv[i]);
        return 2;
      }
      continue;
    }
    Shape3 s;
    if (!parse_shape(a, s)) {
      std::fprintf(stderr, "error: %s: expected --runs N or a shape MxKxN of positive integers\n", a.c_str());
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) shapes = {{2048, 2048, 2048}, {1024, 1024, 1024}, {1024, 1024, 4096}, {1024, 4096, 1024}};
  try {
    for (const Shape3& s : shapes) {
      const double t = time_matmul(s, runs);
      const double gf = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.k) * static_cast<double>(s.n) / t / 1e9;
      std::printf("{\"m\": %lld, \"k\": %lld, \"n\": %lld, \"median_s\": %.6f, \"gflops\": %.2f}\n",
                  static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(s.n), t, gf);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: oneDNN: %s\n", e.what());
    return 4;
  }
  return 0;
}
