// libFuzzer target: the sharding file (docs/sharding-file.md) as a whole: the bytes are the file given with
// --shardings, read against a graph of the GPT's, the MLP's and the docs' value names (fuzz/sharding_fuzz.h). Reaches
// the mesh, tensors, rules (RE2), specs, sub-axes and, through {"hlo": ...} and {"sbp": [...]}, both notations.
#include <cstddef>
#include <cstdint>

#include "fuzz/sharding_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gspmd;
  fuzz::check_sharding_file(fuzz::write_file("s.sharding.json", fuzz::as_text(data, size)));
  return 0;
}
