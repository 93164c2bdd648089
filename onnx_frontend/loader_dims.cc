// The loader's symbolic dims (loader_impl.h): bound by --dim and --inputs, kept with hints, checked by name.
#include "onnx_frontend/loader_impl.h"

namespace gspmd::loader_internal {

const LoadOptions& Loader::with_structured_inputs(LoadOptions& storage) const {
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

std::map<std::string, Shape> Loader::given_shapes() const {
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

std::map<std::string, int64_t> Loader::bound_dims(const std::map<std::string, Shape>& given_shapes) const {
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

void Loader::collect_dim_params(const onnx::TypeProto& t, std::set<std::string>& out) {
  if (t.has_tensor_type())
    for (const auto& d : t.tensor_type().shape().dim())
      if (d.has_dim_param()) out.insert(d.dim_param());
  if (t.has_sequence_type()) collect_dim_params(t.sequence_type().elem_type(), out);
  if (t.has_optional_type()) collect_dim_params(t.optional_type().elem_type(), out);
}

void Loader::check_dim_names(const Graph& g) const {
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

void Loader::check_hint_names() const {
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

void Loader::keep_symbol(const std::string& name, int i, int rank, const std::string& sym) {
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

void Loader::bind_dims() {
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

}  // namespace gspmd::loader_internal
