// Pipeline parallelism the GSPMD way (core/pipeline/schedule.h).
#include "core/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/ir/shift_op.h"
#include "core/ir/typing.h"
#include "core/pipeline/blocks.h"
#include "core/pipeline/vectorize.h"

namespace gspmd {

const char* schedule_name(PipelineSchedule s) { return s == PipelineSchedule::kGpipe ? "gpipe" : "circular"; }

int64_t PipelineLayout::microbatch_at(int64_t t, int64_t s) const {
  const int64_t RS = rounds * stages, j = t - s;  // j: when the item entered stage 0 of its current round
  if (j < 0 || t >= iterations) return -1;
  const int64_t t0 = j - (j % RS) / stages * stages;  // when it entered stage 0 in round 0
  const int64_t m = t0 / RS * stages + t0 % RS;
  return m < microbatches ? m : -1;
}

int64_t PipelineLayout::layer_at(int64_t t, int64_t s, int64_t k) const {
  const int64_t RS = rounds * stages, r = (((t - s) % RS) + RS) % RS / stages;
  return stage_layers.at(static_cast<size_t>(s)).at(static_cast<size_t>(r * slots + k));
}

std::string PipelineLayout::block_name(int64_t layer) const {
  if (layer < 0) return "padding";
  return layers_per_block > 1 ? fmt::format("{}-{}", layer, layer + layers_per_block - 1) : std::to_string(layer);
}

namespace {

/// `name` (a weight of one of the `layers` layers from `layer` on that a block holds) with the component that holds
/// its layer index as '#', or '#+k' for the block's k-th layer: h.0.ln_1.weight -> h.#.ln_1.weight, in a block of
/// layers 0 and 1 h.1.moe.wi -> h.#+1.moe.wi. `name`@stacked when no component is such an index (an unnamed weight,
/// onnx::MatMul_285), so that no stacked weight takes a layer weight's name.
std::string stacked_name(const std::string& name, int64_t layer, int64_t layers) {
  auto is_sep = [](char c) { return c == '.' || c == '/' || c == '_' || c == ':' || c == '-'; };
  for (int64_t k = 0; k < layers; ++k) {
    const std::string index = std::to_string(layer + k);
    for (size_t i = 0; i < name.size();) {
      size_t j = i;
      while (j < name.size() && !is_sep(name[j])) ++j;
      if (j - i == index.size() && name.compare(i, j - i, index) == 0)
        return name.substr(0, i) + (k ? fmt::format("#+{}", k) : "#") + name.substr(j);
      i = j + 1;
    }
  }
  return name + "@stacked";
}

/// Emits the pipelined graph: the original's prefix and suffix copied, the unrolled loop in between.
class Builder {
  using LayoutWeight = PipelineLayout::StackedWeight;

 public:
  Builder(const Graph& g, const LayerBlocks& b, const PipelineOptions& o, const ShapeFunction& shapes,
          PipelinedGraph& r)
      : g_(g), b_(b), o_(o), shapes_(shapes), out_(r.graph), lay_(r.layout) {
    out_.name = g.name;
    out_.opset = g.opset;
  }

