// fuzz: what the sharding-file targets share (sharding_{json,hlo,sbp}_fuzzer.cc): the graph the files annotate, and
// reading a file the way the CLI does, with oracles on what it reads.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::fuzz {

/// The values a sharding file may name: the bundled GPT's weights and input (testdata/gpt), the frontend tests' MLP
/// (testdata/frontend/mlp.onnx), the examples of docs/sharding-file.md, and "r0" .. "r7" of ranks 0 .. 7 (the
/// targets that wrap HLO or SBP text annotate one of those). Only names and shapes matter to the reader.
inline const Graph& sharding_graph() {
  static const Graph g = [] {
    Graph g;
    auto add = [&](const std::string& name, Shape shape, DType t = DType::kFloat32) {
      Value v;
      v.name = name;
      v.dtype = t;
      v.shape = std::move(shape);
      v.is_initializer = name.find("weight") != std::string::npos || name.find("bias") != std::string::npos;
      g.add_value(std::move(v));
    };
    add("input_ids", {8, 64}, DType::kInt64);
    add("wte.weight", {512, 128});
    add("lm_head.weight", {128, 512});
    for (const char* layer : {"h.0.", "h.1."}) {
      const std::string h = layer;
      for (const char* p : {"attn.q.", "attn.k.", "attn.v.", "attn.proj."}) {
        add(h + p + "weight", {128, 128});
        add(h + p + "bias", {128});
      }
      add(h + "mlp.fc_in.weight", {128, 512});
      add(h + "mlp.fc_in.bias", {512});
      add(h + "mlp.fc_out.weight", {512, 128});
      add(h + "mlp.fc_out.bias", {128});
      add(h + "ln_1.weight", {128});
      add(h + "attn.qkv", {8, 64, 384});
      add(h + "mlp.out", {8, 64, 128});
    }
    for (const char* name : {"x", "y", "h", "h_relu"}) add(name, {4, 8});
    add("fc_in.weight", {8, 16});
    add("fc_out.weight", {16, 8});
    add("w1", {8, 6});
    add("w2", {6, 8});
    add("img", {2, 3, 9, 7});
    add("empty", {0, 4});
    for (int r = 0; r < 8; ++r) add("r" + std::to_string(r), Shape(static_cast<size_t>(r), 6));
    return g;
  }();
  return g;
}

/// The same sharding: the same axes per dim and unreduced axes, and the same reduction when some axis is unreduced
/// (a file may give a reduction without unreduced axes; it means nothing, and the writer leaves it out).
inline bool same_sharding(const TensorSharding& a, const TensorSharding& b) {
  return a.dims == b.dims && a.unreduced == b.unreduced && (a.unreduced.empty() || a.reduction == b.reduction);
}

/// The sharding file's annotations written back in `notation` (write_sharding_file, over a graph of the annotated
/// values only) and read again must be the same mesh and shardings (docs/sharding-file.md, "Writing": the output
/// always reads back). Any exception, an InputError included, is a finding.
inline void check_reads_back(const Graph& g, const Annotations& a, ShardingNotation notation) {
  Graph sub;
  std::vector<TensorSharding> shardings;
  for (const auto& [v, ann] : a.by_value) {
    Value val = g.values[static_cast<size_t>(v)];
    sub.add_value(std::move(val));
    shardings.push_back(ann.sharding);
  }
  const std::string path = (scratch_dir() / "again.sharding.json").string();
  write_sharding_file(path, sub, a.mesh, shardings, notation);
  Annotations b;
  try {
    b = read_sharding_file(path, sub, nullptr);
  } catch (const InputError& e) {
    fail(std::string("a written sharding file does not read back: ") + e.what());
  }
  const DeviceMesh au = a.mesh.user(), bu = b.mesh.user();
  if (bu.shape != au.shape || bu.axes != au.axes || bu.devices != au.devices)
    fail("a written sharding file reads back on mesh " + bu.str() + ", not " + au.str());
  // The file read may refine the mesh for sub-axes that no annotation uses (the writer does not write those): compare
  // on the first mesh, which is at least as fine as the second wherever an annotation splits.
  for (size_t v = 0; v < sub.values.size(); ++v) {
    auto it = b.by_value.find(static_cast<int>(v));
    if (it == b.by_value.end() || !same_sharding(remap(it->second.sharding, b.mesh, a.mesh), shardings[v]))
      fail("value '" + sub.values[v].name + "' reads back as " +
           (it == b.by_value.end() ? std::string("nothing") : it->second.sharding.to_partition_spec(b.mesh)) +
           ", not " + shardings[v].to_partition_spec(a.mesh));
  }
}

