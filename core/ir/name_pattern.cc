// core/ir: user patterns over value names, with RE2, and the layer key of a name (name_pattern.h).
#include "core/ir/name_pattern.h"

#include <algorithm>

#include <re2/re2.h>

#include <fmt/format.h>

#include "core/ir/ir.h"

namespace gspmd {

std::optional<NamePattern> NamePattern::try_compile(std::string_view pattern, std::string* why) {
  RE2::Options opts;
  opts.set_log_errors(false);  // the error is ours to report, in one line
  opts.set_max_mem(kMaxProgramBytes);
  auto re = std::make_shared<const RE2>(re2::StringPiece(pattern.data(), pattern.size()), opts);
  if (!re->ok()) {
    if (why) *why = re->error();
    return std::nullopt;
  }
  NamePattern p;
  p.text_ = std::string(pattern);
  p.re_ = std::move(re);
  return p;
}

NamePattern::NamePattern(std::string_view pattern, std::string_view what) {
  std::string why;
  std::optional<NamePattern> p = try_compile(pattern, &why);
  if (!p) {
    throw InputError(fmt::format("{}: '{}' is not a regular expression RE2 accepts: {}", what, cut_text(pattern), why));
  }
  *this = std::move(*p);
}

bool NamePattern::search(std::string_view name) const {
  return RE2::PartialMatch(re2::StringPiece(name.data(), name.size()), *re_);
}

int NamePattern::groups() const { return re_->NumberOfCapturingGroups(); }

std::optional<std::pair<size_t, size_t>> NamePattern::search_group1(std::string_view name) const {
  re2::StringPiece text(name.data(), name.size()), group[2];
  if (groups() < 1 || !re_->Match(text, 0, text.size(), RE2::UNANCHORED, group, 2) || group[1].data() == nullptr)
    return std::nullopt;
  const size_t begin = static_cast<size_t>(group[1].data() - name.data());
  return std::make_pair(begin, begin + group[1].size());
}

std::string layer_key(const std::string& name) {
  // A component is a maximal run between separators; a component made only of digits becomes '#'.
  auto is_sep = [](char c) { return c == '.' || c == '/' || c == '_' || c == ':' || c == '-'; };
  std::string out;
  size_t i = 0;
  while (i < name.size()) {
    if (is_sep(name[i])) {
      out += name[i++];
      continue;
    }
    size_t j = i;
    while (j < name.size() && !is_sep(name[j])) ++j;
    const bool digits = std::all_of(name.begin() + static_cast<long>(i), name.begin() + static_cast<long>(j),
                                    [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? std::string("#") : name.substr(i, j - i);
    i = j;
  }
  return out;
}

std::string torch_module_path(const std::string& node_name) {
  if (node_name.empty() || node_name[0] != '/') return "";
  // The scopes between the slashes, the last part being the op. A scope may repeat its parent's name as a prefix
  // (a Sequential's child "blocks.0" under "blocks"): it then replaces the parent's last part.
  std::string path, last;
  for (size_t begin = 1, end; (end = node_name.find('/', begin)) != std::string::npos; begin = end + 1) {
    const std::string scope = node_name.substr(begin, end - begin);
    if (!last.empty() && scope.starts_with(last + ".")) path.resize(path.size() - last.size() - (path == last ? 0 : 1));
    path += (path.empty() ? "" : ".") + scope;
    last = scope;
  }
  return path;
}

}  // namespace gspmd
