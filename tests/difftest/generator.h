// tests/difftest (private): the random graph generator behind generate_case (random_graph.h). generate.cc holds its
// driver, values and shardings; generate_compute.cc the ops that compute (elementwise, contractions, reductions,
// normalizations); generate_layout.cc the ops that move data (reshapes, slices, gathers) and the windowed ones.
#pragma once

#include "tests/difftest/random_graph.h"

namespace gspmd::difftest::detail {

inline std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

inline std::string mesh_tag(const DeviceMesh& m) {
  std::string s;
  for (size_t i = 0; i < m.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(m.shape[i]);
  return s;
}

/// What the generator knows about a value.
struct Info {
  bool exact = false;  // bit-identical whatever the partitioning (no floating-point reduction upstream)
  bool ge1 = false;    // every element >= 1 (a safe divisor)
  double scale = 0.6;  // rough magnitude (rms)
  int64_t ids_hi = 0;  // int64 ids inputs: values in [0, ids_hi)
};

class Generator {
 public:
  Generator(uint64_t seed, const GenOptions& o) : rng_(seed), opt_(o) { c_.seed = seed; }

  RandomCase run();

 private:
  struct Reject {};
  static constexpr int kNumOps = 30;
  static constexpr int kNumExtraOps = 9;

  std::mt19937_64 rng_;
  GenOptions opt_;
  RandomCase c_;
  DeviceMesh mesh_;
  std::map<int, Info> info_;
  std::vector<int> pool_;    // float values usable as operands
  std::vector<int> bools_;   // bool values (Where conditions)
  std::vector<int> ids_;     // int64 ids graph inputs
  std::map<int, int> uses_;  // consumers per value
  int counter_ = 0;
  int n_float_inputs_ = 0;
  int budget_ = 0;

  struct Snapshot {
    Graph g;
    std::map<int, Info> info;
    std::vector<int> pool, bools, ids;
    std::map<int, int> uses;
    int n_float_inputs;
    size_t ntags;
  };
  Snapshot snapshot() const { return {c_.g, info_, pool_, bools_, ids_, uses_, n_float_inputs_, c_.tags.size()}; }
  void restore(Snapshot& s);

  // ---- randomness
  int64_t R(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool P(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(R(0, static_cast<int64_t>(v.size()) - 1))];
  }
  int64_t rdim() {
    static const std::vector<int64_t> d = {1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9};
    return pick(d);
  }
  Shape rand_shape(int rank, int64_t max_numel);
  void tag(const std::string& t) { c_.tags.push_back(t); }

  // ---- values
  // By value: creating values (weights, constants) while a shape is in use would invalidate a reference.
  Shape shape(int v) const { return c_.g.values[static_cast<size_t>(v)].shape; }
  const Shape& sref(int v) const { return c_.g.values[static_cast<size_t>(v)].shape; }
  int rank(int v) const { return static_cast<int>(shape(v).size()); }
  Info& info(int v) { return info_[v]; }
  int add_value(const std::string& prefix, DType t, const Shape& s);
  void check_numel(const Shape& s) const {
    if (num_elements(s) > opt_.max_numel || num_elements(s) < 1) throw Reject{};
  }
  int new_input(const Shape& s);
  int new_ids(const Shape& s, int64_t hi);
  int init_tensor(const std::string& prefix, Tensor t);
  /// A float weight, uniform in [-amp, amp] (positive: [0.5, 2]; zeros: small set {0, 1}).
  int new_weight(const Shape& s, double amp, bool positive = false, bool small_set = false);
  int const_i64(const std::vector<int64_t>& v, bool scalar = false) {
    return init_tensor("k", Tensor::from_int64s(v, scalar));
  }
  int const_f(float x) { return init_tensor("k", Tensor::from_floats({}, {x})); }

  /// Emits a node; outputs (dtype, shape) get `inf`. Returns the output ids.
  std::vector<int> emit(const std::string& op, const std::vector<int>& ins,
                        const std::vector<std::pair<DType, Shape>>& outs, std::map<std::string, AttrValue> attrs,
                        const Info& inf);
  int emit1(const std::string& op, const std::vector<int>& ins, DType t, const Shape& s,
            std::map<std::string, AttrValue> attrs, const Info& inf) {
    return emit(op, ins, {{t, s}}, std::move(attrs), inf)[0];
  }

  /// A float operand satisfying `pred`, biased to recent and still unused values; -1 if none.
  int pick_float(const std::function<bool(int)>& pred = nullptr);
  int need_float(const std::function<bool(int)>& pred = nullptr) {
    int v = pick_float(pred);
    if (v < 0) throw Reject{};
    return v;
  }
  /// A 4-D float value [N,C,H,W] with C <= 8, or a new image input.
  int need_image() {
    int v = pick_float([&](int x) { return rank(x) == 4 && shape(x)[1] <= 8; });
    if (v >= 0 && P(0.85)) return v;
    return new_input({R(1, 3), R(1, 6), R(3, 8), R(3, 8)});
  }

  /// A shape that broadcasts with `a` (sometimes expanding it, sometimes lower or higher rank).
  Shape partner_shape(const Shape& a);
  /// A second operand for a binary op with `a`: a pool value that broadcasts, a new weight, or a new input.
  int partner(int a, const std::function<bool(int)>& pred, bool positive_weight, bool allow_input = true);

  static double rms2(double a, double b) { return std::sqrt(a * a + b * b); }

  // ---- ops
  bool try_op(int k);

  bool op_unary(const std::string& op);

  bool op_sqrt_abs1();

  bool op_clip();

  bool op_binary(const std::string& op);

  /// Equal/Less/Greater of exact values (so rounding never flips a comparison), then usually a Where on it.
  bool op_compare_where();

  static Shape batch_of(const Shape& s) { return s.size() <= 2 ? Shape{} : Shape(s.begin(), s.end() - 2); }

  bool op_matmul();

  bool op_gemm();

  bool op_softmax();

  bool op_logsoftmax();

  bool op_flatten();

  bool op_expand();

  bool op_pad();

  bool op_tile();

  bool op_cumsum();

  /// ArgMax of an exact value (ties, e.g. Relu zeros, are decided by select_last_index, never by rounding).
  bool op_argmax();

  bool op_layernorm();

  bool op_reduce(const std::string& op);

  bool op_transpose();

  bool op_reshape();

  bool op_unsqueeze();

  bool op_squeeze();

  bool op_concat();

  /// ONNX Slice output length of one axis.
  static int64_t slice_len(int64_t d, int64_t start, int64_t end, int64_t step);

  bool op_slice();

  bool op_split();

  bool op_gather();

  static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil_mode);

  bool op_conv();

  bool op_pool(const std::string& op);

  bool op_gap();

  bool op_einsum();

  bool op_variadic(const std::string& op);

  // ---- outputs, pruning, annotations, inputs
  TensorSharding rand_sharding(const Shape& s, bool allow_unreduced);

  void finish();
};

}  // namespace gspmd::difftest::detail
