// The loader's checks of hostile or malformed models (loader_impl.h): names, function calls, node schemas,
// values read before they are defined, windows, constant sizes.
#include "onnx_frontend/loader_impl.h"

namespace gspmd::loader_internal {

void Loader::check_function_calls() const {
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

bool Loader::changed_after_onnx_1_12(const std::string& op) {
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

void Loader::check_utf8_names(const onnx::GraphProto& g) const {
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

bool Loader::is_utf8(std::string_view s) {
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

void Loader::verify_nodes(const onnx::GraphProto& g, int64_t schema_opset, bool newer) {
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& n = g.node(i);
    auto who = [&] {
      return fmt::format("node '{}' ({})", n.name().empty() ? fmt::format("#{}", i) : cut_text(n.name()), n.op_type());
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

void Loader::check_reads_defined() const {
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

void Loader::check_body_reads(const onnx::GraphProto& b, std::unordered_set<std::string> defined, int ni) const {
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

void Loader::check_conv_pool_ranks() const {
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

void Loader::check_constant_sizes() const {
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

}  // namespace gspmd::loader_internal