  void build() {
    plan();
    // Layer weights that are graph inputs give way to their stacked inputs (stack_weights): only the blocks read them.
    std::set<int> stacked_inputs;
    for (const auto& blk : b_.blocks)
      for (int w : blk.weights)
        if (!g_.values[static_cast<size_t>(w)].is_initializer) stacked_inputs.insert(w);
    for (int v : g_.inputs)
      if (!stacked_inputs.count(v)) out_.inputs.push_back(copy(v));
    in_block_.assign(g_.values.size(), 0);
    for (const auto& blk : b_.blocks)
      for (int n : blk.nodes)
        for (int v : g_.nodes[static_cast<size_t>(n)].outputs)
          if (v >= 0) in_block_[static_cast<size_t>(v)] = 1;
    for (int n : b_.prefix) copy_node(n);
    run_loop();
    for (int n : b_.suffix) copy_node(n);
    for (int v : g_.outputs) {
      if (in_block_[static_cast<size_t>(v)] && v != b_.blocks.back().output)
        throw InputError(fmt::format("--pipeline: graph output '{}' is computed inside layer block {}",
                                     g_.values[static_cast<size_t>(v)].name, b_.blocks.front().layer));
      out_.outputs.push_back(copy(v));
    }
    // Every layer's values and constants to block 0's at the same place (the blocks are alike node by node).
    const LayerBlocks::Block& b0 = b_.blocks[0];
    auto same_place = [&](int v, int v0) {
      lay_.block_values[g_.values[static_cast<size_t>(v)].name] = g_.values[static_cast<size_t>(v0)].name;
    };
    for (const LayerBlocks::Block& blk : b_.blocks) {
      const std::set<int> weights(blk.weights.begin(), blk.weights.end());
      for (size_t p = 0; p < blk.nodes.size(); ++p) {
        const Node &n = g_.nodes[static_cast<size_t>(blk.nodes[p])], &n0 = g_.nodes[static_cast<size_t>(b0.nodes[p])];
        for (size_t o = 0; o < n.outputs.size(); ++o)
          if (n.outputs[o] >= 0 && n.outputs[o] != b_.blocks.back().output) same_place(n.outputs[o], n0.outputs[o]);
        for (size_t i = 0; i < n.inputs.size(); ++i)
          if (const int v = n.inputs[i];
              v >= 0 && g_.values[static_cast<size_t>(v)].is_initializer && !weights.count(v))
            same_place(v, n0.inputs[i]);
      }
    }
  }

 private:
  // ---- the schedule ----------------------------------------------------------------------------------------
  void plan() {
    const int64_t L = static_cast<int64_t>(b_.blocks.size()), S = o_.stages, M = o_.microbatches;
    if (S < 2) throw InputError(fmt::format("--pipeline: {} stage(s): a pipeline needs an axis of at least 2", S));
    if (M < 1) throw InputError(fmt::format("--microbatches: {} is not a positive count", M));
    const Value& stream = g_.values[static_cast<size_t>(b_.blocks[0].input)];
    if (stream.shape.empty()) throw InputError(fmt::format("--pipeline: the stream '{}' is a scalar", stream.name));
    const int64_t B = stream.shape[0];
    if (B % M != 0)
      throw InputError(
          fmt::format("--microbatches: the batch {} (dim 0 of '{}', the stream entering layer {}) does "
                      "not divide into {} microbatches",
                      B, stream.name, b_.blocks[0].layer, M));
    lay_.schedule = o_.schedule;
    lay_.stages = S;
    lay_.microbatches = M;
    lay_.layers = L;
    lay_.layers_per_block = static_cast<int64_t>(b_.blocks[0].layers);
    lay_.batch = B;
    lay_.microbatch = B / M;
    lay_.stream = stream.name;
    const bool circular = o_.schedule == PipelineSchedule::kCircular;
    lay_.rounds = circular ? (L + S - 1) / S : 1;
    lay_.slots = circular ? 1 : (L + S - 1) / S;
    lay_.padded = S * lay_.rounds * lay_.slots - L;
    const int64_t RS = lay_.rounds * S;
    for (int64_t m = 0; m < M; ++m) {
      const int64_t t0 = (m / S) * RS + m % S;
      enter_[t0] = m;
      exit_[t0 + RS] = m;
      lay_.iterations = std::max(lay_.iterations, t0 + RS);
    }
    lay_.bubble = 1.0 - static_cast<double>(M * L) / static_cast<double>(lay_.iterations * lay_.slots * S);
    lay_.stage_layers.assign(static_cast<size_t>(S), {});
    for (int64_t r = 0; r < lay_.rounds; ++r)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t k = 0; k < lay_.slots; ++k) {
          const int64_t p = position(r, s, k);
          lay_.stage_layers[static_cast<size_t>(s)].push_back(p < L ? b_.blocks[static_cast<size_t>(p)].layer : -1);
        }
    lay_.prefix_nodes = static_cast<int64_t>(b_.prefix.size());
    lay_.suffix_nodes = static_cast<int64_t>(b_.suffix.size());
  }

  /// The layer position (index into the blocks; >= L for padding) of round r, stage s, slot k.
  int64_t position(int64_t r, int64_t s, int64_t k) const {
    return o_.schedule == PipelineSchedule::kCircular ? r * lay_.stages + s : s * lay_.slots + k;
  }
  /// The round stage s runs in iteration t (circular; 0 for GPipe).
  int64_t round(int64_t t, int64_t s) const {
    const int64_t RS = lay_.rounds * lay_.stages;
    return (((t - s) % RS) + RS) % RS / lay_.stages;
  }

