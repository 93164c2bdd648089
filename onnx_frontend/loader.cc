// load_model: ONNX file -> core::Graph with static shapes (bind dims, shape inference, folding).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include "onnx_frontend/fold.h"
#include "onnx_frontend/frontend.h"
#include "onnx_frontend/gspmd_schemas.h"
#include "onnx_frontend/proto_util.h"

namespace gspmd {
namespace {

using frontend::dir_of;
using frontend::is_external;
using frontend::tensor_from_proto;
using frontend::tensor_to_proto;

// Constants at most this large stay in the ModelProto for ONNX shape inference (its data propagation reads them);
// larger ones are handed to it as typed graph inputs (shape inference only needs their type).
constexpr size_t kInlineForInference = 64 << 10;

// Node names: kept when non-empty and unique, else "<OpType>_<index>" (made unique with a suffix).
std::vector<std::string> unique_node_names(const google::protobuf::RepeatedPtrField<onnx::NodeProto>& nodes) {
  std::unordered_set<std::string> given, used;
  for (const auto& n : nodes)
    if (!n.name().empty()) given.insert(n.name());
  std::vector<std::string> out;
  for (int ni = 0; ni < nodes.size(); ++ni) {
    std::string name = nodes[ni].name();
    if (name.empty() || used.count(name)) {
      std::string base = fmt::format("{}_{}", nodes[ni].op_type(), ni);
      name = base;
      for (int k = 1; used.count(name) || given.count(name); ++k) name = fmt::format("{}_{}", base, k);
    }
    used.insert(name);
    out.push_back(std::move(name));
  }
  return out;
}

struct Loader {
  const std::string& path;
  const LoadOptions& opts;
  std::string base_dir;
  onnx::ModelProto m;
  frontend::ExternalDataFiles external{base_dir};  // external data locations, each resolved once
  int64_t opset = -1;
  std::vector<std::string> input_names;  // real graph inputs, in order
  std::vector<Value> consts;             // initializers and Constant outputs, in order
  std::unordered_map<std::string, size_t> const_index;
  std::unordered_map<std::string, std::string> non_tensor;      // values typed map (or another non-tensor type but a
                                                                // sequence or optional) by inference
  DimBindings hints;                                            // opts.keep_symbols: the kept symbols' hints
  std::map<std::string, std::vector<DimExpr>> symbolic_inputs;  // and the inputs' dims that read them
  std::set<std::string> input_dim_names = {};      // the dim_params of the graph inputs, before bind_dims binds them
  std::unordered_set<std::string> verified_nodes;  // verify_nodes: what a node's schema check reads, once checked

  Loader(const std::string& model_path, const LoadOptions& options)
      : path(model_path), opts(options), base_dir(frontend::dir_of(model_path)) {}

  [[noreturn]] void fail(const std::string& why) const { throw InputError(fmt::format("{}: {}", path, why)); }

  // The name the loaded graph gives node `ni` of the main graph (unique_node_names), for an error message: O(nodes),
  // so the checks ask for it only when they fail.
  std::string node_label(int ni) const { return unique_node_names(m.graph().node())[static_cast<size_t>(ni)]; }

  void parse() {
    frontend::parse_model_file(path, &m);
    check_utf8_names(m.graph());
    bool imports_onnx = false;
    for (const auto& op : m.opset_import())
      if (op.domain().empty() || op.domain() == "ai.onnx") {
        opset = op.version();
        imports_onnx = true;
      }
    if (!imports_onnx) {
      // IR 1-2 had no opset_import: the default domain at version 1. A model importing only other domains
      // (e.g. ai.onnx.preview.training) uses no ai.onnx op; its ops are reported by the executor.
      opset = m.opset_import_size() == 0 ? 1 : 17;
    }
    if (opset < 1 || opset > kNewestOpset)
      fail(fmt::format("opset {} of ai.onnx is not one of 1 .. {} (docs/loading.md)", opset, kNewestOpset));
    if (m.graph().output_size() == 0) fail("the graph has no outputs: nothing to compute");
    // The installed onnx knows the schemas up to its own newest opset (17 for onnx 1.12): a newer model's nodes are
    // checked against those newest schemas, but for the operators that ONNX changed or added since (opset 18's
    // ReduceMean takes its axes as an input), which are left to the shape functions and the executor.
    const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
    if (auto it = ranges.find(""); it != ranges.end())
      verify_nodes(m.graph(), std::min<int64_t>(opset, it->second.second), opset > it->second.second);
    check_function_calls();
  }

  // No model-local function calls itself, directly or through others (onnx 1.12's shape inference expands calls
  // without end: a stack overflow). Kahn's algorithm on the call graph, without recursion (a hostile model may chain
  // many functions).
  void check_function_calls() const {
    using Key = std::pair<std::string, std::string>;  // domain, name
    std::map<Key, const onnx::FunctionProto*> fns;
    for (const auto& f : m.functions()) fns[{f.domain(), f.name()}] = &f;
    if (fns.empty()) return;
    std::map<Key, std::set<Key>> callees;
    std::map<Key, int> callers;  // per function: the functions calling it that are not yet removed
    for (const auto& [key, f] : fns) {
      std::vector<const onnx::NodeProto*> todo;
      for (const auto& n : f->node()) todo.push_back(&n);
      while (!todo.empty()) {  // the body's nodes and their subgraphs' nodes
        const onnx::NodeProto* n = todo.back();
        todo.pop_back();
        if (Key c{n->domain(), n->op_type()}; fns.count(c) && callees[key].insert(c).second) ++callers[c];
        for (const auto& a : n->attribute()) {
          for (const auto& body : a.graphs())
            for (const auto& b : body.node()) todo.push_back(&b);
          if (a.has_g())
            for (const auto& b : a.g().node()) todo.push_back(&b);
        }
      }
    }
    std::vector<Key> free;
    for (const auto& [key, f] : fns)
      if (!callers[key]) free.push_back(key);
    size_t removed = 0;
    while (!free.empty()) {
      const Key k = free.back();
      free.pop_back();
      ++removed;
      for (const Key& c : callees[k])
        if (--callers[c] == 0) free.push_back(c);
    }
    if (removed == fns.size()) return;
    for (const auto& [key, f] : fns)
      if (callers[key] > 0)
        fail(
            fmt::format("model-local functions call themselves in a cycle ('{}' of domain '{}' is in it or called "
                        "from it)",
                        cut_text(key.second), cut_text(key.first)));
  }

