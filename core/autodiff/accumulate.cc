// Gradient accumulation over microbatches (core/autodiff/accumulate.h).
#include "core/autodiff/accumulate.h"

#include <algorithm>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "core/ir/typing.h"

namespace gspmd {

std::string microbatch_name(const std::string& name, int64_t m) {
  return m == 0 ? name : fmt::format("{}@mb{}", name, m);
}

std::string model_name(const std::string& name) {
  const size_t at = name.rfind("@mb");
  if (at == std::string::npos || at + 3 == name.size()) return name;
  for (size_t i = at + 3; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return name;
  return name.substr(0, at);
}

namespace {

/// Appends node `op` reading `inputs` with one output named after `hint`, typed `dtype` `shape`; returns the output.
int add(Graph& s, const std::string& op, const std::vector<int>& inputs, const std::string& hint, DType dtype,
        const Shape& shape) {
  Node n;
  n.name = "accumulate/" + hint;
  n.op_type = op;
  n.inputs = inputs;
  n.outputs = {s.add_value_unique(hint, dtype, shape)};
  const int out = n.outputs[0];
  s.add_node(std::move(n));
  return out;
}

}  // namespace

AccumulatedStep accumulate_microbatches(const Graph& g, int64_t k, size_t differentiated, int loss,
                                        const std::vector<int>& grads, const std::vector<int>& data,
                                        double loss_scale) {
  const size_t end = g.nodes.size();
  // The nodes the loss and the gradients need.
  std::vector<char> needed(g.values.size(), 0), keep(end, 0);
  needed[static_cast<size_t>(loss)] = 1;
  for (int v : grads) needed[static_cast<size_t>(v)] = 1;
  for (size_t i = end; i-- > 0;) {
    const Node& n = g.nodes[i];
    if (std::none_of(n.outputs.begin(), n.outputs.end(),
                     [&](int v) { return v >= 0 && needed[static_cast<size_t>(v)]; }))
      continue;
    keep[i] = 1;
    for (int v : n.inputs)
      if (v >= 0) needed[static_cast<size_t>(v)] = 1;
  }

  AccumulatedStep out;
  Graph& s = out.graph;
  s = g;  // the values (microbatch 0's keep their ids and names), inputs, metadata; the nodes are emitted again
  s.nodes.clear();
  s.outputs.clear();
  for (Value& v : s.values) v.producer = -1;

  // Each data input as the whole batch, viewed as [b, k, ...]: microbatch m's rows are i*k + m.
  std::vector<int> batched(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const int x = data[i];
    const Value xv = g.values[static_cast<size_t>(x)];
    s.rename(x, xv.name + "@mb0");
    Shape whole = xv.shape, rows = xv.shape;
    whole[0] *= k;
    rows.insert(rows.begin() + 1, k);
    const int full = s.add_value_unique(xv.name, xv.dtype, whole);
    std::replace(s.inputs.begin(), s.inputs.end(), x, full);
    batched[i] = add(s, "Reshape", {full, add_constant(s, xv.name + "@microbatches_shape", Tensor::from_int64s(rows))},
                     xv.name + "@microbatches", xv.dtype, rows);
  }

  std::vector<int> map(g.values.size());
  std::vector<int> acc(grads.size(), -1);
  out.partial_grads.resize(grads.size());
  std::unordered_map<int, size_t> first_of;  // a gradient id -> the first index in `grads` holding it
  int total = -1;
  for (int64_t m = 0; m < k; ++m) {
    const int begin = m == 0 ? 0 : static_cast<int>(s.nodes.size());
    for (size_t v = 0; v < map.size(); ++v) map[v] = static_cast<int>(v);
    const int index =
        data.empty() ? -1 : add_constant(s, fmt::format("accumulate/index_{}", m), Tensor::from_int64s({m}, true));
    for (size_t i = 0; i < data.size(); ++i) {
      const Value& xv = g.values[static_cast<size_t>(data[i])];
      Node gather;
      gather.name = fmt::format("accumulate/{}@mb{}", xv.name, m);
      gather.op_type = "Gather";
      gather.attrs["axis"] = AttrValue(int64_t{1});
      gather.inputs = {batched[i], index};
      const int slice = m == 0 ? data[i] : s.add_value_unique(fmt::format("{}@mb{}", xv.name, m), xv.dtype, xv.shape);
      gather.outputs = {slice};
      s.add_node(std::move(gather));
      map[static_cast<size_t>(data[i])] = slice;
    }
    for (size_t i = 0; i < end; ++i) {
      if (!keep[i]) continue;
      if (i >= differentiated && out.forward_ranges.size() == static_cast<size_t>(m))
        out.forward_ranges.emplace_back(begin, static_cast<int>(s.nodes.size()));
      Node n = g.nodes[i];
      if (m > 0) {
        n.name = microbatch_name(n.name, m);
        for (int& v : n.inputs)
          if (v >= 0) v = map[static_cast<size_t>(v)];
        for (int& v : n.outputs) {
          if (v < 0) continue;
          const Value& val = g.values[static_cast<size_t>(v)];
          const int copy = s.add_value_unique(microbatch_name(val.name, m), val.dtype, val.shape);
          map[static_cast<size_t>(v)] = copy;
          v = copy;
        }
      }
      s.add_node(std::move(n));
    }
    if (out.forward_ranges.size() == static_cast<size_t>(m))  // no backward node: the forward pass is all of it
      out.forward_ranges.emplace_back(begin, static_cast<int>(s.nodes.size()));
    // Accumulate: the gradients, then the loss.
    for (size_t j = 0; j < grads.size(); ++j) {
      const size_t first = first_of.emplace(grads[j], j).first->second;
      if (first != j) continue;
      const int here = map[static_cast<size_t>(grads[j])];
      const Value& gv = g.values[static_cast<size_t>(grads[j])];
      if (m > 0) out.partial_grads[j].insert(out.partial_grads[j].end(), {acc[j], here});
      acc[j] = m == 0 ? here : add(s, "Add", {acc[j], here}, fmt::format("{}@acc{}", gv.name, m), gv.dtype, gv.shape);
    }
    const int here = map[static_cast<size_t>(loss)];
    const Value& lv = g.values[static_cast<size_t>(loss)];
    total = m == 0 ? here : add(s, "Add", {total, here}, fmt::format("loss@acc{}", m), lv.dtype, lv.shape);
  }
  for (size_t j = 0; j < grads.size(); ++j) {
    const size_t first = first_of.at(grads[j]);
    acc[j] = acc[first];
    if (first != j) out.partial_grads[j] = out.partial_grads[first];
  }
  out.grads = std::move(acc);
  const Value& lv = g.values[static_cast<size_t>(loss)];
  out.loss =
      loss_scale == 1.0
          ? total
          : add(s, "Mul",
                {total, add_constant(s, "accumulate/loss_scale", Tensor::filled(lv.dtype, lv.shape, loss_scale))},
                "loss@accumulated", lv.dtype, lv.shape);
  return out;
}

}  // namespace gspmd
