// core/ir: JSON from users (sharding files, --target files, annotated models' metadata) parsed with its nesting
// bounded (docs/sharding-file.md#limits). nlohmann's parser is iterative, but the code that walks a document recurses
// per level: a value nested 40,000 deep crashed it. For the files and modules that already use nlohmann_json.
#pragma once

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/ir/ir.h"

namespace gspmd {

/// The deepest nesting of arrays and objects a user's JSON may have: far above any sharding file (4 levels).
inline constexpr int kMaxJsonDepth = 64;

/// nlohmann::json::parse(text), refusing input nested deeper than kMaxJsonDepth before it is parsed: throws
/// InputError("<what>: JSON nested deeper than 64 levels"), and as json::parse does nlohmann::json::parse_error for
/// malformed text and nlohmann::json::out_of_range for a number past a double's range ("1E6212"): callers catch both
/// as nlohmann::json::exception (the sharding-file fuzzer found the second escaping them). The depth is counted in
/// one pass over the brackets outside strings (nlohmann's parser with a depth callback took twice as long).
inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw InputError(fmt::format("{}: JSON nested deeper than {} levels", what, kMaxJsonDepth));
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to refuse
    }
  }
  return nlohmann::json::parse(text);
}

}  // namespace gspmd
