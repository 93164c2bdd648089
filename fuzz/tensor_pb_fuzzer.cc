// libFuzzer target: the test-data .pb readers (`run --inputs DIR`, `--expected DIR`): the bytes as input_0.pb read as
// a TensorProto (read_tensor_pb) and as each kind read_value_pb takes (tensor, SequenceProto, OptionalProto). The
// file sits in the scratch folder next to `weights.bin`, which external data may name.
// Oracle: a tensor that reads back is written (write_tensor_pb) and read again to the same dtype, shape and bytes.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "onnx_frontend/frontend.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gspmd;
  const std::string path = fuzz::write_file("input_0.pb", fuzz::as_text(data, size));
  fuzz::expect_documented_errors([&] {
    const Tensor t = read_tensor_pb(path);
    const std::string again = (fuzz::scratch_dir() / "again.pb").string();
    write_tensor_pb(again, t, "t");
    const Tensor u = read_tensor_pb(again);
    if (u.dtype != t.dtype || u.shape != t.shape || u.bytes != t.bytes)
      fuzz::fail("a tensor written by write_tensor_pb reads back as " + type_str(u.dtype, u.shape) + ", not " +
                 type_str(t.dtype, t.shape));
  });
  for (ValueKind kind : {ValueKind::kSequence, ValueKind::kOptional})
    fuzz::expect_documented_errors([&] { (void)read_value_pb(path, kind); });
  return 0;
}
