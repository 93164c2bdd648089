// program_fingerprint (spmd.h): a content hash of an SPMD program's structure, stable across processes and hosts.
#include <cstring>
#include <memory>
#include <type_traits>

#include "core/ir/attrs.h"
#include "core/program/program.h"

namespace gspmd {

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

namespace {

struct Hasher {
  uint64_t h = kFnvOffset;
  void bytes(const void* d, size_t n) { h = fnv1a(h, d, n); }
  void i(int64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    i(static_cast<int64_t>(s.size()));
    bytes(s.data(), s.size());
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    i(static_cast<int64_t>(v.size()));
    for (const T& x : v) {
      if constexpr (std::is_same_v<T, std::string>)
        str(x);
      else if constexpr (std::is_same_v<T, float>)
        bytes(&x, sizeof x);
      else
        i(static_cast<int64_t>(x));
    }
  }
  void sharding(const TensorSharding& s) {
    i(static_cast<int64_t>(s.dims.size()));
    for (const auto& d : s.dims) vec(d);
    vec(s.unreduced);
    i(static_cast<int64_t>(s.reduction));
  }
  void binding(const ProgramBinding& b) {
    i(b.local);
    i(b.global);
    sharding(b.sharding);
  }
};

// Hashes a graph's structure (bodies of control-flow nodes recursively).
void hash_graph(Hasher& h, const Graph& g) {
  h.i(g.opset);
  h.i(static_cast<int64_t>(g.values.size()));
  for (const Value& v : g.values) {
    h.str(v.name);
    h.i(static_cast<int64_t>(v.dtype));
    h.vec(v.shape);
    h.i(v.is_initializer);
  }
  h.i(static_cast<int64_t>(g.nodes.size()));
  for (const Node& n : g.nodes) {
    h.str(n.op_type);
    h.str(n.domain);
    h.str(n.name);
    h.vec(n.inputs);
    h.vec(n.outputs);
    attr_bytes(
        n.attrs, [&](const void* d, size_t size) { h.bytes(d, size); },
        [&](const Graph& body) { hash_graph(h, body); });
  }
  h.vec(g.inputs);
  h.vec(g.outputs);
}

}  // namespace

uint64_t program_fingerprint(const SpmdProgram& p) {
  Hasher h;
  h.vec(p.mesh.shape);
  h.vec(p.mesh.axes);
  if (p.mesh.has_device_order()) h.vec(p.mesh.devices);  // the device order decides every device's slices and groups
  hash_graph(h, p.program);
  for (const auto* list : {&p.inputs, &p.params, &p.outputs}) {
    h.i(static_cast<int64_t>(list->size()));
    for (const ProgramBinding& b : *list) h.binding(b);
  }
  return h.h;
}

}  // namespace gspmd
