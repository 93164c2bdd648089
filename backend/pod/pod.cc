// backend/pod: the SPMD interpreter. All devices run the program in lock step, node by node, on this host.
//
// Per device: a slot per program value, either owned (a Tensor the device holds) or shared (a pointer to data that
// outlives the run: program constants, replicated weights/inputs). Memory accounting counts every live value's
// bytes on every device whether owned or shared. Weights (params) and program constants are resident for the whole
// run; other values (inputs, intermediates) are freed after their last use; program outputs stay until the end.
// peak_memory_bytes = max over the run of the live bytes, measured after each node's outputs are allocated and
// before its dead operands are freed (operands and results coexist).
#include "backend/pod/pod.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>

#include <malloc.h>
#include <omp.h>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/pod/collective_executor.h"
#include "backend/kernels/onednn.h"
#include "backend/pod/collectives.h"
#include "core/partition/reshard.h"
#include "core/cost/cost.h"

namespace gspmd {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Number of devices that run a node concurrently: `device_threads` (ExecutorOptions) when not 0 (at least 1), else
/// min(devices, omp_get_max_threads()).
int device_parallelism(int64_t devices, int device_threads) {
  const int t = device_threads == 0 ? omp_get_max_threads() : std::max(1, device_threads);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(devices, t)));
}

/// Keeps freed tensor buffers in the heap for reuse instead of returning them to the OS (glibc serves large
/// allocations with mmap by default: every fresh intermediate then page-faults and is zeroed by the kernel).
/// Process-wide, set once; buffers up to 32 MiB (glibc's limit) come from the heap afterwards.
void keep_freed_buffers() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    return true;
  }();
  (void)done;
}

class Executor {
 public:
  /// Runs `prog` for the devices `devices` (global ids on `mesh`; local index d holds device devices[d]); their
  /// collectives go to `coll`.
  Executor(const Graph& prog, const DeviceMesh& mesh, std::vector<int64_t> devices, CollectiveExecutor& coll,
           const ExecutorOptions& options)
      : prog_(prog), mesh_(mesh), n_(static_cast<int64_t>(devices.size())), nv_(prog.values.size()),
        dev_(std::move(devices)), coll_(coll), options_(options), par_(device_parallelism(n_, options.device_threads)) {
    keep_freed_buffers();
    local_of_.assign(static_cast<size_t>(std::max<int64_t>(mesh.num_devices(), 1)), -1);
    for (int64_t d = 0; d < n_; ++d) local_of_.at(static_cast<size_t>(dev_[d])) = d;
    own_.assign(n_, std::vector<Tensor>(nv_));
    ptr_.assign(n_, std::vector<const Tensor*>(nv_, nullptr));
    owner_.assign(nv_, nullptr);
    acct_.assign(n_, std::vector<int64_t>(nv_, 0));
    live_.assign(n_, 0);
    resident_.assign(nv_, 0);
    keep_.assign(nv_, 0);
    for (int v : prog.outputs) keep_[v] = 1;
    stats_.resize(n_);
    for (int64_t d = 0; d < n_; ++d) stats_[d].device = dev_[d];
  }

  /// Device d holds `t` as value v.
  void set_owned(int64_t d, int v, Tensor t) {
    release_slot(d, v);
    own_[d][v] = std::move(t);
    ptr_[d][v] = &own_[d][v];
    acct_[d][v] = static_cast<int64_t>(own_[d][v].nbytes());
    live_[d] += acct_[d][v];
  }
  /// Device d sees `t` (owned by someone that outlives the run) as value v; accounted as if held. `owner`, when given,
  /// owns `t` and never changes it (a model weight or constant): kernels may cache what they derive from it (a
  /// convolution's weights in oneDNN's blocked layout) for as long as it lives.
  void set_shared(int64_t d, int v, const Tensor* t, const std::shared_ptr<const Tensor>& owner = {}) {
    release_slot(d, v);
    ptr_[d][v] = t;
    if (owner && owner.get() == t) owner_[v] = owner;
    acct_[d][v] = static_cast<int64_t>(t->nbytes());
    live_[d] += acct_[d][v];
  }
  void mark_resident(int v) { resident_[v] = 1; }
  void keep(int v) { keep_[v] = 1; }
  const Tensor* get(int64_t d, int v) const { return ptr_[d][v]; }

  /// Moves value v of device d out (copies it when shared). The slot becomes empty.
  Tensor take(int64_t d, int v) {
    const Tensor* p = ptr_[d][v];
    if (!p) throw std::runtime_error(fmt::format("value '{}' is not available", prog_.values[v].name));
    Tensor out = p == &own_[d][v] ? std::move(own_[d][v]) : *p;
    ptr_[d][v] = nullptr;
    return out;
  }

  /// Runs f(d) for every device: up to par_ devices at a time, each on one OpenMP thread (kernels inside see one
  /// thread), or one after another when par_ == 1. The exception of the lowest failing device is rethrown.
  template <class F>
  void for_devices(F&& f) {
    for_each_index(n_, f);
  }
  /// f(i) for i in [0, count), like for_devices (used for devices and for disjoint replica groups).
  template <class F>
  void for_each_index(int64_t count, F&& f) {
    const int par = static_cast<int>(std::min<int64_t>(par_, count));
    if (par <= 1) {
      for (int64_t d = 0; d < count; ++d) f(d);
      return;
    }
    std::vector<std::exception_ptr> err(static_cast<size_t>(count));
#pragma omp parallel num_threads(par)
    {
      omp_set_num_threads(1);  // nested regions of this worker (oneDNN, elementwise loops) run on it alone
#pragma omp for schedule(dynamic, 1)
      for (int64_t d = 0; d < count; ++d) {
        try {
          f(d);
        } catch (...) {
          err[static_cast<size_t>(d)] = std::current_exception();
        }
      }
    }
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  }

