// Layer blocks vectorized over a leading stage dim (core/pipeline/vectorize.h).
#include "core/pipeline/vectorize.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/ir/name_pattern.h"
#include "core/ir/typing.h"
#include "core/pipeline/batching.h"

namespace gspmd {
BlockStacker::BlockStacker(const Graph& g, const LayerBlocks& b, Graph& out, int64_t stages,
                           const ShapeFunction& shapes, int64_t batch, int64_t microbatch)
    : g_(g), b_(b), out_(out), stages_(stages), batch_(batch), microbatch_(microbatch), shapes_(shapes) {}

void BlockStacker::share(int v, int id) { shared_[v] = {id, false, -1}; }

BlockStacker::Bound BlockStacker::lookup(int v) {
  if (auto it = local_.find(v); it != local_.end()) return it->second;
  if (auto it = shared_.find(v); it != shared_.end()) return it->second;
  // A constant of g that the block reads: copied once, shared by every stage and application.
  const Value& val = g_.values[static_cast<size_t>(v)];
  if (!val.is_initializer)
    throw InternalError(fmt::format("BlockStacker: value '{}' is neither bound nor shared", val.name));
  const int id = out_.add_value_unique(val.name, val.dtype, val.shape);
  out_.values[static_cast<size_t>(id)].is_initializer = true;
  out_.values[static_cast<size_t>(id)].data = val.data;
  return shared_[v] = {id, false, -1};
}

std::vector<int> BlockStacker::emit(const Node& like, const std::string& op, const std::vector<int>& inputs,
                                    std::map<std::string, AttrValue> attrs, size_t outputs, const std::string& name) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.inputs = inputs;
  n.attrs = std::move(attrs);
  std::vector<std::string> names;
  for (size_t k = 0; k < outputs; ++k) names.push_back(fmt::format("{}:{}", name, k));
  try {
    return add_typed_node(out_, std::move(n), names, shapes_);
  } catch (const std::exception& e) {
    throw InputError(fmt::format("--pipeline: node '{}' ({}) stacked over {} stages: {}", like.name, like.op_type,
                                 stages_, e.what()));
  }
}

int BlockStacker::constant(const std::string& name, Tensor t) { return add_constant(out_, name, std::move(t)); }

int BlockStacker::widen(const Node& like, int id, size_t rank, const std::string& tag) {
  const Shape& s = out_.values[static_cast<size_t>(id)].shape;
  if (s.size() >= rank + 1) return id;
  Shape t{s[0]};
  t.resize(rank + 1 - (s.size() - 1), 1);
  t.insert(t.end(), s.begin() + 1, s.end());
  const int shape = constant(like.name + "/stage_shape", Tensor::from_int64s(std::vector<int64_t>(t.begin(), t.end())));
  return emit(like, "Reshape", {id, shape}, {}, 1, like.name + tag + "/stage_align")[0];
}

int BlockStacker::apply(const std::map<int, Bound>& bound, const std::string& tag, std::map<int, int>* instances) {
  local_ = bound;
  const LayerBlocks::Block& b0 = b_.blocks.at(0);
  for (int k : b0.nodes) stack(g_.nodes[static_cast<size_t>(k)], tag);
  if (instances)
    for (int k : b0.nodes)
      for (int v : g_.nodes[static_cast<size_t>(k)].outputs)
        if (auto it = local_.find(v); v >= 0 && it != local_.end()) (*instances)[v] = it->second.id;
  const Bound result = lookup(b0.output);
  local_.clear();
  if (!result.stacked) throw InputError("--pipeline: the layer's output does not depend on its input");
  if (batch_ > 0 && microbatch_ != batch_ && (result.batch != 0 || result.batch_inner != 1))
    throw InputError(fmt::format("--pipeline: layer {}'s output '{}' does not lead with the batch", b0.layer,
                                 g_.values[static_cast<size_t>(b0.output)].name));
  return result.id;
}

void BlockStacker::bind(const Node& n, const std::vector<int>& ids, bool stacked, int batch, int64_t inner) {
  // A node computed from shared values only is the same in every application: later ones reuse it.
  auto& into = stacked ? local_ : shared_;
  for (size_t k = 0; k < n.outputs.size() && k < ids.size(); ++k)
    if (n.outputs[k] >= 0) into[n.outputs[k]] = {ids[k], stacked, batch, inner};
}

