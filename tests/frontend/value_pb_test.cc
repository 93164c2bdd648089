// Sequence and optional values: read_value_pb / write_value_pb (round trips, Debian's ONNX test data, errors),
// flatten_inputs / unflatten_outputs, and read_model_info's kinds and element types.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/frontend/frontend_test_util.h"
#include "tests/frontend/onnx_headers.h"
// SequenceProto / OptionalProto; after onnx_headers.h, which defines ONNX_ML for it.
#include <onnx/onnx-data_pb.h>

namespace gspmd {
namespace {

using test::expect_input_error;
using test::TempDir;

const char* const kNodeData = "/usr/share/libonnx-testdata/data/node";

// A tensor of `dt` and shape `s` holding `v`'s bytes.
template <class T>
Tensor make(DType dt, Shape s, std::vector<T> v) {
  Tensor t(dt, std::move(s));
  std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(T));
  return t;
}

// A sequence value.
OnnxValue sequence(std::vector<Tensor> ts, DType elem) {
  OnnxValue v;
  v.structure = {ValueKind::kSequence, true, false, elem};
  v.tensors = std::move(ts);
  return v;
}

// An optional value.
OnnxValue optional(std::vector<Tensor> ts, bool present, bool of_sequence, DType elem) {
  OnnxValue v;
  v.structure = {ValueKind::kOptional, present, of_sequence, elem};
  v.tensors = std::move(ts);
  return v;
}

// A node test's file: kNodeData/<test>/test_data_set_0/<file>.
std::string node_file(const std::string& test, const std::string& file) {
  return std::string(kNodeData) + "/" + test + "/test_data_set_0/" + file;
}

// A whole file's bytes.
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Same structure and tensors (dtype, shape, bytes).
void expect_same(const OnnxValue& a, const OnnxValue& b, const std::string& what) {
  EXPECT_EQ(a.structure, b.structure) << what;
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].dtype, b.tensors[i].dtype) << what << " element " << i;
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape) << what << " element " << i;
    EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes) << what << " element " << i;
  }
}

TEST(ValuePb, StructureStr) {
  EXPECT_EQ(structure_str({ValueKind::kTensor}), "tensor");
  EXPECT_EQ(structure_str({ValueKind::kSequence}), "sequence");
  EXPECT_EQ(structure_str({ValueKind::kOptional, true, false}), "optional(tensor)");
  EXPECT_EQ(structure_str({ValueKind::kOptional, true, true}), "optional(sequence)");
  EXPECT_EQ(structure_str({ValueKind::kOptional, false, true}), "empty optional");
  OnnxValue v = OnnxValue::of(Tensor::from_int64s({1, 2}));
  EXPECT_EQ(v.structure, (ValueStructure{ValueKind::kTensor, true, false, DType::kInt64}));
  ASSERT_EQ(v.tensors.size(), 1u);
  EXPECT_EQ(v.tensors[0].as_int64s(), (std::vector<int64_t>{1, 2}));
}

TEST(ValuePb, RoundTrip) {
  TempDir d;
  const std::vector<OnnxValue> values = {
      OnnxValue::of(Tensor::from_floats({2, 2}, {1.f, -2.f, 3.5f, 0.f})),
      sequence({Tensor::from_floats({2, 2}, {1.f, 2.f, 3.f, 4.f}), Tensor::from_floats({3}, {5.f, 6.f, 7.f}),
                Tensor::from_floats({}, {8.f})},
               DType::kFloat32),
      optional({make<int32_t>(DType::kInt32, {3}, {1, -1, 2147483647})}, true, false, DType::kInt32),
      optional({Tensor::from_int64s({5}), Tensor::from_int64s({6, 7})}, true, true, DType::kInt64),
      optional({}, true, true, DType::kUndefined),  // an optional holding an empty sequence
      optional({}, false, false, DType::kUndefined),
  };
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string p = d.file("v" + std::to_string(i) + ".pb");
    write_value_pb(p, values[i], "name");
    expect_same(read_value_pb(p, values[i].structure.kind), values[i], structure_str(values[i].structure));
  }
}

