// The repeated layer blocks of a forward graph (core/pipeline/blocks.h).
#include "core/pipeline/blocks.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "core/ir/attrs.h"
#include "core/ir/cuts.h"
#include "core/ir/name_pattern.h"

namespace gspmd {
namespace {

/// A layer weight: its layer index and the key that ties it to its copies in the other layers.
struct LayerWeight {
  int64_t layer;
  std::string key;
};

/// The first whole numeric component of `name` (the layer_key separators), or nullopt.
std::optional<int64_t> first_number(const std::string& name) {
  auto is_sep = [](char c) { return c == '.' || c == '/' || c == '_' || c == ':' || c == '-'; };
  for (size_t i = 0; i < name.size();) {
    size_t j = i;
    while (j < name.size() && !is_sep(name[j])) ++j;
    if (j > i && j - i < 18 &&
        std::all_of(name.begin() + static_cast<long>(i), name.begin() + static_cast<long>(j),
                    [](char c) { return c >= '0' && c <= '9'; }))
      return std::stoll(name.substr(i, j - i));
    i = j + 1;
  }
  return std::nullopt;
}

/// Per value: 1 for an initializer, and with `variables` for a graph input too (a weight the step takes as input).
std::vector<char> weight_like_values(const Graph& g, bool variables) {
  std::vector<char> w(g.values.size(), 0);
  for (size_t v = 0; v < g.values.size(); ++v) w[v] = g.values[v].is_initializer;
  if (variables)
    for (int v : g.inputs) w[static_cast<size_t>(v)] = 1;
  return w;
}

/// Per value: its LayerWeight, for the layer weights (see find_layer_blocks).
std::vector<std::optional<LayerWeight>> layer_weights(const Graph& g, const std::string& layers,
                                                      const std::vector<char>& weight_like) {
  std::vector<std::optional<LayerWeight>> w(g.values.size());
  if (!layers.empty()) {
    const NamePattern re(layers, "--layers");
    if (re.groups() < 1)
      throw InputError(fmt::format("--layers: '{}' has no capture group for the layer index", layers));
    for (size_t v = 0; v < g.values.size(); ++v) {
      const Value& val = g.values[v];
      if (!weight_like[v]) continue;
      const std::optional<std::pair<size_t, size_t>> m = re.search_group1(val.name);
      if (!m) continue;
      const std::string captured = val.name.substr(m->first, m->second - m->first);
      int64_t index = 0;
      try {
        index = std::stoll(captured);
      } catch (const std::exception&) {
        throw InputError(
            fmt::format("--layers: '{}' captures '{}' in '{}', not a layer number", layers, captured, val.name));
      }
      w[v] = LayerWeight{index, val.name.substr(0, m->first) + "#" + val.name.substr(m->second)};
    }
    return w;
  }
  // By name: per layer_key the layer indices that carry it; the layers are the index set most keys share.
  // Float initializers of more than one element, as --training's default trainable set: a per-layer scalar (a
  // folded Constant like /h.3/attn/Constant_output_0) is a constant that every layer must have equal.
  auto candidate = [&](size_t v) {
    const Value& val = g.values[v];
    return weight_like[v] && is_floating(val.dtype) && num_elements(val.shape) > 1;
  };
  std::map<std::string, std::set<int64_t>> indices;
  for (size_t v = 0; v < g.values.size(); ++v)
    if (candidate(v))
      if (auto n = first_number(g.values[v].name)) indices[layer_key(g.values[v].name)].insert(*n);
  std::map<std::set<int64_t>, int> sets;
  for (const auto& [key, s] : indices)
    if (s.size() >= 2) ++sets[s];
  const std::set<int64_t>* best = nullptr;
  int most = 0;
  for (const auto& [s, count] : sets)
    if (count > most) best = &s, most = count;
  if (!best) return w;
  // Keys that only some of those layers carry are layer weights too (GShard alternates dense and MoE layers: the MLP's
  // keys are on the even layers, the experts' on the odd ones); find_layer_blocks then groups the layers by period.
  auto within_best = [&](const std::set<int64_t>& s) {
    return s.size() >= 2 && std::includes(best->begin(), best->end(), s.begin(), s.end());
  };
  for (size_t v = 0; v < g.values.size(); ++v) {
    const Value& val = g.values[v];
    if (!candidate(v)) continue;
    const auto n = first_number(val.name);
    const std::string key = layer_key(val.name);
    if (n && within_best(indices[key])) w[v] = LayerWeight{*n, key};
  }
  return w;
}

/// Two values of two layers hold the same constant: equal data, or (loaded shapes-only) two initializers of one type
/// without data. Two graph inputs are two tensors: the caller binds them as side inputs or layer weights.
bool same_tensor(const Value& a, const Value& b) {
  if (a.dtype != b.dtype || a.shape != b.shape || !a.is_initializer || !b.is_initializer) return false;
  if (!a.data || !b.data) return !a.data && !b.data;
  return a.data->bytes == b.data->bytes;
}

/// find_layer_blocks in its phases: the sweep over the segments between cut points (one block per layer index), the
/// grouping of those into blocks of `period` layers, the hoisting of values the blocks share, each block's stream
/// output, and the node-by-node match of every block against block 0.
class BlockFinder {
 public:
  BlockFinder(const Graph& g, const std::string& layers, bool variables)
      : g_(g),
        nn_(g.nodes.size()),
        weight_like_(weight_like_values(g, variables)),
        lw_(layer_weights(g, layers, weight_like_)),
        dep_(g.values.size(), 0),
        computes_from_layers_(nn_, 0),
        reads_(nn_),
        last_(g.values.size(), -1),
        readers_(g.consumers()) {
    for (size_t k = 0; k < nn_; ++k) {
      for (int v : g.nodes[k].inputs) {
        if (v < 0) continue;
        if (lw_[static_cast<size_t>(v)]) reads_[k].insert(lw_[static_cast<size_t>(v)]->layer);
        computes_from_layers_[k] |= dep_[static_cast<size_t>(v)] || lw_[static_cast<size_t>(v)];
      }
      for (int v : g.nodes[k].outputs)
        if (v >= 0) dep_[static_cast<size_t>(v)] = computes_from_layers_[k];
    }
    for (size_t k = 0; k < nn_; ++k)
      for (int v : g.nodes[k].inputs)
        if (v >= 0) last_[static_cast<size_t>(v)] = static_cast<int>(k);
    for (int v : g.outputs) last_[static_cast<size_t>(v)] = static_cast<int>(nn_);
    cut_ = cut_points(
        g, nn_, [&](int v) { return dep_[static_cast<size_t>(v)] != 0; }, true);
    sweep();
  }

