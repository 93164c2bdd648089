// The generator's ops that move data (generator.h): reshapes, slices, concatenations, gathers; and the windowed
// ops (Conv, the pools).
#include "tests/difftest/generator.h"

namespace gspmd::difftest {

namespace detail {

bool Generator::op_flatten() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const Shape s = shape(x);
  const int r = rank(x);
  const int64_t axis = R(0, r);
  int64_t a = 1, b = 1;
  for (int d = 0; d < r; ++d) (d < axis ? a : b) *= s[static_cast<size_t>(d)];
  std::map<std::string, AttrValue> at;
  if (axis != 1 || P(0.3)) at["axis"] = int64_t{P(0.2) && axis < r ? axis - r : axis};
  emit1("Flatten", {x}, DType::kFloat32, {a, b}, at, info(x));
  return true;
}

bool Generator::op_expand() {
  int x = need_float([&](int v) { return rank(v) <= 3 || std::count(sref(v).begin(), sref(v).end(), 1) > 0; });
  const Shape s = shape(x);
  Shape t;
  if (s.size() < 4 && P(0.3)) t.push_back(R(1, 3));
  for (int64_t d : s) t.push_back(d == 1 ? (P(0.6) ? R(2, 4) : 1) : (P(0.2) ? 1 : d));
  auto y = broadcast(s, t);
  if (!y || *y == s) throw Reject{};
  emit1("Expand", {x, const_i64(std::vector<int64_t>(t.begin(), t.end()))}, DType::kFloat32, *y, {}, info(x));
  return true;
}

bool Generator::op_pad() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const Shape s = shape(x);
  const int r = rank(x);
  const std::string mode = pick(std::vector<std::string>{"constant", "constant", "reflect", "edge"});
  std::vector<int64_t> pads(static_cast<size_t>(2 * r), 0);
  Shape y = s;
  for (int d = 0; d < r; ++d) {
    const int64_t n = s[static_cast<size_t>(d)];
    if (!P(0.6)) continue;
    const int64_t hi = mode == "reflect" ? std::min<int64_t>(2, n - 1) : 2;
    if (hi <= 0) continue;
    pads[static_cast<size_t>(d)] = R(0, hi);
    pads[static_cast<size_t>(d + r)] = R(0, hi);
    if (mode == "constant" && P(0.15) && n > 1) pads[static_cast<size_t>(d)] = -1, tag("Pad:negative");
    y[static_cast<size_t>(d)] += pads[static_cast<size_t>(d)] + pads[static_cast<size_t>(d + r)];
  }
  if (y == s && std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) throw Reject{};
  std::vector<int> ins = {x, const_i64(pads)};
  if (mode == "constant" && P(0.5)) ins.push_back(const_f(0.5f));
  tag("Pad:" + mode);
  std::map<std::string, AttrValue> at;
  if (mode != "constant" || P(0.3)) at["mode"] = mode;
  emit1("Pad", ins, DType::kFloat32, y, at, info(x));
  return true;
}

bool Generator::op_tile() {
  int x = need_float([&](int v) { return rank(v) >= 1 && num_elements(sref(v)) <= 300; });
  const Shape s = shape(x);
  std::vector<int64_t> rep;
  Shape y;
  for (int64_t d : s) {
    rep.push_back(P(0.5) ? R(2, 3) : 1);
    y.push_back(d * rep.back());
  }
  if (y == s) throw Reject{};
  emit1("Tile", {x, const_i64(rep)}, DType::kFloat32, y, {}, info(x));
  return true;
}

bool Generator::op_transpose() {
  int x = need_float([&](int v) { return rank(v) >= 2; });
  const int r = rank(x);
  std::vector<int64_t> perm(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i) perm[static_cast<size_t>(i)] = i;
  std::map<std::string, AttrValue> at;
  Shape y(static_cast<size_t>(r));
  if (P(0.15)) {
    std::reverse(perm.begin(), perm.end());
    tag("Transpose:default-perm");
  } else {
    std::shuffle(perm.begin(), perm.end(), rng_);
    at["perm"] = perm;
  }
  for (int i = 0; i < r; ++i) y[static_cast<size_t>(i)] = shape(x)[static_cast<size_t>(perm[static_cast<size_t>(i)])];
  emit1("Transpose", {x}, DType::kFloat32, y, at, info(x));
  return true;
}

