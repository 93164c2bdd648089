// libFuzzer target: the model loader (docs/loading.md) on a model file's bytes, as `gspmd-onnx` loads MODEL.
// model_fuzzer loads it fully (run, partition: weights read, constants folded by the kernels);
// model_shapes_fuzzer (GSPMD_FUZZ_SHAPES_ONLY) loads initializer shapes only, as simulate does.
// The model sits in the scratch folder next to `weights.bin`, which external data may name. Every symbolic dim of the
// inputs is bound to 2, as --dim would, so that loading gets past "bind it with --dim". Oracles: the graph verifies,
// and the shardings.json `partition` would write for it reads back.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cli/wiring.h"
#include "fuzz/fuzz_util.h"
#include "onnx_frontend/frontend.h"

#ifndef GSPMD_FUZZ_SHAPES_ONLY
#define GSPMD_FUZZ_SHAPES_ONLY 0
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gspmd;
  const std::string path = fuzz::write_file("model.onnx", fuzz::as_text(data, size));
  LoadOptions lo = cli::kernel_load_options();
  lo.load_data = !GSPMD_FUZZ_SHAPES_ONLY;
  fuzz::expect_documented_errors([&] {
    const ModelInfo info = read_model_info(path);
    for (const auto& dims : info.input_dim_params)
      for (const std::string& d : dims)
        if (!d.empty()) lo.dims.emplace(d, 2);
  });
  fuzz::expect_documented_errors([&] {
    LoadReport report;
    Graph g = load_model(path, lo, &report);
    g.verify();  // what loads is a well-formed graph (a std::runtime_error here is a loader bug)
    for (const Value& v : g.values)
      if (v.kind != ValueKind::kTensor) fuzz::fail("value '" + v.name + "' is not a tensor after loading");
    // What `partition` writes about every value (its names in JSON) reads back: shardings.json, replicated on 2.
    const DeviceMesh mesh = DeviceMesh::parse("2");
    std::vector<TensorSharding> shardings;
    for (const Value& v : g.values) shardings.push_back(TensorSharding::replicated(static_cast<int>(v.shape.size())));
    const std::string file = (fuzz::scratch_dir() / "shardings.json").string();
    write_sharding_file(file, g, mesh, shardings);
    try {
      if (read_sharding_file(file, g, nullptr).by_value.size() != g.values.size())
        fuzz::fail("shardings.json of a loaded model does not read back every value");
    } catch (const InputError& e) {
      fuzz::fail(std::string("shardings.json of a loaded model does not read back: ") + e.what());
    }
  });
  return 0;
}