  // The ai.onnx operators whose inputs, outputs or attributes changed in opsets 18 .. 23 (ONNX's Changelog), and
  // those added there: a newer model's node of these is not checked against onnx 1.12's schema.
  static bool changed_after_onnx_1_12(const std::string& op) {
    static const std::unordered_set<std::string> changed = {"AffineGrid",
                                                            "Attention",
                                                            "AveragePool",
                                                            "BitwiseAnd",
                                                            "BitwiseNot",
                                                            "BitwiseOr",
                                                            "BitwiseXor",
                                                            "Cast",
                                                            "CastLike",
                                                            "CenterCropPad",
                                                            "Col2Im",
                                                            "Constant",
                                                            "ConstantOfShape",
                                                            "DFT",
                                                            "DeformConv",
                                                            "DequantizeLinear",
                                                            "Equal",
                                                            "Flatten",
                                                            "Gelu",
                                                            "GridSample",
                                                            "GroupNormalization",
                                                            "Identity",
                                                            "If",
                                                            "ImageDecoder",
                                                            "IsInf",
                                                            "IsNaN",
                                                            "Loop",
                                                            "LpPool",
                                                            "Mish",
                                                            "OptionalGetElement",
                                                            "OptionalHasElement",
                                                            "Pad",
                                                            "QLinearMatMul",
                                                            "QuantizeLinear",
                                                            "RMSNormalization",
                                                            "ReduceL1",
                                                            "ReduceL2",
                                                            "ReduceLogSum",
                                                            "ReduceLogSumExp",
                                                            "ReduceMax",
                                                            "ReduceMean",
                                                            "ReduceMin",
                                                            "ReduceProd",
                                                            "ReduceSum",
                                                            "ReduceSumSquare",
                                                            "RegexFullMatch",
                                                            "Reshape",
                                                            "Resize",
                                                            "RotaryEmbedding",
                                                            "Scan",
                                                            "ScatterElements",
                                                            "ScatterND",
                                                            "Shape",
                                                            "Size",
                                                            "Split",
                                                            "Squeeze",
                                                            "StringConcat",
                                                            "StringSplit",
                                                            "Transpose",
                                                            "Unsqueeze"};
    return changed.count(op) != 0;
  }

  // Every name of graph `g` (bodies included) is UTF-8, as ONNX's IR asks: names reach the JSON the tool writes
  // (shardings.json, reports, traces), which cannot hold other bytes (a value named "h\xff" was an internal error when
  // `partition` wrote shardings.json).
  void check_utf8_names(const onnx::GraphProto& g) const {
    auto check = [&](const std::string& name, const char* what) {
      if (is_utf8(name)) return;
      fail(fmt::format("{} name '{}' is not valid UTF-8", what, frontend::shown_bytes(name)));
    };
    check(g.name(), "graph");
    for (const auto& v : g.input()) check(v.name(), "input");
    for (const auto& v : g.output()) check(v.name(), "output");
    for (const auto& t : g.initializer()) check(t.name(), "initializer");
    for (const auto& n : g.node()) {
      check(n.name(), "node");
      check(n.op_type(), "operator");
      check(n.domain(), "domain");
      for (const std::string& v : n.input()) check(v, "value");
      for (const std::string& v : n.output()) check(v, "value");
      for (const auto& a : n.attribute()) {
        if (a.has_g()) check_utf8_names(a.g());
        for (const auto& body : a.graphs()) check_utf8_names(body);
      }
    }
  }

  // True when `s` is well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF).
  static bool is_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
      const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
      const unsigned char c = byte(i);
      if (c < 0x80) {
        ++i;
        continue;
      }
      size_t n = 0;
      unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
      if (c >= 0xc2 && c <= 0xdf) {
        n = 1;
      } else if (c >= 0xe0 && c <= 0xef) {
        n = 2;
        lo = c == 0xe0 ? 0xa0 : 0x80;
        hi = c == 0xed ? 0x9f : 0xbf;
      } else if (c >= 0xf0 && c <= 0xf4) {
        n = 3;
        lo = c == 0xf0 ? 0x90 : 0x80;
        hi = c == 0xf4 ? 0x8f : 0xbf;
      } else {
        return false;
      }
      if (i + n >= s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return false;
      for (size_t k = 2; k <= n; ++k)
        if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return false;
      i += n + 1;
    }
    return true;
  }

  // The largest value a model may hold, in bytes (docs/loading.md): 1 PiB, far past any model or pod (a 2048-expert
  // MoE's weights are 2^40 bytes), and small enough that the cost model's sums of such sizes do not overflow int64.
  static constexpr int64_t kMaxValueBytes = int64_t{1} << 50;

  // The newest ai.onnx opset read (ONNX 1.18's); opsets past the installed onnx's own are read with its newest
  // schemas (docs/loading.md).
  static constexpr int64_t kNewestOpset = 23;

  // Every ai.onnx node against its operator schema at `schema_opset` (onnx's checker: arity, attribute types,
  // unknown attributes), bodies included. A node of another domain is left to the executor (exit 3 if unknown).
  // `newer`: the model's opset is past the installed onnx's, whose newest schemas are used for the operators that
  // did not change since (changed_after_onnx_1_12); an operator it does not know is left to the executor.
  void verify_nodes(const onnx::GraphProto& g, int64_t schema_opset, bool newer) {
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      auto who = [&] {
        return fmt::format("node '{}' ({})", n.name().empty() ? fmt::format("#{}", i) : cut_text(n.name()),
                           n.op_type());
      };
      bool small_attrs = true;
      for (const auto& a : n.attribute()) {
        if (a.has_g()) verify_nodes(a.g(), schema_opset, newer);
        small_attrs = small_attrs && !a.has_g() && a.graphs_size() == 0;
      }
      if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
      if (newer && changed_after_onnx_1_12(n.op_type())) continue;
      // OpSchema::Verify reads the op, which inputs and outputs are present, and the attributes, never the names:
      // the nodes of repeated layers are verified once (a 96-layer decoder has 12 distinct nodes, not 3,269).
      std::string key;
      if (small_attrs) {
        key = n.op_type() + '\0';
        for (const auto& in : n.input()) key += in.empty() ? '0' : '1';
        key += '\0';
        for (const auto& out : n.output()) key += out.empty() ? '0' : '1';
        for (const auto& a : n.attribute()) {
          if (a.ByteSizeLong() > 256) {
            key.clear();
            break;
          }
          key += '\0' + a.SerializeAsString();
        }
        if (!key.empty() && verified_nodes.count(key)) continue;
      }
      const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(n.op_type(), static_cast<int>(schema_opset), "");
      if (!schema && newer) continue;
      if (!schema) fail(fmt::format("{}: no operator '{}' in ai.onnx opset {}", who(), n.op_type(), opset));
      try {
        schema->Verify(n);
      } catch (const std::exception& e) {
        fail(fmt::format("{}: {}", who(), first_line(e.what())));
      }
      if (!key.empty()) verified_nodes.insert(std::move(key));
    }
  }

  // Reads a constant's data: always when load_data, else only small tensors whose data is at hand.
  std::shared_ptr<const Tensor> read_const(const onnx::TensorProto& t, const std::string& what) {
    DType dt = frontend::proto_dtype(t.data_type(), what);
    int64_t bytes = dt == DType::kString ? 0 : static_cast<int64_t>(dtype_size(dt));
    bool small = dt != DType::kString;
    for (auto d : t.dims())  // saturated: the dims come from the file (tensor_from_proto refuses what is too large)
      if (__builtin_mul_overflow(bytes, d, &bytes)) small = false;
    small = small && bytes <= static_cast<int64_t>(kInlineForInference);
    if (opts.load_data) return std::make_shared<const Tensor>(tensor_from_proto(t, external, what));
    if (is_external(t)) external.file(t, what);  // refused even when not read
    if (!small) return nullptr;
    try {
      return std::make_shared<const Tensor>(tensor_from_proto(t, external, what));
    } catch (const InputError&) {
      if (is_external(t)) return nullptr;  // external file absent: shapes only
      throw;
    }
  }

  void add_const(Value v) {
    if (const_index.count(v.name)) fail(fmt::format("value '{}' is defined twice", v.name));
    const_index.emplace(v.name, consts.size());
    consts.push_back(std::move(v));
  }