bool Generator::op_reshape() {
  int x = need_float([&](int v) { return num_elements(shape(v)) > 1; });
  const Shape s = shape(x);
  const int r = rank(x);
  Shape y;
  int mode = static_cast<int>(R(0, 3));
  if (mode == 0 && r >= 2) {  // merge adjacent dims
    int i = static_cast<int>(R(0, r - 2));
    y = s;
    y[static_cast<size_t>(i)] *= y[static_cast<size_t>(i) + 1];
    y.erase(y.begin() + i + 1);
    tag("Reshape:merge");
  } else if (mode <= 2 && r < 4) {  // split one dim
    std::vector<int> cand;
    for (int i = 0; i < r; ++i) {
      int64_t d = s[static_cast<size_t>(i)];
      for (int64_t f = 2; f < d; ++f)
        if (d % f == 0) {
          cand.push_back(i);
          break;
        }
    }
    if (cand.empty()) throw Reject{};
    int i = pick(cand);
    int64_t d = s[static_cast<size_t>(i)];
    std::vector<int64_t> fs;
    for (int64_t f = 2; f < d; ++f)
      if (d % f == 0) fs.push_back(f);
    int64_t f = pick(fs);
    y = s;
    y[static_cast<size_t>(i)] = f;
    y.insert(y.begin() + i + 1, d / f);
    tag("Reshape:split");
  } else {  // flatten, or a 2-D view
    int64_t n = num_elements(s);
    if (P(0.5) || r == 1) {
      y = {n};
      tag("Reshape:flatten");
    } else {
      y = {s[0], n / s[0]};
      tag("Reshape:2-D");
    }
  }
  if (y == s) throw Reject{};
  std::vector<int64_t> target(y.begin(), y.end());
  for (size_t i = 0; i < target.size(); ++i)
    if (i < s.size() && target[i] == s[i] && P(0.3)) target[i] = 0;
  if (P(0.3)) {
    size_t i = static_cast<size_t>(R(0, static_cast<int64_t>(target.size()) - 1));
    if (target[i] != 0) target[i] = -1, tag("Reshape:-1");
  }
  emit1("Reshape", {x, const_i64(target)}, DType::kFloat32, y, {}, info(x));
  return true;
}

bool Generator::op_unsqueeze() {
  int x = need_float([&](int v) { return rank(v) <= 3; });
  const int r = rank(x);
  const int k = static_cast<int>(R(1, std::min(2, 4 - r)));
  const int R2 = r + k;
  std::vector<int64_t> pos(static_cast<size_t>(R2));
  for (int i = 0; i < R2; ++i) pos[static_cast<size_t>(i)] = i;
  std::shuffle(pos.begin(), pos.end(), rng_);
  pos.resize(static_cast<size_t>(k));
  std::vector<char> is_new(static_cast<size_t>(R2), 0);
  for (int64_t p : pos) is_new[static_cast<size_t>(p)] = 1;
  Shape y;
  size_t j = 0;
  for (int i = 0; i < R2; ++i) y.push_back(is_new[static_cast<size_t>(i)] ? 1 : shape(x)[j++]);
  for (auto& p : pos)
    if (P(0.3)) p -= R2;
  emit1("Unsqueeze", {x, const_i64(pos)}, DType::kFloat32, y, {}, info(x));
  return true;
}

bool Generator::op_squeeze() {
  int x = need_float(
      [&](int v) { return std::count(sref(v).begin(), sref(v).end(), 1) > 0 && num_elements(shape(v)) > 1; });
  const int r = rank(x);
  std::vector<int64_t> axes;
  const bool noaxes = P(0.15);
  std::vector<char> sq(static_cast<size_t>(r), 0);
  for (int d = 0; d < r; ++d)
    if (shape(x)[static_cast<size_t>(d)] == 1 && (noaxes || P(0.6))) sq[static_cast<size_t>(d)] = 1;
  if (!noaxes && std::find(sq.begin(), sq.end(), 1) == sq.end())
    for (int d = 0; d < r; ++d)
      if (shape(x)[static_cast<size_t>(d)] == 1) {
        sq[static_cast<size_t>(d)] = 1;
        break;
      }
  Shape y;
  for (int d = 0; d < r; ++d) {
    if (sq[static_cast<size_t>(d)])
      axes.push_back(P(0.3) ? d - r : d);
    else
      y.push_back(shape(x)[static_cast<size_t>(d)]);
  }
  std::vector<int> ins = {x};
  if (!noaxes)
    ins.push_back(const_i64(axes));
  else
    tag("Squeeze:no-axes");
  emit1("Squeeze", ins, DType::kFloat32, y, {}, info(x));
  return true;
}