// What a round trip loses: the files do not hold it.
TEST(ValuePb, RoundTripLosses) {
  TempDir d;
  // An empty SequenceProto has no tensor to take a dtype from (elem_type only says "tensors"): the element dtype
  // reads back as kUndefined; the kind and the empty element list survive.
  const std::string seq = d.file("empty_seq.pb");
  write_value_pb(seq, sequence({}, DType::kFloat32), "s");
  OnnxValue back = read_value_pb(seq, ValueKind::kSequence);
  EXPECT_EQ(back.structure, (ValueStructure{ValueKind::kSequence, true, false, DType::kUndefined}));
  EXPECT_TRUE(back.tensors.empty());
  // An empty optional is written with elem_type UNDEFINED (as onnx.numpy_helper.from_optional(None)): whether it
  // was declared to hold a sequence and its element dtype are lost.
  const std::string opt = d.file("empty_opt.pb");
  write_value_pb(opt, optional({}, false, true, DType::kInt64), "o");
  back = read_value_pb(opt, ValueKind::kOptional);
  EXPECT_EQ(back.structure, (ValueStructure{ValueKind::kOptional, false, false, DType::kUndefined}));
  EXPECT_TRUE(back.tensors.empty());
}

// Files written by ONNX's own numpy_helper (Debian's libonnx-testdata); the expected contents were read with
// onnx.numpy_helper.to_list / to_optional.
TEST(ValuePb, OnnxTestData) {
  if (!std::filesystem::is_directory(kNodeData)) GTEST_SKIP() << "libonnx-testdata not installed";
  OnnxValue s = read_value_pb(node_file("test_sequence_insert_at_back", "input_0.pb"), ValueKind::kSequence);
  EXPECT_EQ(s.structure, (ValueStructure{ValueKind::kSequence, true, false, DType::kInt64}));
  ASSERT_EQ(s.tensors.size(), 3u);
  const std::vector<Shape> shapes = {{4}, {3}, {2}};
  const std::vector<std::vector<int64_t>> data = {{1, 2, 3, 4}, {5, 6, 7}, {8, 9}};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.tensors[i].dtype, DType::kInt64) << i;
    EXPECT_EQ(s.tensors[i].shape, shapes[i]) << i;
    EXPECT_EQ(s.tensors[i].as_int64s(), data[i]) << i;
  }
  OnnxValue out = read_value_pb(node_file("test_sequence_insert_at_back", "output_0.pb"), ValueKind::kSequence);
  ASSERT_EQ(out.tensors.size(), 4u);
  EXPECT_EQ(out.tensors[3].as_int64s(), (std::vector<int64_t>{10, 11, 12}));
  // The other input is a plain TensorProto.
  OnnxValue t = read_value_pb(node_file("test_sequence_insert_at_back", "input_1.pb"), ValueKind::kTensor);
  EXPECT_EQ(t.structure, (ValueStructure{ValueKind::kTensor, true, false, DType::kInt64}));
  EXPECT_EQ(t.tensors.at(0).as_int64s(), (std::vector<int64_t>{10, 11, 12}));

  OnnxValue ot = read_value_pb(node_file("test_optional_get_element", "input_0.pb"), ValueKind::kOptional);
  EXPECT_EQ(ot.structure, (ValueStructure{ValueKind::kOptional, true, false, DType::kFloat32}));
  ASSERT_EQ(ot.tensors.size(), 1u);
  EXPECT_EQ(ot.tensors[0].shape, (Shape{4}));
  EXPECT_EQ(ot.tensors[0].as_int64s(), (std::vector<int64_t>{1, 2, 3, 4}));

  OnnxValue os = read_value_pb(node_file("test_optional_get_element_sequence", "input_0.pb"), ValueKind::kOptional);
  EXPECT_EQ(os.structure, (ValueStructure{ValueKind::kOptional, true, true, DType::kInt32}));
  ASSERT_EQ(os.tensors.size(), 1u);
  EXPECT_EQ(os.tensors[0].dtype, DType::kInt32);
  EXPECT_EQ(os.tensors[0].shape, (Shape{4}));
  EXPECT_EQ(os.tensors[0].as_int64s(), (std::vector<int64_t>{1, 2, 3, 4}));

  OnnxValue oe = read_value_pb(node_file("test_optional_has_element_empty", "input_0.pb"), ValueKind::kOptional);
  EXPECT_EQ(oe.structure, (ValueStructure{ValueKind::kOptional, false, false, DType::kUndefined}));
  EXPECT_TRUE(oe.tensors.empty());

  TempDir d;
  for (const char* f : {"input_0.pb", "output_0.pb"}) {
    OnnxValue io = read_value_pb(node_file("test_identity_opt", f), ValueKind::kOptional);
    EXPECT_EQ(io.structure, (ValueStructure{ValueKind::kOptional, true, true, DType::kFloat32})) << f;
    ASSERT_EQ(io.tensors.size(), 1u) << f;
    EXPECT_EQ(io.tensors[0].shape, (Shape{5})) << f;
    EXPECT_EQ(io.tensors[0].as_int64s(), (std::vector<int64_t>{1, 2, 3, 4, 5})) << f;
    // Written back and read again: the same value.
    write_value_pb(d.file("io.pb"), io, "opt_out");
    expect_same(read_value_pb(d.file("io.pb"), ValueKind::kOptional), io, f);
  }
}