  /// One layer per block, else the shortest period over which the layers' weight keys repeat.
  LayerBlocks find() const {
    const size_t n = by_layer_.blocks.size();
    std::map<int64_t, std::set<std::string>> keys;  // per layer: its weights' keys
    for (size_t v = 0; v < g_.values.size(); ++v)
      if (lw_[v]) keys[lw_[v]->layer].insert(lw_[v]->key);
    auto keys_repeat = [&](size_t period) {
      for (size_t i = period; i < n; ++i)
        if (keys[by_layer_.blocks[i].layer] != keys[by_layer_.blocks[i - period].layer]) return false;
      return true;
    };
    try {
      return assemble(1);
    } catch (const InputError&) {
      if (keys_repeat(1)) throw;  // the layers are alike by their weights: grouping them changes nothing
      for (size_t period = 2; period <= n / 2; ++period) {
        if (n % period != 0 || !keys_repeat(period)) continue;
        try {
          return assemble(period);
        } catch (const InputError&) {
        }
      }
      throw;  // the one-layer blocks' error
    }
  }

 private:
  std::string node_name(size_t k) const { return fmt::format("'{}' ({})", g_.nodes[k].name, g_.nodes[k].op_type); }

  /// The segments between cuts, each owned by the one layer whose weights it reads (or none), into by_layer_ (one
  /// block per layer index) and after_ (the nodes after the last block that read no layer weights).
  void sweep() {
    LayerBlocks& out = by_layer_;
    std::vector<int>& tail = after_;
    std::map<int64_t, size_t> block_of_layer;
    size_t begin = 0;
    std::set<int64_t> seg_layers;
    auto close_segment = [&](size_t end) {  // nodes [begin, end]
      if (seg_layers.size() > 1)
        throw InputError(
            fmt::format("--pipeline: nodes {} .. {} read the weights of layers {} and {}: they cannot be "
                        "split into layer blocks (name the layers' weights with --layers REGEX)",
                        node_name(begin), node_name(end), *seg_layers.begin(), *seg_layers.rbegin()));
      // A segment that reads no layer weights belongs to the block before it (the end of a layer: its reshapes and
      // residual adds), or to the prefix before the first block; after the last block it is held back (`tail`) until
      // the end decides how much of it is that block's.
      std::vector<int>* into = nullptr;
      if (seg_layers.empty()) {
        into = out.blocks.empty() ? &out.prefix : &tail;
      } else {
        const int64_t layer = *seg_layers.begin();
        if (!out.blocks.empty()) {
          out.blocks.back().nodes.insert(out.blocks.back().nodes.end(), tail.begin(), tail.end());
          tail.clear();
        }
        if (out.blocks.empty() || out.blocks.back().layer != layer) {
          if (block_of_layer.count(layer))
            throw InputError(fmt::format("--pipeline: node {} reads layer {}'s weights after layer {}'s",
                                         node_name(end), layer, out.blocks.back().layer));
          // A new layer starts at its first node that reads a layer weight or a value computed from one; the nodes
          // before it (the embedding before layer 0) end the previous block, or are the prefix.
          std::vector<int>& before = out.blocks.empty() ? out.prefix : out.blocks.back().nodes;
          for (; begin <= end && !computes_from_layers_[begin]; ++begin) before.push_back(static_cast<int>(begin));
          block_of_layer[layer] = out.blocks.size();
          out.blocks.emplace_back().layer = layer;
        }
        into = &out.blocks.back().nodes;
      }
      for (size_t k = begin; k <= end; ++k) into->push_back(static_cast<int>(k));
      seg_layers.clear();
      begin = end + 1;
    };
    for (size_t k = 0; k < nn_; ++k) {
      seg_layers.insert(reads_[k].begin(), reads_[k].end());
      if (cut_[k] || k + 1 == nn_) close_segment(k);
    }
  }

