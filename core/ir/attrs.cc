// Attribute equality, bytes and text (core/ir/attrs.h).
#include "core/ir/attrs.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gspmd {
namespace {

/// Feeds one value of an attribute (not its name or kind) in the layout attr_bytes documents.
struct ValueBytes {
  const BytesSink& put;
  const BodySink& body;
  void i(int64_t v) const { put(&v, sizeof v); }
  void str(const std::string& s) const {
    i(static_cast<int64_t>(s.size()));
    put(s.data(), s.size());
  }
  template <class T>
  void list(const std::vector<T>& v) const {
    i(static_cast<int64_t>(v.size()));
    for (const T& x : v) one(x);
  }
  void one(int64_t x) const { i(x); }
  void one(float x) const { put(&x, sizeof x); }
  void one(const std::string& x) const { str(x); }
  void operator()(int64_t x) const { one(x); }
  void operator()(float x) const { one(x); }
  void operator()(const std::string& x) const { str(x); }
  void operator()(const std::vector<int64_t>& x) const { list(x); }
  void operator()(const std::vector<float>& x) const { list(x); }
  void operator()(const std::vector<std::string>& x) const { list(x); }
  void operator()(const Tensor& t) const {
    i(static_cast<int64_t>(t.dtype));
    list(t.shape);
    put(t.bytes.data(), t.bytes.size());
  }
  void operator()(const std::shared_ptr<const Graph>& g) const { body(*g); }
};

}  // namespace

void attr_bytes(const std::map<std::string, AttrValue>& attrs, const BytesSink& put, const BodySink& body) {
  const ValueBytes w{put, body};
  w.i(static_cast<int64_t>(attrs.size()));
  for (const auto& [name, a] : attrs) {
    w.str(name);
    w.i(static_cast<int64_t>(a.index()));
    std::visit(w, a);
  }
}

bool attr_equal(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const auto* g = std::get_if<std::shared_ptr<const Graph>>(&a))
    return *g == std::get<std::shared_ptr<const Graph>>(b);
  std::string x, y;
  const BodySink none = [](const Graph&) {};
  std::visit(ValueBytes{[&](const void* p, size_t n) { x.append(static_cast<const char*>(p), n); }, none}, a);
  std::visit(ValueBytes{[&](const void* p, size_t n) { y.append(static_cast<const char*>(p), n); }, none}, b);
  return x == y;
}

bool attrs_equal(const std::map<std::string, AttrValue>& a, const std::map<std::string, AttrValue>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j)
    if (i->first != j->first || !attr_equal(i->second, j->second)) return false;
  return true;
}

std::string attr_text(const AttrValue& a) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Tensor>)
          return fmt::format("{}[{}]", dtype_name(x.dtype), fmt::join(x.shape, ","));
        else if constexpr (std::is_same_v<T, std::string>)
          return x;
        else if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return fmt::format("[{}]", fmt::join(x, ","));
        else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, float>)
          return fmt::format("{}", x);
        else if constexpr (std::is_same_v<T, std::shared_ptr<const Graph>>)
          return fmt::format("graph({} nodes)", x->nodes.size());
        else
          return fmt::format("[{}]", fmt::join(x, ","));
      },
      a);
}

}  // namespace gspmd
