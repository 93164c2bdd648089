// The random graph generator (generator.h): its driver, values, operands and shardings; generate_case and
// training_case (random_graph.h).
#include "tests/difftest/generator.h"

namespace gspmd::difftest {

DeviceMesh mesh_of(const std::vector<int64_t>& shape) {
  static const char* names[] = {"x", "y", "z", "w"};
  DeviceMesh m;
  m.shape = shape;
  for (size_t i = 0; i < shape.size(); ++i) m.axes.push_back(names[i]);
  return m;
}
const std::vector<std::vector<int64_t>>& mesh_shapes() {
  static const std::vector<std::vector<int64_t>> m = {{2},    {3},    {4},       {5},       {8},       {16},
                                                      {2, 2}, {2, 3}, {3, 2},    {3, 3},    {2, 4},    {4, 2},
                                                      {4, 4}, {1, 3}, {2, 2, 2}, {2, 2, 4}, {2, 3, 2}, {3, 2, 2}};
  return m;
}
Repro to_repro(const RandomCase& c) { return Repro{c.g, c.ann, c.inputs}; }
namespace detail {

RandomCase Generator::run() {
  // Mesh.
  std::vector<std::vector<int64_t>> meshes;
  for (const auto& m : mesh_shapes()) {
    int64_t n = 1;
    for (int64_t d : m) n *= d;
    if (n <= opt_.max_devices) meshes.push_back(m);
  }
  if (meshes.empty()) meshes.push_back({1});
  mesh_ = mesh_of(pick(meshes));
  c_.g.name = "random_" + std::to_string(c_.seed);
  c_.g.opset = 17;
  tag("mesh:" + mesh_tag(mesh_));

  // First input: sometimes an image for Conv/pools.
  if (P(0.3))
    new_input({R(1, 3), R(1, 6), R(3, 8), R(3, 8)});
  else
    new_input(rand_shape(R(1, 4), 400));

  const int target = R(opt_.min_nodes, opt_.max_nodes);
  for (int attempt = 0; attempt < 400 && static_cast<int>(c_.g.nodes.size()) < target; ++attempt) {
    const int before_nodes = static_cast<int>(c_.g.nodes.size());
    Snapshot snap = snapshot();
    budget_ = target - before_nodes;
    bool ok = false;
    try {
      ok = try_op(R(0, kNumOps - 1 + (opt_.extra_ops ? kNumExtraOps : 0)));
    } catch (const Reject&) {
      ok = false;
    }
    if (!ok) restore(snap);
  }
  finish();
  return std::move(c_);
}

void Generator::restore(Snapshot& s) {
  c_.g = std::move(s.g);
  info_ = std::move(s.info);
  pool_ = std::move(s.pool);
  bools_ = std::move(s.bools);
  ids_ = std::move(s.ids);
  uses_ = std::move(s.uses);
  n_float_inputs_ = s.n_float_inputs;
  c_.tags.resize(s.ntags);
}

Shape Generator::rand_shape(int rank, int64_t max_numel) {
  for (;;) {
    Shape s(static_cast<size_t>(rank));
    for (auto& d : s) d = rdim();
    if (num_elements(s) <= max_numel) return s;
  }
}

int Generator::add_value(const std::string& prefix, DType t, const Shape& s) {
  Value v;
  v.name = prefix + std::to_string(counter_++);
  v.dtype = t;
  v.shape = s;
  return c_.g.add_value(std::move(v));
}

int Generator::new_input(const Shape& s) {
  if (n_float_inputs_ >= opt_.max_float_inputs) throw Reject{};
  check_numel(s);
  int v = add_value("x", DType::kFloat32, s);
  c_.g.inputs.push_back(v);
  info_[v] = Info{true, false, 0.58, 0};
  pool_.push_back(v);
  ++n_float_inputs_;
  return v;
}

int Generator::new_ids(const Shape& s, int64_t hi) {
  if (ids_.size() >= 2) throw Reject{};
  int v = add_value("ids", DType::kInt64, s);
  c_.g.inputs.push_back(v);
  info_[v] = Info{true, false, 0, hi};
  ids_.push_back(v);
  return v;
}

int Generator::init_tensor(const std::string& prefix, Tensor t) {
  Value v;
  v.name = prefix + std::to_string(counter_++);
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.is_initializer = true;
  v.data = std::make_shared<Tensor>(std::move(t));
  return c_.g.add_value(std::move(v));
}

int Generator::new_weight(const Shape& s, double amp, bool positive, bool small_set) {
  check_numel(s);
  std::uniform_real_distribution<float> u(static_cast<float>(-amp), static_cast<float>(amp)), p(0.5f, 2.f);
  std::vector<float> d(static_cast<size_t>(num_elements(s)));
  for (float& x : d) x = small_set ? static_cast<float>(R(0, 1)) : positive ? p(rng_) : u(rng_);
  int v = init_tensor("w", Tensor::from_floats(s, d));
  info_[v] = Info{true, positive, positive ? 1.3 : small_set ? 0.5 : amp * 0.58, 0};
  pool_.push_back(v);
  return v;
}

std::vector<int> Generator::emit(const std::string& op, const std::vector<int>& ins,
                                 const std::vector<std::pair<DType, Shape>>& outs,
                                 std::map<std::string, AttrValue> attrs, const Info& inf) {
  if (budget_ <= 0) throw Reject{};
  for (const auto& o : outs) {
    check_numel(o.second);
    if (o.first == DType::kFloat32 && (inf.scale > 30 || !std::isfinite(inf.scale))) throw Reject{};
  }
  Node n;
  n.op_type = op;
  n.name = op + "_" + std::to_string(c_.g.nodes.size());
  n.inputs = ins;
  n.attrs = std::move(attrs);
  for (const auto& [t, s] : outs) {
    int v = add_value("t", t, s);
    n.outputs.push_back(v);
    info_[v] = inf;
    if (t == DType::kFloat32) pool_.push_back(v);
    if (t == DType::kBool) bools_.push_back(v);
  }
  for (int i : ins)
    if (i >= 0) ++uses_[i];
  std::vector<int> outs_ids = n.outputs;
  c_.g.add_node(std::move(n));
  --budget_;
  tag(op);
  return outs_ids;
}

int Generator::pick_float(const std::function<bool(int)>& pred) {
  std::vector<int> c, unused;
  for (int v : pool_)
    if (!pred || pred(v)) {
      c.push_back(v);
      if (!uses_.count(v)) unused.push_back(v);
    }
  if (c.empty()) return -1;
  if (!unused.empty() && P(0.5)) return pick(unused);
  if (P(0.5))
    return c[static_cast<size_t>(
        R(std::max<int64_t>(0, static_cast<int64_t>(c.size()) - 3), static_cast<int64_t>(c.size()) - 1))];
  return pick(c);
}

Shape Generator::partner_shape(const Shape& a) {
  const int ra = static_cast<int>(a.size());
  int rb = ra;
  double u = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (ra > 0 && u < 0.2)
    rb = static_cast<int>(R(0, ra - 1));
  else if (u > 0.92 && ra < 4)
    rb = ra + 1;
  Shape b(static_cast<size_t>(rb));
  for (int i = 0; i < rb; ++i) {
    int ia = i - (rb - ra);
    if (ia < 0)
      b[static_cast<size_t>(i)] = R(1, 3);
    else if (a[static_cast<size_t>(ia)] == 1)
      b[static_cast<size_t>(i)] = P(0.35) ? R(2, 5) : 1;
    else
      b[static_cast<size_t>(i)] = P(0.7) ? a[static_cast<size_t>(ia)] : 1;
  }
  return b;
}

int Generator::partner(int a, const std::function<bool(int)>& pred, bool positive_weight, bool allow_input) {
  const Shape as = shape(a);
  if (P(0.35)) {
    int b = pick_float([&](int v) { return broadcast(as, shape(v)).has_value() && (!pred || pred(v)); });
    if (b >= 0) return b;
  }
  Shape bs = partner_shape(as);
  if (allow_input && !positive_weight && P(0.2) && n_float_inputs_ < opt_.max_float_inputs) return new_input(bs);
  return new_weight(bs, 1.0, positive_weight);
}

bool Generator::try_op(int k) {
  switch (k) {
    case 0: return op_unary("Relu");
    case 1: return op_unary(pick(std::vector<std::string>{"Tanh", "Sigmoid"}));
    case 2: return op_unary("Exp");
    case 3: return op_unary(pick(std::vector<std::string>{"Neg", "Abs"}));
    case 4: return op_unary("Erf");
    case 5: return op_sqrt_abs1();
    case 6: return op_clip();
    case 7:
    case 8: return op_binary(pick(std::vector<std::string>{"Add", "Sub", "Mul", "Div"}));
    case 9: return op_compare_where();
    case 10:
    case 11: return op_matmul();
    case 12: return op_gemm();
    case 13: return op_softmax();
    case 14: return op_layernorm();
    case 15: return op_reduce(pick(std::vector<std::string>{"ReduceSum", "ReduceMean", "ReduceMax"}));
    case 16: return op_transpose();
    case 17: return op_reshape();
    case 18: return P(0.5) ? op_unsqueeze() : op_squeeze();
    case 19: return op_concat();
    case 20: return op_slice();
    case 21: return op_split();
    case 22: return op_gather();
    case 23: return op_conv();
    case 24: return op_pool(P(0.5) ? "MaxPool" : "AveragePool");
    case 25: return op_gap();
    case 26: return op_einsum();
    case 27: return op_variadic(P(0.5) ? "Sum" : "Max");
    case 28: return op_squeeze();
    case 29: return op_binary(pick(std::vector<std::string>{"Add", "Mul"}));
    // Extra ops (GenOptions::extra_ops).
    case 30: return op_logsoftmax();
    case 31: return op_flatten();
    case 32: return op_expand();
    case 33: return op_pad();
    case 34: return op_tile();
    case 35: return op_cumsum();
    case 36: return op_argmax();
    case 37:
    case 38: return op_reduce(pick(std::vector<std::string>{"ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp"}));
  }
  return false;
}

TensorSharding Generator::rand_sharding(const Shape& s, bool allow_unreduced) {
  const int r = static_cast<int>(s.size());
  TensorSharding t = TensorSharding::replicated(r);
  std::vector<int> axes;
  for (int a = 0; a < mesh_.rank(); ++a) axes.push_back(a);
  std::shuffle(axes.begin(), axes.end(), rng_);
  for (int a : axes) {
    double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (r > 0 && u < 0.6) {
      // Prefer dims of size > 1, but sometimes split a size-1 dim too.
      std::vector<int> dims;
      for (int d = 0; d < r; ++d)
        for (int w = 0; w < (s[static_cast<size_t>(d)] > 1 ? 6 : 1); ++w) dims.push_back(d);
      t.dims[static_cast<size_t>(pick(dims))].push_back(a);
    } else if (allow_unreduced && u < 0.72) {
      t.unreduced.push_back(a);
    }
  }
  std::sort(t.unreduced.begin(), t.unreduced.end());
  return t;
}

void Generator::finish() {
  Graph& g = c_.g;
  // Outputs: every node output nothing consumes, plus some consumed ones.
  std::set<int> outs;
  for (const Node& n : g.nodes)
    for (int o : n.outputs)
      if (!uses_.count(o) || P(0.12)) outs.insert(o);
  g.outputs.assign(outs.begin(), outs.end());
  // Drop unused inputs (a failed op may have created one), then unused initializers.
  std::set<int> used;
  for (const Node& n : g.nodes)
    for (int i : n.inputs)
      if (i >= 0) used.insert(i);
  std::vector<int> keep_inputs;
  for (int v : g.inputs)
    if (used.count(v)) keep_inputs.push_back(v);
  std::map<std::string, Info> by_name;
  for (const auto& [v, inf] : info_) by_name[g.values[static_cast<size_t>(v)].name] = inf;
  g.inputs = keep_inputs;
  g.prune();
  g.verify();

  // Annotations.
  c_.ann.mesh = mesh_;
  int n_unreduced = 0;
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    const Value& x = g.values[static_cast<size_t>(v)];
    const bool is_input = std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end();
    const bool is_weight = x.is_initializer && x.name[0] == 'w';
    double p = is_input || is_weight ? 0.5 : x.is_initializer ? 0.0 : 0.3;
    if (x.shape.empty() || !P(p)) continue;
    const bool unred = x.dtype == DType::kFloat32 && (is_input || opt_.stress);
    TensorSharding s = rand_sharding(x.shape, unred && P(0.3));
    // Non-sum partial values only where they are given (inputs, weights): a node output annotated as a max/min/prod
    // partial is a known gap (partition throws "reshard of 't' did not reach its target"; docs/testing.md).
    if (!s.unreduced.empty() && opt_.stress && (is_input || is_weight) && P(0.4)) {
      s.reduction = pick(std::vector<ReductionKind>{ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd});
      tag("ann:unreduced-" + std::string(reduction_name(s.reduction)));
    }
    if (!s.unreduced.empty() && !is_input) tag("ann:unreduced-non-input");
    if (!s.unreduced.empty()) ++n_unreduced;
    const int prio = P(0.15) ? static_cast<int>(R(1, 2)) : 0;
    if (prio) tag("ann:priority>0");
    c_.ann.by_value[v] = Annotation{s, prio, "random"};
    for (const auto& d : s.dims)
      if (d.size() >= 2) tag("ann:2-axes-on-a-dim");
    if (s.is_uneven(x.shape, mesh_)) tag("ann:uneven");
    if (!x.is_initializer && !is_input) tag("ann:intermediate");
  }
  if (n_unreduced) tag("ann:unreduced-input");

