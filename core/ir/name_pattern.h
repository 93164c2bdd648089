// core/ir: regular expressions that users write over value names (sharding-file rules, --trainable, --layers),
// compiled with RE2 (docs/sharding-file.md#rules): matching takes time linear in the name and bounded memory, with no
// recursion and no backtracking, so a hostile pattern or a 50,000-character name cannot hang or crash the tool
// (std::regex recurses once per character and backtracks).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace re2 {
class RE2;
}

namespace gspmd {

/// A compiled user pattern. Syntax: RE2's (github.com/google/re2/wiki/Syntax), the Perl/ECMAScript forms without
/// backreferences and lookaround. Copies share the compiled pattern; matching is thread-safe.
class NamePattern {
 public:
  /// Compiled program size limit: a pattern that needs more (50,000 alternatives) is refused, not built.
  static constexpr int64_t kMaxProgramBytes = 8 << 20;

  /// Compiles `pattern`. Throws InputError("<what>: '<pattern>' is not a regular expression RE2 accepts: <reason>")
  /// (the pattern shown cut at 60 characters), e.g. for "(a)\\1": "invalid escape sequence: \\1"; `what` names
  /// the flag or the sharding-file item.
  NamePattern(std::string_view pattern, std::string_view what);
  /// The compiled pattern, or nullopt with RE2's reason in `why` ("missing ): (a").
  static std::optional<NamePattern> try_compile(std::string_view pattern, std::string* why);

  /// True when the pattern matches somewhere in `name` (as std::regex_search).
  bool search(std::string_view name) const;
  /// The number of capture groups.
  int groups() const;
  /// When the pattern matches somewhere in `name` and its first capture group took part: that group's
  /// [begin, end) offsets in `name`; else nullopt. Needs groups() >= 1.
  std::optional<std::pair<size_t, size_t>> search_group1(std::string_view name) const;
  const std::string& text() const { return text_; }

 private:
  NamePattern() = default;
  std::string text_;
  std::shared_ptr<const re2::RE2> re_;
};

/// The name with every whole numeric component ("h.12.mlp" / "layer/3/x" / "blk_7_w") replaced by '#': the key
/// that ties a value to its copies in repeated layers (together with shape and dtype).
std::string layer_key(const std::string& name);

/// The module path in a node name as torch's exporter scopes it: "/h.0/attn/q/MatMul" -> "h.0.attn.q", and
/// "/blocks/blocks.1/fc_in/MatMul" -> "blocks.1.fc_in" (a scope that repeats its parent's name as a prefix replaces
/// it); "" for a name without a scope ("MatMul_3", "/MatMul"). `inspect`'s module column (docs/cli.md).
std::string torch_module_path(const std::string& node_name);

}  // namespace gspmd
