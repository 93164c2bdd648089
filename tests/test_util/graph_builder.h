// Shared helpers for tests that build small graphs, values, meshes, nodes and tensors by hand.
// Header-only; depends only on core/ir/ir.h and core/sharding/sharding.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <cmath>
#include <sstream>
#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd::testing {

/// A Value with the given name, dtype and shape (not added to any graph).
inline Value V(std::string name, DType t, Shape s) {
  Value v;
  v.name = std::move(name);
  v.dtype = t;
  v.shape = std::move(s);
  return v;
}

/// A device mesh of the given shape with axes named "x", "y", "z", "w" in order.
inline DeviceMesh mesh_of(std::vector<int64_t> shape) {
  static const char* names[] = {"x", "y", "z", "w"};
  DeviceMesh m;
  m.shape = shape;
  for (size_t i = 0; i < shape.size(); ++i) m.axes.push_back(names[i]);
  return m;
}

/// A detached node "n1" of type `op` with `n_out` outputs numbered 100, 101, ... (for calling kernels directly).
inline Node make_node(const std::string& op, std::map<std::string, AttrValue> attrs = {}, int n_out = 1) {
  Node n;
  n.name = "n1";
  n.op_type = op;
  n.attrs = std::move(attrs);
  for (int i = 0; i < n_out; ++i) n.outputs.push_back(100 + i);
  return n;
}

/// A float32 tensor of shape `s` holding `v`.
inline Tensor F(const Shape& s, const std::vector<float>& v) { return Tensor::from_floats(s, v); }

/// An int64 tensor of shape `s` filled from `v` by raw copy (no size check).
inline Tensor I(const Shape& s, const std::vector<int64_t>& v) {
  Tensor t(DType::kInt64, s);
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), v.size() * 8);
  return t;
}

/// A bool tensor of shape `s` filled from `v` by raw copy (no size check).
inline Tensor B(const Shape& s, const std::vector<uint8_t>& v) {
  Tensor t(DType::kBool, s);
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), v.size());
  return t;
}

/// A float32 tensor of shape `s` with values uniform in [lo, hi) from a mt19937 seeded with `seed`.
inline Tensor rand_f(const Shape& s, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t(DType::kFloat32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

/// The elements of a float32 tensor as a vector.
inline std::vector<float> vals(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

/// Small hand-made graph builder: graph inputs, initializers and single-op nodes with float32 outputs.
struct GraphBuilder {
  Graph g;

  /// Adds a graph input `name` of shape `s` and dtype `t`; returns its value id.
  int input(const std::string& name, Shape s, DType t = DType::kFloat32) {
    int id = g.add_value(V(name, t, std::move(s)));
    g.inputs.push_back(id);
    return id;
  }
  /// Adds a float32 initializer of shape `s` without data; returns its value id.
  int weight(const std::string& name, Shape s) {
    Value v = V(name, DType::kFloat32, std::move(s));
    v.is_initializer = true;
    return g.add_value(std::move(v));
  }
  /// Adds an initializer holding tensor `t`; returns its value id.
  int constant(const std::string& name, Tensor t) {
    Value v = V(name, t.dtype, t.shape);
    v.is_initializer = true;
    v.data = std::make_shared<Tensor>(std::move(t));
    return g.add_value(std::move(v));
  }
  /// Adds an int64 initializer holding `data` (1-D, or a scalar if `scalar`); returns its value id.
  int ints(const std::string& name, const std::vector<int64_t>& data, bool scalar = false) {
    return constant(name, Tensor::from_int64s(data, scalar));
  }
  /// Adds a 1-D float32 initializer holding `data`; returns its value id.
  int floats(const std::string& name, const std::vector<float>& data) {
    return constant(name, Tensor::from_floats({static_cast<int64_t>(data.size())}, data));
  }
  /// Adds a node `op` over `in` with a float32 output of shape `out` (plus one per `extra` shape); returns its id.
  int node(const std::string& op, std::vector<int> in, Shape out, std::map<std::string, AttrValue> attrs = {},
           std::vector<Shape> extra = {}) {
    Node n;
    n.name = op + "_" + std::to_string(g.nodes.size());
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs.push_back(g.add_value_unique(n.name + "_out", DType::kFloat32, out));
    for (const Shape& s : extra) n.outputs.push_back(g.add_value_unique(n.name + "_out", DType::kFloat32, s));
    n.attrs = std::move(attrs);
    return g.add_node(std::move(n));
  }
};

/// "" when `got` equals `ref` within 1e-5 + 1e-4 |ref| (NaN matches NaN, inf exactly; ints and bools exactly),
/// else a description of the first difference and how many elements differ.
inline std::string compare_tensors(const Tensor& got, const Tensor& ref) {
  if (got.dtype != ref.dtype || got.shape != ref.shape)
    return "result is " + std::string(dtype_name(got.dtype)) + shape_str(got.shape) + ", expected " +
           std::string(dtype_name(ref.dtype)) + shape_str(ref.shape);
  const int64_t n = ref.numel();
  int64_t bad = 0, first = -1;
  double gv = 0, rv = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = 0, b = 0;
    bool ok = true;
    switch (ref.dtype) {
      case DType::kFloat32:
      case DType::kFloat64: {
        a = ref.dtype == DType::kFloat32 ? got.data<float>()[i] : got.data<double>()[i];
        b = ref.dtype == DType::kFloat32 ? ref.data<float>()[i] : ref.data<double>()[i];
        if (std::isnan(a) || std::isnan(b))
          ok = std::isnan(a) && std::isnan(b);
        else if (std::isinf(b))
          ok = a == b;
        else
          ok = std::fabs(a - b) <= 1e-5 + 1e-4 * std::fabs(b);
        break;
      }
      case DType::kInt64:
        a = static_cast<double>(got.data<int64_t>()[i]), b = static_cast<double>(ref.data<int64_t>()[i]),
        ok = got.data<int64_t>()[i] == ref.data<int64_t>()[i];
        break;
      case DType::kInt32: a = got.data<int32_t>()[i], b = ref.data<int32_t>()[i], ok = a == b; break;
      case DType::kBool: a = got.data<bool>()[i], b = ref.data<bool>()[i], ok = a == b; break;
      default:
        ok = std::memcmp(got.bytes.data(), ref.bytes.data(), ref.nbytes()) == 0;
        i = n;
        break;
    }
    if (!ok) {
      if (first < 0) first = i, gv = a, rv = b;
      ++bad;
    }
  }
  if (!bad) return "";
  std::ostringstream os;
  os << bad << "/" << n << " elements differ; first at flat index " << first << ": got " << gv << ", expected " << rv;
  return os.str();
}

/// The row-major multi-index of element `flat` of a tensor of shape `s`.
inline std::vector<int64_t> unravel(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = s.size(); i-- > 0;) {
    idx[i] = flat % s[i];
    flat /= s[i];
  }
  return idx;
}

}  // namespace gspmd::testing
