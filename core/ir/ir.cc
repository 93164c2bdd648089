#include "core/ir/ir.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gspmd {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8: return 1;
    case DType::kUInt16:
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32:
    case DType::kUInt32: return 4;
    case DType::kInt64:
    case DType::kUInt64:
    case DType::kFloat64: return 8;
    default: throw std::invalid_argument(fmt::format("dtype {} has no fixed element size", dtype_name(t)));
  }
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUInt16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kString: return "string";
    case DType::kBool: return "bool";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kUInt32: return "uint32";
    case DType::kUInt64: return "uint64";
    case DType::kBFloat16: return "bfloat16";
    default: return "undefined";
  }
}

int64_t num_elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;  // a size past every limit
  return n;
}

std::string shape_str(const Shape& s) { return fmt::format("[{}]", fmt::join(s, ",")); }

std::string type_str(DType t, const Shape& s) { return fmt::format("{}{}", dtype_name(t), shape_str(s)); }

Tensor::Tensor(DType t, Shape s) : dtype(t), shape(std::move(s)) {
  bytes.assign(static_cast<size_t>(num_elements(shape)) * dtype_size(dtype), std::byte{0});
}

std::vector<int64_t> Tensor::as_int64s() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (dtype) {
      case DType::kInt64: out[i] = data<int64_t>()[i]; break;
      case DType::kInt32: out[i] = data<int32_t>()[i]; break;
      case DType::kFloat32: out[i] = saturate_cast<int64_t>(data<float>()[i]); break;
      case DType::kFloat64: out[i] = saturate_cast<int64_t>(data<double>()[i]); break;
      case DType::kBool:
      case DType::kUInt8: out[i] = data<uint8_t>()[i]; break;
      case DType::kInt8: out[i] = data<int8_t>()[i]; break;
      default: throw SpecError(fmt::format("cannot read {} tensor as integers", dtype_name(dtype)));
    }
  }
  return out;
}

Tensor Tensor::from_int64s(const std::vector<int64_t>& v, bool scalar) {
  Tensor t(DType::kInt64, scalar && v.size() == 1 ? Shape{} : Shape{static_cast<int64_t>(v.size())});
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(int64_t));
  return t;
}