  void run(const RunProgress& progress = {}) {
    // last use of every value (node index); kept values (outputs) are never freed.
    last_use_.assign(nv_, -1);
    for (size_t i = 0; i < prog_.nodes.size(); ++i)
      for (int v : prog_.nodes[i].inputs)
        if (v >= 0) last_use_[v] = static_cast<int>(i);
    for (int64_t d = 0; d < n_; ++d) stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
    plan_fusion();
    for (size_t i = 0; i < prog_.nodes.size(); ++i) {
      const Node& n = prog_.nodes[i];
      auto t0 = Clock::now();
      const FusedGroup* g = group_at_[i] >= 0 ? &groups_[static_cast<size_t>(group_at_[i])] : nullptr;
      std::vector<Tensor> results;  // per device: a fused group's result
      if (g) results = run_group(*g);
      else if (n.domain == kGspmdDomain) run_gspmd(n);
      else run_kernel_node(n, static_cast<int>(i));
      const size_t last = g ? static_cast<size_t>(g->last) : i;
      double flops = 0;
      // The accounting walks every node of a fused group as if it had run alone: its intermediates are accounted
      // (virtually) from their node to their last reader, the result is stored at the group's last node.
      for (size_t j = i; j <= last; ++j) {
        const Node& nj = prog_.nodes[j];
        if (g)
          for (int64_t d = 0; d < n_; ++d) {
            const int o = nj.outputs.at(0);
            if (j == last) store(nj, d, 0, std::move(results[static_cast<size_t>(d)]));
            else account_virtual(d, o, declared_bytes(o));
          }
        for (int64_t d = 0; d < n_; ++d) {
          stats_[d].peak_memory_bytes = std::max(stats_[d].peak_memory_bytes, live_[d]);
          for (int v : nj.inputs)
            if (v >= 0 && last_use_[v] == static_cast<int>(j)) free_value(d, v);
          for (int v : nj.outputs)
            if (v >= 0 && last_use_[v] < 0) free_value(d, v);  // produced but never read
        }
        flops += node_flops(prog_, nj) * static_cast<double>(n_);
      }
      host_flops_ += flops;
      OpProfile& op = profile_[g ? g->label : n.domain == kGspmdDomain ? "gspmd." + n.op_type : n.op_type];
      op.nodes += 1;
      op.wall_s += seconds_since(t0);
      op.flops += flops;
      i = last;
      if (progress) progress(i + 1, prog_.nodes.size());
    }
  }

  /// Fused groups planned for the last run (for tests and the profile).
  size_t fused_groups() const { return groups_.size(); }

  std::vector<DeviceStats>& stats() { return stats_; }
  double host_flops() const { return host_flops_; }
  /// Adds wall time outside run() (loading, assembling) to the profile under `what`.
  void add_profile(const std::string& what, double wall_s) {
    OpProfile& op = profile_[what];
    op.nodes += 1;
    op.wall_s += wall_s;
  }
  std::vector<OpProfile> profile() const {
    std::vector<OpProfile> out;
    for (const auto& [name, p] : profile_) {
      out.push_back(p);
      out.back().op = name;
    }
    std::stable_sort(out.begin(), out.end(), [](const OpProfile& a, const OpProfile& b) { return a.wall_s > b.wall_s; });
    return out;
  }

 private:
  void release_slot(int64_t d, int v) {
    live_[d] -= acct_[d][v];
    acct_[d][v] = 0;
    if (ptr_[d][v]) {
      own_[d][v] = Tensor();
      ptr_[d][v] = nullptr;
    }
  }
  void free_value(int64_t d, int v) {
    if (resident_[v] || keep_[v]) return;
    release_slot(d, v);
  }
  /// Device d accounts `bytes` for value v, which the host never materialises (inside a fused group).
  void account_virtual(int64_t d, int v, int64_t bytes) {
    release_slot(d, v);
    acct_[d][v] = bytes;
    live_[d] += bytes;
  }
  int64_t declared_bytes(int v) const { return prog_.values[static_cast<size_t>(v)].nbytes(); }

  // -------------------------------------------------------------------------------------------------------------
  // Fusion (docs/executor.md): a float32 MatMul and the elementwise nodes right after it that only refine its result
  // (Add/Sub/Mul/Div by an operand that broadcasts into it, the erf GELU) run as one oneDNN matmul with post-ops.
  // Planned once per run from the program's declared shapes, so every device runs the same fused groups.

  struct FusedGroup {
    int first = 0, last = 0;            // consecutive program nodes [first, last]; first is the MatMul
    int64_t a_batch = 1, b_batch = 1, m = 0, k = 0, n = 0;
    std::vector<dnn::PostOp> post;
    std::vector<int> operand;           // per post-op: the value read by a binary post-op (-1 for GELU)
    std::string label;                  // "MatMul+Add+Gelu"
  };

  bool is_f32(int v) const { return v >= 0 && prog_.values[static_cast<size_t>(v)].dtype == DType::kFloat32; }
  const Shape& shape_of(int v) const { return prog_.values[static_cast<size_t>(v)].shape; }

  /// Value of a resident float32 scalar that every device holds with the same value, else NaN.
  float resident_scalar(int v) const {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (v < 0 || !resident_[v] || !is_f32(v) || num_elements(shape_of(v)) != 1) return nan;
    const Tensor* t0 = ptr_[0][v];
    if (!t0 || t0->dtype != DType::kFloat32 || t0->numel() != 1) return nan;
    const float x = t0->data<float>()[0];
    for (int64_t d = 1; d < n_; ++d)
      if (!ptr_[d][v] || ptr_[d][v]->numel() != 1 || ptr_[d][v]->data<float>()[0] != x) return nan;
    return x;
  }

  /// True when value v is read by exactly `uses` nodes, all inside [lo, hi], reads it once each, and is no output.
  bool only_read_inside(int v, int uses, int lo, int hi) const {
    if (keep_[v] || resident_[v]) return false;
    const auto& cs = consumers_[static_cast<size_t>(v)];
    if (static_cast<int>(cs.size()) != uses) return false;
    for (int c : cs)
      if (c < lo || c > hi || count_uses(prog_.nodes[static_cast<size_t>(c)], v) != 1) return false;
    return true;
  }

  /// A binary post-op's operand shape mapped onto the matmul result [batch, M, N] of `out` (rank r >= 2):
  /// [1 or batch, 1 or M, 1 or N]; empty when it does not map (or would broadcast the result itself).
  static std::vector<int64_t> operand_dims(const Shape& out, const Shape& s, int64_t batch) {
    const size_t r = out.size();
    if (s.size() > r || r < 2) return {};
    Shape p(r - s.size(), 1);
    p.insert(p.end(), s.begin(), s.end());
    for (size_t i = 0; i < r; ++i)
      if (p[i] != 1 && p[i] != out[i]) return {};
    bool ones = true, full = true;
    for (size_t i = 0; i + 2 < r; ++i) {
      ones = ones && p[i] == 1;
      full = full && p[i] == out[i];
    }
    if (!ones && !full) return {};
    return {ones ? 1 : batch, p[r - 2], p[r - 1]};
  }