  /// The blocks of `period` consecutive layers each (GShard's dense and MoE layers alternate: period 2), made alike.
  LayerBlocks assemble(size_t period) const {
    LayerBlocks out = group(period);
    hoist_shared(out);
    find_outputs(out);
    match_blocks(out);
    return out;
  }

  /// by_layer_'s blocks grouped `period` at a time; after_'s nodes split between the last block and the suffix.
  LayerBlocks group(size_t period) const {
    LayerBlocks out;
    out.prefix = by_layer_.prefix;
    for (size_t i = 0; i < by_layer_.blocks.size(); i += period) {
      LayerBlocks::Block& blk = out.blocks.emplace_back();
      blk.layer = by_layer_.blocks[i].layer;
      blk.layers = period;
      for (size_t j = i; j < i + period; ++j)
        blk.nodes.insert(blk.nodes.end(), by_layer_.blocks[j].nodes.begin(), by_layer_.blocks[j].nodes.end());
    }
    const std::vector<int>& tail = after_;
    // After the last block: as many nodes as make it block 0's size are its own (its residual add), the rest the
    // suffix (the final norm and the head); match_blocks checks the split.
    if (!out.blocks.empty()) {
      const size_t own = out.blocks.size() < 2 || out.blocks[0].nodes.size() < out.blocks.back().nodes.size()
                             ? 0
                             : std::min(tail.size(), out.blocks[0].nodes.size() - out.blocks.back().nodes.size());
      out.blocks.back().nodes.insert(out.blocks.back().nodes.end(), tail.begin(),
                                     tail.begin() + static_cast<long>(own));
      out.suffix.assign(tail.begin() + static_cast<long>(own), tail.end());
    }
    if (out.blocks.size() < 2)
      throw InputError(
          fmt::format("--pipeline: the model has {} layer block{} (layers are found by the whole numbers "
                      "in the weights' names, or by --layers REGEX): nothing to pipeline",
                      out.blocks.size(), out.blocks.size() == 1 ? "" : "s"));
    return out;
  }