  // ---- values and nodes of the original ------------------------------------------------------------------------
  /// The pipelined graph's copy of value v of g (same name, type and data).
  int copy(int v) {
    auto it = map_.find(v);
    if (it != map_.end()) return it->second;
    const Value& val = g_.values[static_cast<size_t>(v)];
    Value c;
    c.name = val.name;
    c.kind = val.kind;
    c.dtype = val.dtype;
    c.shape = val.shape;
    c.is_initializer = val.is_initializer;
    c.data = val.data;
    return map_[v] = out_.add_value(std::move(c));
  }

  void copy_node(int n) {
    Node c = g_.nodes[static_cast<size_t>(n)];
    for (int& v : c.inputs)
      if (v >= 0) v = copy(v);
    for (int& v : c.outputs)
      if (v >= 0) v = copy(v);
    out_.add_node(std::move(c));
  }

  // ---- new nodes -------------------------------------------------------------------------------------------------
  std::vector<int> emit(const std::string& domain, const std::string& op, const std::vector<int>& inputs,
                        std::map<std::string, AttrValue> attrs, const std::vector<std::string>& outputs,
                        const std::string& name) {
    Node n;
    n.name = name;
    n.domain = domain;
    n.op_type = op;
    n.inputs = inputs;
    n.attrs = std::move(attrs);
    try {
      return add_typed_node(out_, std::move(n), outputs, shapes_);
    } catch (const std::exception& e) {
      throw InternalError(fmt::format("pipeline_graph: node '{}' ({}): {}", name, op, e.what()));
    }
  }
  int op(const std::string& op, const std::vector<int>& inputs, const std::string& name,
         std::map<std::string, AttrValue> attrs = {}) {
    return emit("", op, inputs, std::move(attrs), {name}, name)[0];
  }
  int constant(const std::string& name, Tensor t) { return add_constant(out_, name, std::move(t)); }
  int ints(const std::string& name, const std::vector<int64_t>& v) { return constant(name, Tensor::from_int64s(v)); }
  int reshape(int v, Shape s, const std::string& name) {
    return op("Reshape", {v, ints(name + "/shape", std::vector<int64_t>(s.begin(), s.end()))}, name);
  }

  /// `s` with its dim `dim` (the batch) the microbatch, and a leading dim `lead`.
  Shape microbatch_shape(const Shape& s, size_t dim, int64_t lead) const {
    Shape r{lead};
    r.insert(r.end(), s.begin(), s.end());
    r[dim + 1] = lay_.microbatch;
    return r;
  }

  /// Per microbatch, a row [1, ..., mb, ...] of `v` (a value of the pipelined graph whose dim `dim` is the batch).
  /// Microbatch m holds the batch rows i*M + m (strided: a batch split over a data axis stays split over it in every
  /// microbatch).
  std::vector<int> microbatches(int v, size_t dim, const std::string& name) {
    const Shape s = out_.values[static_cast<size_t>(v)].shape;
    const int64_t M = lay_.microbatches, mb = lay_.microbatch;
    const Shape row = microbatch_shape(s, dim, 1);
    if (M == 1) {
      const int r = reshape(v, row, name + "/mb0");
      lay_.carried_values.push_back(out_.values[static_cast<size_t>(r)].name);
      return {r};
    }
    Shape split = s;  // the batch dim as [mb, M]
    split[dim] = mb;
    split.insert(split.begin() + static_cast<long>(dim) + 1, M);
    const int r = reshape(v, split, name + "/microbatches");
    std::vector<int> out;
    for (int64_t m = 0; m < M; ++m) {
      Tensor idx(DType::kInt64, {});
      idx.data<int64_t>()[0] = m;
      const int one = op("Gather", {r, constant(fmt::format("{}/m{}", name, m), std::move(idx))},
                         fmt::format("{}/mb{}", name, m), {{"axis", static_cast<int64_t>(dim) + 1}});
      out.push_back(reshape(one, row, fmt::format("{}/mb{}_row", name, m)));
    }
    for (int v : out) lay_.carried_values.push_back(out_.values[static_cast<size_t>(v)].name);
    return out;
  }