  /// Matches the erf GELU on `x` in the five nodes starting at j: 0.5 x (1 + erf(x / sqrt2)) as
  /// Mul(x, .5), Div(x, sqrt2) [or Mul(x, 1/sqrt2)], Erf, Add(., 1), Mul(., .) in any consistent order, or
  /// x * (erf(x / sqrt2) + 1) * .5. Returns the result value or -1.
  int match_gelu(int x, int j) const {
    const int hi = j + 4;
    if (hi >= static_cast<int>(prog_.nodes.size()) || !only_read_inside(x, 2, j, hi)) return -1;
    auto node = [&](int i) -> const Node& { return prog_.nodes[static_cast<size_t>(i)]; };
    auto plain = [&](const Node& nd, const char* op, size_t nin) {
      return nd.domain.empty() && nd.op_type == op && nd.inputs.size() == nin && nd.outputs.size() == 1;
    };
    auto other = [](const Node& nd, int v) { return nd.inputs[0] == v ? nd.inputs[1] : nd.inputs[1] == v ? nd.inputs[0] : -2; };
    auto near = [](float a, float b) { return std::fabs(a - b) <= 1e-6f * std::fabs(b); };
    auto find = [&](auto&& pred) {
      for (int i = j; i <= hi; ++i)
        if (pred(node(i))) return i;
      return -1;
    };
    // x / sqrt2
    const int dv = find([&](const Node& nd) {
      if (plain(nd, "Div", 2) && nd.inputs[0] == x) return near(resident_scalar(nd.inputs[1]), std::sqrt(2.f));
      if (plain(nd, "Mul", 2) && other(nd, x) >= 0) return near(resident_scalar(other(nd, x)), std::sqrt(0.5f));
      return false;
    });
    if (dv < 0) return -1;
    const int v_div = node(dv).outputs[0];
    const int ev = find([&](const Node& nd) { return plain(nd, "Erf", 1) && nd.inputs[0] == v_div; });
    if (ev < 0) return -1;
    const int v_erf = node(ev).outputs[0];
    const int pv = find([&](const Node& nd) {
      return plain(nd, "Add", 2) && other(nd, v_erf) >= 0 && resident_scalar(other(nd, v_erf)) == 1.f;
    });
    if (pv < 0) return -1;
    const int v_p = node(pv).outputs[0];
    int h = -1, y = -1;
    // form A: h = x * .5, y = h * p
    h = find([&](const Node& nd) {
      return plain(nd, "Mul", 2) && other(nd, x) >= 0 && resident_scalar(other(nd, x)) == .5f;
    });
    if (h >= 0) {
      const int v_h = node(h).outputs[0];
      y = find([&](const Node& nd) {
        return plain(nd, "Mul", 2) && ((nd.inputs[0] == v_h && nd.inputs[1] == v_p) ||
                                       (nd.inputs[0] == v_p && nd.inputs[1] == v_h));
      });
    } else {  // form B: h = x * p, y = h * .5
      h = find([&](const Node& nd) {
        return plain(nd, "Mul", 2) && ((nd.inputs[0] == x && nd.inputs[1] == v_p) ||
                                       (nd.inputs[0] == v_p && nd.inputs[1] == x));
      });
      if (h < 0) return -1;
      const int v_h = node(h).outputs[0];
      y = find([&](const Node& nd) {
        return plain(nd, "Mul", 2) && other(nd, v_h) >= 0 && resident_scalar(other(nd, v_h)) == .5f;
      });
    }
    if (y < 0 || y != hi) return -1;  // the result must come last: the group ends there
    // five distinct nodes, internal values read only inside
    std::vector<int> ids{dv, ev, pv, h, y};
    std::sort(ids.begin(), ids.end());
    if (std::unique(ids.begin(), ids.end()) != ids.end()) return -1;
    for (int i : {dv, ev, pv, h})
      if (!only_read_inside(node(i).outputs[0], 1, j, hi)) return -1;
    const int out = node(y).outputs[0];
    return is_f32(out) && shape_of(out) == shape_of(x) ? out : -1;
  }

  void plan_fusion() {
    groups_.clear();
    group_at_.assign(prog_.nodes.size(), -1);
    if (!options_.fuse) return;
    consumers_ = prog_.consumers();
    // primitives are checked with the thread count the devices will run them with
    struct RestoreThreads {
      int saved = omp_get_max_threads();
      ~RestoreThreads() { omp_set_num_threads(saved); }
    } restore_threads;
    if (par_ > 1) omp_set_num_threads(1);
    const int nn = static_cast<int>(prog_.nodes.size());
    for (int i = 0; i < nn; ++i) {
      const Node& mm = prog_.nodes[static_cast<size_t>(i)];
      if (!mm.domain.empty() || mm.op_type != "MatMul" || mm.inputs.size() != 2 || mm.outputs.size() != 1) continue;
      const int va = mm.inputs[0], vb = mm.inputs[1], vc = mm.outputs[0];
      if (!is_f32(va) || !is_f32(vb) || !is_f32(vc)) continue;
      const Shape &as = shape_of(va), &bs = shape_of(vb), &cs = shape_of(vc);
      if (as.size() < 2 || bs.size() < 2 || num_elements(cs) == 0 || as.back() == 0) continue;
      FusedGroup g;
      g.first = i;
      g.m = as[as.size() - 2];
      g.k = as.back();
      g.n = bs.back();
      if (bs[bs.size() - 2] != g.k) continue;
      g.a_batch = num_elements(Shape(as.begin(), as.end() - 2));
      if (bs.size() == 2) {
        g.b_batch = 1;
      } else if (as.size() == bs.size() && std::equal(as.begin(), as.end() - 2, bs.begin())) {
        g.b_batch = g.a_batch;
      } else {
        continue;
      }
      Shape expect(as.begin(), as.end() - 2);
      expect.push_back(g.m);
      expect.push_back(g.n);
      if (expect != cs) continue;
      const int64_t batch = std::max(g.a_batch, g.b_batch);
      int cur = vc, j = i + 1, last = i;
      std::string label = "MatMul";
      while (j < nn) {
        if (int y = match_gelu(cur, j); y >= 0) {
          g.post.push_back({dnn::PostOp::Kind::kGeluErf, dnn::Binary::kAdd, {}});
          g.operand.push_back(-1);
          if (!dnn::matmul_fused_supported(g.a_batch, g.b_batch, g.m, g.k, g.n, g.post)) {
            g.post.pop_back();
            g.operand.pop_back();
            break;
          }
          label += "+Gelu";
          cur = y;
          last = j + 4;
          j += 5;
          continue;
        }
        const Node& nd = prog_.nodes[static_cast<size_t>(j)];
        if (!nd.domain.empty() || nd.inputs.size() != 2 || nd.outputs.size() != 1 || !only_read_inside(cur, 1, j, j))
          break;
        const std::string& op = nd.op_type;
        const bool comm = op == "Add" || op == "Mul";
        if (!comm && op != "Sub" && op != "Div") break;
        int operand = nd.inputs[0] == cur ? nd.inputs[1] : nd.inputs[0];
        if (nd.inputs[0] != cur && (!comm || nd.inputs[1] != cur)) break;
        const int y = nd.outputs[0];
        if (operand < 0 || !is_f32(operand) || !is_f32(y) || shape_of(y) != shape_of(cur)) break;
        std::vector<int64_t> dims = operand_dims(cs, shape_of(operand), batch);
        if (dims.empty()) break;
        const dnn::Binary alg = op == "Add" ? dnn::Binary::kAdd : op == "Sub" ? dnn::Binary::kSub
                                : op == "Mul" ? dnn::Binary::kMul : dnn::Binary::kDiv;
        const float sv = op == "Mul" && g.post.empty() ? resident_scalar(operand) : std::nanf("");
        if (std::isfinite(sv)) {  // a scale right after the product: the matmul's output scale
          g.post.push_back({dnn::PostOp::Kind::kScale, dnn::Binary::kMul, {}, sv});
          g.operand.push_back(-1);
        } else {
          g.post.push_back({dnn::PostOp::Kind::kBinary, alg, dims});
          g.operand.push_back(operand);
        }
        if (!dnn::matmul_fused_supported(g.a_batch, g.b_batch, g.m, g.k, g.n, g.post)) {
          g.post.pop_back();
          g.operand.pop_back();
          break;
        }
        label += "+" + op;
        cur = y;
        last = j;
        ++j;
      }
      // A plain MatMul becomes a group too when several devices may stack their products (run_group)
      if (g.post.empty() &&
          (n_ == 1 || g.b_batch != 1 || !dnn::matmul_fused_supported(g.a_batch, g.b_batch, g.m, g.k, g.n, g.post)))
        continue;
      g.last = last;
      g.label = label;
      group_at_[static_cast<size_t>(i)] = static_cast<int>(groups_.size());
      groups_.push_back(std::move(g));
      i = last;
    }
  }

