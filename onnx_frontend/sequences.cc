// Lowering of sequence and optional values at load (fold.h lower_structured, docs/sequences.md).
//
// A sequence is a static list of tensor values and an optional a static "present or not" with its tensor or sequence,
// as XLA treats tuples: ops on them become aliases, constants, Identity / Slice / Reshape / Concat / Gather nodes,
// and unrolled bodies. What is left has tensors only, for the partitioner and the executor.
#include <algorithm>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>

#include "core/ir/control_flow.h"
#include "onnx_frontend/fold.h"

namespace gspmd::frontend {
namespace {

// A Loop is unrolled at most this many iterations (a Loop over sequences runs one copy of its body per iteration).
constexpr int64_t kMaxUnrolledIterations = 4096;

const std::unordered_set<std::string>& structured_ops() {
  static const std::unordered_set<std::string> ops = {"SequenceEmpty",   "SequenceConstruct",  "SequenceInsert",
                                                      "SequenceErase",   "SequenceAt",         "SequenceLength",
                                                      "SplitToSequence", "ConcatFromSequence", "SequenceMap",
                                                      "Optional",        "OptionalHasElement", "OptionalGetElement"};
  return ops;
}

// Lowering of one node (fold.h lower_structured).
struct Lowering {
  Pass& p;
  size_t ni;
  const Node n;  // a copy: splicing and new values must not invalidate it

  Graph& g() { return p.g; }
  const Value& val(int id) { return p.g.values[static_cast<size_t>(id)]; }
  int in(size_t k) const { return k < n.inputs.size() ? n.inputs[k] : -1; }
  const FlatValue* structure(int id) const {
    auto it = p.structures.find(id);
    return it == p.structures.end() ? nullptr : &it->second;
  }
  // The constant data of input k, or nullptr.
  const Tensor* constant(size_t k) {
    const int id = in(k);
    return id >= 0 && !p.unknown.count(val(id).name) ? val(id).data.get() : nullptr;
  }

  // Output k is `s` (its elements' ids, its structure).
  Lowered define(size_t k, FlatValue s) {
    const int o = n.outputs.at(k);
    s.name = val(o).name;
    p.structures[o] = std::move(s);
    p.typed(o);
    return Lowered::kDone;
  }
  void define_constant(size_t k, Tensor t) {
    Value& v = p.g.values[static_cast<size_t>(n.outputs.at(k))];
    v.kind = ValueKind::kTensor;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.is_initializer = true;
    v.producer = -1;
    v.data = std::make_shared<const Tensor>(std::move(t));
    p.typed(n.outputs[k]);
  }
  // The element type that ONNX's TensorProto.DataType `v` names, if it is one of DType's.
  static std::optional<DType> elem_dtype(int64_t v) {
    const DType t = static_cast<DType>(v);
    if (v < 1 || v > 16 || dtype_name(t) == "undefined") return std::nullopt;
    return t;
  }
  // Every output stays untyped for `reason` (the rest of the loader's error, fold.h untyped_reason).
  Lowered fail(const std::string& reason) {
    for (int o : n.outputs) p.why[val(o).name] = reason;
    return Lowered::kFailed;
  }
  // An output depends on the values of input k, which is not a constant.
  Lowered data_dependent(size_t k, const std::string& what) {
    return fail(untyped_reason(p.g, n,
                               fmt::format("{} must be known at load (a sequence is a static list of tensors)", what),
                               static_cast<int>(k)));
  }
  Lowered unsupported(const std::string& what) {
    return fail(fmt::format("has no static shape: node '{}' ({}): {}", n.name, n.op_type, what));
  }
  // Constant `t` (`what`) must hold one element, the spec's scalar (found by the model fuzzer: an empty position read
  // past its end): else the outputs stay untyped, saying so.
  std::optional<Lowered> not_one_element(const Tensor& t, const std::string& what) {
    if (t.numel() == 1) return std::nullopt;
    return unsupported(fmt::format("{} holds {} elements; the spec wants one", what, t.numel()));
  }
  // Replaces the node by `nodes`.
  Lowered splice(std::vector<Node> nodes) {
    p.splice(ni, std::move(nodes));
    return Lowered::kSpliced;
  }
  Node make(const std::string& suffix, const char* op, std::vector<int> inputs, std::vector<int> outputs) const {
    Node m;
    m.name = fmt::format("{}/{}", n.name, suffix);
    m.op_type = op;
    m.inputs = std::move(inputs);
    m.outputs = std::move(outputs);
    return m;
  }
  int fresh(const std::string& hint) {
    const int id = p.g.add_value_unique(hint, DType::kUndefined, {});
    p.unknown.insert(val(id).name);
    return id;
  }
  int const_ints(const std::string& hint, const std::vector<int64_t>& v, bool scalar = false) {
    return p.add_constant(fmt::format("{}/{}", n.name, hint), Tensor::from_int64s(v, scalar));
  }
  // A Reshape of element `e` (static shape required) to `shape`.
  Node reshape(const std::string& suffix, int e, const Shape& shape, int out) {
    return make(suffix, "Reshape", {e, const_ints(suffix + "_shape", shape)}, {out});
  }
  bool typed(int id) { return id >= 0 && !p.unknown.count(val(id).name); }