  /// The microbatch rows [1, mb, ...] (in microbatch order) back as [B, ...].
  int unmicrobatch(const std::vector<int>& rows, const Shape& full, const std::string& name) {
    const int64_t M = lay_.microbatches, mb = lay_.microbatch;
    if (M == 1) return reshape(rows[0], full, name);
    Shape col{mb, 1};
    col.insert(col.end(), full.begin() + 1, full.end());
    std::vector<int> cols;
    for (int64_t m = 0; m < M; ++m)
      cols.push_back(reshape(rows[static_cast<size_t>(m)], col, fmt::format("{}/col{}", name, m)));
    const int cat = op("Concat", cols, name + "/microbatches", {{"axis", int64_t{1}}});
    return reshape(cat, full, name);
  }

  /// Zeros of shape `s`, dtype `t` (an Expand of a scalar: no buffer in the graph).
  int zeros(DType t, const Shape& s, const std::string& name) {
    return op("Expand", {constant(name + "/zero", Tensor(t, {})), ints(name + "/shape", {s.begin(), s.end()})}, name);
  }

  // ---- the loop -------------------------------------------------------------------------------------------------
  /// A side input computed from the inputs (a mask): per microbatch, travelling with the state, shifted alongside it.
  struct Carried {
    int v;                  // value of g
    size_t dim;             // its batch dim
    std::vector<int> rows;  // per microbatch
    int state = -1;         // current buffer
  };

  /// The unrolled loop: per iteration t the shift, then each slot's stacked layer; the results gathered back.
  void run_loop() {
    const LayerBlocks::Block& b0 = b_.blocks[0];
    const int64_t S = lay_.stages, K = lay_.slots, T = lay_.iterations;
    BlockStacker stacker(g_, b_, out_, S, shapes_, lay_.batch, lay_.microbatch);
    std::vector<Carried> carried = carry_side_inputs(stacker);
    const Value& sv = g_.values[static_cast<size_t>(b0.input)];
    const std::vector<int> in_rows = microbatches(copy(b0.input), 0, "pipeline/stream");
    int state = zeros(sv.dtype, microbatch_shape(sv.shape, 0, S), "pipeline/state_init");
    for (Carried& c : carried) {
      const Value& val = g_.values[static_cast<size_t>(c.v)];
      c.state = zeros(val.dtype, microbatch_shape(val.shape, c.dim, S), "pipeline/" + val.name + "/init");
    }
    const std::vector<std::vector<int>> weights = stack_slot_weights();
    std::vector<int> exits(static_cast<size_t>(lay_.microbatches), -1);
    for (int64_t t = 0; t <= T; ++t) {
      // The shift: stage s takes stage s-1's state; stage 0 a new microbatch, or (circular, past round 0) the last
      // stage's state; the row leaving the last stage is a microbatch's result when one completes.
      auto entering = enter_.find(t);
      auto leaving = exit_.find(t);
      const std::string tn = fmt::format("pipeline/t{}", t);
      const std::vector<int> r =
          shift(state, entering != enter_.end() ? in_rows[static_cast<size_t>(entering->second)] : -1, b0.input,
                tn + "/state", t);
      if (leaving != exit_.end()) {
        exits[static_cast<size_t>(leaving->second)] = r[1];
        lay_.carried_values.push_back(out_.values[static_cast<size_t>(r[1])].name);
      }
      if (t == T) break;
      state = r[0];
      // The shifted state holds the layer outputs a stage reads next: a copy of block 0's output for annotations.
      lay_.block_instances[g_.values[static_cast<size_t>(b0.output)].name].push_back(
          out_.values[static_cast<size_t>(state)].name);
      for (Carried& c : carried)
        c.state = shift(c.state, entering != enter_.end() ? c.rows[static_cast<size_t>(entering->second)] : -1, c.v,
                        tn + "/" + g_.values[static_cast<size_t>(c.v)].name, t)[0];
      for (int64_t k = 0; k < K; ++k) state = run_slot(stacker, state, carried, weights[static_cast<size_t>(k)], t, k);
    }
    // The results keep the name of the last layer's output (a graph output, or what the suffix reads).
    const int last = b_.blocks.back().output;
    map_[last] = unmicrobatch(exits, sv.shape, g_.values[static_cast<size_t>(last)].name);
    lay_.results = g_.values[static_cast<size_t>(last)].name;
  }