  /// Runs a fused group on every device; returns each device's result (the value of the group's last node).
  /// Stacking (docs/executor.md): devices that hold the same B (a replicated weight, or the same weight slice) and
  /// the same broadcast post-op operands run their products as one matmul over their A's stacked along M, on all
  /// threads: one large product is far more efficient than many small single-threaded ones. Devices stacked are
  /// removed from `rest`; their results are stored in `results`.
  void run_stacked(const FusedGroup& g, std::vector<Tensor>& results, std::vector<int64_t>& rest) {
    if (n_ < 2 || g.b_batch != 1) return;
    const int64_t rows = g.a_batch * g.m;  // A rows per device
    // per post-op: shared (broadcast over all rows: same pointer required) or stacked (one row block per device)
    std::vector<char> stacked(g.post.size(), 0);
    for (size_t p = 0; p < g.post.size(); ++p) {
      if (g.operand[p] < 0) continue;
      const std::vector<int64_t>& dims = g.post[p].src1_dims;
      if (dims[0] == 1 && dims[1] == 1) continue;
      if (dims[0] == std::max(g.a_batch, g.b_batch) && dims[1] == g.m) stacked[p] = 1;
      else return;
    }
    if (!options_.stack) return;
    const Node& mm = prog_.nodes[static_cast<size_t>(g.first)];
    std::map<std::vector<const void*>, std::vector<int64_t>> sets;
    for (int64_t d = 0; d < n_; ++d) {
      std::vector<const void*> key{input(mm, d, 1)->bytes.data()};
      for (size_t p = 0; p < g.post.size(); ++p)
        if (g.operand[p] >= 0 && !stacked[p]) key.push_back(ptr_[d][g.operand[p]] ? ptr_[d][g.operand[p]]->bytes.data() : nullptr);
      sets[key].push_back(d);
    }
    // Chunks of devices, each one stacked product on one worker thread (oneDNN's f32 gemm scales poorly over threads
    // for narrow products, and many chunks keep every worker busy). Sets are split so that there are at least par_
    // chunks when there are fewer sets than workers.
    std::vector<std::vector<int64_t>> chunks;
    size_t multi = 0;
    for (const auto& kv : sets) multi += kv.second.size() >= 2;
    if (multi == 0) return;
    const size_t pieces = std::max<size_t>(1, (static_cast<size_t>(par_) + multi - 1) / multi);
    for (const auto& kv : sets) {
      const std::vector<int64_t>& devs = kv.second;
      if (devs.size() < 2) continue;
      const size_t np = std::min(pieces, devs.size() / 2 == 0 ? size_t{1} : devs.size() / 2);
      for (size_t c = 0; c < np; ++c) {
        const size_t lo = devs.size() * c / np, hi = devs.size() * (c + 1) / np;
        chunks.emplace_back(devs.begin() + static_cast<long>(lo), devs.begin() + static_cast<long>(hi));
      }
    }
    std::vector<char> done(static_cast<size_t>(n_), 0);
    for_each_index(static_cast<int64_t>(chunks.size()), [&](int64_t ci) {
      const std::vector<int64_t>& devs = chunks[static_cast<size_t>(ci)];
      const int64_t G = static_cast<int64_t>(devs.size());
      auto t0 = Clock::now();
      auto stack = [&](int v, int64_t per) {  // copies each device's `per` floats of value v into one buffer
        Tensor t(DType::kFloat32, {G * per});
        for (int64_t j = 0; j < G; ++j) {
          const Tensor* x = ptr_[devs[static_cast<size_t>(j)]][v];
          if (!x || x->numel() != per) fail(mm, devs[static_cast<size_t>(j)], "stacked operand has the wrong size");
          std::memcpy(t.data<float>() + j * per, x->data<float>(), static_cast<size_t>(per) * sizeof(float));
        }
        return t;
      };
      const Tensor A = stack(mm.inputs[0], rows * g.k);
      std::vector<Tensor> ops(g.post.size());
      std::vector<const float*> src1(g.post.size(), nullptr);
      std::vector<dnn::PostOp> post = g.post;
      for (size_t p = 0; p < g.post.size(); ++p) {
        if (g.operand[p] < 0) continue;
        if (stacked[p]) {
          ops[p] = stack(g.operand[p], rows * post[p].src1_dims[2]);
          src1[p] = ops[p].data<float>();
          post[p].src1_dims[0] *= G;
        } else {
          src1[p] = ptr_[devs[0]][g.operand[p]]->data<float>();
        }
      }
      Tensor C(DType::kFloat32, {G * rows * g.n});
      bool ok = false;
      try {
        ok = dnn::matmul_fused(A.data<float>(), input(mm, devs[0], 1)->data<float>(), C.data<float>(), G * g.a_batch,
                               1, g.m, g.k, g.n, post, src1);
      } catch (const std::exception& e) {
        fail(mm, devs[0], e.what());
      }
      if (!ok) return;  // those devices run one by one
      const Shape& out_shape = prog_.values[static_cast<size_t>(prog_.nodes[static_cast<size_t>(g.last)].outputs.at(0))].shape;
      for (int64_t j = 0; j < G; ++j) {
        const int64_t d = devs[static_cast<size_t>(j)];
        Tensor c(DType::kFloat32, out_shape);
        std::memcpy(c.data<float>(), C.data<float>() + j * rows * g.n, static_cast<size_t>(rows * g.n) * sizeof(float));
        results[static_cast<size_t>(d)] = std::move(c);
        done[static_cast<size_t>(d)] = 1;
      }
      const double dt = seconds_since(t0) / static_cast<double>(G);
      for (int64_t d : devs) stats_[d].compute_wall_s += dt;
    });
    std::vector<int64_t> left;
    for (int64_t d : rest)
      if (!done[static_cast<size_t>(d)]) left.push_back(d);
    rest = std::move(left);
  }