  static void set_type(onnx::ValueInfoProto* vi, const std::string& name, DType dt, const Shape& s) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(static_cast<int32_t>(dt));
    auto* shape = tt->mutable_shape();
    shape->clear_dim();
    for (int64_t d : s) shape->add_dim()->set_dim_value(d);
  }

  // Puts a constant into the proto for shape inference: inline when small and known, else as a typed graph input.
  void expose_const(const Value& v, std::unordered_set<std::string>& graph_input_names) {
    auto* g = m.mutable_graph();
    if (v.data && v.data->nbytes() <= kInlineForInference) {
      auto* t = g->add_initializer();
      t->set_name(v.name);
      tensor_to_proto(*v.data, t);
    } else if (graph_input_names.insert(v.name).second) {
      set_type(g->add_input(), v.name, v.dtype, v.shape);
    }
  }

  Value initializer_value(const onnx::TensorProto& t) {
    std::string what = fmt::format("{}: initializer '{}'", path, t.name());
    Value v;
    v.name = t.name();
    v.dtype = frontend::proto_dtype(t.data_type(), what);
    v.shape = frontend::proto_shape(t);
    v.is_initializer = true;
    v.data = read_const(t, what);
    return v;
  }

  // A Constant node's output as a constant value (data read as read_const does).
  Value constant_value(const onnx::NodeProto& n) {
    std::string what = fmt::format("{}: Constant node '{}'", path, n.name().empty() ? n.output(0) : n.name());
    if (n.attribute_size() != 1) fail(fmt::format("Constant node '{}' needs exactly one value attribute", n.output(0)));
    const auto& a = n.attribute(0);
    Value v;
    v.name = n.output(0);
    v.is_initializer = true;
    std::shared_ptr<const Tensor> data;
    if (a.name() == "value") {
      v.dtype = frontend::proto_dtype(a.t().data_type(), what);
      v.shape = frontend::proto_shape(a.t());
      data = read_const(a.t(), what);
    } else if (a.name() == "value_float") {
      data = std::make_shared<const Tensor>(Tensor::from_floats({}, {a.f()}));
    } else if (a.name() == "value_floats") {
      data = std::make_shared<const Tensor>(
          Tensor::from_floats({a.floats_size()}, std::vector<float>(a.floats().begin(), a.floats().end())));
    } else if (a.name() == "value_int") {
      data = std::make_shared<const Tensor>(Tensor::from_int64s({a.i()}, /*scalar=*/true));
    } else if (a.name() == "value_ints") {
      data =
          std::make_shared<const Tensor>(Tensor::from_int64s(std::vector<int64_t>(a.ints().begin(), a.ints().end())));
    } else {
      fail(fmt::format("Constant node '{}': attribute '{}' is not supported", v.name, a.name()));
    }
    if (data) {
      v.dtype = data->dtype;
      v.shape = data->shape;
    }
    v.data = std::move(data);
    return v;
  }

  void prepare() {
    auto* g = m.mutable_graph();
    std::unordered_set<std::string> init_names;
    for (const auto& t : g->initializer()) init_names.insert(t.name());
    std::unordered_set<std::string> graph_input_names;
    for (const auto& in : g->input()) {
      graph_input_names.insert(in.name());
      if (!init_names.count(in.name()) && !opts.frozen_inputs.count(in.name())) input_names.push_back(in.name());
    }
    // Initializers -> consts; the proto keeps only small ones (as raw_data), large ones become typed inputs.
    google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
    inits.Swap(g->mutable_initializer());
    for (auto& t : inits) {
      Value v = initializer_value(t);
      std::string().swap(*t.mutable_raw_data());  // free the proto's copy early
      expose_const(v, graph_input_names);
      add_const(std::move(v));
    }
    inits.Clear();
    // Frozen inputs -> consts.
    for (const auto& [name, data] : opts.frozen_inputs) {
      if (!graph_input_names.count(name) || init_names.count(name))
        fail(fmt::format("frozen input '{}' is not a graph input", name));
      Value v;
      v.name = name;
      v.dtype = data.dtype;
      v.shape = data.shape;
      v.is_initializer = true;
      v.data = std::make_shared<const Tensor>(data);
      // It leaves the proto's inputs (ONNX data propagation reads initializers that are not inputs) and comes back as
      // an initializer (or, when large, as an input typed with the frozen tensor's exact type).
      auto* ins = g->mutable_input();
      for (int i = 0; i < ins->size(); ++i)
        if (ins->Get(i).name() == name) {
          ins->DeleteSubrange(i, 1);
          break;
        }
      graph_input_names.erase(name);
      expose_const(v, graph_input_names);
      add_const(std::move(v));
    }
    // Constant nodes -> consts.
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    nodes.Swap(g->mutable_node());
    for (auto& n : nodes) {
      if (n.op_type() != "Constant" || !(n.domain().empty() || n.domain() == "ai.onnx") || n.output_size() != 1) {
        *g->add_node() = std::move(n);
        continue;
      }
      Value v = constant_value(n);
      expose_const(v, graph_input_names);
      add_const(std::move(v));
    }
  }

  // Absent optional outputs followed by present ones (LSTM's Y = "" with Y_h) get a name, so that shape inference
  // types them like any other value.
  // The values node `n` reads: its inputs and, recursively, its bodies' (outer-scope reads included).
  static void names_read(const onnx::NodeProto& n, std::vector<std::string>& out) {
    for (const auto& in : n.input())
      if (!in.empty()) out.push_back(in);
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        for (const auto& b : a.g().node()) names_read(b, out);
      for (const auto& gr : a.graphs())
        for (const auto& b : gr.node()) names_read(b, out);
    }
  }

  // ONNX asks for topologically sorted nodes, but some exporters write them unsorted (IS-Net's fp16 model casts its
  // input at node 643 of 734) and ONNX Runtime accepts that: sort them, stably, when they are not. A cycle or a value
  // nobody produces is left to convert() to report.
  void sort_nodes() {
    auto* g = m.mutable_graph();
    const int n = g->node_size();
    std::unordered_map<std::string, int> producer;
    for (int i = 0; i < n; ++i)
      for (const auto& o : g->node(i).output())
        if (!o.empty()) producer.emplace(o, i);
    std::vector<std::vector<int>> users(n);
    std::vector<int> pending(n, 0);
    bool sorted = true;
    std::vector<std::string> reads;
    for (int i = 0; i < n; ++i) {
      reads.clear();
      names_read(g->node(i), reads);
      std::sort(reads.begin(), reads.end());
      reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
      for (const std::string& r : reads) {
        auto p = producer.find(r);
        if (p == producer.end() || p->second == i) continue;
        sorted = sorted && p->second < i;
        users[p->second].push_back(i);
        ++pending[i];
      }
    }
    if (sorted) return;
    std::priority_queue<int, std::vector<int>, std::greater<int>> ready;  // lowest index first: stable
    for (int i = 0; i < n; ++i)
      if (pending[i] == 0) ready.push(i);
    std::vector<int> order;
    while (!ready.empty()) {
      const int i = ready.top();
      ready.pop();
      order.push_back(i);
      for (int u : users[i])
        if (--pending[u] == 0) ready.push(u);
    }
    if (static_cast<int>(order.size()) != n) return;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    nodes.Swap(g->mutable_node());
    for (int i : order) *g->add_node() = std::move(nodes[i]);
  }

  void name_absent_outputs() {
    auto* g = m.mutable_graph();
    auto has_gap = [](const onnx::NodeProto& n) {  // an absent output before a present one
      int last = n.output_size() - 1;
      while (last >= 0 && n.output(last).empty()) --last;
      for (int k = 0; k < last; ++k)
        if (n.output(k).empty()) return true;
      return false;
    };
    if (std::none_of(g->node().begin(), g->node().end(), has_gap)) return;
    std::unordered_set<std::string> taken;
    for (const auto& n : g->node())
      for (const auto& o : n.output()) taken.insert(o);
    const auto names = unique_node_names(g->node());
    for (int ni = 0; ni < g->node_size(); ++ni) {
      auto* n = g->mutable_node(ni);
      int last = n->output_size() - 1;
      while (last >= 0 && n->output(last).empty()) --last;
      for (int k = 0; k < last; ++k) {
        if (!n->output(k).empty()) continue;
        std::string name = fmt::format("{}:unused_output_{}", names[ni], k);
        while (taken.count(name) || const_index.count(name)) name += "_";
        taken.insert(name);
        n->set_output(k, name);
      }
    }
  }

  // opts, with the sequence and optional inputs that opts.structured_inputs lacks read from opts.inputs_dir
  // (DIR/input_<i>.pb, when present); a copy in `storage` only when there are such inputs.
  const LoadOptions& with_structured_inputs(LoadOptions& storage) const {
    std::map<std::string, OnnxValue> read;
    for (const auto& in : m.graph().input()) {
      const bool seq = in.type().has_sequence_type(), opt = in.type().has_optional_type();
      if (opts.inputs_dir.empty() || (!seq && !opt) || opts.structured_inputs.count(in.name())) continue;
      auto k = std::find(input_names.begin(), input_names.end(), in.name());
      if (k == input_names.end()) continue;
      const std::filesystem::path file =
          std::filesystem::path(opts.inputs_dir) / fmt::format("input_{}.pb", k - input_names.begin());
      if (std::filesystem::exists(file))
        read[in.name()] = read_value_pb(file.string(), seq ? ValueKind::kSequence : ValueKind::kOptional);
    }
    if (read.empty()) return opts;
    storage = opts;
    storage.structured_inputs.merge(read);
    return storage;
  }

  // The shapes of the given input tensors: opts.input_shapes, and DIR/input_<i>.pb of opts.inputs_dir for the graph
  // inputs that have a dim without a size (only those files are read: the rest are not needed to bind anything).
  std::map<std::string, Shape> given_shapes() const {
    std::map<std::string, Shape> given = opts.input_shapes;
    if (opts.inputs_dir.empty()) return given;
    for (const auto& in : m.graph().input()) {
      auto k = std::find(input_names.begin(), input_names.end(), in.name());
      if (k == input_names.end() || given.count(in.name()) || !in.type().has_tensor_type()) continue;
      const auto& dims = in.type().tensor_type().shape().dim();
      if (std::all_of(dims.begin(), dims.end(), [](const auto& d) { return d.has_dim_value(); })) continue;
      const std::filesystem::path file =
          std::filesystem::path(opts.inputs_dir) / fmt::format("input_{}.pb", k - input_names.begin());
      if (std::filesystem::exists(file)) given[in.name()] = read_tensor_pb(file.string()).shape;
    }
    return given;
  }

  // Symbolic dims -> sizes: from the given input tensors (given_shapes()), else from --dim (opts.dims).
  std::map<std::string, int64_t> bound_dims(const std::map<std::string, Shape>& given_shapes) const {
    std::map<std::string, int64_t> bound = opts.dims;
    std::map<std::string, std::string> from_input;  // symbol -> the input that bound it
    for (const auto& in : m.graph().input()) {
      auto given = given_shapes.find(in.name());
      if (given == given_shapes.end() || !in.type().has_tensor_type() || !in.type().tensor_type().has_shape()) continue;
      const auto& dims = in.type().tensor_type().shape().dim();
      if (static_cast<size_t>(dims.size()) != given->second.size())
        fail(fmt::format("input '{}' has rank {} but the given input tensor has shape {}", in.name(), dims.size(),
                         shape_str(given->second)));
      for (int i = 0; i < dims.size(); ++i) {
        if (!dims[i].has_dim_param() || dims[i].has_dim_value()) continue;
        const std::string& sym = dims[i].dim_param();
        const int64_t v = given->second[static_cast<size_t>(i)];
        auto [it, fresh] = bound.emplace(sym, v);
        if (fresh || it->second == v) {
          from_input.emplace(sym, in.name());
          continue;
        }
        if (auto f = from_input.find(sym); f != from_input.end())
          fail(fmt::format("dim '{}' is {} in the given input '{}' but {} in input '{}'", sym, it->second, f->second, v,
                           in.name()));
        fail(fmt::format("--dim {}={} but the given input '{}' has {} at dim {}", sym, it->second, in.name(), v, i));
      }
    }
    return bound;
  }

  // The dim_params of a graph input's type (a tensor, or a sequence's or optional's elements).
  static void collect_dim_params(const onnx::TypeProto& t, std::set<std::string>& out) {
    if (t.has_tensor_type())
      for (const auto& d : t.tensor_type().shape().dim())
        if (d.has_dim_param()) out.insert(d.dim_param());
    if (t.has_sequence_type()) collect_dim_params(t.sequence_type().elem_type(), out);
    if (t.has_optional_type()) collect_dim_params(t.optional_type().elem_type(), out);
  }

  // Every --dim names a symbolic dim of the model's inputs or, once the graph is typed, a data-dependent dim (whose
  // bound it gives): a misspelt one would bind nothing, silently. Checked on the typed graph `g`.
  void check_dim_names(const Graph& g) const {
    const std::set<std::string>& names = input_dim_names;
    for (const auto& [name, value] : opts.dims) {
      if (names.count(name) || g.runtime_dims.count(name)) continue;
      std::vector<std::string> runtime;
      for (const auto& [sym, d] : g.runtime_dims) runtime.push_back(sym);
      fail(fmt::format(
          "--dim {}={}: the model's inputs have no dim named '{}' ({}{})", cut_text(name), value, cut_text(name),
          names.empty()
              ? std::string("their dims are all static")
              : fmt::format("their symbolic dims: {}", cut_text(fmt::format("{}", fmt::join(names, ", ")), 200)),
          runtime.empty() ? std::string()
                          : fmt::format("; its data-dependent dims: {}",
                                        cut_text(fmt::format("{}", fmt::join(runtime, ", ")), 200))));
    }
  }

  // Every --hint names a symbol that loading keeps (a misspelt one would change nothing, silently).
  void check_hint_names() const {
    for (const auto& [name, value] : opts.hints) {
      if (hints.count(name)) continue;
      if (input_dim_names.count(name))
        fail(fmt::format("--hint {}={}: '{}' is bound{}, so it has no hint", cut_text(name), value, cut_text(name),
                         opts.keep_symbols ? " by --dim or --inputs"
                                           : " here (--training, --pipeline and --auto need sizes: use --dim)"));
      fail(fmt::format(
          "--hint {}={}: the model's inputs have no dim named '{}' ({})", cut_text(name), value, cut_text(name),
          input_dim_names.empty() ? std::string("their dims are all static")
                                  : fmt::format("their symbolic dims: {}",
                                                cut_text(fmt::format("{}", fmt::join(input_dim_names, ", ")), 200))));
    }
  }

  // opts.keep_symbols: input `name`'s dim i (of `rank`) is the symbol `sym`, with its --hint or else the next hint
  // (kFirstDimHint's sequence of primes) when it is new.
  void keep_symbol(const std::string& name, int i, int rank, const std::string& sym) {
    if (auto given = opts.hints.find(sym); given != opts.hints.end() && !hints.count(sym)) hints[sym] = given->second;
    if (!hints.count(sym)) {
      int64_t h = hints.empty() ? kFirstDimHint
                                : std::max_element(
                                      hints.begin(), hints.end(),
                                      [](auto& a, auto& b) {
                                        return a.second < b.second;
                                      })->second +
                                      2;
      auto prime = [](int64_t x) {
        for (int64_t k = 2; k * k <= x; ++k)
          if (x % k == 0) return false;
        return true;
      };
      while (!prime(h)) h += 2;
      hints[sym] = h;
    }
    auto& dims = symbolic_inputs[name];
    if (dims.empty()) dims.assign(static_cast<size_t>(rank), DimExpr());
    dims[static_cast<size_t>(i)] = DimExpr::symbol(sym);
  }

  void bind_dims() {
    for (const auto& in : m.graph().input())
      if (!const_index.count(in.name())) collect_dim_params(in.type(), input_dim_names);
    const std::map<std::string, Shape> given_shapes = this->given_shapes();
    const std::map<std::string, int64_t> bound = bound_dims(given_shapes);
    auto* g = m.mutable_graph();
    for (auto& in : *g->mutable_input()) {
      if (const_index.count(in.name())) continue;
      if (in.type().has_sequence_type() || in.type().has_optional_type()) continue;  // bound by fold.cc
      if (!in.type().has_tensor_type()) fail(fmt::format("input '{}' is not a tensor", in.name()));
      auto* tt = in.mutable_type()->mutable_tensor_type();
      if (!tt->has_shape()) fail(fmt::format("input '{}' has no shape", in.name()));
      auto given = given_shapes.find(in.name());
      for (int i = 0; i < tt->shape().dim_size(); ++i) {
        auto* d = tt->mutable_shape()->mutable_dim(i);
        if (d->has_dim_value()) {
          if (d->dim_value() < 0) fail(fmt::format("input '{}' dim {} is negative", in.name(), i));
          continue;
        }
        if (given != given_shapes.end()) {  // an unnamed dim takes the given tensor's size
          d->set_dim_value(given->second.at(static_cast<size_t>(i)));
          continue;
        }
        const std::string sym = d->has_dim_param() ? d->dim_param() : "";
        if (sym.empty())
          fail(fmt::format("input '{}' dim {} is unknown (the model gives neither a size nor a name)", in.name(), i));
        auto it = bound.find(sym);
        if (it == bound.end() && opts.keep_symbols) {
          keep_symbol(in.name(), i, tt->shape().dim_size(), sym);
          d->set_dim_value(hints.at(sym));
          continue;
        }
        if (it == bound.end())
          fail(fmt::format("input '{}' dim {} '{}' is symbolic: bind it with --dim {}=N", in.name(), i, sym, sym));
        if (it->second < 0) fail(fmt::format("--dim {}={}: a size must be >= 0", sym, it->second));
        d->set_dim_value(it->second);
      }
    }
    check_hint_names();
    // The same symbols elsewhere (outputs, value_info) are bound too, so stale annotations cannot conflict.
    auto bind = [&](onnx::ValueInfoProto& vi) {
      if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
      for (auto& d : *vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim()) {
        if (!d.has_dim_param()) continue;
        auto it = bound.find(d.dim_param());
        if (it != bound.end()) d.set_dim_value(it->second);
        // A kept symbol's hint is not the model's size: let inference type what it says.
        if (hints.count(d.dim_param())) d.clear_dim_param();
      }
    };
    for (auto& vi : *g->mutable_output()) bind(vi);
    for (auto& vi : *g->mutable_value_info()) bind(vi);
  }

  // Every value a node reads is defined before it: a graph input, an initializer, an earlier node's output, and in a
  // body also its own inputs and the enclosing graphs' values defined before its node. Checked before ONNX's shape
  // inference, which crashed (SIGSEGV in onnx 1.12) on nodes that read undefined values (found by the model fuzzer);
  // the messages are convert()'s.
  void check_reads_defined() const {
    const auto& g = m.graph();
    std::unordered_set<std::string> defined;
    for (const auto& in : g.input()) defined.insert(in.name());
    for (const auto& t : g.initializer()) defined.insert(t.name());
    for (int ni = 0; ni < g.node_size(); ++ni) {
      const auto& n = g.node(ni);
      for (const auto& in : n.input())
        if (!in.empty() && !defined.count(in))
          fail(
              fmt::format("node '{}' ({}) reads '{}' before it is defined (missing value or graph not topologically "
                          "sorted)",
                          node_label(ni), n.op_type(), in));
      for (const auto& a : n.attribute()) {
        if (a.has_g()) check_body_reads(a.g(), defined, ni);
        for (const auto& b : a.graphs()) check_body_reads(b, defined, ni);
      }
      for (const auto& o : n.output())
        if (!o.empty()) defined.insert(o);
    }
  }

  // check_reads_defined for body `b` of top-level node `ni`, which sees the values `defined` before it.
  void check_body_reads(const onnx::GraphProto& b, std::unordered_set<std::string> defined, int ni) const {
    for (const auto& in : b.input()) defined.insert(in.name());
    for (const auto& t : b.initializer()) defined.insert(t.name());
    for (const auto& n : b.node()) {
      for (const auto& in : n.input())
        if (!in.empty() && !defined.count(in))
          fail(fmt::format("node '{}' ({}): its body reads '{}', which is not defined before it", node_label(ni),
                           m.graph().node(ni).op_type(), in));
      for (const auto& a : n.attribute()) {
        if (a.has_g()) check_body_reads(a.g(), defined, ni);
        for (const auto& inner : a.graphs()) check_body_reads(inner, defined, ni);
      }
      for (const auto& o : n.output())
        if (!o.empty()) defined.insert(o);
    }
  }

  // The convolutions and pools whose operands' ranks are known before shape inference (graph inputs, initializers,
  // value_info) have the ranks the ONNX spec gives: X [N, C, D1, ...] (rank >= 3), W of X's rank, and spatial
  // attributes of rank - 2 entries (pads: twice that), and positive strides, dilations and kernel sizes. Checked
  // before ONNX's shape inference, whose convolution and pool functions crashed (onnx 1.12: SIGSEGV on a rank-2 X,
  // SIGFPE on a stride of 0; found by the model fuzzers).
  void check_conv_pool_ranks() const {
    const auto& g = m.graph();
    static const std::unordered_set<std::string> kOps = {"Conv",    "ConvTranspose", "ConvInteger", "QLinearConv",
                                                         "MaxPool", "AveragePool",   "LpPool"};
    if (std::none_of(g.node().begin(), g.node().end(), [](const auto& n) { return kOps.count(n.op_type()) != 0; }))
      return;
    std::unordered_map<std::string, int> rank;
    for (const auto& t : g.initializer()) rank[t.name()] = t.dims_size();
    for (const auto* list : {&g.input(), &g.value_info()})
      for (const auto& v : *list)
        if (v.type().has_tensor_type() && v.type().tensor_type().has_shape())
          rank[v.name()] = v.type().tensor_type().shape().dim_size();
    for (int ni = 0; ni < g.node_size(); ++ni) {
      const auto& n = g.node(ni);
      if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
      if (!kOps.count(n.op_type()) || n.input_size() == 0) continue;
      auto bad = [&](const std::string& what) {
        fail(fmt::format("node '{}' ({}): {}", node_label(ni), n.op_type(), what));
      };
      for (const auto& a : n.attribute())  // onnx 1.12 divided by a stride of 0 (SIGFPE, found by the fuzzer)
        if (a.name() == "strides" || a.name() == "dilations" || a.name() == "kernel_shape")
          for (int64_t v : a.ints())
            if (v < 1) bad(fmt::format("attribute '{}' has the entry {}; each must be positive", a.name(), v));
      auto r = rank.find(n.input(0));
      if (r == rank.end()) continue;
      const int x = r->second;
      if (x < 3) bad(fmt::format("input '{}' has rank {}; the spec needs [N, C, D1, ...] (rank >= 3)", n.input(0), x));
      const int wi = n.op_type() == "QLinearConv" ? 3 : 1;
      const bool conv = n.op_type().rfind("Conv", 0) == 0 || n.op_type() == "QLinearConv";
      if (conv && n.input_size() > wi)
        if (auto w = rank.find(n.input(wi)); w != rank.end() && w->second != x)
          bad(fmt::format("weight '{}' has rank {}, input '{}' rank {}", n.input(wi), w->second, n.input(0), x));
      for (const auto& a : n.attribute()) {
        const int want = a.name() == "pads" ? 2 * (x - 2)
                         : a.name() == "kernel_shape" || a.name() == "strides" || a.name() == "dilations" ||
                                 a.name() == "output_padding"
                             ? x - 2
                             : -1;
        if (want >= 0 && a.ints_size() != want)
          bad(fmt::format("attribute '{}' has {} entries; an input of rank {} needs {}", a.name(), a.ints_size(), x,
                          want));
      }
    }
  }

  // A ConstantOfShape or a Range on constants may not ask for more than kMaxConstantElements elements: ONNX's shape
  // inference (onnx 1.12) makes the length of such a 1-D tensor the rank of an Expand or Reshape that reads it as its
  // shape and allocates one dim per element (out of memory at 7e16, found by the model fuzzer); and a
  // SplitToSequence's scalar split on a constant must be positive (onnx 1.12 divides by it). Checked before it.
  void check_constant_sizes() const {
    // a small constant's elements (prepare() read its data), as doubles
    auto values = [&](const std::string& name) -> std::optional<std::vector<double>> {
      auto it = const_index.find(name);
      const Tensor* t = it == const_index.end() ? nullptr : consts[it->second].data.get();
      if (!t || t->numel() > 8) return std::nullopt;
      if (t->dtype == DType::kFloat32) return std::vector<double>(t->data<float>(), t->data<float>() + t->numel());
      if (t->dtype == DType::kFloat64) return std::vector<double>(t->data<double>(), t->data<double>() + t->numel());
      if (t->dtype != DType::kInt64 && t->dtype != DType::kInt32) return std::nullopt;
      const std::vector<int64_t> v = t->as_int64s();
      return std::vector<double>(v.begin(), v.end());
    };
    const auto& g = m.graph();
    for (int ni = 0; ni < g.node_size(); ++ni) {
      const auto& n = g.node(ni);
      if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
      double elements = -1;
      if (n.op_type() == "ConstantOfShape" && n.input_size() >= 1) {
        if (auto v = values(n.input(0))) {
          elements = 1;
          for (double d : *v) elements *= std::max(d, 0.0);
        }
      } else if (n.op_type() == "Range" && n.input_size() == 3) {
        auto a = values(n.input(0)), b = values(n.input(1)), c = values(n.input(2));
        if (a && b && c && a->size() == 1 && b->size() == 1 && c->size() == 1 && (*c)[0] != 0)
          elements = std::max(std::ceil(((*b)[0] - (*a)[0]) / (*c)[0]), 0.0);
      } else if (n.op_type() == "SplitToSequence" && n.input_size() >= 2) {
        // a scalar split is the chunk length, which onnx 1.12's inference divides by (SIGFPE on 0, found by the
        // model fuzzer: fuzz/corpus/model/crash-split-to-sequence-zero.onnx)
        auto it = const_index.find(n.input(1));
        const Tensor* t = it == const_index.end() ? nullptr : consts[it->second].data.get();
        if (t && t->shape.empty() && (t->dtype == DType::kInt64 || t->dtype == DType::kInt32) && t->as_int64s()[0] <= 0)
          fail(
              fmt::format("node '{}' (SplitToSequence): the split '{}' is {}; a scalar split is a chunk length and "
                          "must be positive",
                          node_label(ni), cut_text(n.input(1)), t->as_int64s()[0]));
      }
      if (elements > static_cast<double>(kMaxConstantElements))
        fail(
            fmt::format("node '{}' ({}): its output would hold {:.3g} elements, more than the {} a tensor may "
                        "hold here",
                        node_label(ni), n.op_type(), elements, kMaxConstantElements));
    }
  }

  void infer() {
    // Before IR 4, shape inference types only the initializers listed as graph inputs; the constants exposed here
    // (initializers, Constant outputs, folded values) are not, so the proto says IR 4 from here on.
    if (m.ir_version() < 4) m.set_ir_version(4);
    register_gspmd_schemas();  // a device model's collectives are typed (and checked) by their schemas
    const onnx::ShapeInferenceOptions options(true, 1, true);
    try {
      onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
      return;
    } catch (const std::exception&) {
    }
    // Exporters sometimes leave stale value_info that contradicts inference: retry once from the inputs alone.
    try {
      m.mutable_graph()->clear_value_info();
      onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
    } catch (const std::exception& e) {
      fail(fmt::format("shape inference failed: {}", first_line(e.what())));
    }
  }

  // The bodies of one node's GRAPH attributes, and the outer-scope names they read (see convert_attrs).
  struct Bodies {
    std::vector<std::shared_ptr<Graph>> graphs;
    std::vector<std::string> captures;
  };

  AttrValue convert_attr(const onnx::NodeProto& n, const std::string& node_name, const onnx::AttributeProto& a,
                         Bodies& bodies) {
    using AP = onnx::AttributeProto;
    auto type = a.type();
    if (type == AP::UNDEFINED) {  // very old models: infer from the field that is set
      if (a.has_f())
        type = AP::FLOAT;
      else if (a.has_i())
        type = AP::INT;
      else if (a.has_s())
        type = AP::STRING;
      else if (a.has_t())
        type = AP::TENSOR;
      else if (a.has_g() || a.graphs_size())
        type = AP::GRAPH;
      else if (a.floats_size())
        type = AP::FLOATS;
      else if (a.strings_size())
        type = AP::STRINGS;
      else
        type = AP::INTS;
    }
    switch (type) {
      case AP::FLOAT: return a.f();
      case AP::INT: return static_cast<int64_t>(a.i());
      case AP::STRING: return a.s();
      case AP::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
      case AP::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
      case AP::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
      case AP::TENSOR:
        return tensor_from_proto(a.t(), external,
                                 fmt::format("{}: node '{}' attribute '{}'", path, node_name, a.name()));
      case AP::GRAPH:
        bodies.graphs.push_back(convert_body(a.g(), bodies.captures));
        return std::shared_ptr<const Graph>(bodies.graphs.back());
      case AP::TYPE_PROTO: {  // Optional's `type`: [1 for a sequence else 0, element type] (sequences.cc)
        const onnx::TypeProto* t = &a.tp();
        const bool sequence = t->has_sequence_type();
        if (sequence) t = &t->sequence_type().elem_type();
        return std::vector<int64_t>{sequence ? 1 : 0, t->has_tensor_type() ? t->tensor_type().elem_type() : 0};
      }
      case AP::GRAPHS:
        fail(fmt::format("node '{}' ({}): attribute '{}' holds a list of graphs, which is not supported", node_name,
                         n.op_type(), a.name()));
      default:
        fail(fmt::format("node '{}' ({}): attribute '{}' has an unsupported type", node_name, n.op_type(), a.name()));
    }
  }

  using TypeMap = std::unordered_map<std::string, const onnx::TypeProto*>;

  static TypeMap type_map(const onnx::GraphProto& pg) {
    TypeMap types;
    for (const auto& vi : pg.value_info()) types[vi.name()] = &vi.type();
    for (const auto& vi : pg.output()) types[vi.name()] = &vi.type();
    for (const auto& vi : pg.input()) types[vi.name()] = &vi.type();
    return types;
  }

  // A value typed as `types` says. Without a static tensor type it has no shape and goes to `unknown`; without
  // `unknown` (in a body) its dtype is kUndefined too.
  Value typed_value(const std::string& name, const TypeMap& types, std::unordered_set<std::string>* unknown) {
    Value v;
    v.name = name;
    auto it = types.find(name);
    bool known = false;
    if (it != types.end() && it->second->has_tensor_type()) {
      const auto& tt = it->second->tensor_type();
      if (tt.elem_type() != 0)
        v.dtype = frontend::proto_dtype(tt.elem_type(), fmt::format("{}: value '{}'", path, name));
      if (tt.has_shape() && v.dtype != DType::kUndefined) {
        known = true;
        for (const auto& d : tt.shape().dim()) {
          if (!d.has_dim_value() || d.dim_value() < 0)
            known = false;
          else
            v.shape.push_back(d.dim_value());
        }
      }
    }
    if (it != types.end() && !it->second->has_tensor_type() &&
        it->second->value_case() != onnx::TypeProto::VALUE_NOT_SET) {
      const onnx::TypeProto* element = nullptr;
      if (it->second->has_sequence_type()) {
        v.kind = ValueKind::kSequence;
        element = &it->second->sequence_type().elem_type();
      } else if (it->second->has_optional_type()) {
        v.kind = ValueKind::kOptional;
        element = &it->second->optional_type().elem_type();
        if (element->has_sequence_type()) element = &element->sequence_type().elem_type();
      } else {
        non_tensor[name] = it->second->has_map_type() ? "map" : "non-tensor value";
      }
      if (element && element->has_tensor_type() && element->tensor_type().elem_type() != 0)
        v.dtype = frontend::proto_dtype(element->tensor_type().elem_type(), fmt::format("{}: value '{}'", path, name));
      if (v.kind != ValueKind::kTensor) {  // a sequence or optional: fold.cc lowers it (docs/sequences.md)
        if (unknown) unknown->insert(name);
        return v;
      }
    }
    if (!known) {
      if (unknown)
        unknown->insert(name);
      else
        v.dtype = DType::kUndefined;
      v.shape.clear();
    }
    return v;
  }

  static Value untyped(const std::string& name) {
    Value v;
    v.name = name;
    return v;
  }

  // Node `n`'s attributes from `pn`. The outer-scope values its bodies read (resolved by `resolve`) are appended to
  // its inputs, and to every body's inputs, in first-use order; `gspmd_captures` counts them (ir.h).
  void convert_attrs(const onnx::NodeProto& pn, Node& n, const std::function<int(const std::string&)>& resolve) {
    Bodies bodies;
    for (const auto& a : pn.attribute()) n.attrs.emplace(a.name(), convert_attr(pn, n.name, a, bodies));
    // Before opset 19 ONNX's reference Cast truncates float32 to bfloat16 (onnx 1.12's test data); the model's own
    // Casts keep that, every other rounding to bfloat16 (kernels' outputs, the Casts --precision, the partitioner and
    // the step builder insert) is to nearest even, as TPUs and torch round (backend/kernels: cast_tensor).
    if (opset < 19 && (pn.domain().empty() || pn.domain() == "ai.onnx") &&
        (pn.op_type() == "Cast" || pn.op_type() == "CastLike"))
      n.attrs["gspmd_truncate_bf16"] = int64_t{1};
    const std::vector<std::string>& captures = bodies.captures;
    if (captures.empty()) return;
    for (const std::shared_ptr<Graph>& b : bodies.graphs)
      for (const std::string& name : captures) {
        int id = b->find(name);
        if (id < 0) id = b->add_value(untyped(name));
        b->inputs.push_back(id);
      }
    for (const std::string& name : captures) n.inputs.push_back(resolve(name));
    n.attrs["gspmd_captures"] = static_cast<int64_t>(captures.size());
  }

  // The Node of proto node `pn`, named `name`, without outputs and attributes: op type, domain ("" for ai.onnx), inputs
  // by `resolve` (-1 for an absent optional input).
  static Node node_of(const onnx::NodeProto& pn, const std::string& name,
                      const std::function<int(const std::string&)>& resolve) {
    Node n;
    n.name = name;
    n.op_type = pn.op_type();
    n.domain = pn.domain() == "ai.onnx" ? "" : pn.domain();
    for (const auto& in : pn.input()) n.inputs.push_back(in.empty() ? -1 : resolve(in));
    return n;
  }

  // Absent optional outputs in the middle get a name; trailing ones are dropped.
  static std::vector<std::string> output_names(const onnx::NodeProto& pn, const std::string& node_name,
                                               const Graph& g) {
    std::vector<std::string> out;
    int last = pn.output_size() - 1;
    while (last >= 0 && pn.output(last).empty()) --last;
    for (int k = 0; k <= last; ++k) {
      std::string name = pn.output(k);
      if (name.empty()) {
        name = fmt::format("{}:unused_output_{}", node_name, k);
        while (g.find(name) >= 0) name += "_";
      }
      out.push_back(std::move(name));
    }
    return out;
  }

  // A body (GRAPH attribute) -> Graph: formal inputs typed from the proto where it says, initializers and Constant
  // nodes as constants, other values typed from ONNX inference's value_info where static, else kUndefined (fold.cc
  // types the rest).
  // Names it reads but does not define are appended to `captures` (no repeats) and become values of the body that
  // are not inputs yet (convert_attrs makes them its trailing inputs).
  std::shared_ptr<Graph> convert_body(const onnx::GraphProto& pg, std::vector<std::string>& captures) {
    auto b = std::make_shared<Graph>();
    b->name = pg.name();
    b->opset = opset;
    const TypeMap types = type_map(pg);
    auto define = [&](Value v) {
      if (b->find(v.name) >= 0) fail(fmt::format("body '{}': value '{}' is defined twice", b->name, v.name));
      return b->add_value(std::move(v));
    };
    for (const auto& in : pg.input()) b->inputs.push_back(define(typed_value(in.name(), types, nullptr)));
    for (const auto& t : pg.initializer()) define(initializer_value(t));
    auto resolve = [&](const std::string& name) {
      int id = b->find(name);
      if (id >= 0) return id;
      if (std::find(captures.begin(), captures.end(), name) == captures.end()) captures.push_back(name);
      return b->add_value(untyped(name));
    };
    const std::vector<std::string> names = unique_node_names(pg.node());
    for (int ni = 0; ni < pg.node_size(); ++ni) {
      const auto& pn = pg.node(ni);
      if (pn.op_type() == "Constant" && (pn.domain().empty() || pn.domain() == "ai.onnx") && pn.output_size() == 1) {
        define(constant_value(pn));
        continue;
      }
      Node n = node_of(pn, names[ni], resolve);
      convert_attrs(pn, n, resolve);
      for (const std::string& name : output_names(pn, n.name, *b))
        n.outputs.push_back(define(typed_value(name, types, nullptr)));
      b->add_node(std::move(n));
    }
    for (const auto& out : pg.output()) b->outputs.push_back(resolve(out.name()));
    return b;
  }

  // Proto (after inference) -> Graph. Values whose type is not a static tensor type are listed in `unknown`.
  Graph convert(std::unordered_set<std::string>& unknown) {
    const auto& pg = m.graph();
    Graph g;
    g.name = pg.name();
    g.opset = opset;
    const TypeMap types = type_map(pg);
    auto make_value = [&](const std::string& name) { return typed_value(name, types, &unknown); };
    for (const Value& c : consts) g.add_value(c);
    for (const auto& name : input_names) {
      if (g.find(name) >= 0) fail(fmt::format("graph input '{}' is defined twice", name));
      g.inputs.push_back(g.add_value(make_value(name)));
      if (auto s = symbolic_inputs.find(name); s != symbolic_inputs.end()) {
        Value& v = g.values[static_cast<size_t>(g.inputs.back())];
        std::vector<DimExpr> dims = s->second;
        for (size_t i = 0; i < dims.size() && i < v.shape.size(); ++i)  // the static dims
          if (dims[i] == DimExpr()) dims[i] = v.shape[i];
        v.sym = std::make_shared<const SymbolicValue>(SymbolicValue{std::move(dims), std::nullopt});
      }
    }
    g.dim_hints = hints;
    const std::vector<std::string> names = unique_node_names(pg.node());
    for (int ni = 0; ni < pg.node_size(); ++ni) {
      const auto& pn = pg.node(ni);
      Node n = node_of(pn, names[ni], [&](const std::string& in) {
        int id = g.find(in);
        if (id < 0)
          fail(
              fmt::format("node '{}' ({}) reads '{}' before it is defined (missing value or graph not "
                          "topologically sorted)",
                          names[ni], pn.op_type(), in));
        return id;
      });
      for (const std::string& name : output_names(pn, n.name, g)) {
        if (g.find(name) >= 0) fail(fmt::format("value '{}' is defined twice (node '{}')", name, n.name));
        n.outputs.push_back(g.add_value(make_value(name)));
      }
      convert_attrs(pn, n, [&](const std::string& name) {
        int id = g.find(name);
        if (id < 0)
          fail(fmt::format("node '{}' ({}): its body reads '{}', which is not defined before it", n.name, n.op_type,
                           name));
        return id;
      });
      g.add_node(std::move(n));
    }
    for (const auto& out : pg.output()) {
      int id = g.find(out.name());
      if (id < 0) fail(fmt::format("graph output '{}' is not produced by any node, input or initializer", out.name()));
      g.outputs.push_back(id);
    }
    return g;
  }
};

}  // namespace

