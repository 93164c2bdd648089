// Layer blocks vectorized over a leading stage dim (core/pipeline/vectorize.h).
#include "core/pipeline/vectorize.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/auto/auto.h"
#include "core/ir/typing.h"

namespace gspmd {
namespace {

/// Ops that compute each element from the same elements of their operands (numpy broadcasting): a stage-stacked
/// operand only needs its stage dim lined up with the others'.
const std::set<std::string>& elementwise_ops() {
  static const std::set<std::string> ops = {
      "Add",      "Sub",       "Mul",     "Div",         "Pow",       "Where",      "Equal", "Less",     "Greater",
      "And",      "Or",        "Not",     "Max",         "Min",       "Erf",        "Tanh",  "Relu",     "Sqrt",
      "Exp",      "Log",       "Neg",     "Abs",         "Sigmoid",   "Reciprocal", "Cast",  "Identity", "Gelu",
      "Softplus", "LeakyRelu", "Elu",     "HardSigmoid", "HardSwish", "Sin",        "Cos",   "Floor",    "Ceil",
      "Round",    "Sign",      "Dropout", "Clip",        "IsNaN",     "IsInf"};
  return ops;
}

/// The builder: block 0's values mapped to the stacked graph's, with whether each carries the stage dim.
class Stacker {
 public:
  Stacker(const Graph& g, int64_t stages, const ShapeFunction& shapes) : g_(g), stages_(stages), shapes_(shapes) {
    out_.name = g.name + ".stages";
    out_.opset = g.opset;
  }

  struct Mapped {
    int id = -1;
    bool stacked = false;
  };

  Graph& out() { return out_; }
  std::map<int, Mapped>& map() { return map_; }

  /// The stacked graph's copy of an unstacked value of g (a side input, a constant): an initializer with its data,
  /// or a graph input.
  Mapped shared(int v) {
    auto it = map_.find(v);
    if (it != map_.end()) return it->second;
    const Value& val = g_.values[static_cast<size_t>(v)];
    const int id = out_.add_value_unique(val.name, val.dtype, val.shape);
    out_.values[static_cast<size_t>(id)].is_initializer = val.is_initializer;
    out_.values[static_cast<size_t>(id)].data = val.data;
    if (!val.is_initializer) out_.inputs.push_back(id);
    return map_[v] = {id, false};
  }

  /// A node `op` on `inputs` (ids of the stacked graph) typed by the shape function; its output ids.
  std::vector<int> emit(const Node& like, const std::string& op, const std::vector<int>& inputs,
                        std::map<std::string, AttrValue> attrs, size_t outputs, const std::string& name) {
    Node n;
    n.name = name;
    n.op_type = op;
    n.inputs = inputs;
    n.attrs = std::move(attrs);
    std::vector<TensorType> t;
    try {
      t = node_types(out_, n, shapes_);
    } catch (const std::exception& e) {
      throw InputError(fmt::format("--pipeline: node '{}' ({}) stacked over {} stages: {}", like.name, like.op_type,
                                   stages_, e.what()));
    }
    for (size_t k = 0; k < outputs && k < t.size(); ++k)
      n.outputs.push_back(out_.add_value_unique(fmt::format("{}:{}", name, k), t[k].dtype, t[k].shape));
    const std::vector<int> ids = n.outputs;
    out_.add_node(std::move(n));
    return ids;
  }

  int constant(const std::string& name, Tensor t) {
    const int id = out_.add_value_unique(name, t.dtype, t.shape);
    out_.values[static_cast<size_t>(id)].is_initializer = true;
    out_.values[static_cast<size_t>(id)].data = std::make_shared<const Tensor>(std::move(t));
    return id;
  }

  /// A stacked value given unit dims after the stage dim up to rank 1 + `rank` (its original rank grows to `rank`,
  /// as numpy broadcasting aligns it from the right).
  int widen(const Node& like, int id, size_t rank) {
    const Shape& s = out_.values[static_cast<size_t>(id)].shape;
    if (s.size() >= rank + 1) return id;
    Shape t{s[0]};
    t.resize(rank + 1 - (s.size() - 1), 1);
    t.insert(t.end(), s.begin() + 1, s.end());
    const int shape =
        constant(like.name + "/stage_shape", Tensor::from_int64s(std::vector<int64_t>(t.begin(), t.end())));
    return emit(like, "Reshape", {id, shape}, {}, 1, like.name + "/stage_align")[0];
  }

