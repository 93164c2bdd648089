// backend/pod/fusion.cc: matmul epilogue fusion and device stacking (fusion.h, docs/executor.md).
#include "backend/pod/fusion.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include <omp.h>

#include <fmt/format.h>

namespace gspmd::pod {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int count_uses(const Node& n, int v) {
  int c = 0;
  for (int x : n.inputs) c += x == v;
  return c;
}

/// Plans and runs fused groups over one FusionHost (one Executor's run).
class Fusion {
 public:
  Fusion(FusionHost& h, bool stack)
      : h_(h), prog_(h.program()), n_(h.devices()), par_(h.parallelism()), stack_(stack) {}

  bool is_f32(int v) const { return v >= 0 && prog_.values[static_cast<size_t>(v)].dtype == DType::kFloat32; }
  const Shape& shape_of(int v) const { return prog_.values[static_cast<size_t>(v)].shape; }

  /// Value of a resident float32 scalar that every device holds with the same value, else NaN.
  float resident_scalar(int v) const {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    if (v < 0 || !h_.resident(v) || !is_f32(v) || num_elements(shape_of(v)) != 1) return nan;
    const Tensor* t0 = h_.value(0, v);
    if (!t0 || t0->dtype != DType::kFloat32 || t0->numel() != 1) return nan;
    const float x = t0->data<float>()[0];
    for (int64_t d = 1; d < n_; ++d)
      if (!h_.value(d, v) || h_.value(d, v)->numel() != 1 || h_.value(d, v)->data<float>()[0] != x) return nan;
    return x;
  }

