#include "core/sharding/sharding.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// DeviceMesh

std::optional<int64_t> device_count(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s < 1 || s > kMaxDevices / n) return std::nullopt;
    n *= s;
  }
  return n;
}

DeviceMesh DeviceMesh::parse(std::string_view text) {
  auto bad = [&]() { return InputError(fmt::format("--mesh: '{}' is not a mesh shape like 4x4", text)); };
  DeviceMesh m;
  if (text.empty()) throw bad();
  size_t pos = 0;
  while (true) {
    size_t end = text.find_first_of("xX", pos);
    std::string_view part = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    if (part.empty() || part.size() > 12) throw bad();
    int64_t v = 0;
    for (char c : part) {
      if (c < '0' || c > '9') throw bad();
      v = v * 10 + (c - '0');
    }
    if (v <= 0) throw bad();
    m.shape.push_back(v);
    if (end == std::string_view::npos) break;
    pos = end + 1;
  }
  if (!device_count(m.shape)) {
    long double n = 1;
    for (int64_t s : m.shape) n *= static_cast<long double>(s);
    throw InputError(fmt::format("--mesh: '{}' has {:.0f} devices, more than the {} a mesh may have", text,
                                 static_cast<double>(n), kMaxDevices));
  }
  static const char* kNames[] = {"x", "y", "z", "w"};
  for (size_t i = 0; i < m.shape.size(); ++i) m.axes.push_back(i < 4 ? std::string(kNames[i]) : fmt::format("a{}", i));
  return m;
}

int64_t DeviceMesh::num_devices() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::optional<SubAxisName> parse_sub_axis_name(std::string_view name) {
  const size_t open = name.rfind(":(");
  if (open == std::string_view::npos || open == 0) return std::nullopt;
  auto digits = [&](size_t from, size_t to) -> std::optional<int64_t> {  // [from, to): 1 to 12 digits
    if (to <= from || to - from > 12) return std::nullopt;
    int64_t v = 0;
    for (size_t i = from; i < to; ++i) {
      if (name[i] < '0' || name[i] > '9') return std::nullopt;
      v = v * 10 + (name[i] - '0');
    }
    return v;
  };
  const size_t close = name.find(')', open + 2);
  if (close == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> pre = digits(open + 2, close), size = digits(close + 1, name.size());
  if (!pre || !size) return std::nullopt;
  return SubAxisName{std::string(name.substr(0, open)), *pre, *size};
}

int DeviceMesh::axis_index(std::string_view name) const {
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] == name) return static_cast<int>(i);
  return -1;
}

int64_t DeviceMesh::device_at(int64_t pos) const {
  if (pos < 0 || pos >= num_devices())
    throw std::out_of_range(fmt::format("mesh position {} is not in mesh {}", pos, str()));
  return devices.empty() ? pos : devices[static_cast<size_t>(pos)];
}

int64_t DeviceMesh::position_of(int64_t device) const {
  if (device < 0 || device >= num_devices())
    throw std::out_of_range(fmt::format("device {} is not in mesh {}", device, str()));
  if (devices.empty()) return device;
  auto it = std::find(devices.begin(), devices.end(), device);
  if (it == devices.end()) throw std::out_of_range(fmt::format("device {} is not in mesh {}", device, str()));
  return it - devices.begin();
}

std::vector<int64_t> DeviceMesh::coords(int64_t device) const {
  int64_t pos = position_of(device);
  std::vector<int64_t> c(shape.size());
  for (int i = rank() - 1; i >= 0; --i) {
    c[i] = pos % shape[i];
    pos /= shape[i];
  }
  return c;
}

void DeviceMesh::check_devices() const {
  if (devices.empty()) return;
  const int64_t n = num_devices();
  if (static_cast<int64_t>(devices.size()) != n)
    throw std::invalid_argument(fmt::format("has {} entries but the mesh {} has {} devices", devices.size(), str(), n));
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < devices.size(); ++i) {
    const int64_t d = devices[i];
    if (d < 0 || d >= n) throw std::invalid_argument(fmt::format("entry {} is {}, not a device id 0..{}", i, d, n - 1));
    if (seen[static_cast<size_t>(d)]) throw std::invalid_argument(fmt::format("device {} appears twice", d));
    seen[static_cast<size_t>(d)] = 1;
  }
}

