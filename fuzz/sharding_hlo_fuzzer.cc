// libFuzzer target: XLA HLO sharding text in a sharding file (docs/sharding-file.md, "Notations";
// core/sharding/notation.cc: sharding_from_hlo). The first byte picks the mesh, the annotated value's rank and the
// entry's form (fuzz::notation_file; bit 7 also adds "reduction": "max"); the rest is the text of {"hlo": TEXT}, read
// through read_sharding_file as the CLI reads it. Every other byte of the input can reach the HLO parser
// (JSON-escaped).
#include <cstddef>
#include <cstdint>

#include "fuzz/sharding_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gspmd;
  if (size == 0) return 0;
  const std::string text = fuzz::json_string_body(fuzz::as_text(data + 1, size - 1));
  const std::string entry =
      std::string(R"("hlo": ")") + text + "\"" + ((data[0] & 128) ? R"(, "reduction": "max")" : "");
  fuzz::check_sharding_file(fuzz::write_file("s.sharding.json", fuzz::notation_file(data[0], entry)));
  return 0;
}