bool Generator::op_concat() {
  int x = need_float([&](int v) { return rank(v) >= 1; });
  const Shape s = shape(x);
  const int r = rank(x);
  const int64_t axis = R(0, r - 1);
  std::vector<int> ins = {x};
  const int n = P(0.25) ? 3 : 2;
  for (int k = 1; k < n; ++k) {
    int o = -1;
    if (P(0.5))
      o = pick_float([&](int v) {
        if (rank(v) != r) return false;
        for (int d = 0; d < r; ++d)
          if (d != axis && shape(v)[static_cast<size_t>(d)] != s[static_cast<size_t>(d)]) return false;
        return true;
      });
    if (o < 0) {
      Shape os = s;
      os[static_cast<size_t>(axis)] = R(1, 5);
      o = (P(0.2) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(os) : new_weight(os, 1.0);
    }
    ins.push_back(o);
  }
  Shape y = s;
  y[static_cast<size_t>(axis)] = 0;
  bool exact = true;
  double sc = 0;
  for (int v : ins) {
    y[static_cast<size_t>(axis)] += shape(v)[static_cast<size_t>(axis)];
    exact = exact && info(v).exact;
    sc = std::max(sc, info(v).scale);
  }
  int64_t ax = P(0.3) ? axis - r : axis;
  if (n == 3) tag("Concat:3-way");
  emit1("Concat", ins, DType::kFloat32, y, {{"axis", ax}}, Info{exact, false, sc, 0});
  return true;
}

int64_t Generator::slice_len(int64_t d, int64_t start, int64_t end, int64_t step) {
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, d);
    end = std::clamp<int64_t>(end, 0, d);
    return end > start ? (end - start + step - 1) / step : 0;
  }
  start = std::clamp<int64_t>(start, 0, d - 1);
  end = std::clamp<int64_t>(end, -1, d - 1);
  return start > end ? (start - end + (-step) - 1) / (-step) : 0;
}

bool Generator::op_slice() {
  int x = need_float([&](int v) { return rank(v) >= 1 && num_elements(shape(v)) > 1; });
  const Shape s = shape(x);
  const int r = rank(x);
  std::vector<int> dims;
  for (int d = 0; d < r; ++d) dims.push_back(d);
  std::shuffle(dims.begin(), dims.end(), rng_);
  dims.resize(static_cast<size_t>(R(1, r)));
  const bool with_axes = P(0.8);
  if (!with_axes) {  // axes default to 0..k-1
    std::sort(dims.begin(), dims.end());
    for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int>(i);
  }
  std::vector<int64_t> starts, ends, axes, steps;
  bool nonunit = false;
  Shape y = s;
  for (int d : dims) {
    const int64_t n = s[static_cast<size_t>(d)];
    int64_t st = 0, en = 0, step = 1, len = 0;
    for (int tries = 0; tries < 20 && len < 1; ++tries) {
      double u = std::uniform_real_distribution<double>(0, 1)(rng_);
      step = u < 0.65 ? 1 : u < 0.8 ? 2 : u < 0.95 ? -1 : 3;
      if (step > 0) {
        st = R(0, n - 1);
        en = P(0.2) ? (P(0.5) ? n + R(0, 5) : int64_t{1} << 40) : R(st + 1, n);
      } else {
        st = P(0.2) ? n + R(0, 3) : R(0, n - 1);
        en = P(0.3) ? -(n + 1 + R(0, 3)) : R(-1, std::min(st, n - 1) - 1);
        if (en == -1) en = -(n + 1);  // -1 would mean the last element
      }
      if (P(0.3) && st >= 0 && st < n) st -= n;  // same position, negative form
      len = slice_len(n, st, en, step);
    }
    if (len < 1) throw Reject{};
    if (step != 1) nonunit = true;
    if (step < 0) tag("Slice:negative-step");
    if (step > 1) tag("Slice:step>1");
    starts.push_back(st);
    ends.push_back(en);
    axes.push_back(P(0.2) ? d - r : d);
    steps.push_back(step);
    y[static_cast<size_t>(d)] = len;
  }
  if (y == s && P(0.7)) throw Reject{};
  std::vector<int> ins = {x, const_i64(starts), const_i64(ends)};
  if (with_axes || nonunit || P(0.3)) ins.push_back(with_axes ? const_i64(axes) : -1);
  if (nonunit || P(0.3)) {
    if (ins.size() < 4) ins.push_back(-1);
    ins.push_back(const_i64(steps));
  }
  if (!with_axes) tag("Slice:default-axes");
  emit1("Slice", ins, DType::kFloat32, y, {}, info(x));
  return true;
}