bool DeviceMesh::has_device_order() const {
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] != static_cast<int64_t>(i)) return true;
  return false;
}

int64_t DeviceMesh::axes_size(const std::vector<int>& mesh_axes) const {
  int64_t n = 1;
  for (int a : mesh_axes) n *= shape.at(a);
  return n;
}

int64_t DeviceMesh::tile_index(int64_t device, const std::vector<int>& mesh_axes) const {
  if (mesh_axes.empty()) return 0;
  auto c = coords(device);
  int64_t t = 0;
  for (int a : mesh_axes) t = t * shape.at(a) + c.at(a);
  return t;
}

std::vector<std::vector<int64_t>> DeviceMesh::replica_groups(const std::vector<int>& mesh_axes) const {
  const int64_t n = num_devices();
  const int64_t gsize = axes_size(mesh_axes);
  const int64_t ngroups = n / gsize;
  std::vector<char> in_group(shape.size(), 0);
  for (int a : mesh_axes) in_group.at(a) = 1;
  std::vector<std::vector<int64_t>> groups(ngroups, std::vector<int64_t>(gsize));
  std::vector<int64_t> c(shape.size(), 0);  // odometer over mesh positions, row-major
  for (int64_t k = 0; k < n; ++k) {
    // group = row-major index over the other axes (monotone in the group's smallest device id without an order)
    int64_t g = 0;
    for (int i = 0; i < rank(); ++i)
      if (!in_group[i]) g = g * shape[i] + c[i];
    int64_t t = 0;
    for (int a : mesh_axes) t = t * shape[a] + c[a];
    groups[g][t] = devices.empty() ? k : devices[static_cast<size_t>(k)];
    for (int i = rank() - 1; i >= 0; --i) {
      if (++c[i] < shape[i]) break;
      c[i] = 0;
    }
  }
  if (!devices.empty())
    std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      return *std::min_element(a.begin(), a.end()) < *std::min_element(b.begin(), b.end());
    });
  return groups;
}

std::string DeviceMesh::str() const {
  const auto& sh = is_refined() ? user_shape : shape;
  const auto& ax = is_refined() ? user_axes : axes;
  std::string s = "{";
  for (size_t i = 0; i < sh.size(); ++i) s += fmt::format("{}{}={}", i ? ", " : "", ax[i], sh[i]);
  return s + "}";
}

DeviceMesh DeviceMesh::user() const {
  if (!is_refined()) return *this;
  DeviceMesh m;
  m.shape = user_shape;
  m.axes = user_axes;
  m.devices = devices;
  return m;
}

std::vector<std::vector<int64_t>> DeviceMesh::cuts() const {
  std::vector<std::vector<int64_t>> c(is_refined() ? user_shape.size() : shape.size());
  if (is_refined())
    for (const SubAxis& sa : sub)
      if (sa.pre > 1) c[static_cast<size_t>(sa.parent)].push_back(sa.pre);
  return c;
}

DeviceMesh DeviceMesh::refine(const std::vector<std::vector<int64_t>>& more) const {
  const DeviceMesh u = user();
  std::vector<std::vector<int64_t>> c = cuts();
  bool any = false;
  for (size_t a = 0; a < c.size(); ++a) {
    if (a < more.size()) c[a].insert(c[a].end(), more[a].begin(), more[a].end());
    std::sort(c[a].begin(), c[a].end());
    c[a].erase(std::unique(c[a].begin(), c[a].end()), c[a].end());
    int64_t prev = 1;
    for (int64_t cut : c[a]) {
      if (cut <= 1 || cut >= u.shape[a] || u.shape[a] % cut != 0 || cut % prev != 0)
        throw std::invalid_argument(
            fmt::format("refine: cannot cut axis '{}' of size {} at {}", u.axes[a], u.shape[a], cut));
      prev = cut;
    }
    any = any || !c[a].empty();
  }
  if (!any) return u;
  DeviceMesh m;
  m.devices = u.devices;  // refining splits axes into row-major parts: mesh positions keep their numbers
  m.user_shape = u.shape;
  m.user_axes = u.axes;
  for (int a = 0; a < u.rank(); ++a) {
    int64_t pre = 1;
    std::vector<int64_t> ends = c[static_cast<size_t>(a)];
    ends.push_back(u.shape[a]);
    for (int64_t end : ends) {
      const int64_t size = end / pre;
      m.shape.push_back(size);
      m.axes.push_back(c[static_cast<size_t>(a)].empty() ? u.axes[a] : fmt::format("{}:({}){}", u.axes[a], pre, size));
      m.sub.push_back({a, pre});
      pre = end;
    }
  }
  return m;
}

