// core/partition/reshard.cc: shortest-path reshard planning (Dijkstra over shardings of one value).
#include "core/partition/reshard.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "core/cost/cost.h"

namespace gspmd {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<int> minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> r;
  for (int x : a)
    if (!contains(b, x)) r.push_back(x);
  return r;
}

/// Every non-empty ordered selection of elements of `set` (k <= 4 in practice: 64 sequences).
std::vector<std::vector<int>> sequences(const std::vector<int>& set) {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  std::vector<bool> used(set.size(), false);
  std::function<void()> rec = [&] {
    if (!cur.empty()) out.push_back(cur);
    for (size_t i = 0; i < set.size(); ++i) {
      if (used[i]) continue;
      used[i] = true;
      cur.push_back(set[i]);
      rec();
      cur.pop_back();
      used[i] = false;
    }
  };
  rec();
  return out;
}

ReshardStep make(ReshardStep::Kind kind, std::vector<int> axes, int dim = -1, int dim2 = -1) {
  ReshardStep st;
  st.kind = kind;
  st.axes = std::move(axes);
  st.dim = dim;
  st.dim2 = dim2;
  return st;
}

std::string key_of(const TensorSharding& s) {
  std::string k;
  for (const auto& d : s.dims) {
    for (int a : d) k += static_cast<char>('0' + a);
    k += '|';
  }
  k += 'u';
  for (int a : s.unreduced) k += static_cast<char>('0' + a);
  k += static_cast<char>('0' + static_cast<int>(s.reduction));
  return k;
}

std::vector<int> flat_axes(const TensorSharding& s) {
  std::vector<int> r;
  for (const auto& d : s.dims) r.insert(r.end(), d.begin(), d.end());
  return r;
}

/// Generates the exact steps out of one sharding and prices them.
class Edges {
 public:
  Edges(const DeviceMesh& mesh, const Target& target, const Shape& global, int64_t elem_bytes, const TensorSharding& to,
        std::vector<int> slice_axes, const std::vector<char>& ragged)
      : mesh_(mesh),
        target_(target),
        g_(global),
        eb_(elem_bytes),
        to_(to),
        slice_axes_(std::move(slice_axes)),
        ragged_(ragged) {}

  /// Size `size` of dim d divides by `k` at every size of the dim (ReshardPlanner::plan's `ragged`).
  bool divides(int d, int64_t size, int64_t k) const {
    return size % k == 0 && !(static_cast<size_t>(d) < ragged_.size() && ragged_[static_cast<size_t>(d)]);
  }