  std::vector<Tensor> run_group(const FusedGroup& g) {
    const Node& mm = prog_.nodes[static_cast<size_t>(g.first)];
    const Node& tail = prog_.nodes[static_cast<size_t>(g.last)];
    const Value& out = prog_.values[static_cast<size_t>(tail.outputs.at(0))];
    std::vector<Tensor> results(static_cast<size_t>(n_));
    std::vector<int64_t> rest(static_cast<size_t>(n_));
    for (int64_t d = 0; d < n_; ++d) rest[static_cast<size_t>(d)] = d;
    run_stacked(g, results, rest);
    for_each_index(static_cast<int64_t>(rest.size()), [&](int64_t i) {
      const int64_t d = rest[static_cast<size_t>(i)];
      const Tensor* a = input(mm, d, 0);
      const Tensor* b = input(mm, d, 1);
      std::vector<const float*> src1(g.post.size(), nullptr);
      for (size_t p = 0; p < g.post.size(); ++p) {
        if (g.operand[p] < 0) continue;
        const Tensor* t = ptr_[d][g.operand[p]];
        if (!t) fail(mm, d, fmt::format("fused operand '{}' is not available", prog_.values[g.operand[p]].name));
        src1[p] = t->data<float>();
      }
      Tensor c(DType::kFloat32, out.shape);
      auto t0 = Clock::now();
      bool ok = false;
      try {
        ok = dnn::matmul_fused(a->data<float>(), b->data<float>(), c.data<float>(), g.a_batch, g.b_batch, g.m, g.k,
                               g.n, g.post, src1);
      } catch (const std::exception& e) {
        fail(mm, d, e.what());
      }
      if (!ok) fail(mm, d, "oneDNN has no fused matmul for this group (it had one when planned)");
      stats_[d].compute_wall_s += seconds_since(t0);
      results[static_cast<size_t>(d)] = std::move(c);
    });
    return results;
  }