  /// Per node: the index of its block in `out`, or -1.
  std::vector<int> block_of(const LayerBlocks& out) const {
    std::vector<int> of(nn_, -1);
    for (size_t b = 0; b < out.blocks.size(); ++b)
      for (int k : out.blocks[b].nodes) of[static_cast<size_t>(k)] = static_cast<int>(b);
    return of;
  }

  /// Nodes in a block that compute, from no layer weight, values other blocks read too (an attention mask made from
  /// the input) are computed once before the pipeline: they and what they are computed from move to the prefix.
  void hoist_shared(LayerBlocks& out) const {
    const std::vector<int> block = block_of(out);
    std::vector<char> hoist(nn_, 0);
    std::vector<int> work;
    for (size_t k = 0; k < nn_; ++k) {
      if (block[k] < 0 || computes_from_layers_[k]) continue;
      for (int v : g_.nodes[k].outputs) {
        if (v < 0) continue;
        for (int c : readers_[static_cast<size_t>(v)])
          if (block[static_cast<size_t>(c)] != block[k] && !hoist[k]) {
            hoist[k] = 1;
            work.push_back(static_cast<int>(k));
          }
      }
    }
    while (!work.empty()) {  // and the block nodes they read from
      const int k = work.back();
      work.pop_back();
      for (int v : g_.nodes[static_cast<size_t>(k)].inputs) {
        const int p = v >= 0 ? g_.values[static_cast<size_t>(v)].producer : -1;
        if (p >= 0 && block[static_cast<size_t>(p)] >= 0 && !hoist[static_cast<size_t>(p)]) {
          if (computes_from_layers_[static_cast<size_t>(p)])
            throw InputError(fmt::format("--pipeline: node {} is shared by layers but computed from layer {}'s weights",
                                         node_name(static_cast<size_t>(k)),
                                         out.blocks[static_cast<size_t>(block[static_cast<size_t>(p)])].layer));
          hoist[static_cast<size_t>(p)] = 1;
          work.push_back(p);
        }
      }
    }
    for (LayerBlocks::Block& blk : out.blocks)
      std::erase_if(blk.nodes, [&](int k) { return hoist[static_cast<size_t>(k)] != 0; });
    // Before the first block: as many of the prefix's last nodes as make it block 1's size are block 0's own (a
    // layer that starts by transposing its input or multiplying it by an unnamed weight reads no named layer weight
    // there, which the later layers' first nodes do through the stream); match_blocks checks the split.
    std::vector<int>& b0n = out.blocks[0].nodes;
    const size_t own = b0n.size() < out.blocks[1].nodes.size()
                           ? std::min(out.prefix.size(), out.blocks[1].nodes.size() - b0n.size())
                           : 0;
    b0n.insert(b0n.begin(), out.prefix.end() - static_cast<long>(own), out.prefix.end());
    out.prefix.resize(out.prefix.size() - own);
    for (size_t k = 0; k < nn_; ++k)
      if (hoist[k]) out.prefix.push_back(static_cast<int>(k));
    std::sort(out.prefix.begin(), out.prefix.end());
  }