  // A position input k into a sequence of `size` (insertion: `size` itself allowed); `def` when absent. Returns false
  // (after fail) when it is not a constant or out of range.
  bool position(size_t k, int64_t size, bool insertion, int64_t def, int64_t& pos, Lowered& result) {
    if (in(k) < 0) {
      pos = def;
      return true;
    }
    const Tensor* t = constant(k);
    if (!t) {
      result = data_dependent(k, fmt::format("the position '{}'", val(in(k)).name));
      return false;
    }
    if (auto bad = not_one_element(*t, fmt::format("the position '{}'", val(in(k)).name))) {
      result = *bad;
      return false;
    }
    pos = t->as_int64s().at(0);
    const int64_t hi = insertion ? size : size - 1;
    if (pos < -size || pos > hi) {
      result = unsupported(fmt::format("position {} is out of range for a sequence of {}", pos, size));
      return false;
    }
    if (pos < 0) pos += size;
    return true;
  }

  Lowered run() {
    const std::string& op = n.op_type;
    if (op == "SequenceEmpty") {
      const std::optional<DType> dt = elem_dtype(n.i("dtype", 1));
      if (!dt) return fail(fmt::format("has no element type: attribute 'dtype' is {}", n.i("dtype", 1)));
      return define(0, {"", {ValueKind::kSequence, true, false, *dt}, {}});
    }
    if (op == "SequenceConstruct") {
      FlatValue s{"", {ValueKind::kSequence, true, false, DType::kUndefined}, {}};
      for (int i : n.inputs) s.values.push_back(i);
      if (!n.inputs.empty()) s.structure.elem_dtype = val(n.inputs[0]).dtype;
      return define(0, std::move(s));
    }
    if (op == "Optional") {
      FlatValue s{"", {ValueKind::kOptional, false, false, DType::kUndefined}, {}};
      if (in(0) >= 0) {
        s.structure.present = true;
        if (const FlatValue* e = structure(in(0))) {
          s.structure.of_sequence = true;
          s.structure.elem_dtype = e->structure.elem_dtype;
          s.values = e->values;
        } else {
          s.structure.elem_dtype = val(in(0)).dtype;
          s.values = {in(0)};
        }
      } else {  // the empty optional of attribute `type` ([is a sequence, element type], loader.cc)
        const std::vector<int64_t> type = n.ints("type");
        s.structure.of_sequence = !type.empty() && type[0] == 1;
        if (type.size() > 1) {
          const std::optional<DType> dt = elem_dtype(type[1]);
          if (!dt) return fail(fmt::format("has no element type: attribute 'type' names {}", type[1]));
          s.structure.elem_dtype = *dt;
        }
      }
      return define(0, std::move(s));
    }
    if (op == "OptionalHasElement") {
      const FlatValue* o = structure(in(0));
      const bool present = in(0) >= 0 && (!o || o->structure.kind != ValueKind::kOptional || o->structure.present);
      Tensor t(DType::kBool, {});
      t.data<uint8_t>()[0] = present ? 1 : 0;
      define_constant(0, std::move(t));
      return Lowered::kDone;
    }
    if (op == "OptionalGetElement") {
      const FlatValue* o = structure(in(0));
      if (!o) return splice({make("value", "Identity", {in(0)}, {n.outputs[0]})});  // a tensor (opset 18)
      if (o->structure.kind == ValueKind::kOptional && !o->structure.present)
        return unsupported(fmt::format("'{}' is the empty optional, which has no element", val(in(0)).name));
      if (o->structure.kind == ValueKind::kSequence || o->structure.of_sequence) {
        FlatValue s = *o;
        s.structure = {ValueKind::kSequence, true, false, o->structure.elem_dtype};
        return define(0, std::move(s));
      }
      return splice({make("value", "Identity", {o->values.at(0)}, {n.outputs[0]})});
    }
    if (op == "Identity" && structure(in(0))) return define(0, *structure(in(0)));

    // Ops on one sequence (input 0).
    const FlatValue* seq = structure(in(0));
    if (op == "SequenceInsert" || op == "SequenceErase" || op == "SequenceAt" || op == "SequenceLength" ||
        op == "ConcatFromSequence") {
      if (!seq || seq->structure.kind != ValueKind::kSequence)
        return unsupported(fmt::format("input '{}' is not a sequence", in(0) >= 0 ? val(in(0)).name : ""));
    }
    const int64_t size = seq ? static_cast<int64_t>(seq->values.size()) : 0;
    Lowered result = Lowered::kFailed;
    int64_t pos = 0;
    if (op == "SequenceLength") {
      define_constant(0, Tensor::from_int64s({size}, /*scalar=*/true));
      return Lowered::kDone;
    }
    if (op == "SequenceInsert") {
      if (!position(2, size, true, size, pos, result)) return result;
      FlatValue s = *seq;
      s.values.insert(s.values.begin() + pos, in(1));
      return define(0, std::move(s));
    }
    if (op == "SequenceErase") {
      if (size == 0) return unsupported("the sequence is empty");
      if (!position(1, size, false, size - 1, pos, result)) return result;
      FlatValue s = *seq;
      s.values.erase(s.values.begin() + pos);
      return define(0, std::move(s));
    }
    if (op == "SequenceAt") return sequence_at(*seq);
    if (op == "ConcatFromSequence") return concat_from_sequence(*seq);
    if (op == "SplitToSequence") return split_to_sequence();
    if (op == "SequenceMap") return sequence_map();
    if (op == "Loop") return unroll_loop();
    if (op == "If")
      return fail(untyped_reason(p.g, n,
                                 "the branches make sequences or optionals, which are static lists of tensors: the "
                                 "condition must be known at load",
                                 0));
    for (int i : n.inputs)
      if (i >= 0 && structure(i))
        return unsupported(
            fmt::format("input '{}' is a sequence or optional, which {} does not take", val(i).name, n.op_type));
    return unsupported("its outputs are sequences or optionals");
  }