TEST(ValuePb, Errors) {
  TempDir d;
  const std::string missing = d.file("missing.pb");
  expect_input_error([&] { read_value_pb(missing, ValueKind::kSequence); }, missing + ": cannot open file");

  // A sequence file cut in the middle of its second element.
  const std::string full = d.file("full.pb");
  write_value_pb(full, sequence({Tensor::from_floats({4}, {1, 2, 3, 4}), Tensor::from_floats({4}, {5, 6, 7, 8})},
                                DType::kFloat32));
  std::string bytes = read_bytes(full);
  const std::string cut = d.write("cut.pb", bytes.substr(0, bytes.size() - 6));
  expect_input_error([&] { read_value_pb(cut, ValueKind::kSequence); },
                     cut + ": not a valid serialized onnx.SequenceProto");
  write_value_pb(full, optional({Tensor::from_floats({4}, {1, 2, 3, 4})}, true, false, DType::kFloat32));
  bytes = read_bytes(full);
  const std::string cut_opt = d.write("cut_opt.pb", bytes.substr(0, bytes.size() - 6));
  expect_input_error([&] { read_value_pb(cut_opt, ValueKind::kOptional); },
                     cut_opt + ": not a valid serialized onnx.OptionalProto");

  // A TensorProto read as a sequence: it parses, but into fields a SequenceProto does not have.
  const std::string tensor = d.file("tensor.pb");
  write_tensor_pb(tensor, Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6}), "t");
  expect_input_error([&] { read_value_pb(tensor, ValueKind::kSequence); },
                     tensor + ": not a valid serialized onnx.SequenceProto");
  expect_input_error([&] { read_value_pb(tensor, ValueKind::kOptional); },
                     tensor + ": not a valid serialized onnx.OptionalProto");

  // Element types other than tensors.
  onnx::SequenceProto maps;
  maps.set_name("m");
  maps.set_elem_type(onnx::SequenceProto::MAP);
  maps.add_map_values()->set_key_type(onnx::TensorProto::INT64);
  const std::string map_seq = d.write("maps.pb", maps.SerializeAsString());
  expect_input_error([&] { read_value_pb(map_seq, ValueKind::kSequence); },
                     map_seq + ": a sequence of maps is not supported");
  onnx::SequenceProto nested;
  nested.set_elem_type(onnx::SequenceProto::SEQUENCE);
  nested.add_sequence_values()->set_elem_type(onnx::SequenceProto::TENSOR);
  const std::string nested_seq = d.write("nested.pb", nested.SerializeAsString());
  expect_input_error([&] { read_value_pb(nested_seq, ValueKind::kSequence); },
                     nested_seq + ": a sequence of sequences is not supported");
  onnx::OptionalProto opt_map;
  opt_map.set_elem_type(onnx::OptionalProto::MAP);
  opt_map.mutable_map_value()->set_key_type(onnx::TensorProto::INT64);
  const std::string opt_map_file = d.write("opt_map.pb", opt_map.SerializeAsString());
  expect_input_error([&] { read_value_pb(opt_map_file, ValueKind::kOptional); },
                     opt_map_file + ": an optional map is not supported");
  onnx::OptionalProto opt_seq_of_seq;
  opt_seq_of_seq.set_elem_type(onnx::OptionalProto::SEQUENCE);
  opt_seq_of_seq.mutable_sequence_value()->set_elem_type(onnx::SequenceProto::SEQUENCE);
  const std::string oss = d.write("opt_seq_seq.pb", opt_seq_of_seq.SerializeAsString());
  expect_input_error([&] { read_value_pb(oss, ValueKind::kOptional); },
                     oss + ": a sequence of sequences is not supported");

  // Elements of different dtypes; a bad element names the file and the element.
  const std::string mixed = d.file("mixed.pb");
  write_value_pb(mixed, sequence({Tensor::from_floats({1}, {1}), Tensor::from_int64s({2})}, DType::kFloat32));
  expect_input_error([&] { read_value_pb(mixed, ValueKind::kSequence); },
                     mixed + ": element 1 is int64 but element 0 is float32: a sequence's elements share a dtype");
  onnx::SequenceProto bad_elem;
  bad_elem.set_elem_type(onnx::SequenceProto::TENSOR);
  bad_elem.add_tensor_values()->set_data_type(onnx::TensorProto::FLOAT);
  auto* e1 = bad_elem.add_tensor_values();
  e1->set_data_type(onnx::TensorProto::FLOAT);
  e1->add_dims(2);
  e1->set_raw_data(std::string(4, '\0'));
  const std::string bad_elem_file = d.write("bad_elem.pb", bad_elem.SerializeAsString());
  expect_input_error([&] { read_value_pb(bad_elem_file, ValueKind::kSequence); },
                     bad_elem_file + ": element 0: tensor has 0 elements of data but shape [] needs 1");
}

