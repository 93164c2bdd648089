// The generator's ops that compute (generator.h): elementwise, contractions, reductions, normalizations.
#include "tests/difftest/generator.h"

namespace gspmd::difftest {

namespace detail {

bool Generator::op_unary(const std::string& op) {
  int x = need_float([&](int v) { return op != "Exp" || info(v).scale <= 1.5; });
  const Info& in = info(x);
  Info o;
  o.exact = in.exact && (op == "Relu" || op == "Neg" || op == "Abs");
  o.scale = op == "Relu"      ? in.scale * 0.6
            : op == "Tanh"    ? std::min(in.scale, 1.0)
            : op == "Sigmoid" ? 0.5
            : op == "Exp"     ? std::exp(in.scale * 1.5)
            : op == "Erf"     ? std::min(in.scale, 1.0)
                              : in.scale;
  emit1(op, {x}, DType::kFloat32, shape(x), {}, o);
  return true;
}

bool Generator::op_sqrt_abs1() {
  if (budget_ < 3) return false;
  int x = need_float();
  Info in = info(x);
  int a = emit1("Abs", {x}, DType::kFloat32, shape(x), {}, Info{in.exact, false, in.scale, 0});
  int b = emit1("Add", {a, const_f(1.f)}, DType::kFloat32, shape(x), {}, Info{false, true, in.scale + 1, 0});
  emit1("Sqrt", {b}, DType::kFloat32, shape(x), {}, Info{false, true, std::sqrt(in.scale + 1), 0});
  tag("Sqrt:of-abs+1");
  return true;
}

bool Generator::op_clip() {
  int x = need_float();
  float lo = -static_cast<float>(R(1, 8)) / 8.f, hi = static_cast<float>(R(1, 8)) / 8.f;
  std::vector<int> ins = {x};
  int v = static_cast<int>(R(0, 2));
  if (v == 0) ins = {x, const_f(lo), const_f(hi)}, tag("Clip:min+max");
  if (v == 1) ins = {x, const_f(lo)}, tag("Clip:min");
  if (v == 2) ins = {x, -1, const_f(hi)}, tag("Clip:max");
  emit1("Clip", ins, DType::kFloat32, shape(x), {}, Info{info(x).exact, false, std::min(info(x).scale, 1.0), 0});
  return true;
}

bool Generator::op_binary(const std::string& op) {
  int a = need_float();
  int b = op == "Div" ? partner(
                            a, [&](int v) { return info(v).ge1; }, true)
                      : partner(a, nullptr, false);
  if (op != "Div" && P(0.4)) std::swap(a, b);
  auto y = broadcast(shape(a), shape(b));
  if (!y) throw Reject{};
  if (*y != shape(a) && *y != shape(b))
    tag(op + ":broadcast-both");
  else if (shape(a) != shape(b))
    tag(op + ":broadcast");
  const double sa = info(a).scale, sb = info(b).scale;
  double s = op == "Mul" ? sa * sb : op == "Div" ? sa * 2 : rms2(sa, sb);
  emit1(op, {a, b}, DType::kFloat32, *y, {}, Info{false, false, s, 0});
  return true;
}

bool Generator::op_compare_where() {
  const std::string op = pick(std::vector<std::string>{"Equal", "Less", "Greater"});
  int cond = -1;
  if (!bools_.empty() && P(0.3)) {
    cond = pick(bools_);
  } else if (op == "Equal" && !ids_.empty() && P(0.3)) {
    int ids = pick(ids_);
    int k = const_i64({R(0, std::max<int64_t>(0, info(ids).ids_hi - 1))}, true);
    cond = emit1("Equal", {ids, k}, DType::kBool, shape(ids), {}, Info{true, false, 0, 0});
    tag("Equal:int64");
  } else {
    int a = need_float([&](int v) { return info(v).exact; });
    int b;
    if (P(0.4)) {
      b = pick_float([&](int v) { return info(v).exact && v != a && broadcast(shape(a), shape(v)).has_value(); });
      if (b < 0) b = new_weight(partner_shape(shape(a)), 1.0, false, op == "Equal");
    } else {
      b = new_weight(partner_shape(shape(a)), 1.0, false, op == "Equal");
    }
    if (P(0.3)) std::swap(a, b);
    auto y = broadcast(shape(a), shape(b));
    if (!y) throw Reject{};
    cond = emit1(op, {a, b}, DType::kBool, *y, {}, Info{true, false, 0, 0});
  }
  if (P(0.25) && cond >= 0 && uses_.count(cond) == 0) return true;  // the bool is a graph output
  // Where(cond, x, y).
  const Shape cs = shape(cond);
  int x = need_float([&](int v) { return broadcast(cs, shape(v)).has_value(); });
  auto xs = broadcast(cs, shape(x));
  int y = partner(
      x, [&](int v) { return broadcast(*xs, shape(v)).has_value(); }, false);
  if (P(0.5)) std::swap(x, y);
  auto out = broadcast(*xs, shape(y));
  if (!out) throw Reject{};
  out = broadcast(*out, shape(x));
  if (!out) throw Reject{};
  emit1("Where", {cond, x, y}, DType::kFloat32, *out, {},
        Info{info(x).exact && info(y).exact, false, std::max(info(x).scale, info(y).scale), 0});
  return true;
}

bool Generator::op_matmul() {
  int a = need_float([&](int v) { return rank(v) >= 1 && info(v).scale < 5; });
  const Shape as = shape(a);
  const int ra = rank(a);
  const int64_t K = as.back();
  int b = -1;
  if (P(0.25)) {
    b = pick_float([&](int v) {
      const Shape& s = shape(v);
      if (s.empty() || (ra == 1 && s.size() == 1) || info(v).scale > 5) return false;
      int64_t kb = s.size() == 1 ? s[0] : s[s.size() - 2];
      return kb == K && broadcast(batch_of(as), batch_of(s)).has_value();
    });
  }
  const double amp = 1.7 / std::sqrt(static_cast<double>(K));
  if (b < 0) {
    const int64_t N = rdim();
    double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (u < 0.1 && ra >= 2) {
      b = new_weight({K}, amp);
    } else if (u < 0.4 && ra >= 3) {
      Shape bs = batch_of(as);
      for (auto& d : bs)
        if (P(0.25)) d = 1;
      bs.push_back(K);
      bs.push_back(N);
      b = (P(0.4) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bs) : new_weight(bs, amp);
    } else {
      b = new_weight({K, N}, amp);
    }
  }
  const Shape bs = shape(b);
  auto batch = broadcast(batch_of(as), batch_of(bs));
  if (!batch) throw Reject{};
  Shape y = *batch;
  if (ra >= 2) y.push_back(as[as.size() - 2]);
  if (bs.size() >= 2) y.push_back(bs.back());
  if (ra == 1)
    tag("MatMul:1-D x N-D");
  else if (bs.size() == 1)
    tag("MatMul:N-D x 1-D");
  else if (bs.size() >= 3)
    tag("MatMul:batched x batched");
  else if (ra >= 3)
    tag("MatMul:batched x 2-D");
  else
    tag("MatMul:2-D");
  emit1("MatMul", {a, b}, DType::kFloat32, y, {},
        Info{false, false, info(a).scale * info(b).scale * std::sqrt(static_cast<double>(K)), 0});
  return true;
}

bool Generator::op_gemm() {
  int a = need_float([&](int v) { return rank(v) == 2 && info(v).scale < 5; });
  const bool ta = P(0.3), tb = P(0.3);
  const int64_t M = ta ? shape(a)[1] : shape(a)[0], K = ta ? shape(a)[0] : shape(a)[1];
  const int64_t N = rdim();
  const double amp = 1.7 / std::sqrt(static_cast<double>(K));
  Shape bshape = tb ? Shape{N, K} : Shape{K, N};
  int b = (P(0.25) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bshape) : new_weight(bshape, amp);
  std::vector<int> ins = {a, b};
  const float alpha = pick(std::vector<float>{1.f, 0.5f, 2.f}), beta = pick(std::vector<float>{1.f, 0.5f, 2.f});
  int cv = static_cast<int>(R(0, 4));
  if (cv > 0) {
    Shape cs = cv == 1 ? Shape{N} : cv == 2 ? Shape{1, N} : cv == 3 ? Shape{M, N} : Shape{M, 1};
    ins.push_back((P(0.3) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(cs) : new_weight(cs, 1.0));
    tag(std::string("Gemm:C") + (cv == 1 ? "[N]" : cv == 2 ? "[1,N]" : cv == 3 ? "[M,N]" : "[M,1]"));
  }
  if (ta) tag("Gemm:transA");
  if (tb) tag("Gemm:transB");
  std::map<std::string, AttrValue> at = {{"alpha", alpha}, {"beta", beta}};
  if (ta) at["transA"] = int64_t{1};
  if (tb) at["transB"] = int64_t{1};
  emit1("Gemm", ins, DType::kFloat32, {M, N}, at,
        Info{false, false, alpha * info(a).scale * info(b).scale * std::sqrt(double(K)) + beta, 0});
  return true;
}

bool Generator::op_softmax() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const int r = rank(x);
  int64_t axis = R(-r, r - 1);
  emit1("Softmax", {x}, DType::kFloat32, shape(x), {{"axis", axis}}, Info{false, false, 0.5, 0});
  return true;
}

bool Generator::op_logsoftmax() {
  int x = need_float([&](int v) { return rank(v) >= 1 && info(v).scale < 5; });
  const int r = rank(x);
  int64_t axis = R(-r, r - 1);
  emit1("LogSoftmax", {x}, DType::kFloat32, shape(x), {{"axis", axis}}, Info{false, false, 3.0, 0});
  return true;
}

bool Generator::op_cumsum() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const int r = rank(x);
  const int64_t axis = R(-r, r - 1);
  std::map<std::string, AttrValue> at;
  if (P(0.3)) at["exclusive"] = int64_t{1}, tag("CumSum:exclusive");
  if (P(0.3)) at["reverse"] = int64_t{1}, tag("CumSum:reverse");
  const double n = static_cast<double>(shape(x)[static_cast<size_t>(axis < 0 ? axis + r : axis)]);
  emit1("CumSum", {x, const_i64({axis}, true)}, DType::kFloat32, shape(x), at,
        Info{false, false, info(x).scale * std::sqrt(n) * 1.5, 0});
  return true;
}

bool Generator::op_argmax() {
  int x = need_float([&](int v) { return rank(v) >= 1 && info(v).exact; });
  const int r = rank(x);
  const int64_t axis = R(-r, r - 1);
  const bool keep = P(0.5);
  Shape y = shape(x);
  if (keep)
    y[static_cast<size_t>(axis < 0 ? axis + r : axis)] = 1;
  else
    y.erase(y.begin() + (axis < 0 ? axis + r : axis));
  std::map<std::string, AttrValue> at = {{"axis", axis}, {"keepdims", int64_t{keep}}};
  if (P(0.4)) at["select_last_index"] = int64_t{1}, tag("ArgMax:select_last_index");
  emit1("ArgMax", {x}, DType::kInt64, y, at, Info{true, false, 0, 0});
  return true;
}

bool Generator::op_layernorm() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const int r = rank(x);
  int64_t axis = R(-r, r - 1);
  const int64_t a = axis < 0 ? axis + r : axis;
  const Shape xs = shape(x);
  Shape ns(xs.begin() + a, xs.end());
  if (P(0.3) && ns.size() > 1)
    ns.erase(ns.begin(), ns.begin() + R(1, static_cast<int64_t>(ns.size()) - 1)),
        tag("LayerNormalization:broadcast-scale");
  std::vector<float> d(static_cast<size_t>(num_elements(ns)));
  for (float& v : d) v = 0.5f + static_cast<float>(R(0, 100)) / 100.f;
  check_numel(ns);
  int scale = init_tensor("w", Tensor::from_floats(ns, d));
  info_[scale] = Info{true, false, 1.0, 0};
  std::vector<int> ins = {x, scale};
  if (P(0.6))
    ins.push_back(new_weight(ns, 1.0));
  else
    tag("LayerNormalization:no-bias");
  // epsilon >= 1e-2: rows of (nearly) equal values (broadcast scalars, a Softmax over a size-1 axis) would
  // otherwise amplify the rounding differences of the split mean/variance (another summation order than the
  // single-device run) by up to 1/sqrt(epsilon) beyond the comparison's 1e-5 (seed 20243325 at 1e-3).
  const float eps = P(0.7) ? 1e-1f : 1e-2f;
  emit1("LayerNormalization", ins, DType::kFloat32, shape(x), {{"axis", axis}, {"epsilon", eps}},
        Info{false, false, 2.0, 0});
  return true;
}