  // d: local device index
  [[noreturn]] void fail(const Node& n, int64_t d, const std::string& what) const {
    throw std::runtime_error(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], what));
  }

  const Tensor* input(const Node& n, int64_t d, size_t k) const {
    int v = n.inputs[k];
    if (v < 0) return nullptr;
    const Tensor* t = ptr_[d][v];
    if (!t) fail(n, d, fmt::format("input {} '{}' is not available (not computed yet or already freed)", k,
                                   prog_.values[v].name));
    return t;
  }

  /// True when device d owns value v and node `node` (which reads v exactly once) is its last reader: the kernel may
  /// then reuse v's buffer. The accounting is unaffected (acct_ keeps v's bytes until it is freed after the node).
  bool donatable(const Node& n, int node, int64_t d, int v) const {
    return v >= 0 && ptr_[d][v] == &own_[d][v] && !resident_[v] && !keep_[v] && last_use_[v] == node &&
           count_uses(n, v) == 1;
  }

  // Stores output k of node n on device d, checking it against the program's declared type and shape.
  void store(const Node& n, int64_t d, size_t k, Tensor t) {
    if (k >= n.outputs.size()) return;
    int v = n.outputs[k];
    if (v < 0) return;
    const Value& val = prog_.values[v];
    if ((val.dtype != DType::kUndefined && t.dtype != val.dtype) || t.shape != val.shape)
      fail(n, d, fmt::format("output {} '{}' is {} but the program declares {}", k, val.name,
                             type_str(t.dtype, t.shape), type_str(val.dtype, val.shape)));
    set_owned(d, v, std::move(t));
  }

  /// True when a node is too cheap to be worth waking worker threads for: views (Reshape & co. reuse the donated
  /// buffer) and nodes whose every output is small.
  bool cheap(const Node& n) const {
    static const char* const kViews[] = {"Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size"};
    for (const char* v : kViews)
      if (n.op_type == v) return true;
    int64_t bytes = 0;
    for (int v : n.outputs) {
      if (v < 0) continue;
      try {
        bytes += prog_.values[static_cast<size_t>(v)].nbytes();
      } catch (const std::exception&) {
        return false;  // no fixed element size (undefined or string): let the kernel decide
      }
    }
    return bytes < (int64_t{64} << 10);
  }

  void run_kernel_node(const Node& n, int node) {
    // A cheap node on several devices: devices one after another on the calling thread, with one OpenMP thread
    // like the workers (the same cached primitives, no parallel region).
    const bool seq = par_ > 1 && cheap(n);
    struct Restore {
      int& par;
      int saved_par, saved_threads;
      bool on;
      ~Restore() {
        if (!on) return;
        par = saved_par;
        omp_set_num_threads(saved_threads);
      }
    } restore{par_, par_, omp_get_max_threads(), seq};
    if (seq) {
      par_ = 1;
      omp_set_num_threads(1);
    }
    for_devices([&](int64_t d) {
      std::vector<const Tensor*> ins(n.inputs.size());
      std::vector<Tensor*> donated(n.inputs.size(), nullptr);
      std::vector<const std::shared_ptr<const Tensor>*> owners(n.inputs.size(), nullptr);
      for (size_t k = 0; k < ins.size(); ++k) {
        ins[k] = input(n, d, k);
        if (donatable(n, node, d, n.inputs[k])) donated[k] = &own_[d][n.inputs[k]];
        const int v = n.inputs[k];
        if (v >= 0 && owner_[v] && owner_[v].get() == ins[k]) owners[k] = &owner_[v];
      }
      std::vector<Tensor> outs;
      auto t0 = Clock::now();
      try {
        outs = run_kernel(n, ins, prog_.opset, donated, owners);
      } catch (const UnsupportedError&) {
        throw;
      } catch (const std::exception& e) {
        fail(n, d, e.what());
      }
      stats_[d].compute_wall_s += seconds_since(t0);
      if (outs.size() < n.outputs.size()) {
        for (size_t k = outs.size(); k < n.outputs.size(); ++k)
          if (n.outputs[k] >= 0 && last_use_[n.outputs[k]] >= 0)
            fail(n, d, fmt::format("kernel returned {} outputs, output {} is used", outs.size(), k));
      }
      for (size_t k = 0; k < outs.size(); ++k) store(n, d, k, std::move(outs[k]));
    });
  }

  /// `axes` (an attribute of `n`) checked against the mesh.
  const std::vector<int>& checked(const Node& n, const std::vector<int>& axes) const {
    for (int a : axes)
      if (a >= mesh_.rank()) fail(n, 0, fmt::format("mesh axis {} out of range for mesh {}", a, mesh_.str()));
    return axes;
  }

  /// Runs a `gspmd` node (core/partition/program_ops.h) on every device.
  void run_gspmd(const Node& n) {
    const std::optional<GspmdOp> op = gspmd_op(n);
    if (!op) throw UnsupportedError(fmt::format("node '{}' ({}.{}): unknown gspmd op", n.name, n.domain, n.op_type));
    switch (*op) {
      case GspmdOp::kAllReduce:
      case GspmdOp::kAllGather:
      case GspmdOp::kReduceScatter:
      case GspmdOp::kAllToAll:
      case GspmdOp::kCollectivePermute: return run_collective(n);
      case GspmdOp::kShardSlice: {
        const ShardSliceAttrs a = shard_slice_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          store(n, d, 0, pod::shard_slice(*input(n, d, 0), a.axis, a.start(tile), a.length()));
        });
      }
      case GspmdOp::kMaskPad: {
        const MaskPadAttrs a = mask_pad_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          int xv = n.inputs.at(0);
          const Tensor* x = input(n, d, 0);
          Tensor y;
          // in place (steal the operand) when this is its last use and the device owns it
          bool steal = donatable(n, current_node(n), d, xv);
          if (steal) {
            y = std::move(own_[d][xv]);  // the operand stays accounted until it is freed after this node
          } else {
            y = *x;
          }
          const int64_t rank = static_cast<int64_t>(y.shape.size());
          const int64_t len = y.shape.at(static_cast<size_t>(a.axis < 0 ? a.axis + rank : a.axis));
          pod::mask_pad(y, a.axis, a.first(tile, len), a.full_size, a.value);
          store(n, d, 0, std::move(y));
        });
      }
      case GspmdOp::kPartitionOffset: {
        const PartitionOffsetAttrs a = partition_offset_attrs(n);
        return run_per_device(n, checked(n, a.mesh_axes), [&](int64_t d, int64_t tile) {
          const Value& out = prog_.values.at(n.outputs.at(0));
          Shape s = num_elements(out.shape) == 1 ? out.shape : Shape{};
          Tensor t(DType::kInt64, s);
          t.data<int64_t>()[0] = a.offset(tile);
          store(n, d, 0, std::move(t));
        });
      }
    }
  }

  /// Runs a collective node: one CollectiveExecutor call per replica group with members on this process.
  void run_collective(const Node& n) {
    const CollectiveAttrs a = collective_attrs(n);
    const std::vector<int>& axes = checked(n, a.mesh_axes);
    const std::string& op = n.op_type;
    if (n.inputs.size() != 1 || n.outputs.size() != 1) fail(n, 0, "a collective takes one input and one output");
    std::vector<std::vector<int64_t>> groups = mesh_.replica_groups(axes);
    CollectiveCall call;
    call.node = &n;
    call.op = a.kind;
    call.mesh_axes = axes;
    call.reduction = a.reduction;
    call.axis = a.axis;
    call.split_axis = a.split_axis;
    call.concat_axis = a.concat_axis;
    if (a.kind == Collective::kCollectivePermute) {
      const std::vector<int>& target_axes = checked(n, a.target_axes);
      try {
        call.sources = permute_sources(mesh_, axes, a.shift, target_axes);
      } catch (const std::exception& e) {
        fail(n, 0, e.what());
      }
    }
    std::vector<const Tensor*> ins;
    std::vector<int64_t> members, locals;
    for (const auto& group : groups) {
      ins.clear();
      members.clear();
      locals.clear();
      for (size_t t = 0; t < group.size(); ++t) {
        int64_t d = local_of_.at(static_cast<size_t>(group[t]));
        if (d < 0) continue;
        members.push_back(static_cast<int64_t>(t));
        locals.push_back(d);
        ins.push_back(input(n, d, 0));
      }
      if (members.empty()) continue;
      call.group = &group;
      auto t0 = Clock::now();
      std::vector<Tensor> outs;
      try {
        outs = coll_.run(call, members, ins);
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, op, dev_[locals[0]], e.what()));
      } catch (const std::exception& e) {
        fail(n, locals[0], e.what());
      }
      if (outs.size() != locals.size())
        fail(n, locals[0],
             fmt::format("the collective returned {} results for {} members", outs.size(), locals.size()));
      double dt = seconds_since(t0);
      for (size_t j = 0; j < locals.size(); ++j) {
        stats_[locals[j]].communication_wall_s += dt;
        store(n, locals[j], 0, std::move(outs[j]));
      }
    }
  }

  /// Runs `body(d, tile)` for every device d of this process, with d's tile index over `axes` (the node's
  /// mesh_axes); errors name the node and the device.
  template <class Body>
  void run_per_device(const Node& n, const std::vector<int>& axes, const Body& body) {
    for_devices([&](int64_t d) {
      auto t0 = Clock::now();
      try {
        body(d, mesh_.tile_index(dev_[d], axes));
      } catch (const UnsupportedError& e) {
        throw UnsupportedError(fmt::format("node '{}' ({}) on device {}: {}", n.name, n.op_type, dev_[d], e.what()));
      } catch (const std::runtime_error& e) {
        std::string w = e.what();
        if (w.rfind("node '", 0) == 0) throw;
        fail(n, d, w);
      } catch (const std::exception& e) {
        fail(n, d, e.what());
      }
      stats_[d].compute_wall_s += seconds_since(t0);
    });
  }

  int current_node(const Node& n) const { return static_cast<int>(&n - prog_.nodes.data()); }
  static int count_uses(const Node& n, int v) {
    int c = 0;
    for (int x : n.inputs) c += x == v;
    return c;
  }

  const Graph& prog_;
  const DeviceMesh& mesh_;
  int64_t n_;
  size_t nv_;
  std::vector<int64_t> dev_;       // local index -> global device id
  std::vector<int64_t> local_of_;  // global device id -> local index, -1 when not held here
  CollectiveExecutor& coll_;
  const ExecutorOptions options_;
  std::vector<std::vector<Tensor>> own_;
  std::vector<std::vector<const Tensor*>> ptr_;
  std::vector<std::shared_ptr<const Tensor>> owner_;  // per value: the immutable weight it is bound to, if any
  std::vector<std::vector<int64_t>> acct_;  // bytes accounted per device and value (0 when not live)
  std::vector<int64_t> live_;
  std::vector<char> resident_, keep_;
  std::vector<int> last_use_;
  std::vector<DeviceStats> stats_;
  double host_flops_ = 0;
  int par_ = 1;
  std::map<std::string, OpProfile> profile_;
  std::vector<FusedGroup> groups_;
  std::vector<int> group_at_;                 // per node: index into groups_ of the group starting there, or -1
  std::vector<std::vector<int>> consumers_;   // prog_.consumers()
};