/// Reads the sharding file at `path` as the CLI does: sharding_file_names first (which weights stay unfolded), then
/// read_sharding_file without --mesh and with --mesh 2x2. Oracles on what reads: every annotation verifies on the
/// mesh at its value's rank, and the annotations read back from each notation the writer has.
inline void check_sharding_file(const std::string& path) {
  const Graph& g = sharding_graph();
  if (auto names = sharding_file_names(path))
    for (const Value& v : g.values) (void)names(v);
  static const DeviceMesh cli_mesh = DeviceMesh::parse("2x2");
  for (const DeviceMesh* cli : {static_cast<const DeviceMesh*>(nullptr), &cli_mesh}) {
    std::optional<Annotations> a;
    expect_documented_errors([&] { a = read_sharding_file(path, g, cli); });
    if (!a) continue;
    for (const auto& [v, ann] : a->by_value)
      ann.sharding.verify(a->mesh, static_cast<int>(g.values[static_cast<size_t>(v)].shape.size()));
    if (cli) continue;  // the same file read back once is enough
    for (ShardingNotation n : {ShardingNotation::kSpec, ShardingNotation::kHlo, ShardingNotation::kSbp})
      check_reads_back(g, *a, n);
  }
}

/// `text` as the contents of a JSON string (without the quotes): '"', '\\', control bytes and bytes >= 0x7f escaped
/// as \u00XX, so any bytes make valid JSON (a byte >= 0x80 becomes that code point, in UTF-8).
inline std::string json_string_body(std::string_view text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      static const char* const kHex = "0123456789abcdef";
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

/// The meshes the HLO and SBP targets annotate on, chosen by the input's first byte: plain, 1-D, 3-D, with a size-1
/// axis, and with device orders.
inline const char* notation_mesh(uint8_t selector) {
  static const char* const kMeshes[] = {
      R"({"shape": [2, 2], "axes": ["data", "model"]})",
      R"({"shape": [8], "axes": ["x"]})",
      R"({"shape": [2, 4], "axes": ["x", "y"]})",
      R"({"shape": [2, 2], "axes": ["data", "model"], "devices": [3, 0, 2, 1]})",
      R"({"shape": [2, 2, 2], "axes": ["x", "y", "z"]})",
      R"({"shape": [1, 4], "axes": ["a", "b"]})",
      R"({"shape": [4, 4], "axes": ["x", "y"]})",
      R"({"shape": [3, 2], "axes": ["p", "q"], "devices": [5, 4, 3, 2, 1, 0]})",
  };
  return kMeshes[selector % 8];
}

/// A sharding file annotating "r<rank>" with `entry` (a JSON object body such as `"hlo": "..."`): selector bits 0-2
/// pick the mesh (notation_mesh), bits 3-5 the rank, bit 6 makes it a rule matching "^r<rank>$" instead of a
/// `tensors` entry, bit 7 adds `"priority": 1, "open": true`.
inline std::string notation_file(uint8_t selector, const std::string& entry) {
  const std::string name = "r" + std::to_string((selector >> 3) & 7);
  const std::string extra = (selector & 128) ? R"(, "priority": 1, "open": true)" : "";
  std::string file = std::string(R"({"mesh": )") + notation_mesh(selector);
  if (selector & 64)
    file += R"(, "rules": [{"match": "^)" + name + R"($", )" + entry + extra + "}]}";
  else
    file += R"(, "tensors": {")" + name + R"(": {)" + entry + extra + "}}}";
  return file;
}

}  // namespace gspmd::fuzz