std::vector<int> DeviceMesh::parts_between(int u, int64_t lo, int64_t hi) const {
  std::vector<int> r;
  if (!is_refined()) {
    if (lo != 1 || hi != shape.at(u)) throw std::invalid_argument("parts_between: the mesh has no sub-axes");
    return {u};
  }
  int64_t at = lo;
  for (int a = 0; a < rank(); ++a) {
    if (sub[a].parent != u || sub[a].pre < lo || sub[a].pre * shape[a] > hi) continue;
    if (sub[a].pre != at) break;
    r.push_back(a);
    at *= shape[a];
  }
  if (at != hi)
    throw std::invalid_argument(
        fmt::format("parts_between: {}:({}){} does not fall on the mesh's sub-axes", user_axes.at(u), lo, hi / lo));
  return r;
}

TensorSharding remap(const TensorSharding& s, const DeviceMesh& from, const DeviceMesh& to) {
  auto map_axes = [&](const std::vector<int>& axes) {
    std::vector<int> r;
    for (int a : axes) {
      const int u = from.user_axis(a);
      const int64_t pre = from.is_refined() ? from.sub.at(a).pre : 1;
      std::vector<int> p = to.parts_between(u, pre, pre * from.shape.at(a));
      r.insert(r.end(), p.begin(), p.end());
    }
    return r;
  };
  TensorSharding t = s;
  for (auto& d : t.dims) d = map_axes(d);
  t.unreduced = map_axes(s.unreduced);
  std::sort(t.unreduced.begin(), t.unreduced.end());
  return t;
}

std::vector<int> DeviceMesh::parts_of(int u) const {
  if (!is_refined()) return {u};
  std::vector<int> r;
  for (int a = 0; a < rank(); ++a)
    if (sub[a].parent == u) r.push_back(a);
  return r;
}

std::vector<std::string> DeviceMesh::axis_names(const std::vector<int>& mesh_axes) const {
  std::vector<std::string> names;
  for (size_t i = 0; i < mesh_axes.size(); ++i) {
    const int a = mesh_axes[i];
    if (a < 0 || a >= rank()) {
      names.push_back(fmt::format("#{}", a));
      continue;
    }
    if (is_refined()) {
      const std::vector<int> parts = parts_of(sub[a].parent);
      if (parts.size() > 1 && parts[0] == a && i + parts.size() <= mesh_axes.size() &&
          std::equal(parts.begin(), parts.end(), mesh_axes.begin() + static_cast<long>(i))) {
        names.push_back(user_axes[sub[a].parent]);
        i += parts.size() - 1;
        continue;
      }
    }
    names.push_back(axes[a]);
  }
  return names;
}

std::string_view reduction_name(ReductionKind k) {
  switch (k) {
    case ReductionKind::kSum: return "sum";
    case ReductionKind::kMax: return "max";
    case ReductionKind::kMin: return "min";
    case ReductionKind::kProd: return "prod";
  }
  return "sum";
}

// ---------------------------------------------------------------------------------------------------------------
// TensorSharding

TensorSharding TensorSharding::replicated(int rank) {
  TensorSharding s;
  s.dims.resize(rank);
  return s;
}

bool TensorSharding::is_replicated() const { return !is_tiled() && unreduced.empty(); }