  /// Calls out(step) for every step leaving `s`.
  template <class Out>
  void each(const TensorSharding& s, const Out& out) const {
    const int rank = s.rank();
    const Shape L = s.local_shape(g_, mesh_);
    const int64_t in = num_elements(L) * eb_;
    const std::vector<int> reducible = minus(s.unreduced, to_.unreduced);
    // all-reduce any subset of the unreduced axes the target does not keep
    const size_t nr = reducible.size();
    for (uint32_t mask = 1; mask < (1u << nr); ++mask) {
      std::vector<int> axes;
      for (size_t i = 0; i < nr; ++i)
        if (mask & (1u << i)) axes.push_back(reducible[i]);
      ReshardStep st = make(ReshardStep::Kind::kAllReduce, axes);
      st.after = reduced(s, axes);
      out(price(L, in, std::move(st)));
    }
    const auto reducible_seqs = sequences(reducible);
    std::vector<int> unused;
    for (int a : slice_axes_) {
      bool used = contains(s.unreduced, a);
      for (const auto& dd : s.dims) used = used || contains(dd, a);
      if (!used) unused.push_back(a);
    }
    const auto unused_seqs = sequences(unused);
    for (int d = 0; d < rank; ++d) {
      // reduce-scatter onto dim d
      for (const auto& seq : reducible_seqs) {
        if (!divides(d, L[d], mesh_.axes_size(seq))) continue;
        ReshardStep st = make(ReshardStep::Kind::kReduceScatter, seq, d);
        st.after = reduced(s, seq);
        st.after.dims[d].insert(st.after.dims[d].end(), seq.begin(), seq.end());
        out(price(L, in, std::move(st)));
      }
      // all-gather a trailing run of dim d's axes
      const auto& cd = s.dims[d];
      for (size_t p = 0; p < cd.size(); ++p) {
        std::vector<int> keep(cd.begin(), cd.begin() + static_cast<long>(p));
        std::vector<int> gathered(cd.begin() + static_cast<long>(p), cd.end());
        if (p > 0 && !nests(d, keep, gathered)) continue;
        ReshardStep st = make(ReshardStep::Kind::kAllGather, gathered, d);
        st.trim = p == 0 && !divides(d, g_[d], mesh_.axes_size(gathered));
        st.after = s;
        st.after.dims[d] = keep;
        out(price(L, in, std::move(st)));
      }
      // slice locally over unused axes
      for (const auto& seq : unused_seqs) {
        if (!cd.empty() && !nests(d, cd, seq)) continue;
        ReshardStep st = make(ReshardStep::Kind::kSlice, seq, d);
        st.after = s;
        st.after.dims[d].insert(st.after.dims[d].end(), seq.begin(), seq.end());
        out(price(L, in, std::move(st)));
      }
      // all-to-all: trailing axes of dim d move to the end of dim b
      for (int b = 0; b < rank; ++b) {
        if (b == d) continue;
        for (size_t p = 0; p < cd.size(); ++p) {
          std::vector<int> moved(cd.begin() + static_cast<long>(p), cd.end());
          std::vector<int> nb = s.dims[b];
          nb.insert(nb.end(), moved.begin(), moved.end());
          if (!divides(d, g_[d], mesh_.axes_size(cd)) || !divides(b, g_[b], mesh_.axes_size(nb))) continue;
          ReshardStep st = make(ReshardStep::Kind::kAllToAll, moved, d, b);
          st.after = s;
          st.after.dims[d].resize(p);
          st.after.dims[b] = nb;
          out(price(L, in, std::move(st)));
        }
      }
    }
    permutes(s, L, in, out);
  }

  /// A step's bytes and seconds from the local shapes before and after it.
  ReshardStep price(const Shape& L, int64_t in, ReshardStep st) const {
    int64_t outb = num_elements(st.after.local_shape(g_, mesh_)) * eb_;
    const std::optional<Collective> coll = step_collective(st.kind);
    if (!coll) {  // a local slice
      st.seconds = static_cast<double>(in) / target_.hbm_bandwidth;
      return st;
    }
    if (*coll == Collective::kAllGather) {  // before the trim: the padded concatenation
      Shape gathered = L;
      gathered[static_cast<size_t>(st.dim)] *= mesh_.axes_size(st.axes);
      outb = num_elements(gathered) * eb_;
    }
    st.bytes = std::max(in, outb);
    st.seconds = collective_time(*coll, static_cast<double>(st.bytes), st.axes, mesh_, target_);
    return st;
  }

 private:
  TensorSharding reduced(const TensorSharding& s, const std::vector<int>& axes) const {
    TensorSharding r = s;
    r.unreduced = minus(s.unreduced, axes);
    if (r.unreduced.empty()) r.reduction = ReductionKind::kSum;
    return r;
  }

  /// Shards over `major` split further over `minor` keep the canonical layout: ceil(d/T) == m*ceil(d/(T*m)).
  bool nests(int d, const std::vector<int>& major, const std::vector<int>& minor) const {
    const int64_t t = mesh_.axes_size(major), m = mesh_.axes_size(minor);
    return ceil_div(g_[d], t) == m * ceil_div(g_[d], t * m);
  }