bool Generator::op_split() {
  int x =
      need_float([&](int v) { return std::any_of(sref(v).begin(), sref(v).end(), [](int64_t d) { return d >= 2; }); });
  const Shape s = shape(x);
  const int r = rank(x);
  std::vector<int> cand;
  for (int d = 0; d < r; ++d)
    if (s[static_cast<size_t>(d)] >= 2) cand.push_back(d);
  const int axis = pick(cand);
  const int64_t n = s[static_cast<size_t>(axis)];
  const int k = static_cast<int>(R(2, std::min<int64_t>(3, n)));
  std::vector<int64_t> sizes;
  std::vector<int> ins = {x};
  if (n % k == 0 && P(0.3)) {
    sizes.assign(static_cast<size_t>(k), n / k);
    tag("Split:equal-no-input");
  } else {
    // k positive parts summing to n.
    std::vector<int64_t> cuts;
    for (int64_t i = 1; i < n; ++i) cuts.push_back(i);
    std::shuffle(cuts.begin(), cuts.end(), rng_);
    cuts.resize(static_cast<size_t>(k - 1));
    std::sort(cuts.begin(), cuts.end());
    int64_t prev = 0;
    for (int64_t c : cuts) sizes.push_back(c - prev), prev = c;
    sizes.push_back(n - prev);
    ins.push_back(const_i64(sizes));
  }
  std::vector<std::pair<DType, Shape>> outs;
  for (int64_t z : sizes) {
    Shape y = s;
    y[static_cast<size_t>(axis)] = z;
    outs.push_back({DType::kFloat32, y});
  }
  emit("Split", ins, outs, {{"axis", int64_t{P(0.3) ? axis - r : axis}}}, info(x));
  return true;
}

bool Generator::op_gather() {
  int data;
  int64_t axis = 0;
  if (P(0.6)) {
    data = new_weight({R(2, 12), R(1, 8)}, 1.0);
    tag("Gather:embedding");
  } else {
    data = need_float([&](int v) { return rank(v) >= 1; });
    axis = R(0, rank(data) - 1);
    tag("Gather:axis" + std::to_string(axis));
  }
  const int64_t hi = shape(data)[static_cast<size_t>(axis)];
  int ids = -1;
  for (int v : ids_)
    if (info(v).ids_hi <= hi && P(0.5)) ids = v;
  if (ids < 0) {
    Shape is = rand_shape(static_cast<int>(R(1, 2)), 40);
    ids = new_ids(is, hi);
  }
  const Shape ds = shape(data);
  Shape y(ds.begin(), ds.begin() + axis);
  for (int64_t d : shape(ids)) y.push_back(d);
  y.insert(y.end(), ds.begin() + axis + 1, ds.end());
  std::map<std::string, AttrValue> at;
  if (axis != 0 || P(0.3)) at["axis"] = int64_t{P(0.3) ? axis - static_cast<int64_t>(ds.size()) : axis};
  emit1("Gather", {data, ids}, DType::kFloat32, y, at, info(data));
  return true;
}

int64_t Generator::window_out(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil_mode) {
  const int64_t span = in + pb + pe - d * (k - 1) - 1;
  if (span < 0) return 0;
  int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (o - 1) * s >= in + pb) --o;
  return o;
}