  /// The side inputs: constants are shared by every stage (`stacker`); computed ones are split into microbatches.
  std::vector<Carried> carry_side_inputs(BlockStacker& stacker) {
    const int64_t B = lay_.batch;
    std::vector<Carried> carried;
    for (int v : b_.side_inputs) {
      const Value& val = g_.values[static_cast<size_t>(v)];
      if (val.is_initializer) {
        stacker.share(v, copy(v));
        continue;
      }
      // Its batch dim: dim 0, else its one dim of the batch's size (a sequence-first copy of the stream). The stacker
      // refuses an op that lines it up with another dim of the stream's, so a wrong guess cannot go unnoticed.
      size_t dim = 0;
      if (val.shape.empty() || val.shape[0] != B) {
        const auto n = std::count(val.shape.begin(), val.shape.end(), B);
        if (n != 1)
          throw InputError(
              fmt::format("--pipeline: '{}' {} is read by every layer and computed from the inputs, but "
                          "has no one dim of the batch's size {}: it cannot be split into microbatches",
                          val.name, shape_str(val.shape), B));
        dim = static_cast<size_t>(std::find(val.shape.begin(), val.shape.end(), B) - val.shape.begin());
      }
      carried.push_back({v, dim, microbatches(copy(v), dim, "pipeline/" + val.name), -1});
    }
    return carried;
  }

  /// The stacked weights: per slot k and block weight j, [S] (GPipe) or [R, S] (circular) + the weight's shape.
  std::vector<std::vector<int>> stack_slot_weights() {
    const LayerBlocks::Block& b0 = b_.blocks[0];
    const int64_t S = lay_.stages, R = lay_.rounds, K = lay_.slots, L = lay_.layers;
    std::vector<std::vector<int>> weights(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k)
      for (size_t j = 0; j < b0.weights.size(); ++j) {
        std::vector<int> members;
        LayoutWeight lw;
        for (int64_t r = 0; r < R; ++r)
          for (int64_t s = 0; s < S; ++s) {
            const int64_t p = position(r, s, k);
            const int64_t real = std::min(p, L - 1);  // a padding slot holds a copy of the last layer's weight
            members.push_back(b_.blocks[static_cast<size_t>(real)].weights[j]);
            lw.members.push_back(p < L ? g_.values[static_cast<size_t>(members.back())].name : "");
          }
        std::string name =
            stacked_name(g_.values[static_cast<size_t>(b0.weights[j])].name, b0.layer, static_cast<int64_t>(b0.layers));
        if (K > 1) name += fmt::format("@slot{}", k);
        const Shape lead = R > 1 ? Shape{R, S} : Shape{S};
        const int id = stack_weights(g_, out_, members, lead, name);
        lw.name = out_.values[static_cast<size_t>(id)].name;
        lw.stage_dim = R > 1 ? 1 : 0;
        lay_.weights.push_back(std::move(lw));
        weights[static_cast<size_t>(k)].push_back(id);
      }
    return weights;
  }

  /// Iteration t's shift of buffer `x` (the value of g it `carries`), stage 0 taking `in` (-1: none; circular past
  /// round 0: the last stage's row wraps around): {the shifted buffer, the row leaving the last stage}.
  std::vector<int> shift(int x, int in, int carries, const std::string& name, int64_t t) {
    const bool wrap = lay_.rounds > 1 && t % (lay_.rounds * lay_.stages) >= lay_.stages;
    std::vector<int> ins{x};
    if (in >= 0) ins.push_back(in);
    const std::vector<int> r =
        emit(kPipelineDomain, kShiftOp, ins, {{"shift", int64_t{1}}, {"wrap", int64_t{wrap ? 1 : 0}}},
             {name, name + "/exit"}, name);
    lay_.shifts.push_back(name);
    if (t != lay_.iterations) lay_.states.push_back({name, g_.values[static_cast<size_t>(carries)].name});
    return r;
  }