Tensor Tensor::from_floats(const Shape& shape, const std::vector<float>& v) {
  Tensor t(DType::kFloat32, shape);
  if (static_cast<int64_t>(v.size()) != t.numel())
    throw std::invalid_argument(fmt::format("{} floats for shape {}", v.size(), shape_str(shape)));
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor Tensor::filled(DType t, const Shape& shape, double v) {
  Tensor r(t, shape);
  auto fill = [&](auto x) { std::fill_n(r.data<decltype(x)>(), r.numel(), x); };
  switch (t) {
    case DType::kFloat32: fill(static_cast<float>(v)); break;
    case DType::kFloat64: fill(v); break;
    case DType::kFloat16: fill(float_to_half(static_cast<float>(v))); break;
    case DType::kBFloat16: fill(float_to_bf16(static_cast<float>(v))); break;
    default: throw std::invalid_argument(fmt::format("{} is not a floating-point type", dtype_name(t)));
  }
  return r;
}

namespace {
template <class T>
const T& get_attr(const Node& n, const std::string& a) {
  const auto& v = n.attrs.at(a);
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw SpecError(fmt::format("node '{}' ({}): attribute '{}' has the wrong type", n.name, n.op_type, a));
}
}  // namespace

int64_t Node::i(const std::string& a, int64_t def) const { return has(a) ? get_attr<int64_t>(*this, a) : def; }
float Node::f(const std::string& a, float def) const { return has(a) ? get_attr<float>(*this, a) : def; }
std::string Node::s(const std::string& a, const std::string& def) const {
  return has(a) ? get_attr<std::string>(*this, a) : def;
}
std::vector<int64_t> Node::ints(const std::string& a, const std::vector<int64_t>& def) const {
  return has(a) ? get_attr<std::vector<int64_t>>(*this, a) : def;
}
std::vector<float> Node::floats(const std::string& a, const std::vector<float>& def) const {
  return has(a) ? get_attr<std::vector<float>>(*this, a) : def;
}
const Tensor* Node::t(const std::string& a) const { return has(a) ? &get_attr<Tensor>(*this, a) : nullptr; }
const Graph* Node::g(const std::string& a) const {
  return has(a) ? get_attr<std::shared_ptr<const Graph>>(*this, a).get() : nullptr;
}
bool Node::has_body() const {
  return std::any_of(attrs.begin(), attrs.end(),
                     [](const auto& kv) { return std::holds_alternative<std::shared_ptr<const Graph>>(kv.second); });
}

int Graph::add_value(Value v) {
  const int id = static_cast<int>(values.size());
  if (!index_.try_emplace(v.name, id).second)
    throw std::invalid_argument(fmt::format("duplicate value name '{}'", v.name));
  values.push_back(std::move(v));
  return id;
}

int Graph::add_value_unique(const std::string& hint, DType t, const Shape& s) {
  // Suffixes continue from the last one given for this hint: probing from 1 each time would make k values with
  // one hint (the partitioner's "shape" constants) cost O(k^2) lookups. Each probe inserts when the name is free.
  const int id = static_cast<int>(values.size());
  Value v;
  v.name = hint;
  if (!index_.try_emplace(hint, id).second) {
    int& k = next_suffix_[hint];
    do v.name = fmt::format("{}_{}", hint, ++k);
    while (!index_.try_emplace(v.name, id).second);
  }
  v.dtype = t;
  v.shape = s;
  values.push_back(std::move(v));
  return id;
}

int Graph::add_node(Node n) {
  int id = static_cast<int>(nodes.size());
  for (int o : n.outputs) values.at(o).producer = id;
  nodes.push_back(std::move(n));
  return id;
}

void Graph::rename(int v, const std::string& name) {
  std::string& old = values.at(static_cast<size_t>(v)).name;
  if (old == name) return;
  if (!index_.try_emplace(name, v).second)
    throw std::invalid_argument(fmt::format("rename: value name '{}' is taken", name));
  index_.erase(old);
  old = name;
}

void Graph::reserve(size_t nv, size_t nn) {
  values.reserve(nv);
  nodes.reserve(nn);
  index_.reserve(nv);
}

int Graph::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

int Graph::at(std::string_view name) const {
  int id = find(name);
  if (id < 0) throw std::out_of_range(fmt::format("unknown value '{}'", name));
  return id;
}

std::vector<std::vector<int>> Graph::consumers() const {
  std::vector<std::vector<int>> out(values.size());
  for (int n = 0; n < static_cast<int>(nodes.size()); ++n)
    for (int v : nodes[n].inputs)
      if (v >= 0 && (out[v].empty() || out[v].back() != n)) out[v].push_back(n);
  return out;
}

void Graph::verify() const {
  const int nv = static_cast<int>(values.size());
  std::vector<char> ready(values.size(), 0);
  for (int v = 0; v < nv; ++v) {
    if (find(values[v].name) != v) throw InternalError(fmt::format("value '{}' is not indexed", values[v].name));
    if (values[v].producer < 0) ready[v] = 1;
  }
  for (int n = 0; n < static_cast<int>(nodes.size()); ++n) {
    const Node& node = nodes[n];
    for (int v : node.inputs) {
      if (v < -1 || v >= nv) throw InternalError(fmt::format("node '{}': input id {} out of range", node.name, v));
      if (v >= 0 && !ready[v])
        throw InternalError(fmt::format("node '{}' reads '{}' before it is produced", node.name, values[v].name));
    }
    for (int v : node.outputs) {
      if (v < 0 || v >= nv) throw InternalError(fmt::format("node '{}': output id {} out of range", node.name, v));
      if (values[v].producer != n)
        throw InternalError(
            fmt::format("value '{}' has producer {} but node {} writes it", values[v].name, values[v].producer, n));
      ready[v] = 1;
    }
  }
  for (int v : outputs)
    if (v < 0 || v >= nv || !ready[v]) throw InternalError(fmt::format("graph output id {} is not produced", v));
}

void Graph::prune() {
  std::vector<char> live_v(values.size(), 0), live_n(nodes.size(), 0);
  for (int v : outputs) live_v[v] = 1;
  for (int v : inputs) live_v[v] = 1;
  // the nodes that compute the data-dependent symbols a live value reads (a count folded into a Loop's trip count)
  std::set<std::string, std::less<>> computing;
  auto reads = [&](int v) {
    const Value& val = values[static_cast<size_t>(v)];
    if (runtime_dims.empty() || !val.sym) return;
    auto add = [&](const DimExpr& e) {
      for (const std::string& s : e.symbols())
        if (auto rt = runtime_dims.find(s); rt != runtime_dims.end()) computing.insert(rt->second.node);
    };
    for (const DimExpr& e : val.sym->dims) add(e);
    if (val.sym->elems)
      for (const DimExpr& e : *val.sym->elems) add(e);
  };
  for (int v : outputs) reads(v);
  for (int n = static_cast<int>(nodes.size()) - 1; n >= 0; --n) {
    bool live = computing.count(nodes[n].name) > 0;
    for (int o : nodes[n].outputs) live = live || live_v[o];
    if (!live) continue;
    live_n[n] = 1;
    for (int o : nodes[n].outputs) live_v[o] = 1;
    for (int i : nodes[n].inputs)
      if (i >= 0 && !live_v[i]) {
        live_v[i] = 1;
        reads(i);
      }
  }
  if (std::all_of(live_v.begin(), live_v.end(), [](char c) { return c != 0; }) &&
      std::all_of(live_n.begin(), live_n.end(), [](char c) { return c != 0; }))
    return;
  std::vector<int> remap(values.size(), -1);
  std::vector<Value> nvals;
  for (size_t v = 0; v < values.size(); ++v)
    if (live_v[v]) {
      remap[v] = static_cast<int>(nvals.size());
      nvals.push_back(std::move(values[v]));
    }
  std::vector<Node> nnodes;
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!live_n[n]) continue;
    Node node = std::move(nodes[n]);
    for (int& i : node.inputs) i = i >= 0 ? remap[i] : -1;
    for (int& o : node.outputs) o = remap[o];
    for (int o : node.outputs) nvals[o].producer = static_cast<int>(nnodes.size());
    nnodes.push_back(std::move(node));
  }
  for (int& v : inputs) v = remap[v];
  for (int& v : outputs) v = remap[v];
  values = std::move(nvals);
  nodes = std::move(nnodes);
  reindex();
}