  /// Each block's stream output: the one value it makes that a later node (or the graph's output) reads.
  void find_outputs(LayerBlocks& out) const {
    for (LayerBlocks::Block& blk : out.blocks)
      for (int k : blk.nodes)
        for (int v : g_.nodes[static_cast<size_t>(k)].outputs) {
          if (v < 0 || last_[static_cast<size_t>(v)] <= blk.nodes.back()) continue;
          if (!dep_[static_cast<size_t>(v)])
            throw InputError(
                fmt::format("--pipeline: layer {}'s node {} computes '{}' for later layers: shared "
                            "values must be computed before the first layer",
                            blk.layer, node_name(static_cast<size_t>(k)), g_.values[static_cast<size_t>(v)].name));
          if (blk.output >= 0 && blk.output != v)
            throw InputError(fmt::format("--pipeline: layer {} passes two values on, '{}' and '{}'", blk.layer,
                                         g_.values[static_cast<size_t>(blk.output)].name,
                                         g_.values[static_cast<size_t>(v)].name));
          blk.output = v;
        }
  }

  /// A node's values by (node position in its block, output index).
  using Positions = std::map<int, std::pair<size_t, size_t>>;

  /// Block i against block 0, node by node: the same op, attributes and wiring (match_block); sets the blocks'
  /// stream inputs, weights and the side inputs.
  void match_blocks(LayerBlocks& out) const {
    const LayerBlocks::Block& b0 = out.blocks[0];
    const std::vector<int> block = block_of(out);
    Positions pos0;
    for (size_t p = 0; p < b0.nodes.size(); ++p)
      for (size_t o = 0; o < g_.nodes[static_cast<size_t>(b0.nodes[p])].outputs.size(); ++o)
        pos0[g_.nodes[static_cast<size_t>(b0.nodes[p])].outputs[o]] = {p, o};
    std::set<int> side_seen;
    for (size_t b = 1; b < out.blocks.size(); ++b) match_block(out, b, block, pos0, side_seen);
    if (out.blocks[0].input < 0)
      throw InputError(fmt::format("--pipeline: layer {} reads no stream value", out.blocks[0].layer));
  }

  /// Block `b` against block 0. An operand is internal (the same node position and output), the stream (block 0: the
  /// value at the positions where block 1 reads block 0's output; block i > 0: block i-1's output), a layer weight
  /// (the same key, type and shape), or a side input (the same value, or an equal constant).
  void match_block(LayerBlocks& out, size_t b, const std::vector<int>& block, Positions& pos0,
                   std::set<int>& side_seen) const {
    const LayerBlocks::Block& b0 = out.blocks[0];
    LayerBlocks::Block& bi = out.blocks[b];
    auto differ = [&](size_t p, const std::string& why) {
      const size_t at = p < bi.nodes.size() ? static_cast<size_t>(bi.nodes[p]) : static_cast<size_t>(bi.nodes.back());
      return InputError(fmt::format("--pipeline: layer {} differs from layer {} at node {}: {}", bi.layer, b0.layer,
                                    node_name(at), why));
    };
    if (bi.nodes.size() != b0.nodes.size())
      throw differ(0, fmt::format("{} nodes against {}", bi.nodes.size(), b0.nodes.size()));
    Positions posi;
    for (size_t p = 0; p < bi.nodes.size(); ++p) {
      const Node& n0 = g_.nodes[static_cast<size_t>(b0.nodes[p])];
      const Node& ni = g_.nodes[static_cast<size_t>(bi.nodes[p])];
      if (ni.op_type != n0.op_type || ni.domain != n0.domain)
        throw differ(p, fmt::format("{} where layer {} has {}", ni.op_type, b0.layer, n0.op_type));
      if (ni.has_body()) throw differ(p, "control flow in a layer block is not supported");
      if (!attrs_equal(ni.attrs, n0.attrs)) throw differ(p, "other attributes");
      if (ni.inputs.size() != n0.inputs.size() || ni.outputs.size() != n0.outputs.size())
        throw differ(p, "another number of inputs or outputs");
      for (size_t i = 0; i < ni.inputs.size(); ++i) {
        const int v0 = n0.inputs[i], vi = ni.inputs[i];
        if ((v0 < 0) != (vi < 0)) throw differ(p, fmt::format("input {} is present in one layer only", i));
        if (v0 < 0) continue;
        const std::string why = match_input(out, b, block, v0, vi, pos0, posi, side_seen);
        if (!why.empty())
          throw differ(p, fmt::format("input {} ('{}' against '{}'){}", i, g_.values[static_cast<size_t>(vi)].name,
                                      g_.values[static_cast<size_t>(v0)].name, why));
      }
      for (size_t o = 0; o < ni.outputs.size(); ++o) {
        const int v0 = n0.outputs[o], vi = ni.outputs[o];
        if ((v0 < 0) != (vi < 0)) throw differ(p, fmt::format("output {} is present in one layer only", o));
        if (v0 < 0) continue;
        const Value &y0 = g_.values[static_cast<size_t>(v0)], &yi = g_.values[static_cast<size_t>(vi)];
        if (y0.dtype != yi.dtype || y0.shape != yi.shape)
          throw differ(p, fmt::format("output {} is {}, layer {}'s {}", o, type_str(yi.dtype, yi.shape), b0.layer,
                                      type_str(y0.dtype, y0.shape)));
        posi[vi] = {p, o};
      }
    }
    if (bi.input < 0)
      throw InputError(fmt::format("--pipeline: layer {} does not read layer {}'s output '{}'", bi.layer,
                                   out.blocks[b - 1].layer,
                                   g_.values[static_cast<size_t>(out.blocks[b - 1].output)].name));
    if (pos0.count(b0.output) == 0 || posi.count(bi.output) == 0 || pos0[b0.output] != posi[bi.output])
      throw differ(bi.nodes.size() - 1,
                   "its output is not the same node's as layer " + std::to_string(b0.layer) + "'s");
  }

