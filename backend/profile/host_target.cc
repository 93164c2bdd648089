// backend/profile: measures the "host" target (see host_target.h; the numbers are documented in docs/cost-model.md).
#include "backend/profile/host_target.h"

#include <fmt/format.h>
#include <omp.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/kernels/kernels.h"
#include "backend/kernels/onednn.h"
#include "backend/pod/pod.h"
#include "core/cost/cost.h"

namespace gspmd {
namespace {

/// Evicts `n` bytes at `p` from every cache level (clflush per 64-byte line; nothing on other ISAs), so that an op
/// measured next reads its operands from memory, as in a program whose working set exceeds the caches.
void evict(const void* p, size_t n) {
#if defined(__x86_64__) || defined(__i386__)
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < n; i += 64) _mm_clflush(c + i);
  if (n) _mm_clflush(c + n - 1);
  _mm_mfence();
#else
  (void)p;
  (void)n;
#endif
}

/// Best (smallest) wall time in seconds of `reps` calls of f, after one warm-up call.
template <typename F>
double best_of(int reps, F&& f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return std::max(best, 1e-9);
}

Target measure() {
  Target t;
  t.name = "host";
  // Square f32 matmuls of 64 .. 1024: the contraction curve; the largest is the peak.
  for (int64_t n : {64, 128, 256, 512, 1024}) {
    std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
    const double flops = 2.0 * static_cast<double>(n * n * n);
    const int reps = n >= 512 ? 5 : 20;
    t.contraction_curve.emplace_back(
        flops, flops / best_of(reps, [&] { dnn::matmul(a.data(), b.data(), c.data(), 1, 1, n, n, n); }));
  }
  // A larger matmul can always run as fast as a smaller one (by tiles): keep the curve non-decreasing, which also
  // absorbs a noisy sample.
  for (size_t i = 1; i < t.contraction_curve.size(); ++i)
    t.contraction_curve[i].second = std::max(t.contraction_curve[i].second, t.contraction_curve[i - 1].second);
  t.peak_flops = t.contraction_curve.back().second;
  {
    // A ResNet-style 3x3 convolution, 64 -> 64 channels on 56x56 (231 MFLOP), against the curve at its FLOPs.
    dnn::ConvGeom g;
    g.src = {1, 64, 56, 56};
    g.wei = {64, 64, 3, 3};
    g.wei_strides = {64 * 9, 9, 3, 1};
    g.dst = {1, 64, 56, 56};
    g.strides = {1, 1};
    g.dilations = {0, 0};
    g.pad_l = {1, 1};
    g.pad_r = {1, 1};
    std::vector<float> src(64 * 56 * 56, 0.5f), wei(64 * 64 * 9, 0.25f), dst(src.size());
    const double flops = 2.0 * 64 * 56 * 56 * 64 * 9;
    double s = best_of(5, [&] { dnn::conv(g, src.data(), wei.data(), nullptr, dst.data()); });
    t.conv_efficiency = std::min(1.0, (flops / s) / t.contraction_rate(flops, DType::kFloat32, false));
  }
  {
    const int64_t n = int64_t{32} << 20;
    std::vector<float> in(static_cast<size_t>(n), 1.f), out(static_cast<size_t>(n));
    t.hbm_bandwidth = 2.0 * 4.0 * static_cast<double>(n) /
                      best_of(3, [&] { dnn::eltwise(dnn::Eltwise::kRelu, in.data(), out.data(), n); });
    t.link_bandwidth = 4.0 * static_cast<double>(n / 2) /
                       best_of(3, [&] { std::memcpy(out.data(), in.data(), static_cast<size_t>(n / 2) * 4); });
  }
  {
    // The executor's fixed cost per op: a chain of kOps Relu nodes on 16 floats through run_single (compute and
    // bytes are negligible: 64 B per op).
    constexpr int kOps = 256;
    Graph g;
    g.opset = 17;
    int v = g.add_value_unique("x", DType::kFloat32, {16});
    g.inputs = {v};
    for (int i = 0; i < kOps; ++i) {
      Node n;
      n.name = n.op_type = "Relu";
      n.inputs = {v};
      v = g.add_value_unique("r", DType::kFloat32, {16});
      n.outputs = {v};
      g.nodes.push_back(std::move(n));
    }
    g.outputs = {v};
    std::vector<Tensor> in = {Tensor::from_floats({16}, std::vector<float>(16, 1.f))};
    t.op_overhead = best_of(3, [&] { run_single(g, in); }) / kOps;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  t.hbm_bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 1;
  t.torus_dims = 1;
  return t;
}

}  // namespace

int measure_program_ops(const SpmdProgram& p, Target& t, double share, double budget_s, int64_t max_input_bytes,
                        MeasureSpread* spread) {
  using Clock = std::chrono::steady_clock;
  const Graph& program = p.program;
  const auto start = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  // Values a device keeps bound, unchanged, from one step to the next, as the executor binds them with an owner
  // (bind_weights): constants, and params replicated over the mesh (shared from the model, not sliced).
  std::vector<char> persistent(program.values.size(), 0);
  for (const ProgramBinding& b : p.params)
    if (b.sharding.is_replicated()) persistent[static_cast<size_t>(b.local)] = 1;
  int added = 0;
  for (const Node& n : program.nodes) {
    if (elapsed() >= budget_s) break;
    if (n.domain == kGspmdDomain || !has_kernel(n.domain, n.op_type)) continue;
    std::string sig = op_signature(program, n);
    if (t.measured_ops.count(sig)) continue;
    int64_t bytes = 0;
    for (int v : n.inputs) {
      const Value* val = v < 0 ? nullptr : &program.values[static_cast<size_t>(v)];
      if (val && !val->data) bytes += val->nbytes();
    }
    if (bytes > max_input_bytes) continue;
    try {
      std::vector<std::shared_ptr<const Tensor>> held(n.inputs.size());  // the inputs' data
      std::vector<const Tensor*> ins(n.inputs.size(), nullptr);
      std::vector<const std::shared_ptr<const Tensor>*> owners(n.inputs.size(), nullptr);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int v = n.inputs[k];
        if (v < 0) continue;
        const Value& val = program.values[static_cast<size_t>(v)];
        if (val.data) {
          held[k] = val.data;
        } else {
          auto x = std::make_shared<Tensor>(val.dtype, val.shape);
          if (val.dtype == DType::kFloat32) std::fill_n(x->data<float>(), x->numel(), 0.5f);
          if (val.dtype == DType::kFloat64) std::fill_n(x->data<double>(), x->numel(), 0.5);
          held[k] = std::move(x);
        }
        ins[k] = held[k].get();
        if (val.data || persistent[static_cast<size_t>(v)]) owners[k] = &held[k];
      }
      run_kernel(n, ins, program.opset, {}, owners);  // warm-up: oneDNN creates (and JIT-compiles) its primitive
      std::vector<double> times;
      for (double spent = 0; times.size() < 5 && (times.size() < 3 || spent < 0.02);) {
        for (const Tensor* x : ins)
          if (x) evict(x->bytes.data(), x->nbytes());
        auto t0 = Clock::now();
        run_kernel(n, ins, program.opset, {}, owners);
        times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        spent += times.back();
      }
      if (spread) {
        const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
        const double ratio = *hi / std::max(*lo, 1e-9);
        ++spread->ops;
        spread->unsteady += ratio > MeasureSpread::kUnsteadySpread;
        if (ratio > spread->worst) spread->worst = ratio, spread->worst_op = n.op_type;
      }
      std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
      const double median = times[times.size() / 2];
      t.measured_ops.emplace(std::move(sig), median / share);
      ++added;
    } catch (const std::exception&) {
      // left to the roofline
    }
  }
  return added;
}