  /// True when value v is read by exactly `uses` nodes, all inside [lo, hi], reads it once each, and is no output.
  bool only_read_inside(int v, int uses, int lo, int hi) const {
    if (h_.kept(v) || h_.resident(v)) return false;
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
    auto other = [](const Node& nd, int v) {
      return nd.inputs[0] == v ? nd.inputs[1] : nd.inputs[1] == v ? nd.inputs[0] : -2;
    };
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
        return plain(nd, "Mul", 2) &&
               ((nd.inputs[0] == v_h && nd.inputs[1] == v_p) || (nd.inputs[0] == v_p && nd.inputs[1] == v_h));
      });
    } else {  // form B: h = x * p, y = h * .5
      h = find([&](const Node& nd) {
        return plain(nd, "Mul", 2) &&
               ((nd.inputs[0] == x && nd.inputs[1] == v_p) || (nd.inputs[0] == v_p && nd.inputs[1] == x));
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

  std::vector<FusedGroup> plan() {
    std::vector<FusedGroup> groups;
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
        const dnn::Binary alg = op == "Add"   ? dnn::Binary::kAdd
                                : op == "Sub" ? dnn::Binary::kSub
                                : op == "Mul" ? dnn::Binary::kMul
                                              : dnn::Binary::kDiv;
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
      groups.push_back(std::move(g));
      i = last;
    }
    return groups;
  }

  /// Runs a fused group on every device; returns each device's result (the value of the group's last node).
  /// Stacking (docs/executor.md): devices that hold the same B (a replicated weight, or the same weight slice) and
  /// the same broadcast post-op operands run their products as one matmul over their A's stacked along M, on all
  /// threads: one large product is far more efficient than many small single-threaded ones. Devices stacked are
  /// removed from `rest`; their results are stored in `results`.
  void run_stacked(const FusedGroup& g, std::vector<Tensor>& results, std::vector<int64_t>& rest) const {
    if (!stack_ || n_ < 2 || g.b_batch != 1) return;
    const int64_t rows = g.a_batch * g.m;  // A rows per device
    // per post-op: shared (broadcast over all rows: same pointer required) or stacked (one row block per device)
    std::vector<char> stacked(g.post.size(), 0);
    for (size_t p = 0; p < g.post.size(); ++p) {
      if (g.operand[p] < 0) continue;
      const std::vector<int64_t>& dims = g.post[p].src1_dims;
      if (dims[0] == 1 && dims[1] == 1) continue;
      if (dims[0] == std::max(g.a_batch, g.b_batch) && dims[1] == g.m)
        stacked[p] = 1;
      else
        return;
    }
    const Node& mm = prog_.nodes[static_cast<size_t>(g.first)];
    std::map<std::vector<const void*>, std::vector<int64_t>> sets;
    for (int64_t d = 0; d < n_; ++d) {
      std::vector<const void*> key{h_.input(mm, d, 1)->bytes.data()};
      for (size_t p = 0; p < g.post.size(); ++p)
        if (g.operand[p] >= 0 && !stacked[p]) {
          const Tensor* t = h_.value(d, g.operand[p]);
          key.push_back(t ? t->bytes.data() : nullptr);
        }
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
    h_.parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t ci) {
      const std::vector<int64_t>& devs = chunks[static_cast<size_t>(ci)];
      const int64_t G = static_cast<int64_t>(devs.size());
      auto t0 = Clock::now();
      auto stack = [&](int v, int64_t per) {  // copies each device's `per` floats of value v into one buffer
        Tensor t(DType::kFloat32, {G * per});
        for (int64_t j = 0; j < G; ++j) {
          const Tensor* x = h_.value(devs[static_cast<size_t>(j)], v);
          if (!x || x->numel() != per) h_.fail(mm, devs[static_cast<size_t>(j)], "stacked operand has the wrong size");
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
          src1[p] = h_.value(devs[0], g.operand[p])->data<float>();
        }
      }
      Tensor C(DType::kFloat32, {G * rows * g.n});
      bool ok = false;
      try {
        ok = dnn::matmul_fused(A.data<float>(), h_.input(mm, devs[0], 1)->data<float>(), C.data<float>(), G * g.a_batch,
                               1, g.m, g.k, g.n, post, src1);
      } catch (const std::exception& e) {
        h_.fail(mm, devs[0], e.what());
      }
      if (!ok) return;  // those devices run one by one
      const Shape& out_shape =
          prog_.values[static_cast<size_t>(prog_.nodes[static_cast<size_t>(g.last)].outputs.at(0))].shape;
      for (int64_t j = 0; j < G; ++j) {
        const int64_t d = devs[static_cast<size_t>(j)];
        Tensor c(DType::kFloat32, out_shape);
        std::memcpy(c.data<float>(), C.data<float>() + j * rows * g.n, static_cast<size_t>(rows * g.n) * sizeof(float));
        results[static_cast<size_t>(d)] = std::move(c);
        done[static_cast<size_t>(d)] = 1;
      }
      const double dt = seconds_since(t0) / static_cast<double>(G);
      for (int64_t d : devs) h_.add_compute_s(d, dt);
    });
    std::vector<int64_t> left;
    for (int64_t d : rest)
      if (!done[static_cast<size_t>(d)]) left.push_back(d);
    rest = std::move(left);
  }

  std::vector<Tensor> run(const FusedGroup& g) const {
    const Node& mm = prog_.nodes[static_cast<size_t>(g.first)];
    const Node& tail = prog_.nodes[static_cast<size_t>(g.last)];
    const Value& out = prog_.values[static_cast<size_t>(tail.outputs.at(0))];
    std::vector<Tensor> results(static_cast<size_t>(n_));
    std::vector<int64_t> rest(static_cast<size_t>(n_));
    for (int64_t d = 0; d < n_; ++d) rest[static_cast<size_t>(d)] = d;
    run_stacked(g, results, rest);
    h_.parallel_for(static_cast<int64_t>(rest.size()), [&](int64_t i) {
      const int64_t d = rest[static_cast<size_t>(i)];
      const Tensor* a = h_.input(mm, d, 0);
      const Tensor* b = h_.input(mm, d, 1);
      std::vector<const float*> src1(g.post.size(), nullptr);
      for (size_t p = 0; p < g.post.size(); ++p) {
        if (g.operand[p] < 0) continue;
        const Tensor* t = h_.value(d, g.operand[p]);
        if (!t) h_.fail(mm, d, fmt::format("fused operand '{}' is not available", prog_.values[g.operand[p]].name));
        src1[p] = t->data<float>();
      }
      Tensor c(DType::kFloat32, out.shape);
      auto t0 = Clock::now();
      bool ok = false;
      try {
        ok = dnn::matmul_fused(a->data<float>(), b->data<float>(), c.data<float>(), g.a_batch, g.b_batch, g.m, g.k, g.n,
                               g.post, src1);
      } catch (const std::exception& e) {
        h_.fail(mm, d, e.what());
      }
      if (!ok) h_.fail(mm, d, "oneDNN has no fused matmul for this group (it had one when planned)");
      h_.add_compute_s(d, seconds_since(t0));
      results[static_cast<size_t>(d)] = std::move(c);
    });
    return results;
  }

 private:
  FusionHost& h_;
  const Graph& prog_;
  int64_t n_;
  int par_;
  bool stack_;
  std::vector<std::vector<int>> consumers_;  // prog_.consumers(), for planning
};

}  // namespace

std::vector<FusedGroup> plan_fusion(FusionHost& host) { return Fusion(host, false).plan(); }

std::vector<Tensor> run_fused_group(FusionHost& host, const FusedGroup& g, bool stack) {
  return Fusion(host, stack).run(g);
}

}  // namespace gspmd::pod