  /// Operand `vi` of block `b` against block 0's `v0` at the same place: records a stream input, a weight or a side
  /// input, and returns "" when they match, else why not (appended to "input I ('x' against 'y')").
  std::string match_input(LayerBlocks& out, size_t b, const std::vector<int>& block, int v0, int vi,
                          const Positions& pos0, const Positions& posi, std::set<int>& side_seen) const {
    LayerBlocks::Block& b0 = out.blocks[0];
    LayerBlocks::Block& bi = out.blocks[b];
    const Value &x0 = g_.values[static_cast<size_t>(v0)], &xi = g_.values[static_cast<size_t>(vi)];
    // An unnamed layer weight (torch exports a Linear's transposed weight as "onnx::MatMul_285"): a float initializer
    // that only block c's nodes read.
    auto owned_weight = [&](int v, size_t c) {
      const Value& x = g_.values[static_cast<size_t>(v)];
      if (!weight_like_[static_cast<size_t>(v)] || !is_floating(x.dtype) || readers_[static_cast<size_t>(v)].empty())
        return false;
      return std::all_of(readers_[static_cast<size_t>(v)].begin(), readers_[static_cast<size_t>(v)].end(),
                         [&](int k) { return block[static_cast<size_t>(k)] == static_cast<int>(c); });
    };
    auto add_weights = [&] {
      if (b == 1 && std::find(b0.weights.begin(), b0.weights.end(), v0) == b0.weights.end()) b0.weights.push_back(v0);
      if (std::find(bi.weights.begin(), bi.weights.end(), vi) == bi.weights.end()) bi.weights.push_back(vi);
    };
    if (auto it = pos0.find(v0); it != pos0.end()) {
      auto jt = posi.find(vi);
      if (jt == posi.end() || jt->second != it->second) return " is wired differently";
    } else if (vi == bi.input || (bi.input < 0 && vi == out.blocks[b - 1].output)) {
      if (b == 1) {
        if (b0.input >= 0 && b0.input != v0) return ": layer " + std::to_string(b0.layer) + " reads two stream values";
        b0.input = v0;
      } else if (v0 != b0.input) {
        return " is wired differently";
      }
      bi.input = vi;
    } else if (lw_[static_cast<size_t>(v0)] || lw_[static_cast<size_t>(vi)]) {
      if (!lw_[static_cast<size_t>(v0)] || !lw_[static_cast<size_t>(vi)] ||
          lw_[static_cast<size_t>(v0)]->key != lw_[static_cast<size_t>(vi)]->key || x0.dtype != xi.dtype ||
          x0.shape != xi.shape)
        return " are not the same weight of two layers";
      add_weights();
    } else if (v0 == vi || same_tensor(x0, xi)) {
      if (b == 1 && v0 == vi && side_seen.insert(v0).second) out.side_inputs.push_back(v0);
    } else if (x0.dtype == xi.dtype && x0.shape == xi.shape && owned_weight(v0, 0) && owned_weight(vi, b)) {
      add_weights();
    } else {
      return " differ";
    }
    return "";
  }

