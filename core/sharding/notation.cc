// Reading the HLO and SBP notations into named-axis shardings (docs/sharding-file.md, "Notations"). Their writers
// are TensorSharding::to_hlo and to_sbp (sharding.cc).
#include <algorithm>
#include <cctype>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/sharding/sharding.h"

namespace gspmd {
namespace {

[[noreturn]] void bad(const std::string& why) { throw std::invalid_argument(why); }

/// The text as messages show it: whole when short, else its start.
std::string shown(std::string_view text) {
  return text.size() <= 72 ? std::string(text) : fmt::format("{}...", text.substr(0, 69));
}

/// What HLO sharding text says: the tile dims, the device id of every tile (row-major over them) and the kind of
/// each trailing tile dim ("replicated" or "unreduced"); or that the value is replicated.
struct HloTiles {
  bool replicated = false;
  std::vector<int64_t> dims;
  std::vector<int64_t> ids;
  std::vector<std::string> trailing;
};

/// A cursor over HLO sharding text (the grammar XLA's HloSharding::ToString prints; spaces between tokens allowed).
class HloText {
 public:
  explicit HloText(std::string_view t) : t_(t) {}

  bool eat(std::string_view s) {
    skip_space();
    if (t_.substr(i_, s.size()) != s) return false;
    i_ += s.size();
    return true;
  }
  void expect(std::string_view s) {
    if (!eat(s)) fail(fmt::format("'{}'", s));
  }
  int64_t integer() {
    skip_space();
    size_t j = i_;
    int64_t v = 0;
    while (j < t_.size() && std::isdigit(static_cast<unsigned char>(t_[j])) && j - i_ < 12)
      v = v * 10 + (t_[j++] - '0');
    if (j == i_) fail("a non-negative integer");
    i_ = j;
    return v;
  }
  /// One or more integers separated by commas.
  std::vector<int64_t> integers() {
    std::vector<int64_t> v{integer()};
    while (eat(",")) v.push_back(integer());
    return v;
  }
  std::string word() {
    skip_space();
    size_t j = i_;
    while (j < t_.size() && (std::isalpha(static_cast<unsigned char>(t_[j])) || t_[j] == '_')) ++j;
    if (j == i_) fail("a word");
    std::string w(t_.substr(i_, j - i_));
    i_ = j;
    return w;
  }
  /// Skips a balanced "{...}" (metadata).
  void skip_braces() {
    expect("{");
    for (int depth = 1; depth > 0; ++i_) {
      if (i_ >= t_.size()) fail("'}'");
      depth += t_[i_] == '{' ? 1 : t_[i_] == '}' ? -1 : 0;
    }
  }
  bool at_end() {
    skip_space();
    return i_ == t_.size();
  }
  [[noreturn]] void fail(const std::string& expected) const {
    bad(fmt::format("malformed sharding \"{}\": expected {} at column {}", shown(t_), expected, i_ + 1));
  }

 private:
  void skip_space() {
    while (i_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[i_]))) ++i_;
  }
  std::string_view t_;
  size_t i_ = 0;
};

int64_t product(const std::vector<int64_t>& v, const char* what) {
  const std::optional<int64_t> n = device_count(v);
  if (n) return *n;
  const std::string list = cut_text(fmt::format("{}", fmt::join(v, ",")));
  if (std::any_of(v.begin(), v.end(), [](int64_t x) { return x < 1; }))
    bad(fmt::format("{}[{}] is not a list of positive sizes", what, list));
  bad(fmt::format("{}[{}] has more than the {} devices a mesh may have", what, list, kMaxDevices));
}