void Graph::reindex() {
  index_.clear();
  index_.reserve(values.size());
  for (int v = 0; v < static_cast<int>(values.size()); ++v) {
    if (!index_.emplace(values[v].name, v).second)
      throw std::invalid_argument(fmt::format("duplicate value name '{}'", values[v].name));
  }
}

// ---- 16-bit floats -------------------------------------------------------------------------------------------

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to >= 65520: infinity
  if (ax < 0x38800000u) {                                              // below 2^-14: subnormal or zero
    if (ax < 0x33000000u) return sign;                                 // below half the smallest subnormal
    // value = m * 2^(e-150); counted in subnormal units of 2^-24 that is m * 2^(e-126), a right shift by 14..24.
    const uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
    const uint32_t s = 126 - e;
    uint32_t q = m >> s;
    const uint32_t rem = m & ((1u << s) - 1), halfway = 1u << (s - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = ((ax >> 23) - 112) << 10 | ((ax >> 13) & 0x3ff);
  const uint32_t rem = ax & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

std::string first_line(std::string_view text) {
  std::string first;
  int more = 0;
  for (size_t b = 0; b <= text.size();) {
    size_t e = text.find('\n', b);
    if (e == std::string_view::npos) e = text.size();
    std::string_view line = text.substr(b, e - b);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
    if (!line.empty()) {
      if (first.empty())
        first = line;
      else
        ++more;
    }
    b = e + 1;
  }
  return more ? fmt::format("{} (and {} more)", first, more) : first;
}

bool SymbolicValue::has_symbols() const {
  auto symbolic = [](const DimExpr& e) { return !e.is_constant(); };
  return std::any_of(dims.begin(), dims.end(), symbolic) ||
         (elems && std::any_of(elems->begin(), elems->end(), symbolic));
}

bool reads_runtime_dim(const Graph& g, const DimExpr& e) {
  if (g.runtime_dims.empty() || e.is_constant()) return false;
  for (const std::string& s : e.symbols())
    if (g.runtime_dims.count(s)) return true;
  return false;
}

std::vector<char> runtime_dims_of(const Graph& g, int v) {
  if (g.runtime_dims.empty() || v < 0 || static_cast<size_t>(v) >= g.values.size()) return {};
  const Value& val = g.values[static_cast<size_t>(v)];
  if (!val.sym) return {};
  std::vector<char> r(val.sym->dims.size(), 0);
  bool any = false;
  for (size_t d = 0; d < r.size(); ++d) any |= (r[d] = reads_runtime_dim(g, val.sym->dims[d])) != 0;
  return any ? r : std::vector<char>{};
}

Shape run_shape(const Graph& g, int v, const Shape& local) {
  Shape s = g.values.at(static_cast<size_t>(v)).shape;
  const std::vector<char> runtime = runtime_dims_of(g, v);
  for (size_t d = 0; d < runtime.size() && d < s.size() && d < local.size(); ++d)
    if (runtime[d]) s[d] = local[d];
  return s;
}

std::vector<std::string> input_dim_symbols(const Graph& g) {
  std::vector<std::string> r;
  for (const auto& [sym, hint] : g.dim_hints)
    if (!g.runtime_dims.count(sym)) r.push_back(sym);
  return r;
}

std::string cut_text(std::string_view text, size_t max) {
  return text.size() <= max ? std::string(text) : std::string(text.substr(0, max < 3 ? 0 : max - 3)) + "...";
}

bool is_input_caused(const std::exception& e) {
  return dynamic_cast<const InputError*>(&e) || dynamic_cast<const UnsupportedError*>(&e) ||
         dynamic_cast<const std::bad_alloc*>(&e) || dynamic_cast<const std::length_error*>(&e);
}

}  // namespace gspmd
