// Shape functions of ops_rnn.cc's kernels: RNN, GRU, LSTM.
#include <algorithm>

#include <fmt/format.h>

#include "core/shapes/shape_ctx.h"

namespace gspmd::shapes {
namespace {

// X [S, B, I] (layout 1: [B, S, I]), W [D, G*H, I], R [D, G*H, H] with G gates; outputs Y [S, D, B, H]
// (layout 1: [B, S, D, H]), Y_h and (LSTM) Y_c [D, B, H] (layout 1: [B, D, H]), each in X's dtype.
template <int64_t G, size_t n_outputs>
std::vector<TensorType> rnn_types(const ShapeCtx& c) {
  const Shape &X = c.shape(0), &W = c.shape(1), &R = c.shape(2);
  const bool layout = c.node.i("layout", 0) != 0;
  const std::string direction = c.node.s("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    c.fail(fmt::format("unknown direction '{}'", direction));
  const int64_t D = direction == "bidirectional" ? 2 : 1;
  if (X.size() != 3) c.fail(fmt::format("X must be 3-D, got {}", shape_str(X)));
  const int64_t S = layout ? X[1] : X[0], B = layout ? X[0] : X[1], I = X[2];
  if (!c.node.has("hidden_size") && W.size() < 2) c.fail(fmt::format("W must be 3-D, got {}", shape_str(W)));
  const int64_t H = c.node.has("hidden_size") ? c.node.i("hidden_size") : W[1] / G;
  if (W != Shape{D, G * H, I} || R != Shape{D, G * H, H})
    c.fail(fmt::format("W {} / R {} do not match [{}, {}, {}] / [{}, {}, {}]", shape_str(W), shape_str(R), D, G * H, I,
                       D, G * H, H));
  const DType t = c.dtype(0);
  std::vector<TensorType> out{{t, layout ? Shape{B, S, D, H} : Shape{S, D, B, H}}};
  for (size_t i = 1; i < std::min(c.n_out(), n_outputs); ++i)
    out.push_back({t, layout ? Shape{B, D, H} : Shape{D, B, H}});
  return out;
}

}  // namespace

void register_rnn_shapes(ShapeTable& t) {
  t["RNN"] = rnn_types<1, 2>;
  t["GRU"] = rnn_types<3, 2>;
  t["LSTM"] = rnn_types<4, 3>;
}

}  // namespace gspmd::shapes