/// The device ids of XLA's iota tile assignment "<=[reshape]T(perm)": iota over `reshape`, its dims permuted by
/// `perm` (result dim i is reshape dim perm[i]), read row-major.
std::vector<int64_t> iota_ids(const std::vector<int64_t>& reshape, const std::vector<int64_t>& perm) {
  const size_t k = reshape.size();
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < k; ++i)
    if (sorted.size() != k || sorted[i] != static_cast<int64_t>(i))
      bad(fmt::format("T({}) is not a permutation of 0..{}", fmt::join(perm, ","), k - 1));
  const int64_t n = product(reshape, "<=");
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::vector<int64_t> idx(k, 0);  // odometer over the permuted dims
  for (int64_t q = 0; q < n; ++q) {
    int64_t v = 0;  // row-major index over `reshape` of the element at idx
    for (size_t d = 0; d < k; ++d) {
      const size_t j = static_cast<size_t>(std::find(perm.begin(), perm.end(), static_cast<int64_t>(d)) - perm.begin());
      v = v * reshape[d] + idx[j];
    }
    ids[static_cast<size_t>(q)] = v;
    for (size_t j = k; j-- > 0;) {
      if (++idx[j] < reshape[static_cast<size_t>(perm[j])]) break;
      idx[j] = 0;
    }
  }
  return ids;
}

HloTiles parse_hlo(std::string_view text) {
  HloText c(text);
  HloTiles h;
  c.expect("{");
  if (c.eat("{")) bad("tuple shardings are not supported: give each tensor its own sharding");
  if (c.eat("maximal"))
    bad("{maximal device=N} is not supported (one device holding the whole tensor): use {replicated} or a tiled "
        "sharding");
  if (c.eat("manual")) bad("{manual} is not supported: every value is partitioned by this tool");
  if (c.eat("replicated")) {
    h.replicated = true;
  } else {
    c.expect("devices");
    c.expect("=");
    c.expect("[");
    h.dims = c.integers();
    c.expect("]");
    const int64_t tiles = product(h.dims, "devices=");
    if (c.eat("<=")) {
      c.expect("[");
      std::vector<int64_t> reshape = c.integers();
      c.expect("]");
      std::vector<int64_t> perm;
      for (size_t i = 0; i < reshape.size(); ++i) perm.push_back(static_cast<int64_t>(i));
      if (c.eat("T")) {
        c.expect("(");
        perm = c.integers();
        c.expect(")");
      }
      h.ids = iota_ids(reshape, perm);
    } else {
      h.ids = c.integers();
    }
    if (static_cast<int64_t>(h.ids.size()) != tiles)
      bad(fmt::format("devices=[{}] has {} tiles but {} device ids", fmt::join(h.dims, ","), tiles, h.ids.size()));
  }
  while (!c.eat("}")) {
    if (c.eat("last_tile_dims")) {
      c.expect("=");
      c.expect("{");
      do {
        std::string kind = c.word();
        if (kind == "partial") kind = "unreduced";
        if (kind == "manual") bad("last_tile_dims={manual} is not supported: every value is partitioned by this tool");
        if (kind != "replicated" && kind != "unreduced")
          bad(fmt::format("unknown last_tile_dims kind '{}' (expected replicated or unreduced)", kind));
        h.trailing.push_back(kind);
      } while (c.eat(","));
      c.expect("}");
    } else if (c.eat("last_tile_dim_replicate")) {
      h.trailing.push_back("replicated");
    } else if (c.eat("metadata")) {
      c.expect("=");
      c.skip_braces();
    } else {
      c.fail("last_tile_dim_replicate, last_tile_dims={...}, metadata={...} or '}'");
    }
  }
  if (!c.at_end()) c.fail("the end of the text");
  if (h.replicated && !h.trailing.empty()) bad("{replicated} takes no last_tile_dims");
  if (h.trailing.size() > h.dims.size())
    bad(fmt::format("{} trailing tile dims but devices=[{}] has {} dims", h.trailing.size(), fmt::join(h.dims, ","),
                    h.dims.size()));
  return h;
}

/// Part of a tile dim: `size` consecutive tile indices that step one mesh axis by `stride`.
struct Segment {
  int dim;
  int axis;
  int64_t stride, size;
};

}  // namespace