  const Graph& g_;
  const size_t nn_;
  const std::vector<char> weight_like_;
  const std::vector<std::optional<LayerWeight>> lw_;
  std::vector<char> dep_;                   // per value: computed from a layer weight
  std::vector<char> computes_from_layers_;  // per node: reads a layer weight or a value computed from one
  std::vector<std::set<int64_t>> reads_;    // per node: the layers whose weights it reads
  std::vector<int> last_;                   // per value: its last reader (nn_: a graph output)
  const std::vector<std::vector<int>> readers_;
  std::vector<char> cut_;   // per node: a cut point over dep_ (core/ir/cuts.h, as --remat full's)
  LayerBlocks by_layer_;    // sweep(): one block per layer index
  std::vector<int> after_;  // sweep(): the nodes after the last block that read no layer weights
};

}  // namespace

LayerBlocks find_layer_blocks(const Graph& g, const std::string& layers, bool variables) {
  return BlockFinder(g, layers, variables).find();
}

bool layer_weights_are_inputs(const Graph& g, const std::string& layers) {
  auto any = [](const std::vector<std::optional<LayerWeight>>& w) {
    return std::any_of(w.begin(), w.end(), [](const std::optional<LayerWeight>& x) { return x.has_value(); });
  };
  return !any(layer_weights(g, layers, weight_like_values(g, false))) &&
         any(layer_weights(g, layers, weight_like_values(g, true)));
}

Graph keep_first_layers(const Graph& g, const LayerBlocks& b, size_t k) {
  if (k < 1 || k > b.blocks.size())
    throw std::invalid_argument(fmt::format("keep_first_layers: {} of {} blocks", k, b.blocks.size()));
  Graph out = g;
  if (k == b.blocks.size()) return out;
  const int last = b.blocks.back().output, kept = b.blocks[k - 1].output;
  for (int n : b.suffix)
    for (int& v : out.nodes[static_cast<size_t>(n)].inputs)
      if (v == last) v = kept;
  for (int& v : out.outputs)
    if (v == last) v = kept;
  // Graph inputs that only the dropped blocks read (their weights, when the step takes them as arguments) go too.
  std::vector<char> read_by_dropped(g.values.size(), 0), read_by_kept(g.values.size(), 0);
  std::vector<char> dropped(g.nodes.size(), 0);
  for (size_t i = k; i < b.blocks.size(); ++i)
    for (int n : b.blocks[i].nodes) dropped[static_cast<size_t>(n)] = 1;
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (int v : g.nodes[n].inputs)
      if (v >= 0) (dropped[n] ? read_by_dropped : read_by_kept)[static_cast<size_t>(v)] = 1;
  for (int v : out.outputs) read_by_kept[static_cast<size_t>(v)] = 1;
  std::erase_if(out.inputs, [&](int v) {
    return read_by_dropped[static_cast<size_t>(v)] && !read_by_kept[static_cast<size_t>(v)];
  });
  out.prune();
  return out;
}

}  // namespace gspmd