  /// Layouts with the same number of shards per dim but the tiled axes in other places: a permutation of devices.
  /// Only layouts from which the target is reached without more communication are tried (every dim's axes a prefix
  /// of the target's): a permute moves whole shards, so it is the last collective of a plan.
  template <class Out>
  void permutes(const TensorSharding& s, const Shape& L, int64_t in, const Out& out) const {
    std::vector<int> axes = flat_axes(s);
    if (axes.size() < 2) return;
    const int rank = s.rank();
    TensorSharding t = s;
    for (int d = 0; d < rank; ++d) {
      // the prefix of the target's dim d with as many shards as s has on dim d
      const int64_t want = mesh_.axes_size(s.dims[d]);
      t.dims[d].clear();
      int64_t size = 1;
      for (size_t i = 0; i < to_.dims[d].size() && size < want; ++i) {
        size *= mesh_.shape[to_.dims[d][i]];
        t.dims[d].push_back(to_.dims[d][i]);
      }
      if (size != want) return;
    }
    std::vector<int> target = flat_axes(t), a = axes, b = target;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a != b || t == s) return;
    ReshardStep st = make(ReshardStep::Kind::kPermute, axes);
    st.target_axes = std::move(target);
    st.after = std::move(t);
    out(price(L, in, std::move(st)));
  }

  const DeviceMesh& mesh_;
  const Target& target_;
  const Shape& g_;
  int64_t eb_;
  const TensorSharding& to_;
  std::vector<int> slice_axes_;
  const std::vector<char>& ragged_;
};

}  // namespace

std::optional<Collective> step_collective(ReshardStep::Kind k) {
  switch (k) {
    case ReshardStep::Kind::kAllReduce: return Collective::kAllReduce;
    case ReshardStep::Kind::kReduceScatter: return Collective::kReduceScatter;
    case ReshardStep::Kind::kAllToAll: return Collective::kAllToAll;
    case ReshardStep::Kind::kAllGather: return Collective::kAllGather;
    case ReshardStep::Kind::kSlice: return std::nullopt;
    case ReshardStep::Kind::kPermute: return Collective::kCollectivePermute;
  }
  throw InternalError("step_collective: invalid ReshardStep::Kind");
}

std::string_view step_name(ReshardStep::Kind k) {
  const std::optional<Collective> c = step_collective(k);
  return c ? collective_name(*c) : "slice";
}

const ReshardPlan& ReshardPlanner::plan(const Shape& global, int64_t elem_bytes, const TensorSharding& from,
                                        const TensorSharding& to, const std::vector<char>& ragged) {
  // The key as bytes (every partitioned node asks, for each operand and result: it must be cheap to build): the dims,
  // the element size, then both shardings' axes with dim separators.
  std::string key;
  key.reserve(8 * global.size() + 64);
  key.append(reinterpret_cast<const char*>(global.data()), global.size() * sizeof(int64_t));
  key.append(reinterpret_cast<const char*>(&elem_bytes), sizeof elem_bytes);
  key.append(ragged.begin(), ragged.end());
  key += '\xfe';
  for (const TensorSharding* s : {&from, &to}) {
    for (const auto& d : s->dims) {
      for (int a : d) key += static_cast<char>(a);
      key += '\xff';
    }
    for (int a : s->unreduced) key += static_cast<char>(a);
    key += static_cast<char>(0xf0 + static_cast<int>(s->reduction));
  }
  auto it = cache_.find(key);
  if (it != cache_.end()) {
    ++hits_;
    return it->second;
  }
  ++searches_;
  return cache_.emplace(std::move(key), search(global, elem_bytes, from, to, ragged)).first->second;
}