void check_input(const Value& v, const Tensor& t) {
  if (t.dtype != v.dtype || t.shape != v.shape)
    throw InputError(fmt::format("input '{}': expected {} but got {}", v.name, type_str(v.dtype, v.shape),
                                 type_str(t.dtype, t.shape)));
}

}  // namespace

namespace {

std::vector<int64_t> all_devices(int64_t n) {
  std::vector<int64_t> d(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) d[i] = i;
  return d;
}

// Binds the program constants (shared, resident) and the params (each device's slice of the global initializer,
// resident; replicated params shared; a slice held by several devices cut once into `slices` and shared) for the
// executor's devices `devices`.
void bind_weights(Executor& ex, const SpmdProgram& p, const Graph& global, const std::vector<int64_t>& devices,
                  std::vector<char>& bound, std::vector<std::unique_ptr<Tensor>>& slices) {
  const Graph& prog = p.program;
  const DeviceMesh& mesh = p.mesh;
  const int64_t n = static_cast<int64_t>(devices.size());
  for (size_t v = 0; v < prog.values.size(); ++v) {
    const Value& val = prog.values[v];
    if (val.is_initializer && val.data) {
      ex.mark_resident(static_cast<int>(v));
      for (int64_t d = 0; d < n; ++d) ex.set_shared(d, static_cast<int>(v), val.data.get(), val.data);
      bound[v] = 1;
    }
  }
  // Params: resident. Replicated params share the global data. Otherwise every distinct slice is cut once (devices
  // whose coordinates differ only on mesh axes the param is replicated over hold the same slice) and shared by the
  // local devices that hold it; the slices are cut concurrently. Every device still accounts its slice.
  struct SliceJob {
    const Tensor* full;
    const TensorSharding* sharding;
    int64_t device;  // the first (global) device holding this slice
    Tensor* out;
  };
  std::vector<SliceJob> jobs;
  std::vector<std::pair<int, std::vector<Tensor*>>> param_slices;  // (local value, slice of each local device)
  for (const ProgramBinding& b : p.params) {
    const Value& gv = global.values.at(b.global);
    if (!gv.data) throw InputError(fmt::format("initializer '{}' has no data", gv.name));
    ex.mark_resident(b.local);
    bound[b.local] = 1;
    if (b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape) {
      for (int64_t d = 0; d < n; ++d) ex.set_shared(d, b.local, gv.data.get(), gv.data);
      continue;
    }
    std::map<std::vector<int64_t>, Tensor*> by_key;
    std::vector<Tensor*> of_device(static_cast<size_t>(n));
    for (int64_t d = 0; d < n; ++d) {
      const int64_t dev = devices[static_cast<size_t>(d)];
      // shard_tensor's result depends only on the offsets and on whether an unreduced tile is not the first
      std::vector<int64_t> key;
      for (int i = 0; i < b.sharding.rank(); ++i) key.push_back(b.sharding.offset(i, gv.shape, mesh, dev));
      key.push_back(b.sharding.unreduced.empty() ? 0 : mesh.tile_index(dev, b.sharding.unreduced) != 0);
      Tensor*& t = by_key[key];
      if (!t) {
        slices.push_back(std::make_unique<Tensor>());
        t = slices.back().get();
        jobs.push_back({gv.data.get(), &b.sharding, dev, t});
      }
      of_device[static_cast<size_t>(d)] = t;
    }
    param_slices.emplace_back(b.local, std::move(of_device));
  }
  std::vector<std::exception_ptr> slice_err(jobs.size());
#pragma omp parallel for schedule(dynamic, 1) if (jobs.size() > 1)
  for (size_t j = 0; j < jobs.size(); ++j) {
    try {
      *jobs[j].out = shard_tensor(*jobs[j].full, *jobs[j].sharding, mesh, jobs[j].device);
    } catch (...) {
      slice_err[j] = std::current_exception();
    }
  }
  for (auto& e : slice_err)
    if (e) std::rethrow_exception(e);
  for (const auto& [local, of_device] : param_slices)
    for (int64_t d = 0; d < n; ++d) ex.set_shared(d, local, of_device[static_cast<size_t>(d)]);
}

// Every program input and initializer is bound; outputs are kept to the end.
void finish_binding(Executor& ex, const SpmdProgram& p, const std::vector<char>& bound) {
  const Graph& prog = p.program;
  for (int v : prog.inputs)
    if (!bound[v]) throw std::runtime_error(fmt::format("program input '{}' has no binding", prog.values[v].name));
  for (size_t v = 0; v < prog.values.size(); ++v)
    if (prog.values[v].is_initializer && !bound[v])
      throw std::runtime_error(
          fmt::format("program initializer '{}' has neither data nor a param binding", prog.values[v].name));
  for (const ProgramBinding& b : p.outputs) ex.keep(b.local);
}

// Runs a plain graph as `device` of `mesh`: initializers are shared resident constants, inputs shared.
LocalRun run_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                   CollectiveExecutor& coll, const RunProgress& progress, const ExecutorOptions& options) {
  auto t_start = Clock::now();
  if (inputs.size() != g.inputs.size())
    throw InputError(fmt::format("run: the model has {} inputs, {} were given", g.inputs.size(), inputs.size()));
  Executor ex(g, mesh, {device}, coll, options);
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (!val.is_initializer) continue;
    if (!val.data) throw InputError(fmt::format("initializer '{}' has no data", val.name));
    ex.mark_resident(static_cast<int>(v));
    ex.set_shared(0, static_cast<int>(v), val.data.get(), val.data);
  }
  for (size_t k = 0; k < g.inputs.size(); ++k) {
    check_input(g.values[g.inputs[k]], inputs[k]);
    ex.set_shared(0, g.inputs[k], &inputs[k]);
  }
  ex.add_profile("(load)", seconds_since(t_start));
  auto t_exec = Clock::now();
  ex.run(progress);
  LocalRun r;
  r.run_s = seconds_since(t_exec);
  for (size_t k = 0; k < g.outputs.size(); ++k) {
    int v = g.outputs[k];
    bool again = false;
    for (size_t j = k + 1; j < g.outputs.size(); ++j) again |= g.outputs[j] == v;
    const Tensor* t = ex.get(0, v);
    if (!t) throw std::runtime_error(fmt::format("graph output '{}' was not computed", g.values[v].name));
    r.output_shards.push_back({});
    r.output_shards.back().push_back(again ? *t : ex.take(0, v));
  }
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

}  // namespace