bool Generator::op_conv() {
  int x = need_image();
  const Shape xs = shape(x);
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  int64_t G = 1, O;
  double u = std::uniform_real_distribution<double>(0, 1)(rng_);
  if (u < 0.25 && C > 1) {
    G = C;
    O = C * R(1, 2);
    tag("Conv:depthwise");
  } else if (u < 0.45) {
    std::vector<int64_t> gs;
    for (int64_t g = 2; g < C; ++g)
      if (C % g == 0) gs.push_back(g);
    if (gs.empty()) throw Reject{};
    G = pick(gs);
    O = G * R(1, 3);
    tag("Conv:grouped");
  } else {
    O = R(1, 6);
  }
  const int64_t kh = R(1, 3), kw = R(1, 3);
  const int64_t sh = P(0.3) ? 2 : 1, sw = P(0.3) ? 2 : 1;
  const int64_t dh = P(0.1) ? 2 : 1, dw = P(0.1) ? 2 : 1;
  std::vector<int64_t> pads = {R(0, kh - 1), R(0, kw - 1), R(0, kh - 1), R(0, kw - 1)};
  const int64_t Ho = window_out(H, kh, sh, dh, pads[0], pads[2], false);
  const int64_t Wo = window_out(W, kw, sw, dw, pads[1], pads[3], false);
  if (Ho < 1 || Wo < 1) throw Reject{};
  const int64_t fan = (C / G) * kh * kw;
  int w = new_weight({O, C / G, kh, kw}, 1.7 / std::sqrt(double(fan)));
  std::vector<int> ins = {x, w};
  if (P(0.5)) ins.push_back(new_weight({O}, 1.0)), tag("Conv:bias");
  std::map<std::string, AttrValue> at = {{"kernel_shape", std::vector<int64_t>{kh, kw}}};
  if (sh != 1 || sw != 1 || P(0.3)) at["strides"] = std::vector<int64_t>{sh, sw};
  if (sh != 1 || sw != 1) tag("Conv:stride2");
  if (dh != 1 || dw != 1) at["dilations"] = std::vector<int64_t>{dh, dw}, tag("Conv:dilation2");
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) at["pads"] = pads, tag("Conv:pads");
  if (G != 1) at["group"] = G;
  if (kh == 1 && kw == 1) tag("Conv:1x1");
  emit1("Conv", ins, DType::kFloat32, {N, O, Ho, Wo}, at, Info{false, false, info(x).scale + 0.6, 0});
  return true;
}

bool Generator::op_pool(const std::string& op) {
  int x = need_image();
  const Shape xs = shape(x);
  const int64_t kh = R(1, 3), kw = R(1, 3);
  const int64_t sh = R(1, 2), sw = R(1, 2);
  std::vector<int64_t> pads = {R(0, kh - 1), R(0, kw - 1), R(0, kh - 1), R(0, kw - 1)};
  const bool ceil_mode = P(0.15);
  const int64_t Ho = window_out(xs[2], kh, sh, 1, pads[0], pads[2], ceil_mode);
  const int64_t Wo = window_out(xs[3], kw, sw, 1, pads[1], pads[3], ceil_mode);
  if (Ho < 1 || Wo < 1) throw Reject{};
  std::map<std::string, AttrValue> at = {{"kernel_shape", std::vector<int64_t>{kh, kw}}};
  if (sh != 1 || sw != 1 || P(0.3)) at["strides"] = std::vector<int64_t>{sh, sw};
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) at["pads"] = pads, tag(op + ":pads");
  if (ceil_mode) at["ceil_mode"] = int64_t{1}, tag(op + ":ceil_mode");
  if (op == "AveragePool" && P(0.5)) at["count_include_pad"] = int64_t{1}, tag(op + ":count_include_pad");
  if (sh == 2 || sw == 2) tag(op + ":stride2");
  emit1(op, {x}, DType::kFloat32, {xs[0], xs[1], Ho, Wo}, at,
        Info{op == "MaxPool" && info(x).exact, false, info(x).scale, 0});
  return true;
}

bool Generator::op_gap() {
  int x = need_image();
  const Shape xs = shape(x);
  emit1("GlobalAveragePool", {x}, DType::kFloat32, {xs[0], xs[1], 1, 1}, {}, Info{false, false, info(x).scale, 0});
  return true;
}

}  // namespace detail

}  // namespace gspmd::difftest