ParsedSharding sharding_from_hlo(std::string_view text, const DeviceMesh& given) {
  const DeviceMesh mesh = given.user();
  const HloTiles h = parse_hlo(text);
  if (h.replicated) return {TensorSharding::replicated(0), mesh, true};
  const int64_t n = mesh.num_devices();
  const std::string on_mesh = mesh.has_device_order() && n <= 64
                                  ? fmt::format("{} (devices [{}])", mesh.str(), fmt::join(mesh.devices, ","))
                                  : mesh.str();
  if (static_cast<int64_t>(h.ids.size()) != n)
    bad(fmt::format("the tile assignment has {} devices but the mesh {} has {}", h.ids.size(), mesh.str(), n));
  // pos[q]: the mesh position of the device at tile q
  std::vector<int64_t> position(static_cast<size_t>(n)), pos(static_cast<size_t>(n), -1);
  for (int64_t p = 0; p < n; ++p) position[static_cast<size_t>(mesh.device_at(p))] = p;
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (size_t q = 0; q < h.ids.size(); ++q) {
    const int64_t d = h.ids[q];
    if (d >= n) bad(fmt::format("device {} is not on the mesh {} (devices 0..{})", d, mesh.str(), n - 1));
    if (seen[static_cast<size_t>(d)]) bad(fmt::format("device {} appears twice in the tile assignment", d));
    seen[static_cast<size_t>(d)] = 1;
    pos[q] = position[static_cast<size_t>(d)];
  }
  auto cannot = [&](const std::string& why) {
    bad(fmt::format("{} cannot be expressed on mesh {}: {}", shown(text), on_mesh, why));
  };
  auto coords_at = [&](int64_t q) {
    std::vector<int64_t> c(mesh.shape.size());
    int64_t p = pos[static_cast<size_t>(q)];
    for (int i = mesh.rank() - 1; i >= 0; --i) {
      c[i] = p % mesh.shape[i];
      p /= mesh.shape[i];
    }
    return c;
  };
  const int nd = static_cast<int>(h.dims.size());
  const int rank = nd - static_cast<int>(h.trailing.size());
  std::vector<int64_t> tile_stride(h.dims.size(), 1);
  for (int t = nd - 2; t >= 0; --t) tile_stride[t] = tile_stride[t + 1] * h.dims[t + 1];
  if (pos[0] != 0)
    cannot(fmt::format("its first tile is device {}, but a named-axis sharding starts with device {}", h.ids[0],
                       mesh.device_at(0)));

  // Walk each tile dim from tile 0: every run of tiles that steps one mesh axis evenly is a segment (minor first).
  std::vector<Segment> segs;
  for (int t = 0; t < nd; ++t) {
    for (int64_t unit = 1; unit < h.dims[t];) {
      const std::vector<int64_t> c = coords_at(unit * tile_stride[t]);
      int axis = -1;
      for (int a = 0; a < mesh.rank(); ++a) {
        if (c[a] == 0) continue;
        if (axis >= 0)
          cannot(
              fmt::format("along tile dim {}, device {} follows device {} but they differ on more than one mesh axis",
                          t, h.ids[static_cast<size_t>(unit * tile_stride[t])], h.ids[0]));
        axis = a;
      }
      const int64_t stride = c[axis];
      int64_t size = 2;
      for (; unit * size < h.dims[t]; ++size) {
        std::vector<int64_t> want(mesh.shape.size(), 0);
        want[axis] = stride * size;
        if (coords_at(unit * size * tile_stride[t]) != want) break;
      }
      if (h.dims[t] % (unit * size) != 0 || mesh.shape[axis] % (stride * size) != 0)
        cannot(fmt::format("along tile dim {}, the devices do not step through mesh axis '{}' evenly", t,
                           mesh.axes[axis]));
      segs.push_back({t, axis, stride, size});
      unit *= size;
    }
  }
  // Each mesh axis must be covered exactly once: its segments' strides chain 1, s1, s1*s2, ... up to its size.
  std::vector<std::vector<int64_t>> cuts(mesh.shape.size());
  for (int a = 0; a < mesh.rank(); ++a) {
    std::vector<const Segment*> on;
    for (const Segment& s : segs)
      if (s.axis == a) on.push_back(&s);
    std::sort(on.begin(), on.end(), [](const Segment* x, const Segment* y) { return x->stride < y->stride; });
    int64_t covered = 1;
    for (const Segment* s : on) {
      if (s->stride != covered)
        cannot(fmt::format("the tile dims do not cover mesh axis '{}' exactly once", mesh.axes[a]));
      covered *= s->size;
      if (covered < mesh.shape[a]) cuts[a].push_back(mesh.shape[a] / covered);
    }
    if (covered != mesh.shape[a])
      cannot(fmt::format("the tile dims do not cover mesh axis '{}' exactly once", mesh.axes[a]));
  }
  // Check every tile against the segments: the tile index along each dim must equal the device's.
  std::vector<int64_t> rem(h.dims.size());
  for (int64_t q = 0; q < n; ++q) {
    int64_t rest = q;
    for (int t = nd - 1; t >= 0; --t) {
      rem[t] = rest % h.dims[t];
      rest /= h.dims[t];
    }
    std::vector<int64_t> want(mesh.shape.size(), 0);
    for (const Segment& s : segs) {
      want[s.axis] += rem[s.dim] % s.size * s.stride;
      rem[s.dim] /= s.size;
    }
    if (coords_at(q) != want)
      cannot(fmt::format("device {} at tile {} is not where the devices of the first tiles place it",
                         h.ids[static_cast<size_t>(q)], q));
  }

  ParsedSharding out;
  out.mesh = mesh.refine(cuts);
  out.sharding.dims.resize(static_cast<size_t>(rank));
  for (auto s = segs.rbegin(); s != segs.rend(); ++s) {  // major parts first
    const int64_t pre = mesh.shape[s->axis] / (s->stride * s->size);
    const std::vector<int> parts = out.mesh.parts_between(s->axis, pre, pre * s->size);
    if (s->dim < rank) {
      auto& d = out.sharding.dims[static_cast<size_t>(s->dim)];
      d.insert(d.end(), parts.begin(), parts.end());
    } else if (h.trailing[static_cast<size_t>(s->dim - rank)] == "unreduced") {
      out.sharding.unreduced.insert(out.sharding.unreduced.end(), parts.begin(), parts.end());
    }
  }
  std::sort(out.sharding.unreduced.begin(), out.sharding.unreduced.end());
  return out;
}