  // SequenceAt: a constant position is an Identity of that element; otherwise, when every element has the same static
  // type, a Gather from their Concat along a new leading axis.
  Lowered sequence_at(const FlatValue& seq) {
    const int64_t size = static_cast<int64_t>(seq.values.size());
    if (size == 0) return unsupported("the sequence is empty");
    if (constant(1)) {
      int64_t pos = 0;
      Lowered result = Lowered::kFailed;
      if (!position(1, size, false, 0, pos, result)) return result;
      return splice({make("element", "Identity", {seq.values[static_cast<size_t>(pos)]}, {n.outputs[0]})});
    }
    const int first = seq.values[0];
    bool uniform = typed(first);
    for (int e : seq.values)
      uniform = uniform && typed(e) && val(e).dtype == val(first).dtype && val(e).shape == val(first).shape;
    if (!uniform)
      return data_dependent(
          1, fmt::format("the position '{}' into a sequence of differently typed tensors", val(in(1)).name));
    Shape one = val(first).shape;
    one.insert(one.begin(), 1);
    std::vector<Node> nodes;
    std::vector<int> parts;
    for (size_t i = 0; i < seq.values.size(); ++i) {
      const int r = fresh(fmt::format("{}/stack_{}", n.name, i));
      nodes.push_back(reshape(fmt::format("stack_{}", i), seq.values[i], one, r));
      parts.push_back(r);
    }
    const int stacked = fresh(n.name + "/stacked");
    Node c = make("concat", "Concat", parts, {stacked});
    c.attrs["axis"] = int64_t{0};
    nodes.push_back(std::move(c));
    Node gather = make("gather", "Gather", {stacked, in(1)}, {n.outputs[0]});
    gather.attrs["axis"] = int64_t{0};
    nodes.push_back(std::move(gather));
    return splice(std::move(nodes));
  }