bool Generator::op_reduce(const std::string& op) {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const int r = rank(x);
  std::vector<int64_t> axes;
  const bool all = P(0.15);
  std::vector<char> red(static_cast<size_t>(r), all);
  if (!all) {
    for (int d = 0; d < r; ++d)
      if (P(0.4)) red[static_cast<size_t>(d)] = 1;
    if (std::find(red.begin(), red.end(), 1) == red.end()) red[static_cast<size_t>(R(0, r - 1))] = 1;
    for (int d = 0; d < r; ++d)
      if (red[static_cast<size_t>(d)]) axes.push_back(P(0.3) ? d - r : d);
    std::shuffle(axes.begin(), axes.end(), rng_);
  }
  const bool keep = P(0.5);
  Shape y;
  int64_t n = 1;
  for (int d = 0; d < r; ++d) {
    if (!red[static_cast<size_t>(d)])
      y.push_back(shape(x)[static_cast<size_t>(d)]);
    else {
      n *= shape(x)[static_cast<size_t>(d)];
      if (keep) y.push_back(1);
    }
  }
  std::vector<int> ins = {x};
  std::map<std::string, AttrValue> at = {{"keepdims", int64_t{keep}}};
  if (!all) {
    if (op == "ReduceSum")
      ins.push_back(const_i64(axes));
    else
      at["axes"] = axes;
  }
  tag(op + (keep ? ":keepdims=1" : ":keepdims=0"));
  if (all) tag(op + ":all-axes");
  const double s = info(x).scale;
  if (op == "ReduceProd" && (n > 6 || s > 1.5)) throw Reject{};
  emit1(op, ins, DType::kFloat32, y, at,
        Info{(op == "ReduceMax" || op == "ReduceMin") && info(x).exact, false,
             op == "ReduceSum" || op == "ReduceL2" ? s * std::sqrt(double(n)) * 1.5
             : op == "ReduceLogSumExp"             ? s + std::log(double(n)) + 1
                                                   : s,
             0});
  return true;
}

