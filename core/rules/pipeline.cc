// Rules of the pipeline's stage shift (gspmd.pipeline Shift, core/ir/shift_op.h):
// - sharding: the stage dim is one factor of x and y (the partitioner's handler turns its one-row-per-device split
//   into a collective-permute); every other dim is one factor of x, in, y and out, whose stage dim (size 1) has none;
// - gradient: the reverse shift (shift = -shift, same wrap) of (dy, d_out) gives (dx, d_in).
#include "core/ir/shift_op.h"
#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

RuleResult shift_rule(const Graph& g, const Node& n) {
  if (n.inputs.empty() || n.inputs[0] < 0) return reject("expects the state x");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  if (x.empty()) return reject("the state is a scalar");
  const std::vector<int> f = m.factors(x, FactorKind::kPassThrough);
  DimFactors full = one_factor_each(f), row = full;
  row[0].clear();
  m.operand(0, full);
  if (m.has_input(1)) m.operand(1, row);
  if (m.has_output(0)) m.result(0, full);
  if (m.has_output(1)) m.result(1, row);
  m.all_linear();
  return m.build();
}

}  // namespace

void register_pipeline_rules() { add_builtin(kShiftOp, shift_rule, kPipelineDomain); }

void register_pipeline_gradients() {
  add_builtin_gradient(
      kShiftOp,
      [](GradContext& c) {
        const Node& n = c.node();
        const bool want_x = c.wants(0), want_in = n.inputs.size() > 1 && c.wants(1);
        if (!want_x && !want_in) return;
        // When y has no gradient (the state after a schedule's last iteration) the reverse shift moves zeros, an
        // Expand that the partitioner does not send: dx is d_out on the exit row. (x's shape, not y's: reading y
        // would recompute it under --remat.)
        int dy = n.outputs.empty() || n.outputs[0] < 0 ? -1 : c.dy(0);
        if (dy < 0) {
          const Value x = c.value(n.inputs[0]);
          dy = c.expand(c.scalar(0.0, x.dtype), x.shape);
        }
        const int dout = n.outputs.size() > 1 && n.outputs[1] >= 0 ? c.dy(1) : -1;
        const std::vector<int> r = c.emit_in(kPipelineDomain, kShiftOp, {dy, dout},
                                             {{"shift", -n.i("shift", 1)}, {"wrap", n.i("wrap", 0)}}, 2);
        if (want_x) c.set_dx(0, r[0]);
        if (want_in) c.set_dx(1, r[1]);
      },
      kPipelineDomain);
}

}  // namespace gspmd::rules_internal