  // ConcatFromSequence: a Concat of the elements (new_axis: each reshaped with a size-1 dim at `axis` first).
  Lowered concat_from_sequence(const FlatValue& seq) {
    if (seq.values.empty()) return unsupported("the sequence is empty");
    const bool new_axis = n.i("new_axis", 0) != 0;
    int64_t axis = n.i("axis", 0);
    std::vector<int> parts = seq.values;
    std::vector<Node> nodes;
    if (new_axis) {
      for (int e : seq.values)
        if (!typed(e)) return fail(fmt::format("has no static shape: its element '{}' has none", val(e).name));
      const int64_t rank = static_cast<int64_t>(val(seq.values[0]).shape.size()) + 1;
      if (axis < -rank || axis >= rank)
        return unsupported(fmt::format("axis {} is out of range for rank {}", axis, rank));
      if (axis < 0) axis += rank;
      for (size_t i = 0; i < parts.size(); ++i) {
        Shape s = val(parts[i]).shape;
        s.insert(s.begin() + axis, 1);
        const int r = fresh(fmt::format("{}/expanded_{}", n.name, i));
        nodes.push_back(reshape(fmt::format("expand_{}", i), parts[i], s, r));
        parts[i] = r;
      }
    }
    Node c = make("concat", "Concat", parts, {n.outputs[0]});
    c.attrs["axis"] = axis;
    nodes.push_back(std::move(c));
    return splice(std::move(nodes));
  }

  // SplitToSequence: one Slice per piece (and a Reshape dropping the axis when keepdims is 0 without `split`).
  Lowered split_to_sequence() {
    const int x = in(0);
    if (!typed(x)) return fail(fmt::format("has no static shape: its input '{}' has none", val(x).name));
    const Shape shape = val(x).shape;
    const int64_t rank = static_cast<int64_t>(shape.size());
    int64_t axis = n.i("axis", 0);
    if (axis < -rank || axis >= rank)
      return unsupported(fmt::format("axis {} is out of range for rank {}", axis, rank));
    if (axis < 0) axis += rank;
    const int64_t dim = shape[static_cast<size_t>(axis)];
    std::vector<int64_t> sizes;
    bool squeeze = false;
    if (in(1) < 0) {
      sizes.assign(static_cast<size_t>(dim), 1);
      squeeze = n.i("keepdims", 1) == 0;
    } else {
      const Tensor* t = constant(1);
      if (!t) return data_dependent(1, fmt::format("the split '{}'", val(in(1)).name));
      const std::vector<int64_t> split = t->as_int64s();
      if (t->shape.empty()) {
        const int64_t chunk = split.at(0);
        if (chunk <= 0) return unsupported(fmt::format("split {} must be positive", chunk));
        for (int64_t b = 0; b < dim; b += chunk) sizes.push_back(std::min(chunk, dim - b));
      } else {
        sizes = split;
        int64_t sum = 0;
        for (int64_t s : sizes) sum += s;
        if (sum != dim || std::any_of(sizes.begin(), sizes.end(), [](int64_t s) { return s < 0; }))
          return unsupported(fmt::format("split sizes sum to {}, axis {} has {}", sum, axis, dim));
      }
    }
    FlatValue s{"", {ValueKind::kSequence, true, false, val(x).dtype}, {}};
    std::vector<Node> nodes;
    const int axes = const_ints("axes", {axis});
    int64_t begin = 0;
    const std::string out_name = val(n.outputs[0]).name;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int piece = fresh(fmt::format("{}[{}]", out_name, i));
      const int starts = const_ints(fmt::format("starts_{}", i), {begin});
      const int ends = const_ints(fmt::format("ends_{}", i), {begin + sizes[i]});
      begin += sizes[i];
      if (!squeeze) {
        nodes.push_back(make(fmt::format("slice_{}", i), "Slice", {x, starts, ends, axes}, {piece}));
        s.values.push_back(piece);
        continue;
      }
      const int sliced = fresh(fmt::format("{}/slice_{}", n.name, i));
      nodes.push_back(make(fmt::format("slice_{}", i), "Slice", {x, starts, ends, axes}, {sliced}));
      Shape dropped = shape;
      dropped.erase(dropped.begin() + axis);
      nodes.push_back(reshape(fmt::format("squeeze_{}", i), sliced, dropped, piece));
      s.values.push_back(piece);
    }
    define(0, std::move(s));
    if (nodes.empty()) return Lowered::kDone;
    return splice(std::move(nodes));
  }