  /// Slot k of iteration t: the stacked layer applied to `state` with the slot's `weights`; padding slots pass the
  /// state through. Returns the new state.
  int run_slot(BlockStacker& stacker, int state, const std::vector<Carried>& carried, const std::vector<int>& weights,
               int64_t t, int64_t k) {
    const LayerBlocks::Block& b0 = b_.blocks[0];
    const int64_t S = lay_.stages;
    const std::string tag = lay_.slots > 1 ? fmt::format("@t{}.{}", t, k) : fmt::format("@t{}", t);
    std::map<int, BlockStacker::Bound> bound;
    bound[b0.input] = {state, true, 0};
    for (const Carried& c : carried) bound[c.v] = {c.state, true, static_cast<int>(c.dim)};
    for (size_t j = 0; j < b0.weights.size(); ++j) bound[b0.weights[j]] = {select_round(weights[j], t, tag), true, -1};
    std::map<int, int> made;
    const int next = stacker.apply(bound, tag, &made);
    for (const auto& [v, id] : made)
      lay_.block_instances[g_.values[static_cast<size_t>(v)].name].push_back(out_.values[static_cast<size_t>(id)].name);
    std::vector<uint8_t> active(static_cast<size_t>(S));
    bool all = true;
    for (int64_t s = 0; s < S; ++s) {
      active[static_cast<size_t>(s)] = position(round(t, s), s, k) < lay_.layers;
      all = all && active[static_cast<size_t>(s)];
    }
    if (all) return next;
    Shape ms(out_.values[static_cast<size_t>(next)].shape.size(), 1);
    ms[0] = S;
    Tensor mask(DType::kBool, ms);
    for (int64_t s = 0; s < S; ++s) mask.data<uint8_t>()[s] = active[static_cast<size_t>(s)];
    return op("Where", {constant("pipeline/active" + tag, std::move(mask)), next, state}, "pipeline/state" + tag);
  }

  /// The weights stage s uses in iteration t: row round(t, s) of a circular [R, S, ...] stack (an Einsum with a
  /// one-hot [R, S] selector, local to each stage); the [S, ...] stack itself for GPipe.
  int select_round(int w, int64_t t, const std::string& tag) {
    const int64_t R = lay_.rounds, S = lay_.stages;
    if (R == 1) return w;
    const Value& wv = out_.values[static_cast<size_t>(w)];
    Tensor sel(wv.dtype, {R, S});
    for (int64_t s = 0; s < S; ++s) {
      const int64_t i = round(t, s) * S + s;
      if (wv.dtype == DType::kFloat32)
        sel.data<float>()[i] = 1.f;
      else if (wv.dtype == DType::kFloat64)
        sel.data<double>()[i] = 1.0;
      else
        throw InputError(fmt::format("--schedule circular: weight '{}' is {}: supported in float32 and float64",
                                     wv.name, dtype_name(wv.dtype)));
    }
    std::string dims;
    for (size_t d = 2; d < wv.shape.size(); ++d) dims += static_cast<char>('a' + d - 2);
    return op("Einsum", {w, constant(wv.name + "/round" + tag, std::move(sel))}, wv.name + tag,
              {{"equation", "rs" + dims + ",rs->s" + dims}});
  }

  const Graph& g_;
  const LayerBlocks& b_;
  const PipelineOptions& o_;
  const ShapeFunction& shapes_;
  Graph& out_;
  PipelineLayout& lay_;
  std::map<int, int> map_;            // g's values -> their copies
  std::map<int64_t, int64_t> enter_;  // iteration (shift) -> the microbatch entering stage 0
  std::map<int64_t, int64_t> exit_;   // shift -> the microbatch leaving the last stage
  std::vector<char> in_block_;        // per value of g: computed inside a layer block
};

}  // namespace

int64_t pipeline_batch(const Graph& g, const std::string& layers) {
  const LayerBlocks b = find_layer_blocks(g, layers, layer_weights_are_inputs(g, layers));
  const Shape& s = g.values[static_cast<size_t>(b.blocks.at(0).input)].shape;
  return s.empty() ? 1 : s[0];
}

PipelinedGraph pipeline_graph(const Graph& g, const PipelineOptions& o, const ShapeFunction& shapes) {
  const LayerBlocks b = find_layer_blocks(g, o.layers, layer_weights_are_inputs(g, o.layers));
  PipelinedGraph r;
  Builder(g, b, o, shapes, r).build();
  r.graph.verify();
  return r;
}

}  // namespace gspmd