void BlockStacker::stack(const Node& n, const std::string& tag) {
  if (!n.outputs.empty() && n.outputs[0] >= 0 && shared_.count(n.outputs[0])) return;  // computed once already
  std::vector<Bound> in;
  bool any = false;
  for (int v : n.inputs) {
    in.push_back(v < 0 ? Bound{} : lookup(v));
    any = any || in.back().stacked;
  }
  if (!any) {  // computed from shared values only: once, for every stage
    std::vector<int> ids;
    for (const Bound& m : in) ids.push_back(m.id);
    bind(n, emit(n, n.op_type, ids, n.attrs, n.outputs.size(), n.name), false, -1, 1);
    return;
  }
  auto fail = [&](const std::string& why) {
    return InputError(fmt::format("--pipeline: node '{}' ({}): {}", n.name, n.op_type, why));
  };
  if (!n.domain.empty()) throw fail("no batching rule for a non-ONNX op");
  const Batching::Rule rule = Batching::find(n.op_type, g_.opset);
  if (!rule)
    throw fail("no batching rule over a stage dim (the ops of transformer layers and GShard's MoE are supported)");
  Batching(*this, n, tag, std::move(in)).run(rule);
}

Graph stack_blocks(const Graph& g, const LayerBlocks& b, const std::vector<size_t>& blocks,
                   const ShapeFunction& shapes) {
  const int64_t stages = static_cast<int64_t>(blocks.size());
  for (size_t k : blocks)
    if (k >= b.blocks.size()) throw std::out_of_range(fmt::format("stack_blocks: block {} of {}", k, b.blocks.size()));
  if (blocks.empty()) throw std::out_of_range("stack_blocks: no block");
  const LayerBlocks::Block& b0 = b.blocks[0];
  Graph out;
  out.name = g.name + ".stages";
  out.opset = g.opset;
  BlockStacker s(g, b, out, stages, shapes);
  std::map<int, BlockStacker::Bound> bound;
  const Value& in = g.values[static_cast<size_t>(b0.input)];
  Shape state_shape{stages};
  state_shape.insert(state_shape.end(), in.shape.begin(), in.shape.end());
  const int state = out.add_value_unique("state", in.dtype, state_shape);
  out.inputs.push_back(state);
  bound[b0.input] = {state, true};
  for (int v : b.side_inputs) {  // computed side inputs are inputs of the stacked graph
    const Value& val = g.values[static_cast<size_t>(v)];
    if (val.is_initializer) continue;
    const int id = out.add_value_unique(val.name, val.dtype, val.shape);
    out.inputs.push_back(id);
    s.share(v, id);
  }
  for (size_t k = 0; k < b0.weights.size(); ++k) {
    std::vector<int> members;
    for (size_t st : blocks) members.push_back(b.blocks[st].weights[k]);
    const Value& w = g.values[static_cast<size_t>(b0.weights[k])];
    bound[b0.weights[k]] = {stack_weights(g, out, members, {stages}, layer_key(w.name)), true};
  }
  const int y = s.apply(bound, "");
  out.rename(y, "state_out");
  out.outputs.push_back(y);
  return out;
}

int stack_weights(const Graph& g, Graph& out, const std::vector<int>& members, const Shape& lead,
                  const std::string& name) {
  const Value& w = g.values[static_cast<size_t>(members.at(0))];
  Shape shape = lead;
  shape.insert(shape.end(), w.shape.begin(), w.shape.end());
  if (num_elements(lead) != static_cast<int64_t>(members.size()))
    throw std::invalid_argument(fmt::format("stack_weights: {} members for {}", members.size(), shape_str(lead)));
  const int id = out.add_value_unique(name, w.dtype, shape);
  // Initializers stack into an initializer; graph inputs (a step's parameters) into a graph input of `out`.
  if (w.is_initializer)
    out.values[static_cast<size_t>(id)].is_initializer = true;
  else
    out.inputs.push_back(id);
  const bool data = std::all_of(members.begin(), members.end(),
                                [&](int m) { return g.values[static_cast<size_t>(m)].data != nullptr; });
  if (data) {
    Tensor t(w.dtype, shape);
    const size_t bytes = static_cast<size_t>(w.nbytes());
    for (size_t k = 0; k < members.size(); ++k)
      std::memcpy(t.bytes.data() + k * bytes, g.values[static_cast<size_t>(members[k])].data->bytes.data(), bytes);
    out.values[static_cast<size_t>(id)].data = std::make_shared<const Tensor>(std::move(t));
  }
  return id;
}

}  // namespace gspmd