  // SequenceMap: its body once per element (sequence inputs give element i, tensor inputs themselves).
  Lowered sequence_map() {
    const Graph* body = n.g("body");
    if (!body) return unsupported("no body");
    const size_t own = own_inputs(n);
    const FlatValue* first = structure(in(0));
    if (!first) return unsupported("input 0 is not a sequence");
    const size_t len = first->values.size();
    for (size_t k = 0; k < own; ++k)
      if (const FlatValue* s = structure(in(k)); s && s->values.size() != len)
        return unsupported(fmt::format("sequence inputs of lengths {} and {}", len, s->values.size()));
    std::vector<FlatValue> outs(n.outputs.size(),
                                FlatValue{"", {ValueKind::kSequence, true, false, DType::kUndefined}, {}});
    for (size_t o = 0; o < outs.size(); ++o) outs[o].structure.elem_dtype = val(n.outputs[o]).dtype;
    std::vector<Node> nodes;
    for (size_t i = 0; i < len; ++i) {
      std::vector<int> bound;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const FlatValue* s = k < own ? structure(in(k)) : nullptr;
        bound.push_back(s ? s->values[i] : in(k));
      }
      std::vector<int> out_ids;
      std::vector<Node> copy =
          p.clone_body(*body, fmt::format("{}/{}", n.name, i), bound, {}, /*keep_types=*/false, out_ids);
      nodes.insert(nodes.end(), std::make_move_iterator(copy.begin()), std::make_move_iterator(copy.end()));
      for (size_t o = 0; o < outs.size() && o < out_ids.size(); ++o) outs[o].values.push_back(out_ids[o]);
    }
    p.report.rewrites.push_back(
        fmt::format("node '{}' (SequenceMap): body unrolled over {} element{}", n.name, len, len == 1 ? "" : "s"));
    for (size_t o = 0; o < outs.size(); ++o) define(o, std::move(outs[o]));
    if (nodes.empty()) return Lowered::kDone;
    return splice(std::move(nodes));
  }

  // A Loop whose carried values or captures are sequences or optionals, unrolled one iteration per visit: the body's
  // copy for iteration i, then this Loop again (same name, reading the copy's condition and carried values). When the
  // trip count is reached or the condition is false, the carried values become the outputs and each scan output the
  // Concat of its per-iteration values.
  Lowered unroll_loop() {
    const Graph* body = n.g("body");
    if (!body) return unsupported("no body");
    Pass::Unroll& state = p.unrolling[n.name];
    const size_t carried = own_inputs(n) - 2;
    int64_t trips = INT64_MAX;
    if (in(0) >= 0) {
      const Tensor* m = constant(0);
      if (!m) return data_dependent(0, fmt::format("the trip count '{}'", val(in(0)).name));
      if (auto bad = not_one_element(*m, fmt::format("the trip count '{}'", val(in(0)).name))) return *bad;
      trips = m->as_int64s().at(0);
    }
    bool cond = true;
    if (in(1) >= 0) {
      const Tensor* c = constant(1);
      if (!c) return data_dependent(1, fmt::format("the condition '{}'", val(in(1)).name));
      if (auto bad = not_one_element(*c, fmt::format("the condition '{}'", val(in(1)).name))) return *bad;
      cond = c->bytes.at(0) != std::byte{0};
    }
    if (state.next >= trips || !cond) return finish_loop(state, carried);
    if (state.next >= kMaxUnrolledIterations)
      return unsupported(
          fmt::format("its carried values are sequences or optionals, so it is unrolled, and it runs "
                      "more than {} iterations",
                      kMaxUnrolledIterations));
    const int64_t i = state.next;
    std::vector<int> bound{const_ints(fmt::format("iteration_{}", i), {i}, /*scalar=*/true)};
    if (in(1) >= 0) {
      bound.push_back(in(1));
    } else {
      Tensor t(DType::kBool, {});
      t.data<uint8_t>()[0] = 1;
      bound.push_back(p.add_constant(n.name + "/cond", std::move(t)));
    }
    for (size_t k = 2; k < n.inputs.size(); ++k) bound.push_back(n.inputs[k]);
    std::vector<int> out_ids;
    std::vector<Node> nodes =
        p.clone_body(*body, fmt::format("{}/{}", n.name, i), bound, {}, /*keep_types=*/false, out_ids);
    if (out_ids.size() < 1 + carried) return unsupported("its body has fewer outputs than carried values");
    Node next = n;
    next.inputs[1] = out_ids[0];
    for (size_t k = 0; k < carried; ++k) next.inputs[2 + k] = out_ids[1 + k];
    const size_t scans = out_ids.size() - 1 - carried;
    state.scans.resize(scans);
    for (size_t j = 0; j < scans; ++j) state.scans[j].push_back(out_ids[1 + carried + j]);
    ++state.next;
    nodes.push_back(std::move(next));
    return splice(std::move(nodes));
  }