TensorSharding sharding_from_sbp(const std::vector<std::string>& sbp, const DeviceMesh& mesh) {
  const DeviceMesh user = mesh.user();
  if (sbp.size() != user.shape.size())
    bad(fmt::format("has {} entries but the mesh has {} axes ({})", sbp.size(), user.rank(),
                    fmt::join(user.axes, ", ")));
  TensorSharding s;
  int first_partial = -1;
  for (int u = 0; u < user.rank(); ++u) {
    std::string e = sbp[static_cast<size_t>(u)];
    e.erase(std::remove_if(e.begin(), e.end(), [](unsigned char ch) { return std::isspace(ch); }), e.end());
    const std::vector<int> parts = mesh.parts_of(u);
    auto inner = [&](char head) -> std::optional<std::string> {
      if (e.size() < 3 || e[0] != head || e[1] != '(' || e.back() != ')') return std::nullopt;
      return e.substr(2, e.size() - 3);
    };
    if (e == "B") continue;
    if (auto d = inner('S'); d && !d->empty() && d->size() <= 6 &&
                             std::all_of(d->begin(), d->end(), [](unsigned char ch) { return std::isdigit(ch); })) {
      const size_t dim = std::stoul(*d);
      if (s.dims.size() <= dim) s.dims.resize(dim + 1);
      s.dims[dim].insert(s.dims[dim].end(), parts.begin(), parts.end());
      continue;
    }
    std::optional<ReductionKind> kind;
    const std::optional<std::string> r = e == "P" ? std::optional<std::string>("sum") : inner('P');
    for (ReductionKind k : {ReductionKind::kSum, ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd})
      if (r && *r == reduction_name(k)) kind = k;
    if (!kind)
      bad(fmt::format("entry {} is \"{}\"; expected S(dim), B, P or P(max), P(min), P(prod)", u,
                      sbp[static_cast<size_t>(u)]));
    if (first_partial >= 0 && *kind != s.reduction)
      bad(fmt::format("entries {} and {} are partial with different reductions ({} and {})", first_partial, u,
                      reduction_name(s.reduction), reduction_name(*kind)));
    if (first_partial < 0) first_partial = u;
    s.reduction = *kind;
    s.unreduced.insert(s.unreduced.end(), parts.begin(), parts.end());
  }
  std::sort(s.unreduced.begin(), s.unreduced.end());
  return s;
}

}  // namespace gspmd