  // Inputs.
  for (int v : g.inputs) {
    const Value& x = g.values[static_cast<size_t>(v)];
    Tensor t(x.dtype, x.shape);
    if (x.dtype == DType::kInt64) {
      const int64_t hi = std::max<int64_t>(1, by_name[x.name].ids_hi);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = R(0, hi - 1);
    } else {
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng_);
    }
    c_.inputs.push_back(std::move(t));
  }
  // Keep only the tags of nodes that survived pruning (op tags are re-derived from the graph by callers).
}

}  // namespace detail

RandomCase generate_case(uint64_t seed, const GenOptions& opt) { return detail::Generator(seed, opt).run(); }
std::optional<RandomCase> training_case(const RandomCase& c, std::string* why, RematPolicy remat) {
  Graph g = c.g;
  int out = -1;
  for (int o : g.outputs)
    if (out < 0 && is_floating(g.values[static_cast<size_t>(o)].dtype)) out = o;
  if (out < 0) return std::nullopt;
  g.outputs = {out};
  TrainingOptions o;
  o.loss = LossKind::kSum;
  o.remat = remat;
  for (const Value& v : g.values)
    if (v.is_initializer && is_floating(v.dtype) && !v.name.empty() && v.name[0] == 'w') o.trainable.push_back(v.name);
  if (o.trainable.empty()) return std::nullopt;
  RandomCase t;
  try {
    TrainingStep step = build_training_step(
        g, o,
        [](const Node& n, const std::vector<const TensorType*>& types, const std::vector<const Tensor*>& values,
           int64_t opset) { return infer_types(n, types, values, opset, &kernel_evaluator()); });
    t.g = std::move(step.graph);
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
  t.seed = c.seed;
  t.ann.mesh = c.ann.mesh;
  for (const auto& [v, a] : c.ann.by_value) {
    const int id = t.g.find(c.g.values[static_cast<size_t>(v)].name);
    if (id >= 0) t.ann.by_value.emplace(id, a);
  }
  for (int v : t.g.inputs) {
    const std::string& name = t.g.values[static_cast<size_t>(v)].name;
    for (size_t k = 0; k < c.g.inputs.size(); ++k)
      if (c.g.values[static_cast<size_t>(c.g.inputs[k])].name == name) t.inputs.push_back(c.inputs[k]);
  }
  t.tags = c.tags;
  t.tags.push_back("training");
  if (remat != RematPolicy::kNone) t.tags.push_back("remat-" + std::string(remat_name(remat)));
  return t;
}

}  // namespace gspmd::difftest