  Lowered finish_loop(const Pass::Unroll& state, size_t carried) {
    p.report.rewrites.push_back(
        fmt::format("node '{}' (Loop): unrolled, {} iteration{} (it carries sequences or "
                    "optionals)",
                    n.name, state.next, state.next == 1 ? "" : "s"));
    std::vector<Node> nodes;
    for (size_t k = 0; k < carried && k < n.outputs.size(); ++k) {
      const int from = in(2 + k);
      if (const FlatValue* s = structure(from)) {
        define(k, *s);
      } else {
        nodes.push_back(make(fmt::format("output_{}", k), "Identity", {from}, {n.outputs[k]}));
      }
    }
    for (size_t j = 0; carried + j < n.outputs.size(); ++j) {
      const std::vector<int> values = j < state.scans.size() ? state.scans[j] : std::vector<int>{};
      if (values.empty()) return unsupported("a scan output of zero iterations has no element shape");
      std::vector<int> parts;
      for (size_t i = 0; i < values.size(); ++i) {
        if (!typed(values[i])) return fail(fmt::format("has no static shape: '{}' has none", val(values[i]).name));
        Shape s = val(values[i]).shape;
        s.insert(s.begin(), 1);
        const int r = fresh(fmt::format("{}/scan_{}_{}", n.name, j, i));
        nodes.push_back(reshape(fmt::format("scan_{}_{}", j, i), values[i], s, r));
        parts.push_back(r);
      }
      Node c = make(fmt::format("scan_{}", j), "Concat", parts, {n.outputs[carried + j]});
      c.attrs["axis"] = int64_t{0};
      nodes.push_back(std::move(c));
    }
    p.unrolling.erase(n.name);
    if (nodes.empty()) return Lowered::kDone;
    return splice(std::move(nodes));
  }
};

}  // namespace

Lowered lower_structured(Pass& p, size_t ni) {
  const Node& n = p.g.nodes[ni];
  const bool onnx = n.domain.empty() || n.domain == "ai.onnx";
  bool touches = onnx && structured_ops().count(n.op_type);
  for (int i : n.inputs) {
    if (i < 0) continue;
    if (p.structures.count(i)) {
      touches = true;
    } else if (p.g.values[static_cast<size_t>(i)].kind != ValueKind::kTensor) {
      return Lowered::kNo;  // not lowered itself (an unbound input, a failed lowering): the outputs stay untyped
    }
  }
  for (int o : n.outputs) touches = touches || p.g.values[static_cast<size_t>(o)].kind != ValueKind::kTensor;
  if (!touches) return Lowered::kNo;
  if (!onnx) return Lowering{p, ni, n}.unsupported("its inputs or outputs are sequences or optionals");
  return Lowering{p, ni, n}.run();
}

}  // namespace gspmd::frontend