ReshardPlan ReshardPlanner::search(const Shape& global, int64_t elem_bytes, const TensorSharding& from,
                                   const TensorSharding& to, const std::vector<char>& ragged) const {
  if (from.rank() != static_cast<int>(global.size()) || to.rank() != from.rank())
    throw InternalError("reshard: sharding rank does not match the value's rank");
  for (int a : to.unreduced)
    if (!contains(from.unreduced, a)) throw InternalError("reshard: cannot make a value unreduced");
  if (!to.unreduced.empty() && to.reduction != from.reduction)
    throw InternalError("reshard: unreduced values keep their reduction kind");

  // A* over shardings (ties on time go to fewer steps); states are keyed by their layout. The heuristic: a sharding
  // from which slices alone cannot reach `to` (an unreduced axis to combine, or a dim whose axes are not a prefix of
  // the target's) needs at least one more collective, and every collective over axes of size >= 2 costs at least
  // the link latency. Slices never lower it, so it is consistent and the plan stays optimal.
  const bool unit_axis = std::find(mesh_.shape.begin(), mesh_.shape.end(), 1) != mesh_.shape.end();
  auto heuristic = [&](const TensorSharding& s) {
    if (unit_axis) return 0.0;
    for (int a : s.unreduced)
      if (!contains(to.unreduced, a)) return target_.link_latency;
    for (int d = 0; d < s.rank(); ++d)
      if (s.dims[d].size() > to.dims[d].size() || !std::equal(s.dims[d].begin(), s.dims[d].end(), to.dims[d].begin()))
        return target_.link_latency;
    return 0.0;
  };
  struct Entry {
    TensorSharding s;
    double seconds = 0;
    int steps = 0;
    std::string prev;
    ReshardStep step;
    bool done = false;
  };
  std::unordered_map<std::string, Entry> seen;
  using Item = std::tuple<double, int, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
  const std::string start = key_of(from), goal = key_of(to);
  seen[start].s = from;
  queue.emplace(0.0, 0, start);
  const Edges edges(mesh_, target_, global, elem_bytes, to, to.tiled_axes(), ragged);
  while (!queue.empty()) {
    auto [f, steps, k] = queue.top();
    queue.pop();
    Entry& e = seen[k];
    if (e.done) continue;
    e.done = true;
    if (k == goal) break;
    const TensorSharding s = e.s;
    const double sec = e.seconds;
    edges.each(s, [&, steps = steps, &k = k](ReshardStep&& st) {
      std::string nk = key_of(st.after);
      const double ns = sec + st.seconds;
      auto [pos, fresh] = seen.try_emplace(nk);
      Entry& n = pos->second;
      if (n.done || (!fresh && std::make_tuple(n.seconds, n.steps) <= std::make_tuple(ns, steps + 1))) return;
      n.s = st.after;
      n.seconds = ns;
      n.steps = steps + 1;
      n.prev = k;
      n.step = std::move(st);
      queue.emplace(ns + heuristic(n.s), steps + 1, nk);
    });
  }
  auto it = seen.find(goal);
  if (it == seen.end() || !it->second.done)
    throw InternalError(fmt::format("reshard: no plan from {} to {}", start, goal));
  ReshardPlan plan;
  plan.states = static_cast<int>(seen.size());
  for (std::string k = goal; k != start; k = seen[k].prev) plan.steps.push_back(seen[k].step);
  std::reverse(plan.steps.begin(), plan.steps.end());
  for (const auto& st : plan.steps) {
    plan.seconds += st.seconds;
    plan.bytes += st.bytes;
  }
  return plan;
}

std::vector<int64_t> permute_sources(const DeviceMesh& mesh, const std::vector<int>& mesh_axes, int64_t shift,
                                     const std::vector<int>& target_axes, bool wrap) {
  const int64_t n = mesh.axes_size(mesh_axes);
  std::vector<int64_t> src(static_cast<size_t>(n), -1);
  if (target_axes.empty()) {
    for (int64_t t = 0; t < n; ++t)
      if (wrap)
        src[static_cast<size_t>(t)] = ((t - shift) % n + n) % n;
      else if (t - shift >= 0 && t - shift < n)
        src[static_cast<size_t>(t)] = t - shift;
    return src;
  }
  std::vector<int> sorted_a = mesh_axes, sorted_b = target_axes;
  std::sort(sorted_a.begin(), sorted_a.end());
  std::sort(sorted_b.begin(), sorted_b.end());
  if (sorted_a != sorted_b) throw std::invalid_argument("collective-permute: target_axes must permute mesh_axes");
  std::vector<int64_t> coord(mesh.shape.size(), 0);
  for (int64_t t = 0; t < n; ++t) {
    int64_t rest = t;  // unravel t over mesh_axes, minor axis last
    for (size_t i = mesh_axes.size(); i-- > 0;) {
      coord[mesh_axes[i]] = rest % mesh.shape[mesh_axes[i]];
      rest /= mesh.shape[mesh_axes[i]];
    }
    int64_t s = 0;
    for (int a : target_axes) s = s * mesh.shape[a] + coord[a];
    src[static_cast<size_t>(t)] = s;
  }
  return src;
}

}  // namespace gspmd