  /// Node n of block 0 on the mapped operands.
  void stack(const Node& n) {
    std::vector<Mapped> in;
    bool any = false;
    for (int v : n.inputs) {
      in.push_back(v < 0 ? Mapped{} : (map_.count(v) ? map_[v] : shared(v)));
      any = any || in.back().stacked;
    }
    auto fail = [&](const std::string& why) {
      return InputError(fmt::format("--pipeline: node '{}' ({}): {}", n.name, n.op_type, why));
    };
    std::vector<int> ids;
    for (const Mapped& m : in) ids.push_back(m.id);
    if (!any) {  // computed from shared values only: once, for every stage
      bind(n, emit(n, n.op_type, ids, n.attrs, n.outputs.size(), n.name), false);
      return;
    }
    if (!n.domain.empty()) throw fail("no batching rule for a non-ONNX op");
    auto orig_rank = [&](const Mapped& m) {
      const size_t r = out_.values[static_cast<size_t>(m.id)].shape.size();
      return m.stacked ? r - 1 : r;
    };
    auto shifted = [&](int64_t axis) { return axis < 0 ? axis : axis + 1; };
    std::map<std::string, AttrValue> attrs = n.attrs;
    const std::string& op = n.op_type;
    if (elementwise_ops().count(op) || op == "MatMul") {
      size_t rank = 0;
      for (const Mapped& m : in)
        if (m.id >= 0) rank = std::max(rank, orig_rank(m));
      if (op == "MatMul" && (orig_rank(in[0]) < 2 || orig_rank(in[1]) < 2))
        throw fail("a 1-D operand stacked over stages");
      for (size_t i = 0; i < in.size(); ++i)
        if (in[i].stacked) ids[i] = widen(n, ids[i], rank);
    } else if (op == "Transpose") {
      const size_t r = orig_rank(in[0]);
      std::vector<int64_t> perm = n.ints("perm");
      if (perm.empty())
        for (size_t d = r; d-- > 0;) perm.push_back(static_cast<int64_t>(d));
      std::vector<int64_t> p{0};
      for (int64_t d : perm) p.push_back(d + 1);
      attrs["perm"] = p;
    } else if (op == "Reshape") {
      const Tensor* target = in[1].stacked ? nullptr : out_.values[static_cast<size_t>(ids[1])].data.get();
      if (!target) throw fail("the target shape is not a constant");
      std::vector<int64_t> t{stages_};
      for (int64_t d : target->as_int64s()) t.push_back(d);
      ids[1] = constant(n.name + "/stage_shape", Tensor::from_int64s(t));
    } else if (op == "Softmax" || op == "LogSoftmax") {
      if (g_.opset < 13) throw fail("opset < 13 flattens from the axis: stack a model of opset 13 or later");
      attrs["axis"] = shifted(n.i("axis", -1));
    } else if (op == "Concat") {
      attrs["axis"] = shifted(n.i("axis", 0));
      for (size_t i = 0; i < in.size(); ++i)
        if (!in[i].stacked) throw fail("concatenates a value shared by the stages");
    } else if (op == "LayerNormalization") {
      if (!in[0].stacked) throw fail("normalizes a value shared by the stages");
      attrs["axis"] = shifted(n.i("axis", -1));
      // A stacked Scale / B does not broadcast onto the normalized dims: normalize with unit scale, then scale and
      // shift by the stacked parameters lined up with the stage dim.
      const bool scale_stacked = in.size() > 1 && in[1].stacked, bias_stacked = in.size() > 2 && in[2].stacked;
      if (scale_stacked || bias_stacked) {
        if (out_.values[static_cast<size_t>(ids[0])].dtype != DType::kFloat32)
          throw fail("stacked LayerNormalization parameters are supported in float32");
        const Shape& norm = g_.values[static_cast<size_t>(n.inputs[1])].shape;
        Tensor ones(out_.values[static_cast<size_t>(ids[0])].dtype, norm);
        for (int64_t k = 0; k < ones.numel(); ++k) ones.data<float>()[k] = 1.f;
        std::vector<int> y =
            emit(n, op, {ids[0], constant(n.name + "/unit_scale", std::move(ones))}, attrs, n.outputs.size(), n.name);
        const size_t rank = orig_rank(in[0]);
        auto lined_up = [&](size_t i) { return in[i].stacked ? widen(n, ids[i], rank) : ids[i]; };
        int r = emit(n, "Mul", {y[0], lined_up(1)}, {}, 1, n.name + "/scale")[0];  // x̂ · Scale, then + B
        if (in.size() > 2 && ids[2] >= 0) r = emit(n, "Add", {r, lined_up(2)}, {}, 1, n.name + "/bias")[0];
        y[0] = r;
        bind(n, y, true);
        return;
      }
    } else {
      throw fail("no batching rule over a stage dim (the ops of transformer layers are supported)");
    }
    bind(n, emit(n, op, ids, attrs, n.outputs.size(), n.name), true);
  }