bool Generator::op_einsum() {
  int p = static_cast<int>(R(0, 6));
  std::string eq;
  std::vector<int> ins;
  Shape y;
  double sc = 1;
  auto small = [&](int v) { return info(v).scale < 5; };
  if (p == 0) {  // ij,jk->ik
    int a = need_float([&](int v) { return rank(v) == 2 && small(v); });
    int64_t K = shape(a)[1], N = rdim();
    ins = {a, new_weight({K, N}, 1.7 / std::sqrt(double(K)))};
    eq = "ij,jk->ik";
    y = {shape(a)[0], N};
    sc = info(a).scale * 1.2;
  } else if (p == 1) {  // bij,bjk->bik
    int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
    const Shape as = shape(a);
    int64_t N = rdim();
    Shape bs = {as[0], as[2], N};
    ins = {a, (P(0.4) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bs)
                                                                  : new_weight(bs, 1.7 / std::sqrt(double(as[2])))};
    eq = "bij,bjk->bik";
    y = {as[0], as[1], N};
    sc = info(a).scale * info(ins[1]).scale * std::sqrt(double(as[2]));
  } else if (p == 2) {  // bsh,hf->bsf
    int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
    const Shape as = shape(a);
    int64_t F = rdim();
    ins = {a, new_weight({as[2], F}, 1.7 / std::sqrt(double(as[2])))};
    eq = "bsh,hf->bsf";
    y = {as[0], as[1], F};
    sc = info(a).scale * 1.2;
  } else if (p == 3) {  // ij->ji
    int a = need_float([&](int v) { return rank(v) == 2; });
    ins = {a};
    eq = "ij->ji";
    y = {shape(a)[1], shape(a)[0]};
    sc = info(a).scale;
  } else if (p == 4) {  // bij->bj (sum over i)
    int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
    ins = {a};
    eq = "bij->bj";
    y = {shape(a)[0], shape(a)[2]};
    sc = info(a).scale * std::sqrt(double(shape(a)[1])) * 1.5;
  } else if (p == 5) {  // ij,ij->i
    int a = need_float([&](int v) { return rank(v) == 2 && small(v); });
    int b = pick_float([&](int v) { return v != a && shape(v) == shape(a) && small(v); });
    if (b < 0) b = new_weight(shape(a), 1.0);
    ins = {a, b};
    eq = "ij,ij->i";
    y = {shape(a)[0]};
    sc = info(a).scale * info(b).scale * std::sqrt(double(shape(a)[1]));
  } else {  // ...ij,jk->...ik
    int a = need_float([&](int v) { return rank(v) >= 2 && small(v); });
    const Shape as = shape(a);
    int64_t K = as.back(), N = rdim();
    ins = {a, new_weight({K, N}, 1.7 / std::sqrt(double(K)))};
    eq = "...ij,jk->...ik";
    y = as;
    y.back() = N;
    sc = info(a).scale * 1.2;
  }
  tag("Einsum:" + eq);
  emit1("Einsum", ins, DType::kFloat32, y, {{"equation", eq}}, Info{false, false, sc, 0});
  return true;
}

bool Generator::op_variadic(const std::string& op) {
  int a = need_float();
  std::vector<int> ins = {a};
  Shape y = shape(a);
  const int n = P(0.5) ? 3 : 2;
  bool exact = info(a).exact;
  double sc = info(a).scale * info(a).scale;
  for (int k = 1; k < n; ++k) {
    int b = partner(
        a, [&](int v) { return broadcast(y, shape(v)).has_value(); }, false);
    auto yy = broadcast(y, shape(b));
    if (!yy) throw Reject{};
    y = *yy;
    ins.push_back(b);
    exact = exact && info(b).exact;
    sc += info(b).scale * info(b).scale;
  }
  std::shuffle(ins.begin(), ins.end(), rng_);
  tag(op + ":" + std::to_string(n) + "-way");
  emit1(op, ins, DType::kFloat32, y, {}, Info{op == "Max" && exact, false, std::sqrt(sc), 0});
  return true;
}

}  // namespace detail

}  // namespace gspmd::difftest