PodRun run_spmd(const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
                const RunProgress& progress, const ExecutorOptions& options) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  const DeviceMesh& mesh = p.mesh;
  const int64_t N = mesh.num_devices();
  if (inputs.size() != global.inputs.size())
    throw InputError(fmt::format("run: the model has {} inputs, {} were given", global.inputs.size(), inputs.size()));
  std::vector<int> input_index(global.values.size(), -1);
  for (size_t k = 0; k < global.inputs.size(); ++k) input_index[global.inputs[k]] = static_cast<int>(k);

  InProcessCollectives coll;
  const std::vector<int64_t> devices = all_devices(N);
  std::vector<std::unique_ptr<Tensor>> slices;  // weight slices shared by devices; outlive the executor's use
  Executor ex(prog, mesh, devices, coll, options);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound, slices);
  // Inputs: shard the full values.
  for (const ProgramBinding& b : p.inputs) {
    const Value& gv = global.values.at(b.global);
    int k = input_index.at(b.global);
    if (k < 0) throw std::runtime_error(fmt::format("program input binds '{}', not a graph input", gv.name));
    check_input(gv, inputs[k]);
    bool shared = b.sharding.is_replicated() && prog.values.at(b.local).shape == gv.shape;
    for (int64_t d = 0; d < N; ++d) {
      if (shared) ex.set_shared(d, b.local, &inputs[k]);
      else ex.set_owned(d, b.local, shard_tensor(inputs[k], b.sharding, mesh, d));
    }
    bound[b.local] = 1;
  }
  finish_binding(ex, p, bound);
  ex.add_profile("(load)", seconds_since(t_start));

  ex.run(progress);

  auto t_assemble = Clock::now();
  PodRun r;
  std::vector<const Tensor*> shards(static_cast<size_t>(N));
  for (const ProgramBinding& b : p.outputs) {
    for (int64_t d = 0; d < N; ++d) {
      shards[d] = ex.get(d, b.local);
      if (!shards[d])
        throw std::runtime_error(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
    }
    r.outputs.push_back(assemble_tensor(shards, b.sharding, mesh, global.values.at(b.global).shape));
  }
  ex.add_profile("(assemble)", seconds_since(t_assemble));
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_spmd_local(const SpmdProgram& p, const Graph& global,
                        const std::vector<std::vector<Tensor>>& input_shards, const std::vector<int64_t>& devices,
                        CollectiveExecutor& collectives, const RunProgress& progress,
                        const ExecutorOptions& options) {
  auto t_start = Clock::now();
  const Graph& prog = p.program;
  if (input_shards.size() != p.inputs.size())
    throw InputError(fmt::format("run: the program has {} inputs, {} were given", p.inputs.size(), input_shards.size()));
  for (int64_t d : devices)
    if (d < 0 || d >= p.mesh.num_devices())
      throw std::runtime_error(fmt::format("device {} is not on the mesh {}", d, p.mesh.str()));
  std::vector<std::unique_ptr<Tensor>> slices;  // weight slices shared by devices; outlive the executor's use
  Executor ex(prog, p.mesh, devices, collectives, options);
  std::vector<char> bound(prog.values.size(), 0);
  bind_weights(ex, p, global, devices, bound, slices);
  for (size_t k = 0; k < p.inputs.size(); ++k) {
    const ProgramBinding& b = p.inputs[k];
    if (input_shards[k].size() != devices.size())
      throw std::runtime_error(fmt::format("input '{}': {} shards for {} devices", prog.values[b.local].name,
                                           input_shards[k].size(), devices.size()));
    for (size_t d = 0; d < devices.size(); ++d) {
      check_input(prog.values[b.local], input_shards[k][d]);
      ex.set_shared(static_cast<int64_t>(d), b.local, &input_shards[k][d]);
    }
    bound[b.local] = 1;
  }
  finish_binding(ex, p, bound);
  ex.add_profile("(load)", seconds_since(t_start));

  auto t_exec = Clock::now();
  ex.run(progress);

  LocalRun r;
  r.run_s = seconds_since(t_exec);
  for (const ProgramBinding& b : p.outputs) {
    r.output_shards.emplace_back();
    for (size_t d = 0; d < devices.size(); ++d) {
      if (!ex.get(static_cast<int64_t>(d), b.local))
        throw std::runtime_error(fmt::format("program output '{}' was not computed", prog.values[b.local].name));
      r.output_shards.back().push_back(*ex.get(static_cast<int64_t>(d), b.local));
    }
  }
  r.devices = std::move(ex.stats());
  r.host_flops = ex.host_flops();
  r.profile = ex.profile();
  r.wall_s = seconds_since(t_start);
  return r;
}

LocalRun run_device_graph(const Graph& g, const DeviceMesh& mesh, int64_t device, const std::vector<Tensor>& inputs,
                          CollectiveExecutor& collectives, const RunProgress& progress,
                          const ExecutorOptions& options) {
  if (device < 0 || device >= mesh.num_devices())
    throw std::runtime_error(fmt::format("device {} is not on the mesh {}", device, mesh.str()));
  return run_graph(g, mesh, device, inputs, collectives, progress, options);
}

PodRun run_single(const Graph& g, const std::vector<Tensor>& inputs, const RunProgress& progress,
                  const ExecutorOptions& options) {
  DeviceMesh mesh;
  mesh.shape = {1};
  mesh.axes = {"x"};
  InProcessCollectives coll;
  LocalRun l = run_graph(g, mesh, 0, inputs, coll, progress, options);
  PodRun r;
  for (auto& o : l.output_shards) r.outputs.push_back(std::move(o.at(0)));
  r.devices = std::move(l.devices);
  r.host_flops = l.host_flops;
  r.profile = std::move(l.profile);
  r.wall_s = l.wall_s;
  return r;
}

std::string format_profile(const PodRun& r) {
  std::string out = fmt::format("{:<40} {:>7} {:>10} {:>6} {:>9}\n", "step", "nodes", "wall ms", "%", "GFLOP/s");
  for (const OpProfile& p : r.profile)
    out += fmt::format("{:<40} {:>7} {:>10.2f} {:>6.1f} {:>9}\n", p.op, p.nodes, p.wall_s * 1e3,
                       r.wall_s > 0 ? 100.0 * p.wall_s / r.wall_s : 0.0,
                       p.flops > 0 && p.wall_s > 0 ? fmt::format("{:.1f}", p.flops / p.wall_s / 1e9) : "");
  out += fmt::format("{:<40} {:>7} {:>10.2f} {:>6.1f} {:>9.1f}\n", "total", "", r.wall_s * 1e3, 100.0,
                     r.wall_s > 0 ? r.host_flops / r.wall_s / 1e9 : 0.0);
  return out;
}

}  // namespace gspmd