bool TensorSharding::is_tiled() const {
  for (const auto& d : dims)
    if (!d.empty()) return true;
  return false;
}

std::vector<int> TensorSharding::tiled_axes() const {
  std::vector<int> out;
  for (const auto& d : dims) out.insert(out.end(), d.begin(), d.end());
  return out;
}

int64_t TensorSharding::shards(int dim, const DeviceMesh& mesh) const { return mesh.axes_size(dims.at(dim)); }

Shape TensorSharding::local_shape(const Shape& global, const DeviceMesh& mesh) const {
  if (global.size() != dims.size())
    throw std::invalid_argument(fmt::format("sharding has rank {} but the shape {} has rank {}", dims.size(),
                                            shape_str(global), global.size()));
  Shape out(global.size());
  for (size_t i = 0; i < global.size(); ++i) {
    int64_t n = shards(static_cast<int>(i), mesh);
    out[i] = (global[i] + n - 1) / n;
  }
  return out;
}

int64_t TensorSharding::offset(int dim, const Shape& global, const DeviceMesh& mesh, int64_t device) const {
  int64_t n = shards(dim, mesh);
  int64_t shard = (global.at(dim) + n - 1) / n;
  return mesh.tile_index(device, dims.at(dim)) * shard;
}

int64_t TensorSharding::valid(int dim, const Shape& global, const DeviceMesh& mesh, int64_t device) const {
  int64_t n = shards(dim, mesh);
  int64_t shard = (global.at(dim) + n - 1) / n;
  int64_t off = mesh.tile_index(device, dims.at(dim)) * shard;
  return std::clamp<int64_t>(global.at(dim) - off, 0, shard);
}

bool TensorSharding::is_uneven(const Shape& global, const DeviceMesh& mesh) const {
  for (size_t i = 0; i < dims.size() && i < global.size(); ++i)
    if (global[i] % shards(static_cast<int>(i), mesh) != 0) return true;
  return false;
}

void TensorSharding::verify(const DeviceMesh& mesh, int tensor_rank) const {
  if (rank() != tensor_rank)
    throw std::invalid_argument(fmt::format("sharding has {} dims but the tensor has rank {}", rank(), tensor_rank));
  std::vector<char> used(mesh.shape.size(), 0);
  auto use = [&](int a) {
    if (a < 0 || a >= mesh.rank())
      throw std::invalid_argument(fmt::format("axis id {} is not in mesh {}", a, mesh.str()));
    if (used[a]) throw std::invalid_argument(fmt::format("axis '{}' is used twice", mesh.axes[a]));
    used[a] = 1;
  };
  for (const auto& d : dims)
    for (int a : d) use(a);
  for (int a : unreduced) use(a);
  if (!std::is_sorted(unreduced.begin(), unreduced.end())) throw std::invalid_argument("unreduced axes are not sorted");
}

std::string TensorSharding::to_partition_spec(const DeviceMesh& mesh) const {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    const std::vector<std::string> d = mesh.axis_names(dims[i]);
    if (d.empty()) {
      s += "null";
    } else if (d.size() == 1) {
      s += fmt::format("\"{}\"", d[0]);
    } else {
      s += "[";
      for (size_t j = 0; j < d.size(); ++j) s += fmt::format("{}\"{}\"", j ? ", " : "", d[j]);
      s += "]";
    }
  }
  s += "]";
  if (!unreduced.empty()) {
    s +=
        reduction == ReductionKind::kSum ? " unreduced={" : fmt::format(" unreduced({})={{", reduction_name(reduction));
    s += fmt::format("{}}}", fmt::join(mesh.axis_names(unreduced), ", "));
  }
  return s;
}