Graph load_model(const std::string& path, const LoadOptions& opts, LoadReport* report) {
  Loader L(path, opts);
  L.parse();
  const bool annotated = frontend::has_sharding_annotations(L.m);
  L.prepare();
  L.sort_nodes();
  L.name_absent_outputs();
  L.bind_dims();
  LoadReport local;
  LoadReport& rep = report ? *report : local;
  rep = {};
  rep.sharding_annotations = annotated;
  L.check_reads_defined();
  L.check_conv_pool_ranks();
  L.check_constant_sizes();
  L.infer();
  std::unordered_set<std::string> unknown;
  Graph g = L.convert(unknown);
  frontend::simplify_for_inference(g, rep);
  g.prune();
  std::map<std::string, std::string> why;
  try {
    LoadOptions with_inputs;
    frontend::infer_and_fold(g, unknown, why, L.with_structured_inputs(with_inputs), rep);
  } catch (const InputError& e) {
    L.fail(e.what());
  }
  L.check_dim_names(g);
  {  // prune renumbers the values: the signature follows them by name
    std::vector<std::vector<std::string>> names;
    for (const auto* sig : {&rep.inputs, &rep.outputs})
      for (const FlatValue& f : *sig) {
        names.emplace_back();
        for (int v : f.values) names.back().push_back(g.values[static_cast<size_t>(v)].name);
      }
    g.prune();
    size_t k = 0;
    for (auto* sig : {&rep.inputs, &rep.outputs})
      for (FlatValue& f : *sig) {
        for (size_t e = 0; e < f.values.size(); ++e) f.values[e] = g.find(names[k][e]);
        ++k;
      }
  }
  for (const Value& v : g.values) {
    if (auto nt = L.non_tensor.find(v.name); nt != L.non_tensor.end())
      L.fail(fmt::format("value '{}' is a {}, which is not supported (only tensors, sequences and optionals are)",
                         v.name, nt->second));
    if (!unknown.count(v.name)) continue;
    std::string by = v.producer >= 0 ? fmt::format(" (output of node '{}' ({}))", g.nodes[v.producer].name,
                                                   g.nodes[v.producer].op_type)
                                     : "";
    auto w = why.find(v.name);
    L.fail(fmt::format("value '{}'{} {}", v.name, by,
                       w != why.end() ? w->second : "has no static shape after shape inference and constant folding"));
  }
  for (const Value& v : g.values)
    if (v.kind != ValueKind::kTensor)  // every node reading it was lowered (sequences.cc): a bug if not
      L.fail(fmt::format("value '{}' is a {} that is still read after lowering", v.name,
                         v.kind == ValueKind::kSequence ? "sequence" : "optional"));
  for (const Value& v : g.values) {
    if (v.dtype == DType::kString) L.fail(fmt::format("value '{}' is a string tensor, which is not supported", v.name));
    if (dtype_name(v.dtype) == "undefined") L.fail(fmt::format("value '{}' has no element type", v.name));
    // sizes the cost model and the executor multiply (a Tile to 2^65 elements overflowed them)
    int64_t bytes = static_cast<int64_t>(dtype_size(v.dtype));
    for (int64_t d : v.shape)
      if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > Loader::kMaxValueBytes)
        L.fail(fmt::format("value '{}' has the shape {}: {}", cut_text(v.name), cut_text(shape_str(v.shape), 200),
                           d < 0 ? "a negative dim" : "more than 2^50 bytes (1 PiB), the limit of a value"));
  }
  try {
    g.verify();
  } catch (const std::exception& e) {
    L.fail(e.what());
  }
  return g;
}

}  // namespace gspmd