// A graph with inputs a (float32[2]), x0 (float32[2]), x1 (float32[3]) and its signature: tensor "a" and sequence
// "x" of 2 elements, listed in the opposite order of the graph inputs.
struct Signature {
  Graph g;
  LoadReport report;
  int a, x0, x1;
  Signature() {
    a = add("a", {2});
    x0 = add("x[0]", {2});
    x1 = add("x[1]", {3});
    g.inputs = {a, x0, x1};
    report.inputs = {FlatValue{"x", {ValueKind::kSequence, true, false, DType::kFloat32}, {x0, x1}},
                     FlatValue{"a", {ValueKind::kTensor, true, false, DType::kFloat32}, {a}}};
  }
  int add(const std::string& name, Shape s) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = std::move(s);
    return g.add_value(std::move(v));
  }
};

TEST(StructuredIo, FlattenInputs) {
  Signature s;
  std::vector<OnnxValue> values;
  values.push_back(sequence({Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({3}, {3, 4, 5})}, DType::kFloat32));
  values.push_back(OnnxValue::of(Tensor::from_floats({2}, {6, 7})));
  const std::byte* x1_data = values[0].tensors[1].bytes.data();
  std::vector<Tensor> flat = flatten_inputs(s.g, s.report, std::move(values));
  ASSERT_EQ(flat.size(), 3u);
  EXPECT_EQ(flat[0].as_int64s(), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(flat[1].as_int64s(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(flat[2].as_int64s(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(flat[2].bytes.data(), x1_data);  // moved, not copied

  // An empty optional maps to no graph input, whatever element kind the model declared for it.
  s.report.inputs.push_back(FlatValue{"o", {ValueKind::kOptional, false, true, DType::kFloat32}, {}});
  values.clear();
  values.push_back(sequence({Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({3}, {3, 4, 5})}, DType::kFloat32));
  values.push_back(OnnxValue::of(Tensor::from_floats({2}, {6, 7})));
  values.push_back(optional({}, false, false, DType::kUndefined));
  EXPECT_EQ(flatten_inputs(s.g, s.report, std::move(values)).size(), 3u);
}

TEST(StructuredIo, FlattenInputsErrors) {
  Signature s;
  auto flatten = [&](OnnxValue x) {
    std::vector<OnnxValue> values;
    values.push_back(std::move(x));
    values.push_back(OnnxValue::of(Tensor::from_floats({2}, {6, 7})));
    flatten_inputs(s.g, s.report, std::move(values));
  };
  expect_input_error(
      [&] {
        std::vector<OnnxValue> one;
        one.push_back(OnnxValue::of(Tensor::from_floats({2}, {6, 7})));
        flatten_inputs(s.g, s.report, std::move(one));
      },
      "1 input value, the model has 2 inputs");
  expect_input_error(
      [&] {
        flatten(OnnxValue::of(Tensor::from_floats({2}, {1, 2})));
      },
      "input 'x': the model was loaded for a sequence but the value is a tensor");
  expect_input_error([&] { flatten(optional({}, false, false, DType::kUndefined)); },
                     "input 'x': the model was loaded for a sequence but the value is an empty optional");
  expect_input_error(
      [&] {
        flatten(sequence({Tensor::from_floats({2}, {1, 2})}, DType::kFloat32));
      },
      "input 'x': the model was loaded for a sequence of 2 tensors but the value has 1");
  expect_input_error(
      [&] {
        flatten(sequence({Tensor::from_floats({2}, {1, 2}), Tensor::from_int64s({3, 4, 5})}, DType::kFloat32));
      },
      "input 'x' element 1: dtype int64, the model expects float32");
  expect_input_error(
      [&] {
        std::vector<OnnxValue> values;
        values.push_back(
            sequence({Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({3}, {3, 4, 5})}, DType::kFloat32));
        values.push_back(OnnxValue::of(Tensor::from_int64s({6, 7})));
        flatten_inputs(s.g, s.report, std::move(values));
      },
      "input 'a': dtype int64, the model expects float32");
  // Optionals: present vs empty, tensor vs sequence.
  s.report.inputs[0].structure = {ValueKind::kOptional, true, true, DType::kFloat32};
  expect_input_error(
      [&] {
        flatten(optional({Tensor::from_floats({2}, {1, 2})}, true, false, DType::kFloat32));
      },
      "input 'x': the model was loaded for an optional(sequence) but the value is an "
      "optional(tensor)");
  expect_input_error([&] { flatten(optional({}, false, true, DType::kFloat32)); },
                     "input 'x': the model was loaded for an optional(sequence) but the value is an empty optional");
  // A signature that does not match the graph is a caller's bug.
  s.report.inputs[0].values = {s.x0, s.x0};
  EXPECT_THROW(flatten(optional({Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({2}, {1, 2})}, true, true,
                                DType::kFloat32)),
               std::invalid_argument);
}

TEST(StructuredIo, UnflattenOutputs) {
  // Outputs: y (float32[2]) twice in g.outputs, s0 and s1 once; signature: "y1" = y, sequence "s" = (s0, s1),
  // "y2" = y, "y3" = y (more uses of y than positions: the last position is copied, then moved).
  Graph g;
  auto add = [&](const std::string& name) {
    Value v;
    v.name = name;
    v.dtype = DType::kFloat32;
    v.shape = {2};
    return g.add_value(std::move(v));
  };
  const int y = add("y"), s0 = add("s[0]"), s1 = add("s[1]");
  g.outputs = {y, s0, y, s1};
  LoadReport report;
  const ValueStructure tensor{ValueKind::kTensor, true, false, DType::kFloat32};
  const ValueStructure seq{ValueKind::kSequence, true, false, DType::kFloat32};
  report.outputs = {FlatValue{"y1", tensor, {y}}, FlatValue{"s", seq, {s0, s1}}, FlatValue{"y2", tensor, {y}},
                    FlatValue{"y3", tensor, {y}}};
  std::vector<Tensor> outs = {Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({2}, {3, 4}),
                              Tensor::from_floats({2}, {1, 2}), Tensor::from_floats({2}, {5, 6})};
  const std::byte* y0_data = outs[0].bytes.data();
  const std::byte* s0_data = outs[1].bytes.data();
  std::vector<OnnxValue> v = unflatten_outputs(g, report, std::move(outs));
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].structure, tensor);
  EXPECT_EQ(v[1].structure, seq);
  ASSERT_EQ(v[0].tensors.size(), 1u);
  ASSERT_EQ(v[1].tensors.size(), 2u);
  EXPECT_EQ(v[0].tensors[0].as_int64s(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(v[0].tensors[0].bytes.data(), y0_data);  // the only use of position 0: moved
  EXPECT_EQ(v[1].tensors[0].bytes.data(), s0_data);
  EXPECT_EQ(v[1].tensors[1].as_int64s(), (std::vector<int64_t>{5, 6}));
  for (size_t i : {2u, 3u}) {
    ASSERT_EQ(v[i].tensors.size(), 1u);
    EXPECT_EQ(v[i].tensors[0].as_int64s(), (std::vector<int64_t>{1, 2})) << i;
  }
  EXPECT_NE(v[2].tensors[0].bytes.data(), v[3].tensors[0].bytes.data());

  EXPECT_THROW(unflatten_outputs(g, report, std::vector<Tensor>(3)), std::invalid_argument);
  report.outputs[0].values = {99};
  EXPECT_THROW(unflatten_outputs(g, report, std::vector<Tensor>(4)), std::invalid_argument);
}

TEST(ModelInfoKinds, SequenceAndOptional) {
  if (!std::filesystem::is_directory(kNodeData)) GTEST_SKIP() << "libonnx-testdata not installed";
  ModelInfo seq = read_model_info(std::string(kNodeData) + "/test_sequence_insert_at_back/model.onnx");
  EXPECT_EQ(seq.inputs, (std::vector<std::string>{"sequence", "tensor"}));
  EXPECT_EQ(seq.input_kinds, (std::vector<ValueKind>{ValueKind::kSequence, ValueKind::kTensor}));
  EXPECT_EQ(seq.input_dtypes, (std::vector<DType>{DType::kInt64, DType::kInt64}));
  EXPECT_EQ(seq.input_shapes, (std::vector<std::vector<int64_t>>{{}, {3}}));
  EXPECT_EQ(seq.output_kinds, (std::vector<ValueKind>{ValueKind::kSequence}));
  EXPECT_EQ(seq.output_dtypes, (std::vector<DType>{DType::kInt64}));

  ModelInfo opt = read_model_info(std::string(kNodeData) + "/test_optional_has_element/model.onnx");
  EXPECT_EQ(opt.input_kinds, (std::vector<ValueKind>{ValueKind::kOptional}));
  EXPECT_EQ(opt.input_dtypes, (std::vector<DType>{DType::kFloat32}));
  EXPECT_EQ(opt.input_shapes, (std::vector<std::vector<int64_t>>{{}}));
  EXPECT_EQ(opt.output_kinds, (std::vector<ValueKind>{ValueKind::kTensor}));
  EXPECT_EQ(opt.output_dtypes, (std::vector<DType>{DType::kBool}));

  ModelInfo opt_seq = read_model_info(std::string(kNodeData) + "/test_identity_opt/model.onnx");
  EXPECT_EQ(opt_seq.input_kinds, (std::vector<ValueKind>{ValueKind::kOptional}));
  EXPECT_EQ(opt_seq.input_dtypes, (std::vector<DType>{DType::kFloat32}));
  EXPECT_EQ(opt_seq.output_kinds, (std::vector<ValueKind>{ValueKind::kOptional}));
  EXPECT_EQ(opt_seq.output_dtypes, (std::vector<DType>{DType::kFloat32}));
}

}  // namespace
}  // namespace gspmd
