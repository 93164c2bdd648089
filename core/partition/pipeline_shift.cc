// The partitioner's handler of the pipeline's stage shift (gspmd.pipeline Shift, core/ir/shift_op.h; GSPMD §3.3):
// with the stage dim split one row per device, the shift is one collective-permute between neighbouring stages and
// the row that enters or leaves the pipeline is chosen by the partition id; otherwise the stage dim is gathered and
// the shift is computed locally with standard ONNX ops.
#include <algorithm>

#include <fmt/format.h>

#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {
namespace {

/// A scalar tensor of `t` holding zero.
Tensor zero_scalar(DType t) {
  return Tensor(t, {});  // zero-initialised
}

/// Whether value v of g is all zeros by construction: an Expand of a zero constant (the schedule's initial state, the
/// gradient of a state that nothing reads). Shifting it moves no data.
bool known_zero(const Graph& g, int v) {
  const int n = g.values[static_cast<size_t>(v)].producer;
  if (n < 0 || g.nodes[static_cast<size_t>(n)].op_type != "Expand" || !g.nodes[static_cast<size_t>(n)].domain.empty())
    return false;
  const Value& c = g.values[static_cast<size_t>(g.nodes[static_cast<size_t>(n)].inputs[0])];
  return c.data &&
         std::all_of(c.data->bytes.begin(), c.data->bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

}  // namespace

bool Partitioner::lower_pipeline_shift(int n) {
  const Node& node = g_.nodes[n];
  const int gx = node.inputs[0], gin = node.inputs.size() > 1 ? node.inputs[1] : -1;
  // An output nothing reads is not computed: y after the last iteration, out of a shift where no microbatch leaves.
  auto used = [&](size_t k) {
    const int v = k < node.outputs.size() ? node.outputs[k] : -1;
    return v >= 0 && (is_output_[static_cast<size_t>(v)] || !consumers_[static_cast<size_t>(v)].empty()) ? v : -1;
  };
  const int gy = used(0), gout = used(1);
  const Value& xv = g_.values[gx];
  const int64_t S = xv.shape[0], shift = node.i("shift", 1);
  const bool wrap = node.i("wrap", 0) != 0;
  const int64_t enter = shift > 0 ? 0 : S - 1, exit = S - 1 - enter;
  // The state keeps the sharding planned for y (x's when y is not computed); its stage dim stays split only one row
  // per device.
  TensorSharding s = gy >= 0 ? plan_.shardings[gy] : current_dims(gx);
  s.unreduced.clear();
  s.reduction = ReductionKind::kSum;
  const std::vector<int> A = s.dims[0];
  const bool split = !A.empty() && mesh_.axes_size(A) == S;
  if (!split) s.dims[0].clear();
  TensorSharding row = s;
  row.dims[0].clear();
  const std::string why = fmt::format("{} (pipeline shift) needs the state reduced", node.name);
  const int x = get(gx, s, node.name, why);
  const int in = gin >= 0 ? get(gin, row, node.name, why) : -1;
  const Shape ls = P().values[x].shape;
  Shape rs = ls;
  rs[0] = 1;
  const DType t = xv.dtype;
  const std::string& base = node.name;
  if (split) {
    // The device's stage is its tile over A (one row each).
    const int tile =
        emit(gspmd_node(PartitionOffsetAttrs{.mesh_axes = A, .shard_size = 1}), {}, base + "/stage", DType::kInt64, {});
    auto is_stage = [&](int64_t st, const char* what) {
      return emit("Equal", {tile, int64_const(base + "/" + what, {st}, true)}, base + "/is_" + what, DType::kBool, {});
    };
    if (gy >= 0 && known_zero(g_, gx)) {  // zeros shifted are zeros: only the entering row
      const int y = in < 0 ? x
                           : emit("Where", {is_stage(enter, "enter"), in, new_constant(base + "/zero", zero_scalar(t))},
                                  g_.values[gy].name, t, ls);
      bind(gy, s, y);
    } else if (gy >= 0) {
      int y = collective({.kind = Collective::kCollectivePermute, .mesh_axes = A, .shift = shift, .wrap = wrap}, x, ls,
                         node.name, gx,
                         fmt::format("pipeline shift of '{}': stage s hands its state to stage s{}{}", xv.name,
                                     shift > 0 ? "+1" : "-1", wrap ? " (cyclic)" : ""));
      if (in >= 0) {
        const int entered = wrap ? emit("Add", {y, in}, base + "/entered", t, ls) : in;
        y = emit("Where", {is_stage(enter, "enter"), entered, y}, g_.values[gy].name, t, ls);
      }
      bind(gy, s, y);
    }
    if (gout >= 0) {  // x on the exit stage, 0 elsewhere: a partial sum over A
      const int zero = new_constant(base + "/zero", zero_scalar(t));
      const int out = emit("Where", {is_stage(exit, "exit"), x, zero}, g_.values[gout].name, t, ls);
      TensorSharding os = row;
      os.unreduced = A;
      bind(gout, os, out);
    }
    return true;
  }
  // The whole stage dim is local: slices and a concat.
  const int64_t axes = 0;
  auto rows = [&](int64_t from, int64_t to, const std::string& hint) {
    Shape sh = ls;
    sh[0] = to - from;
    return emit("Slice",
                {x, int64_const(hint + "/starts", {from}), int64_const(hint + "/ends", {to}),
                 int64_const(hint + "/axes", {axes})},
                hint, t, sh);
  };
  const int leaving = rows(exit, exit + 1, base + "/exit_row");
  if (gy >= 0) {
    int entered = -1;
    if (in >= 0 && wrap)
      entered = emit("Add", {in, leaving}, base + "/entered", t, rs);
    else if (in >= 0)
      entered = in;
    else if (wrap)
      entered = leaving;
    else
      entered = emit("Expand", {new_constant(base + "/zero", zero_scalar(t)), int64_const(base + "/row_shape", rs)},
                     base + "/entered", t, rs);
    int y = entered;
    if (S > 1) {
      const int kept = shift > 0 ? rows(0, S - 1, base + "/kept") : rows(1, S, base + "/kept");
      std::vector<int> parts = shift > 0 ? std::vector<int>{entered, kept} : std::vector<int>{kept, entered};
      y = emit("Concat", parts, g_.values[gy].name, t, ls, {{"axis", int64_t{0}}});
    }
    bind(gy, s, y);
  }
  if (gout >= 0) bind(gout, row, leaving);
  return true;
}

}  // namespace gspmd::partition_internal