 private:
  void bind(const Node& n, const std::vector<int>& ids, bool stacked) {
    for (size_t k = 0; k < n.outputs.size() && k < ids.size(); ++k)
      if (n.outputs[k] >= 0) map_[n.outputs[k]] = {ids[k], stacked};
  }

  const Graph& g_;
  const int64_t stages_;
  const ShapeFunction& shapes_;
  Graph out_;
  std::map<int, Mapped> map_;  // block 0's values (and the shared ones) -> the stacked graph's
};

}  // namespace

Graph stack_blocks(const Graph& g, const LayerBlocks& b, const std::vector<size_t>& blocks,
                   const ShapeFunction& shapes) {
  const int64_t stages = static_cast<int64_t>(blocks.size());
  for (size_t k : blocks)
    if (k >= b.blocks.size()) throw std::out_of_range(fmt::format("stack_blocks: block {} of {}", k, b.blocks.size()));
  if (blocks.empty()) throw std::out_of_range("stack_blocks: no block");
  const LayerBlocks::Block& b0 = b.blocks[0];
  Stacker s(g, stages, shapes);
  Graph& out = s.out();
  const Value& in = g.values[static_cast<size_t>(b0.input)];
  Shape state_shape{stages};
  state_shape.insert(state_shape.end(), in.shape.begin(), in.shape.end());
  const int state = out.add_value_unique("state", in.dtype, state_shape);
  out.inputs.push_back(state);
  s.map()[b0.input] = {state, true};
  for (size_t k = 0; k < b0.weights.size(); ++k) {  // block 0's weights, stacked over `blocks`
    const Value& w = g.values[static_cast<size_t>(b0.weights[k])];
    Shape shape{stages};
    shape.insert(shape.end(), w.shape.begin(), w.shape.end());
    const int id = out.add_value_unique(layer_key(w.name), w.dtype, shape);
    out.values[static_cast<size_t>(id)].is_initializer = true;
    bool data = true;
    for (int64_t st = 0; st < stages; ++st)
      data = data && g.values[static_cast<size_t>(b.blocks[blocks[static_cast<size_t>(st)]].weights[k])].data;
    if (data) {
      Tensor t(w.dtype, shape);
      const size_t bytes = static_cast<size_t>(w.nbytes());
      for (int64_t st = 0; st < stages; ++st)
        std::memcpy(
            t.bytes.data() + static_cast<size_t>(st) * bytes,
            g.values[static_cast<size_t>(b.blocks[blocks[static_cast<size_t>(st)]].weights[k])].data->bytes.data(),
            bytes);
      out.values[static_cast<size_t>(id)].data = std::make_shared<const Tensor>(std::move(t));
    }
    s.map()[b0.weights[k]] = {id, true};
  }
  for (int k : b0.nodes) s.stack(g.nodes[static_cast<size_t>(k)]);
  const Stacker::Mapped result = s.map().at(b0.output);
  if (!result.stacked) throw InputError("--pipeline: the layer's output does not depend on its input");
  out.rename(result.id, "state_out");
  out.outputs.push_back(result.id);
  return out;
}

}  // namespace gspmd