namespace {

/// The device ids of to_hlo's tile array, row-major over (tensor dims' tiles, [unreduced], [replicated]).
std::vector<int64_t> tile_assignment(const TensorSharding& sh, const DeviceMesh& mesh, const std::vector<int64_t>& tile,
                                     int64_t nu, int64_t nr, const std::vector<int>& rep_axes) {
  const int r = sh.rank();
  const auto& dims = sh.dims;
  const auto& unreduced = sh.unreduced;
  const int64_t n = mesh.num_devices();
  std::vector<int64_t> arr(n);
  std::vector<int64_t> c(mesh.shape.size(), 0);
  auto fold = [&](const std::vector<int>& axes) {
    int64_t t = 0;
    for (int a : axes) t = t * mesh.shape[a] + c[a];
    return t;
  };
  for (int64_t k = 0; k < n; ++k) {
    int64_t pos = 0;
    for (int i = 0; i < r; ++i) pos = pos * tile[i] + fold(dims[i]);
    if (nu > 1) pos = pos * nu + fold(unreduced);
    if (nr > 1) pos = pos * nr + fold(rep_axes);
    arr[pos] = mesh.device_at(k);
    for (int i = mesh.rank() - 1; i >= 0; --i) {
      if (++c[i] < mesh.shape[i]) break;
      c[i] = 0;
    }
  }
  return arr;
}

}  // namespace

std::string TensorSharding::to_hlo(const DeviceMesh& mesh, bool iota) const {
  const int r = rank();
  // Tile dims: tensor dims, then [unreduced], then [replicated] (each trailing dim only if > 1 device).
  std::vector<char> role(mesh.shape.size(), 0);  // 0 replicated, 1 tiled, 2 unreduced
  for (const auto& d : dims)
    for (int a : d) role.at(a) = 1;
  for (int a : unreduced) role.at(a) = 2;
  std::vector<int> rep_axes;
  for (int a = 0; a < mesh.rank(); ++a)
    if (!role[a]) rep_axes.push_back(a);
  const int64_t nu = mesh.axes_size(unreduced), nr = mesh.axes_size(rep_axes);
  std::vector<int64_t> tile(r);
  int64_t ntiles = 1;
  for (int i = 0; i < r; ++i) ntiles *= (tile[i] = shards(i, mesh));
  if (ntiles == 1 && nu == 1) return "{replicated}";
  std::vector<int64_t> tdims = tile;
  if (nu > 1) tdims.push_back(nu);
  if (nr > 1) tdims.push_back(nr);
  std::string s = fmt::format("{{devices=[{}]", fmt::join(tdims, ","));
  if (iota && !mesh.has_device_order()) {
    // The iota mesh positions transposed to tile order: every axis, by the tile dim it feeds (unit axes anywhere).
    std::vector<int> perm = tiled_axes();
    perm.insert(perm.end(), unreduced.begin(), unreduced.end());
    perm.insert(perm.end(), rep_axes.begin(), rep_axes.end());
    std::vector<int> moved;  // the axes that are not units, in tile order: sorted = no transpose
    for (int a : perm)
      if (mesh.shape[a] > 1) moved.push_back(a);
    if (std::is_sorted(moved.begin(), moved.end()))
      s += fmt::format("<=[{}]", mesh.num_devices());
    else
      s += fmt::format("<=[{}]T({})", fmt::join(mesh.shape, ","), fmt::join(perm, ","));
  } else {
    s += fmt::format("{}", fmt::join(tile_assignment(*this, mesh, tile, nu, nr, rep_axes), ","));
  }
  if (nu > 1 && nr > 1)
    s += " last_tile_dims={unreduced, replicated}";
  else if (nu > 1)
    s += " last_tile_dims={unreduced}";
  else if (nr > 1)
    s += " last_tile_dim_replicate";
  return s + "}";
}

std::string TensorSharding::to_sbp(const DeviceMesh& mesh) const {
  std::string s = "(";
  for (int a = 0; a < mesh.rank(); ++a) {
    if (a) s += ", ";
    std::string e = "B";
    for (int i = 0; i < rank(); ++i)
      if (std::find(dims[i].begin(), dims[i].end(), a) != dims[i].end()) e = fmt::format("S({})", i);
    if (std::find(unreduced.begin(), unreduced.end(), a) != unreduced.end())
      e = reduction == ReductionKind::kSum ? "P" : fmt::format("P({})", reduction_name(reduction));
    s += e;
  }
  return s + ")";
}

}  // namespace gspmd
