// libFuzzer target: OneFlow nd-SBP in a sharding file (docs/sharding-file.md, "Notations"; core/sharding/notation.cc:
// sharding_from_sbp). The first byte picks the mesh, the annotated value's rank and the entry's form
// (fuzz::notation_file); the rest, split at newlines, is the list of {"sbp": [...]} (one entry per line, JSON-escaped),
// read through read_sharding_file as the CLI reads it.
#include <cstddef>
#include <cstdint>

#include "fuzz/sharding_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gspmd;
  if (size == 0) return 0;
  const std::string_view rest = fuzz::as_text(data + 1, size - 1);
  std::string list;
  for (size_t begin = 0; begin <= rest.size();) {
    size_t end = rest.find('\n', begin);
    if (end == std::string_view::npos) end = rest.size();
    list += (list.empty() ? "\"" : ", \"") + fuzz::json_string_body(rest.substr(begin, end - begin)) + "\"";
    begin = end + 1;
  }
  fuzz::check_sharding_file(
      fuzz::write_file("s.sharding.json", fuzz::notation_file(data[0], R"("sbp": [)" + list + "]")));
  return 0;
}