int host_cores() {
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                           : static_cast<int>(std::thread::hardware_concurrency());
  cores = std::max(1, cores);
  // The cgroup's quota: v2 "max 100000" or "200000 100000"; v1 quota -1 for none.
  double quota = -1, period = 0;
  if (std::ifstream v2("/sys/fs/cgroup/cpu.max"); v2) {
    std::string q;
    if (v2 >> q >> period && q != "max") quota = std::atof(q.c_str());
  } else if (std::ifstream q1("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p1("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
             q1 && p1) {
    q1 >> quota;
    p1 >> period;
  }
  if (quota > 0 && period > 0) cores = std::min(cores, std::max(1, static_cast<int>(std::ceil(quota / period))));
  return cores;
}

std::string host_spread_warning(const MeasureSpread& s, int threads, int cores) {
  if (threads > cores)
    return fmt::format(
        "host: OpenMP runs {} threads on {} cores (OMP_NUM_THREADS): kernels oversubscribe the cores, so the host "
        "times may not repeat; set OMP_NUM_THREADS={}",
        threads, cores, cores);
  if (s.unsteady < std::max(2, s.ops / 10)) return "";  // one small op's slow repeat is noise
  return fmt::format(
      "host: {} of {} measured ops varied more than {:g}x between repeats (worst {:.1f}x, a {}): the machine is "
      "busy, so the host times may not repeat",
      s.unsteady, s.ops, MeasureSpread::kUnsteadySpread, s.worst, s.worst_op);
}

int limit_threads_to_cores() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if ((!env || !*env) && omp_get_max_threads() > host_cores()) omp_set_num_threads(host_cores());
  return host_threads();
}

int host_threads() { return std::max(1, omp_get_max_threads()); }

Target measure_host_target() {
  static std::once_flag once;
  static Target host;
  std::call_once(once, [] { host = measure(); });
  return host;
}

}  // namespace gspmd
