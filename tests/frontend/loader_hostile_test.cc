// The loader against bad and hostile input (onnx_frontend/loader_checks.cc): missing, truncated and irregular files,
// external data outside the model's folder, hostile sizes and names, malformed graphs, schema checks.
#include "tests/frontend/loader_test_util.h"

namespace gspmd {
namespace {

TEST(Loader, MissingFile) {
  TempDir t;
  const std::string p = t.file("nope.onnx");
  expect_input_error([&] { load_model(p, load_opts()); }, p + ": cannot open file");
}

TEST(Loader, TruncatedFile) {
  TempDir t;
  std::ifstream in(frontend_data("reshape_chain.onnx"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t cut : {bytes.size() / 2, bytes.size() - 3, size_t{0}}) {
    const std::string p = t.write("cut.onnx", bytes.substr(0, cut));
    expect_input_error(
        [&] {
          load_model(p, load_opts({{"batch", 1}}));
        },
        p + ": not a valid ONNX model (truncated or malformed protobuf)");
  }
  const std::string p = t.write("text.onnx", "this is not a model\n");
  expect_input_error([&] { load_model(p, load_opts()); },
                     p + ": not a valid ONNX model (truncated or malformed protobuf)");
}

TEST(Loader, ExternalDataMissingFile) {
  TempDir t;
  std::filesystem::copy_file(frontend_data("external_data.onnx"), t.file("m.onnx"));
  const std::string p = t.file("m.onnx");
  try {
    load_model(p, load_opts());
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              p + ": initializer 'w': cannot open external data file '" + t.file("external_data.bin") + "'");
  }
  // Shapes only: the missing file is not needed.
  Graph g = load_model(p, load_opts({}, /*load_data=*/false));
  EXPECT_FALSE(g.values[g.at("w")].data);
  EXPECT_EQ(g.values[g.at("w")].shape, (Shape{8, 16}));
  expect_all_static(g);
}

// A model comes from strangers: its external data must stay inside its folder (onnx's CVE-2022-25882 read any file
// through '..' or an absolute location), and only regular files are read. Refused even when loading shapes only.
TEST(Loader, ExternalDataMustStayInTheModelsFolder) {
  TempDir t;
  std::filesystem::create_directories(t.file("m"));
  std::filesystem::copy_file(frontend_data("external_data.bin"), t.file("m/w.bin"));
  std::filesystem::create_symlink("/etc/passwd", t.file("m/link.bin"));
  std::filesystem::create_symlink(t.file("m/w.bin"), t.file("m/inside.bin"));
  ASSERT_EQ(::mkfifo(t.file("m/fifo.bin").c_str(), 0600), 0);
  auto load_with = [&](const std::string& location, bool load_data) {
    onnx::ModelProto m = test::read_onnx_model(frontend_data("external_data.onnx"));
    for (auto& init : *m.mutable_graph()->mutable_initializer())
      for (auto& kv : *init.mutable_external_data())
        if (kv.key() == "location") kv.set_value(location);
    const std::string p = t.file("m/model.onnx");
    test::write_onnx_model(m, p);
    try {
      load_model(p, load_opts({}, load_data));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  const std::string w = t.file("m/model.onnx") + ": initializer 'w': external data ";
  const std::string dir = t.file("m");
  for (bool load_data : {true, false}) {
    EXPECT_EQ(load_with("../../../../etc/passwd", load_data),
              w + "location '../../../../etc/passwd' leaves the model's folder '" + dir + "'");
    EXPECT_EQ(
        load_with("/etc/passwd", load_data),
        w + "location '/etc/passwd' is an absolute path; it must be relative to the model's folder '" + dir + "'");
    EXPECT_EQ(load_with("link.bin", load_data), w + "location 'link.bin' leaves the model's folder '" + dir + "'");
    EXPECT_EQ(load_with("sub/../../n/w.bin", load_data),
              w + "location 'sub/../../n/w.bin' leaves the model's folder '" + dir + "'");
    // a NUL ends the path the OS sees: the folder itself was opened (found by the tensor fuzzer)
    EXPECT_EQ(load_with(std::string("\0w.bin", 6), load_data), w + "location '\\x00w.bin' has a control character");
  }
  EXPECT_EQ(load_with("fifo.bin", true), w + "file '" + dir + "/fifo.bin' is not a regular file");
  std::filesystem::create_directories(t.file("m/folder.bin"));
  EXPECT_EQ(load_with("folder.bin", true), w + "file '" + dir + "/folder.bin' is not a regular file");
  EXPECT_EQ(load_with("w.bin", true), "loaded");
  EXPECT_EQ(load_with("./sub/../w.bin", true), "loaded");  // resolved to w.bin (sub need not exist)
  EXPECT_EQ(load_with("sub/../../m/w.bin", true), "loaded");
  EXPECT_EQ(load_with("inside.bin", true), "loaded");  // a symlink that stays inside
}

// Found by the model fuzzer (docs/testing.md): an external tensor's size is checked against its file before it is
// allocated (a few bytes of model declared terabytes), also at an offset near 2^63; a body that defines a value twice
// is refused like the main graph (it was a std::invalid_argument, an internal error); a node reading an undefined
// value is refused before ONNX's shape inference (which crashed on an old-opset Dropout reading one); names that are
// not UTF-8 are refused (shardings.json could not hold them: an internal error in `partition`).
TEST(Loader, HostileSizesAndNamesFoundByFuzzing) {
  TempDir t;
  std::filesystem::copy_file(frontend_data("external_data.bin"), t.file("w.bin"));
  const std::string p = t.file("m.onnx");
  auto error_of = [&](onnx::ModelProto m) {
    test::write_onnx_model(m, p);
    try {
      load_model(p, load_opts());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  auto external = [&](int64_t rows, const std::string& offset) {
    onnx::ModelProto m = test::read_onnx_model(frontend_data("external_data.onnx"));
    onnx::TensorProto& w = *m.mutable_graph()->mutable_initializer(0);
    w.set_dims(0, rows);
    w.clear_external_data();
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", "w.bin"}, {"offset", offset}}) {
      auto* e = w.add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    return m;
  };
  const std::string w = p + ": initializer 'w': external data file '" + t.file("w.bin") + "' is 512 bytes, too short ";
  EXPECT_EQ(error_of(external(int64_t{1} << 34, "0")), w + "for 1099511627776 bytes at offset 0");
  EXPECT_EQ(error_of(external(8, "9223372036854775807")), w + "for 512 bytes at offset 9223372036854775807");
  onnx::ModelProto loop = test::read_onnx_model(frontend_data("loop_scan.onnx"));
  loop.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g()->mutable_input(1)->set_name("i");
  EXPECT_EQ(error_of(loop), p + ": body 'loop_body': value 'i' is defined twice");
  loop = test::read_onnx_model(frontend_data("loop_scan.onnx"));
  loop.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g()->mutable_node(1)->set_input(1, "nowhere");
  EXPECT_EQ(error_of(loop), p + ": node 'loop' (Loop): its body reads 'nowhere', which is not defined before it");
  onnx::ModelProto dropout = test::read_onnx_model(frontend_data("old_opset_dropout.onnx"));
  dropout.mutable_graph()->mutable_node(2)->set_input(0, "nowhere");
  EXPECT_EQ(error_of(dropout), p + ": node 'dropout' (Dropout) reads 'nowhere' before it is defined (missing value "
                                   "or graph not topologically sorted)");
  onnx::ModelProto mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  mlp.mutable_graph()->mutable_node(0)->set_output(0, "h\xff");
  mlp.mutable_graph()->mutable_node(1)->set_input(0, "h\xff");
  EXPECT_EQ(error_of(mlp), p + ": value name 'h\\xff' is not valid UTF-8");
  // onnx 1.12's Conv inference died of SIGSEGV on a rank-2 input (fuzz/corpus/model/crash-conv-rank2-input.onnx)
  dropout = test::read_onnx_model(frontend_data("old_opset_dropout.onnx"));
  auto* x = dropout.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  while (x->dim_size() > 2) x->mutable_dim()->RemoveLast();
  EXPECT_EQ(error_of(dropout),
            p + ": node 'conv' (Conv): input 'x' has rank 2; the spec needs [N, C, D1, ...] (rank >= 3)");
  dropout = test::read_onnx_model(frontend_data("old_opset_dropout.onnx"));
  auto* pads = dropout.mutable_graph()->mutable_node(0)->mutable_attribute(0);
  ASSERT_EQ(pads->name(), "pads");
  pads->add_ints(1);
  EXPECT_EQ(error_of(dropout), p + ": node 'conv' (Conv): attribute 'pads' has 5 entries; an input of rank 4 needs 4");
  // ... and divided by a stride of 0 (SIGFPE; fuzz/corpus/model/crash-conv-stride-zero.onnx)
  dropout = test::read_onnx_model(frontend_data("old_opset_dropout.onnx"));
  auto* strides = dropout.mutable_graph()->mutable_node(0)->add_attribute();
  strides->set_name("strides");
  strides->set_type(onnx::AttributeProto::INTS);
  strides->add_ints(0);
  strides->add_ints(2);
  EXPECT_EQ(error_of(dropout), p + ": node 'conv' (Conv): attribute 'strides' has the entry 0; each must be positive");
  // onnx 1.12 made a huge constant 1-D tensor's length the rank of the Expand that read it as its shape, and ran out
  // of memory allocating its dims (fuzz/corpus/model/crash-oom-expand-rank-from-constant-shape.onnx)
  onnx::ModelProto cls = test::read_onnx_model(frontend_data("loop_scan.onnx"));
  onnx::NodeProto* cos = cls.mutable_graph()->add_node();
  cos->set_op_type("ConstantOfShape");
  cos->set_name("cos");
  cos->add_input("big_shape");
  cos->add_output("ones");
  onnx::TensorProto* three = cls.mutable_graph()->add_initializer();
  three->set_name("big_shape");
  three->set_data_type(onnx::TensorProto::INT64);
  three->add_dims(1);
  three->add_int64_data(int64_t{1} << 41);
  EXPECT_EQ(error_of(cls), p + ": node 'cos' (ConstantOfShape): its output would hold 2.2e+12 elements, more than the "
                               "1099511627776 a tensor may hold here");
  three->set_int64_data(0, int64_t{1} << 20);  // a large tensor, but not impossibly large
  EXPECT_EQ(error_of(cls), "loaded");
  // A SequenceInsert's position with no element was read past its end (std::out_of_range, an internal error;
  // fuzz/corpus/model/crash-sequence-position-empty.onnx)
  onnx::ModelProto seq = test::read_onnx_model(frontend_data("seq_split_concat.onnx"));
  onnx::TensorProto* position = nullptr;
  for (auto& t : *seq.mutable_graph()->mutable_initializer())
    if (t.name() == "zero") position = &t;
  ASSERT_NE(position, nullptr);
  position->clear_int64_data();
  position->clear_raw_data();
  position->clear_dims();
  position->add_dims(0);
  EXPECT_EQ(error_of(seq), p + ": value 'seq' (output of node 'insert' (SequenceInsert)) has no static shape: node "
                               "'insert' (SequenceInsert): the position 'zero' holds 0 elements; the spec wants one");
  // onnx 1.12's SplitToSequence inference divided by a scalar split of 0 (SIGFPE;
  // fuzz/corpus/model/crash-split-to-sequence-zero.onnx)
  seq = test::read_onnx_model(frontend_data("seq_split_concat.onnx"));
  for (auto& t : *seq.mutable_graph()->mutable_initializer())
    if (t.name() == "two") t.set_raw_data(std::string(8, '\0'));
  EXPECT_EQ(error_of(seq), p + ": node 'split' (SplitToSequence): the split 'two' is 0; a scalar split is a chunk "
                               "length and must be positive");
  // A Cast to element type 0 inside a Loop's body, which ONNX's inference does not check, typed a value 'undefined'
  // whose size was asked later (std::invalid_argument, an internal error); a Resize scale of NaN was cast to a dim
  // (UB). Both found by the shapes-only fuzzer at stop 38.
  auto error_of_file = [&](const std::string& name) {
    const std::string f = std::string(GSPMD_SOURCE_DIR) + "/fuzz/corpus/model/" + name;
    try {
      load_model(f, load_opts());
    } catch (const InputError& e) {
      return std::string(e.what()).substr(f.size());
    }
    return std::string("loaded");
  };
  EXPECT_EQ(error_of_file("crash-cast-to-undefined.onnx"),
            ": value 'loop/0/fi' (output of node 'loop/0/cast_i' (Cast)) has no static shape: attribute 'to' is 0, "
            "which is not an element type (ONNX TensorProto.DataType) this tool supports");
  EXPECT_EQ(error_of_file("crash-resize-nan-scale.onnx"),
            ": value 'Y' (output of node 'Resize_0' (Resize)) has no static shape: scales must be positive and finite, "
            "got -nan");
}

// Writes `m` to `path` and loads it (batch 2): the InputError's text, or "loaded".
std::string load_error(const onnx::ModelProto& m, const std::string& path) {
  test::write_onnx_model(m, path);
  try {
    load_model(path, load_opts({{"batch", 2}}));
  } catch (const InputError& e) {
    return e.what();
  }
  return "loaded";
}

// Found by the bad-input suite (tests/bad_input/run_bad_inputs.py): a newer opset's nodes are still checked against
// the installed onnx's newest schemas where the operator did not change since; a node that breaks its op's spec is
// refused at load even where ONNX's inference typed it (the kernel failed at run time: an internal error); a value
// past 2^50 bytes is refused (its sizes overflowed the cost model); a model-local function calling itself is refused
// before ONNX's inference, which recursed until the stack overflowed.
TEST(Loader, MalformedGraphsFoundByTheBadInputSuite) {
  TempDir t;
  const std::string p = t.file("m.onnx");
  auto error_of = [&](const onnx::ModelProto& m) { return load_error(m, p); };
  onnx::ModelProto mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  mlp.mutable_opset_import(0)->set_version(21);
  EXPECT_EQ(error_of(mlp), "loaded");
  mlp.mutable_graph()->mutable_node(0)->add_input("x");
  EXPECT_EQ(error_of(mlp), p + ": node 'fc_in' (MatMul): Node (fc_in) has input size 3 not in range [min=2, max=2].");
  onnx::ModelProto conv = test::read_onnx_model(frontend_data("old_opset_dropout.onnx"));
  auto* group = conv.mutable_graph()->mutable_node(0)->add_attribute();
  group->set_name("group");
  group->set_type(onnx::AttributeProto::INT);
  group->set_i(2);
  EXPECT_EQ(error_of(conv), p + ": node 'conv' (Conv): X of shape [2,3,4,4] and W of shape [4,3,3,3] do not match "
                                "group=2");
  expect_input_error(
      [&] {
        load_model(frontend_data("mlp.onnx"), load_opts({{"batch", int64_t{1} << 50}}));
      },
      frontend_data("mlp.onnx") +
          ": value 'x' has the shape [1125899906842624,8]: more than 2^50 bytes (1 PiB), the limit of "
          "a value");
  mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  auto* f = mlp.add_functions();
  f->set_name("f");
  f->set_domain("local");
  f->add_input("a");
  f->add_output("b");
  auto* call = f->add_node();
  call->set_op_type("f");
  call->set_domain("local");
  call->add_input("a");
  call->add_output("b");
  f->add_opset_import()->set_version(17);
  auto* local = mlp.add_opset_import();
  local->set_domain("local");
  local->set_version(1);
  auto* relu = mlp.mutable_graph()->mutable_node(1);
  relu->set_op_type("f");
  relu->set_domain("local");
  EXPECT_EQ(error_of(mlp), p + ": model-local functions call themselves in a cycle ('f' of domain 'local' is in it or "
                               "called from it)");
}

// The schema check runs once per distinct node (op, inputs and outputs present, attributes; names aside): a node that
// differs from a checked twin in any of them is checked itself.
TEST(Loader, SchemaCheckOfRepeatedNodesStillSeesEachDifference) {
  TempDir t;
  const std::string p = t.file("m.onnx");
  auto error_of = [&](const onnx::ModelProto& m) { return load_error(m, p); };
  onnx::ModelProto mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  auto gemm = [&](int node, onnx::AttributeProto::AttributeType type) {  // fc_in and fc_out: twins but for alpha
    auto* n = mlp.mutable_graph()->mutable_node(node);
    n->set_op_type("Gemm");
    auto* alpha = n->add_attribute();
    alpha->set_name("alpha");
    alpha->set_type(type);
    if (type == onnx::AttributeProto::FLOAT) alpha->set_f(1);
    if (type == onnx::AttributeProto::INT) alpha->set_i(1);
  };
  gemm(0, onnx::AttributeProto::FLOAT);
  gemm(2, onnx::AttributeProto::FLOAT);
  EXPECT_EQ(error_of(mlp), "loaded");
  mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  gemm(0, onnx::AttributeProto::FLOAT);
  gemm(2, onnx::AttributeProto::INT);
  EXPECT_EQ(error_of(mlp), p + ": node 'fc_out' (Gemm): Mismatched attribute type in 'fc_out : alpha'");
  mlp = test::read_onnx_model(frontend_data("mlp.onnx"));
  mlp.mutable_graph()->mutable_node(2)->set_input(0, "");  // a required input left out
  EXPECT_EQ(
      error_of(mlp),
      p + ": node 'fc_out' (MatMul): Node (fc_out)'s input 0 is marked single but has an empty string in the graph");
}

// Reading a FIFO would wait for a writer forever: only regular files are read.
TEST(Loader, OnlyRegularFilesAreRead) {
  TempDir t;
  ASSERT_EQ(::mkfifo(t.file("model.onnx").c_str(), 0600), 0);
  try {
    load_model(t.file("model.onnx"), load_opts());
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), t.file("model.onnx") + ": not a regular file (a FIFO, socket or device)");
  }
}

// A model is validated before it is used, as onnx's checker does: every ai.onnx node against its schema at the
// model's opset (arity, attribute types, unknown attributes), the opset range, and at least one output. Each is one
// line naming the node; before, MatMul with 3 inputs, an unknown attribute and opset 99 loaded, and a string axis was
// an internal error.
TEST(Loader, ModelsAreCheckedAgainstTheOperatorSchemas) {
  TempDir t;
  auto error_of = [&](const std::function<void(onnx::ModelProto&)>& edit) {
    onnx::ModelProto m;
    m.set_ir_version(8);
    m.add_opset_import()->set_version(17);
    onnx::GraphProto* g = m.mutable_graph();
    g->set_name("g");
    for (const char* name : {"x"}) {
      onnx::ValueInfoProto* in = g->add_input();
      in->set_name(name);
      auto* tt = in->mutable_type()->mutable_tensor_type();
      tt->set_elem_type(onnx::TensorProto::FLOAT);
      tt->mutable_shape()->add_dim()->set_dim_value(2);
      tt->mutable_shape()->add_dim()->set_dim_value(2);
    }
    g->add_output()->set_name("y");
    onnx::NodeProto* n = g->add_node();
    n->set_name("n");
    n->set_op_type("Relu");
    n->add_input("x");
    n->add_output("y");
    edit(m);
    test::write_onnx_model(m, t.file("m.onnx"));
    try {
      load_model(t.file("m.onnx"), load_opts());
    } catch (const InputError& e) {
      return std::string(e.what()).substr(t.file("m.onnx").size() + 2);
    }
    return std::string("loaded");
  };
  auto node = [](onnx::ModelProto& m) { return m.mutable_graph()->mutable_node(0); };
  EXPECT_EQ(error_of([](onnx::ModelProto&) {}), "loaded");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) {
              node(m)->set_op_type("MatMul");
              node(m)->add_input("x");
              node(m)->add_input("x");
            }),
            "node 'n' (MatMul): Node (n) has input size 3 not in range [min=2, max=2].");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) { node(m)->add_output("z"); }),
            "node 'n' (Relu): Node (n) has output size 2 not in range [min=1, max=1].");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) {
              node(m)->set_op_type("Softmax");
              onnx::AttributeProto* a = node(m)->add_attribute();
              a->set_name("axis");
              a->set_type(onnx::AttributeProto::STRING);
              a->set_s("1");
            }),
            "node 'n' (Softmax): Mismatched attribute type in 'n : axis'");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) {
              onnx::AttributeProto* a = node(m)->add_attribute();
              a->set_name("alpha");
              a->set_type(onnx::AttributeProto::FLOAT);
              a->set_f(1.f);
            }),
            "node 'n' (Relu): Unrecognized attribute: alpha for operator Relu");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) { node(m)->set_op_type("Frobnicate"); }),
            "node 'n' (Frobnicate): no operator 'Frobnicate' in ai.onnx opset 17");
  // Opset 18: ReduceMean takes its axes as an input, which onnx 1.12's schemas (up to 17) do not know: not checked.
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) {
              m.mutable_opset_import(0)->set_version(18);
              node(m)->set_op_type("ReduceMean");
              node(m)->add_input("axes");
              onnx::TensorProto* axes = m.mutable_graph()->add_initializer();
              axes->set_name("axes");
              axes->set_data_type(onnx::TensorProto::INT64);
              axes->add_dims(1);
              axes->add_int64_data(1);
            }),
            "loaded");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) { m.mutable_opset_import(0)->set_version(99); }),
            "opset 99 of ai.onnx is not one of 1 .. 23 (docs/loading.md)");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) { m.mutable_opset_import(0)->set_version(-5); }),
            "opset -5 of ai.onnx is not one of 1 .. 23 (docs/loading.md)");
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) { m.mutable_graph()->clear_output(); }),
            "the graph has no outputs: nothing to compute");
  // onnx's shape inference lists every node it cannot type, one per line: the first, and how many more.
  EXPECT_EQ(error_of([&](onnx::ModelProto& m) {
              onnx::GraphProto* g = m.mutable_graph();
              g->clear_node();
              onnx::ValueInfoProto* w = g->add_input();
              *w = g->input(0);
              w->set_name("w");
              w->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(3);
              for (const char* out : {"y", "z"}) {
                onnx::NodeProto* n = g->add_node();
                n->set_name(std::string("add_") + out);
                n->set_op_type("Add");
                n->add_input("x");
                n->add_input("w");
                n->add_output(out);
              }
              g->add_output()->set_name("z");
            }),
            "shape inference failed: [ShapeInferenceError] Shape inference error(s): (op_type:Add, node name: add_y): "
            "[ShapeInferenceError] Incompatible dimensions (and 1 more)");
}

}  // namespace
}  // namespace gspmd
