// core/ir: user patterns over value names, with RE2 (name_pattern.h).
#include "core/ir/name_pattern.h"

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

}  // namespace gspmd
