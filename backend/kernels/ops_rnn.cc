// Recurrent kernels: RNN, GRU, LSTM (opset 7/14: layout, sequence_lens, initial states, peepholes, clip,
// linear_before_reset, forward / reverse / bidirectional), plain C++ in the input's float type.
// Gate orders follow the ONNX spec: GRU z, r, h; LSTM i, o, f, c (peepholes i, o, f).
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "backend/kernels/kernels_util.h"

namespace gspmd::kern {
namespace {

enum class Cell { kRnn, kGru, kLstm };

using Act = double (*)(double);
double act_sigmoid(double v) { return 1 / (1 + std::exp(-v)); }
double act_tanh(double v) { return std::tanh(v); }
double act_relu(double v) { return v > 0 ? v : 0; }

Act activation(const Ctx& c, const std::string& name) {
  if (name == "Sigmoid") return act_sigmoid;
  if (name == "Tanh") return act_tanh;
  if (name == "Relu") return act_relu;
  c.unsupported(fmt::format("no kernel for activation '{}'", name));
}

// RNN / GRU / LSTM attributes and sizes (onnx/docs/Operators.md#RNN, #GRU, #LSTM), checked against X, W and R.
struct RnnConfig {
  int64_t layout = 0;
  std::string direction;
  int64_t D = 1;                        // directions
  int64_t S = 0, Bn = 0, I = 0, H = 0;  // sequence, batch, input size, hidden size
  bool lbr = false;                     // GRU linear_before_reset
  double clip = 0.0;                    // 0: no clipping
  int per_dir = 1;                      // activations per direction
  std::vector<std::string> names;       // activations, per_dir per direction
  std::vector<int64_t> lens;            // per batch entry: its sequence length
};

template <Cell cell>
RnnConfig rnn_config(const Ctx& c, int64_t G) {
  const Tensor& X = c.req(0);
  const Tensor& W = c.req(1);
  const Tensor& R = c.req(2);
  RnnConfig k;
  k.layout = c.node.i("layout", 0);
  k.direction = c.node.s("direction", "forward");
  k.D = k.direction == "bidirectional" ? 2 : 1;
  if (k.direction != "forward" && k.direction != "reverse" && k.direction != "bidirectional")
    c.fail(fmt::format("unknown direction '{}'", k.direction));
  if (X.shape.size() != 3) c.fail(fmt::format("X must be 3-D, got {}", shape_str(X.shape)));
  k.S = k.layout ? X.shape[1] : X.shape[0];
  k.Bn = k.layout ? X.shape[0] : X.shape[1];
  k.I = X.shape[2];
  k.H = c.node.has("hidden_size") ? c.node.i("hidden_size") : W.shape.at(1) / G;
  const int64_t D = k.D, H = k.H;
  if (W.shape != Shape{D, G * H, k.I} || R.shape != Shape{D, G * H, H})
    c.fail(fmt::format("W {} / R {} do not match [{}, {}, {}] / [{}, {}, {}]", shape_str(W.shape), shape_str(R.shape),
                       D, G * H, k.I, D, G * H, H));
  if (c.node.i("input_forget", 0) != 0) c.unsupported("no kernel for input_forget=1");
  k.lbr = c.node.i("linear_before_reset", 0) != 0;
  k.clip = c.node.has("clip") ? c.node.f("clip") : 0.0;
  if (c.node.has("activations")) {
    const auto* v = std::get_if<std::vector<std::string>>(&c.node.attrs.at("activations"));
    if (!v) c.fail("attribute 'activations' must be a list of strings");
    k.names = *v;
  }
  k.per_dir = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 2 : 3;
  if (k.names.empty()) {
    if constexpr (cell == Cell::kRnn) k.names = {"Tanh"};
    if constexpr (cell == Cell::kGru) k.names = {"Sigmoid", "Tanh"};
    if constexpr (cell == Cell::kLstm) k.names = {"Sigmoid", "Tanh", "Tanh"};
    const std::vector<std::string> one_direction = k.names;
    for (int64_t d = 1; d < D; ++d) k.names.insert(k.names.end(), one_direction.begin(), one_direction.end());
  }
  if (static_cast<int64_t>(k.names.size()) != k.per_dir * D)
    c.fail(fmt::format("expected {} activations, got {}", k.per_dir * D, k.names.size()));
  k.lens.assign(static_cast<size_t>(k.Bn), k.S);
  if (const Tensor* lens_t = c.in(4)) k.lens = lens_t->as_int64s();
  return k;
}

template <Cell cell>
std::vector<Tensor> rnn_kernel(const Ctx& c) {
  constexpr int G = cell == Cell::kRnn ? 1 : cell == Cell::kGru ? 3 : 4;  // gates
  const Tensor& X = c.req(0);
  const Tensor& W = c.req(1);
  const Tensor& R = c.req(2);
  const Tensor* B = c.in(3);
  const Tensor* h0 = c.in(5);
  const Tensor* c0 = cell == Cell::kLstm ? c.in(6) : nullptr;
  const Tensor* P = cell == Cell::kLstm ? c.in(7) : nullptr;
  const RnnConfig k = rnn_config<cell>(c, G);
  const int64_t layout = k.layout, D = k.D, S = k.S, Bn = k.Bn, I = k.I, H = k.H;
  const bool lbr = k.lbr;
  const double clip = k.clip;
  const int per_dir = k.per_dir;
  const std::string& direction = k.direction;
  const std::vector<std::string>& names = k.names;
  const std::vector<int64_t>& lens = k.lens;

  std::vector<Tensor> outs;
  Shape ys = layout ? Shape{Bn, S, D, H} : Shape{S, D, Bn, H};
  Shape hs = layout ? Shape{Bn, D, H} : Shape{D, Bn, H};
  outs.emplace_back(X.dtype, ys);
  outs.emplace_back(X.dtype, hs);
  if (cell == Cell::kLstm) outs.emplace_back(X.dtype, hs);
  dispatch_float(c, X.dtype, [&]<class T>() {
    const T* x = X.data<T>();
    T* y = outs[0].data<T>();
    auto xi = [&](int64_t t, int64_t b) { return x + (layout ? (b * S + t) : (t * Bn + b)) * I; };
    auto yi = [&](int64_t t, int64_t d, int64_t b) {
      return y + (layout ? ((b * S + t) * D + d) : ((t * D + d) * Bn + b)) * H;
    };
    auto si = [&](int64_t d, int64_t b) { return (layout ? (b * D + d) : (d * Bn + b)) * H; };
    for (int64_t d = 0; d < D; ++d) {
      const bool reverse = direction == "reverse" || d == 1;
      const Act f = activation(c, names[static_cast<size_t>(d * per_dir)]);
      const Act g = per_dir > 1 ? activation(c, names[static_cast<size_t>(d * per_dir + 1)]) : f;
      const Act h = per_dir > 2 ? activation(c, names[static_cast<size_t>(d * per_dir + 2)]) : f;
      const T* w = W.data<T>() + d * G * H * I;
      const T* r = R.data<T>() + d * G * H * H;
      const T* wb = B ? B->data<T>() + d * 2 * G * H : nullptr;
      const T* rb = wb ? wb + G * H : nullptr;
      const T* p = P ? P->data<T>() + d * 3 * H : nullptr;
      std::vector<double> gx(static_cast<size_t>(G * H)), gh(static_cast<size_t>(G * H)), hv(static_cast<size_t>(H)),
          cv(static_cast<size_t>(H)), rh(static_cast<size_t>(H));
      for (int64_t b = 0; b < Bn; ++b) {
        for (int64_t k = 0; k < H; ++k) {
          hv[k] = h0 ? static_cast<double>(h0->data<T>()[si(d, b) + k]) : 0.0;
          cv[k] = c0 ? static_cast<double>(c0->data<T>()[si(d, b) + k]) : 0.0;
        }
        const int64_t len = std::min<int64_t>(lens[b], S);
        for (int64_t step = 0; step < len; ++step) {
          const int64_t t = reverse ? len - 1 - step : step;
          const T* xt = xi(t, b);
          // gx = W x + Wb, gh = R h + Rb (gate rows contiguous).
          for (int64_t row = 0; row < G * H; ++row) {
            double sx = wb ? static_cast<double>(wb[row]) : 0.0, sh = rb ? static_cast<double>(rb[row]) : 0.0;
            const T* wr = w + row * I;
            for (int64_t k = 0; k < I; ++k) sx += static_cast<double>(wr[k]) * static_cast<double>(xt[k]);
            const T* rr = r + row * H;
            for (int64_t k = 0; k < H; ++k) sh += static_cast<double>(rr[k]) * hv[k];
            gx[row] = sx;
            gh[row] = sh;
          }
          auto cl = [clip](double v) { return clip > 0 ? std::max(-clip, std::min(clip, v)) : v; };
          if constexpr (cell == Cell::kRnn) {
            for (int64_t k = 0; k < H; ++k) hv[k] = f(cl(gx[k] + gh[k]));
          } else if constexpr (cell == Cell::kGru) {
            if (!lbr) {  // (r * h) R_h^T needs r first
              for (int64_t k = 0; k < H; ++k) rh[k] = f(cl(gx[H + k] + gh[H + k])) * hv[k];
            }
            for (int64_t k = 0; k < H; ++k) {
              const double z = f(cl(gx[k] + gh[k]));
              const double rg = f(cl(gx[H + k] + gh[H + k]));
              double hh;
              if (lbr) {
                hh = g(cl(gx[2 * H + k] + rg * gh[2 * H + k]));
              } else {
                double s = rb ? static_cast<double>(rb[2 * H + k]) : 0.0;
                const T* rr = r + (2 * H + k) * H;
                for (int64_t j = 0; j < H; ++j) s += static_cast<double>(rr[j]) * rh[j];
                hh = g(cl(gx[2 * H + k] + s));
              }
              gx[k] = (1 - z) * hh + z * hv[k];  // new h, kept in gx[0..H) until all k are done
            }
            for (int64_t k = 0; k < H; ++k) hv[k] = gx[k];
          } else {
            for (int64_t k = 0; k < H; ++k) {
              const double ig = f(cl(gx[k] + gh[k] + (p ? static_cast<double>(p[k]) * cv[k] : 0.0)));
              const double fg =
                  f(cl(gx[2 * H + k] + gh[2 * H + k] + (p ? static_cast<double>(p[2 * H + k]) * cv[k] : 0.0)));
              const double cg = g(cl(gx[3 * H + k] + gh[3 * H + k]));
              const double cn = fg * cv[k] + ig * cg;
              const double og = f(cl(gx[H + k] + gh[H + k] + (p ? static_cast<double>(p[H + k]) * cn : 0.0)));
              cv[k] = cn;
              hv[k] = og * h(cn);
            }
          }
          T* yt = yi(t, d, b);
          for (int64_t k = 0; k < H; ++k) yt[k] = static_cast<T>(hv[k]);
        }
        for (int64_t k = 0; k < H; ++k) {
          outs[1].data<T>()[si(d, b) + k] = static_cast<T>(hv[k]);
          if (cell == Cell::kLstm) outs[2].data<T>()[si(d, b) + k] = static_cast<T>(cv[k]);
        }
      }
    }
  });
  outs.resize(std::max<size_t>(1, std::min(outs.size(), c.n_out())));
  return outs;
}

}  // namespace

void register_rnn(KernelTable& t) {
  t["RNN"] = rnn_kernel<Cell::kRnn>;
  t["GRU"] = rnn_kernel<Cell::kGru>;
  t["LSTM"] = rnn_kernel<Cell::kLstm>;
}

}  // namespace gspmd::kern
