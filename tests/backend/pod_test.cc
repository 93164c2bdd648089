// backend/pod: hand-built SPMD programs on meshes 2, 2x2, 2x3; every gspmd op checked element by element,
// peak memory accounting checked in exact bytes, run_single on a tiny graph.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "backend/pod/collectives.h"
#include "backend/pod/pod.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::mesh_of;
using testing::V;

TensorSharding split0(int rank, std::vector<int> axes) {
  TensorSharding s = TensorSharding::replicated(rank);
  s.dims[0] = std::move(axes);
  return s;
}

std::vector<int> all_axes(const DeviceMesh& m) {
  std::vector<int> a;
  for (int i = 0; i < m.rank(); ++i) a.push_back(i);
  return a;
}

Tensor floats(const Shape& s, std::vector<float> v) { return Tensor::from_floats(s, v); }

template <class T>
Tensor typed(DType dt, const Shape& s, std::vector<T> v) {
  Tensor t(dt, s);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(T));
  return t;
}

template <class T = float>
std::vector<T> vals(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(T));
  return v;
}

// Tensors stacked along dim 0 (all the same type and shape) and the inverse.
Tensor stack0(const std::vector<Tensor>& ts) {
  Shape s = ts[0].shape;
  s[0] *= static_cast<int64_t>(ts.size());
  Tensor out(ts[0].dtype, s);
  size_t off = 0;
  for (const Tensor& t : ts) {
    std::memcpy(out.bytes.data() + off, t.bytes.data(), t.nbytes());
    off += t.nbytes();
  }
  return out;
}
std::vector<Tensor> unstack0(const Tensor& t, int64_t n) {
  Shape s = t.shape;
  s[0] /= n;
  std::vector<Tensor> out;
  size_t chunk = t.nbytes() / static_cast<size_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    Tensor x(t.dtype, s);
    std::memcpy(x.bytes.data(), t.bytes.data() + i * chunk, chunk);
    out.push_back(std::move(x));
  }
  return out;
}

Node gspmd_node(const std::string& op, std::map<std::string, AttrValue> attrs) {
  Node n;
  n.name = op + "_0";
  n.op_type = op;
  n.domain = kGspmdDomain;
  n.attrs = std::move(attrs);
  return n;
}

// Runs a one-node program on `mesh` in which device d's operand is ins[d] (the global input is the operands stacked
// along dim 0, split over every mesh axis, so device d gets exactly ins[d]); returns each device's result, read back
// the same way. `ins` empty = a node without inputs.
std::vector<Tensor> run_node(const DeviceMesh& mesh, Node node, const std::vector<Tensor>& ins, DType out_type,
                             const Shape& out_local, PodRun* run = nullptr) {
  const int64_t N = mesh.num_devices();
  Graph global;
  SpmdProgram p;
  p.mesh = mesh;
  Graph& prog = p.program;
  std::vector<Tensor> feeds;
  if (!ins.empty()) {
    Tensor X = stack0(ins);
    int gx = global.add_value(V("X", X.dtype, X.shape));
    global.inputs = {gx};
    int x = prog.add_value(V("x", ins[0].dtype, ins[0].shape));
    prog.inputs = {x};
    node.inputs = {x};
    p.inputs.push_back(ProgramBinding{x, gx, split0(static_cast<int>(X.shape.size()), all_axes(mesh))});
    feeds.push_back(std::move(X));
  }
  Shape gshape = out_local;
  gshape[0] *= N;
  int gy = global.add_value(V("Y", out_type, gshape));
  global.outputs = {gy};
  int y = prog.add_value(V("y", out_type, out_local));
  node.outputs = {y};
  prog.add_node(node);
  prog.outputs = {y};
  p.outputs.push_back(ProgramBinding{y, gy, split0(static_cast<int>(gshape.size()), all_axes(mesh))});
  PodRun r = run_spmd(p, global, feeds);
  EXPECT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.devices.size(), static_cast<size_t>(N));
  std::vector<Tensor> out = unstack0(r.outputs.at(0), N);
  if (run) *run = std::move(r);
  return out;
}

// Device d's operand: [rows, cols] floats 100*d + i.
std::vector<Tensor> per_device(int64_t N, const Shape& s) {
  std::vector<Tensor> v;
  for (int64_t d = 0; d < N; ++d) {
    Tensor t(DType::kFloat32, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(100 * d + i);
    v.push_back(std::move(t));
  }
  return v;
}

// ------------------------------------------------------------------------------------------------ AllReduce
TEST(PodCollectives, AllReduceSumOverOneAxisMesh2) {
  DeviceMesh m = mesh_of({2});
  auto ins = per_device(2, {2, 3});
  auto out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}, {"reduction", std::string("sum")}}),
               ins, DType::kFloat32, {2, 3});
  std::vector<float> want = {100, 102, 104, 106, 108, 110};  // (0+i) + (100+i)
  EXPECT_EQ(vals(out[0]), want);
  EXPECT_EQ(vals(out[1]), want);
}

TEST(PodCollectives, AllReduceMaxMinOn2x2PerAxis) {
  DeviceMesh m = mesh_of({2, 2});
  std::vector<Tensor> ins;
  // device d: [1,2] = {d, 10 - d}
  for (int d = 0; d < 4; ++d) ins.push_back(floats({1, 2}, {float(d), float(10 - d)}));
  // max over y: groups {0,1}, {2,3}
  auto out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{1}}, {"reduction", std::string("max")}}),
               ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{1, 10}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, 10}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{3, 8}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{3, 8}));
  // min over x: groups {0,2}, {1,3}
  out =
      run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}, {"reduction", std::string("min")}}),
               ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 8}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 8}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, 7}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{1, 7}));
  // sum over both axes
  out = run_node(m, gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0, 1}}}), ins, DType::kFloat32, {1, 2});
  for (int d = 0; d < 4; ++d) EXPECT_EQ(vals(out[d]), (std::vector<float>{6, 34}));
}

TEST(PodCollectives, AllReduceDTypes) {
  std::vector<const Tensor*> p;
  // int64 prod
  Tensor a = typed<int64_t>(DType::kInt64, {3}, {2, -3, 4}), b = typed<int64_t>(DType::kInt64, {3}, {5, 6, -7});
  auto r = pod::all_reduce({&a, &b}, ReductionKind::kProd);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(vals<int64_t>(r[0]), (std::vector<int64_t>{10, -18, -28}));
  EXPECT_EQ(vals<int64_t>(r[1]), (std::vector<int64_t>{10, -18, -28}));
  // int32 sum
  Tensor c = typed<int32_t>(DType::kInt32, {2}, {1, 2}), d = typed<int32_t>(DType::kInt32, {2}, {30, 40});
  EXPECT_EQ(vals<int32_t>(pod::all_reduce({&c, &d}, ReductionKind::kSum)[0]), (std::vector<int32_t>{31, 42}));
  // float64 max
  Tensor e = typed<double>(DType::kFloat64, {2}, {1.5, -2}), f = typed<double>(DType::kFloat64, {2}, {-1, 2.25});
  EXPECT_EQ(vals<double>(pod::all_reduce({&e, &f}, ReductionKind::kMax)[1]), (std::vector<double>{1.5, 2.25}));
  // bool: sum/max = or, min/prod = and
  Tensor g = typed<uint8_t>(DType::kBool, {3}, {1, 0, 0}), h = typed<uint8_t>(DType::kBool, {3}, {1, 1, 0});
  EXPECT_EQ(vals<uint8_t>(pod::all_reduce({&g, &h}, ReductionKind::kSum)[0]), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(vals<uint8_t>(pod::all_reduce({&g, &h}, ReductionKind::kMin)[0]), (std::vector<uint8_t>{1, 0, 0}));
  // 16-bit floats: each step in float32, rounded once to the type (1 + 2^-10 is a float16; in bfloat16 it rounds to 1)
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    const bool f16 = t == DType::kFloat16;
    Tensor k(t, {2}), l(t, {2});
    const float kv[2] = {1.f, -2.f}, lv[2] = {0x1p-10f, 3.f};
    for (int i = 0; i < 2; ++i) {
      k.data<uint16_t>()[i] = f16 ? float_to_half(kv[i]) : float_to_bf16(kv[i]);
      l.data<uint16_t>()[i] = f16 ? float_to_half(lv[i]) : float_to_bf16(lv[i]);
    }
    const Tensor s = pod::all_reduce({&k, &l}, ReductionKind::kSum)[0];
    auto at = [&](int i) { return f16 ? half_to_float(s.data<uint16_t>()[i]) : bf16_to_float(s.data<uint16_t>()[i]); };
    EXPECT_EQ(at(0), f16 ? 1.f + 0x1p-10f : 1.f);
    EXPECT_EQ(at(1), 1.f);
  }
  // operands must agree
  Tensor z(DType::kFloat32, {2});
  Tensor w(DType::kFloat32, {3});
  EXPECT_THROW(pod::all_reduce({&z, &w}, ReductionKind::kSum), InternalError);
}

// ------------------------------------------------------------------------------------------------ AllGather
TEST(PodCollectives, AllGatherAxis1OverEachAxisOf2x2) {
  DeviceMesh m = mesh_of({2, 2});
  std::vector<Tensor> ins;
  for (int d = 0; d < 4; ++d) ins.push_back(floats({2, 1}, {float(10 * d), float(10 * d + 1)}));
  // over x: groups {0,2}, {1,3}
  auto out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{1}}}), ins,
                      DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 20, 1, 21}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 20, 1, 21}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{10, 30, 11, 31}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{10, 30, 11, 31}));
  // over y: groups {0,1}, {2,3}
  out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{1}}, {"axis", int64_t{1}}}), ins,
                 DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 10, 1, 11}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{0, 10, 1, 11}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{20, 30, 21, 31}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{20, 30, 21, 31}));
}

TEST(PodCollectives, AllGatherOverBothAxesOf2x3AndNegativeAxis) {
  DeviceMesh m = mesh_of({2, 3});
  std::vector<Tensor> ins;
  for (int d = 0; d < 6; ++d) ins.push_back(floats({1, 1}, {float(d)}));
  auto out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0, 1}}, {"axis", int64_t{-1}}}),
                      ins, DType::kFloat32, {1, 6});
  for (int d = 0; d < 6; ++d) EXPECT_EQ(vals(out[d]), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // axes listed minor-first: tile order is y-major: tile = y*2 + x -> devices 0,3,1,4,2,5
  out = run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{1, 0}}, {"axis", int64_t{1}}}), ins,
                 DType::kFloat32, {1, 6});
  EXPECT_EQ(vals(out[4]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

// ------------------------------------------------------------------------------------------------ ReduceScatter
TEST(PodCollectives, ReduceScatterOn2x2) {
  DeviceMesh m = mesh_of({2, 2});
  auto ins = per_device(4, {1, 4});  // device d: 100d + {0,1,2,3}
  // over y, axis 1: groups {0,1} -> sum {100,102,104,106}; {2,3} -> {500,502,504,506}
  auto out = run_node(
      m,
      gspmd_node("ReduceScatter",
                 {{"mesh_axes", std::vector<int64_t>{1}}, {"axis", int64_t{1}}, {"reduction", std::string("sum")}}),
      ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{100, 102}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{104, 106}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{500, 502}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{504, 506}));
  // max over x: groups {0,2}, {1,3}
  out = run_node(
      m,
      gspmd_node("ReduceScatter",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{1}}, {"reduction", std::string("max")}}),
      ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{200, 201}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{202, 203}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{300, 301}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{302, 303}));
  // indivisible dim
  Tensor a(DType::kFloat32, {3}), b(DType::kFloat32, {3});
  EXPECT_THROW(pod::reduce_scatter({&a, &b}, 0, ReductionKind::kSum), InternalError);
}

// ------------------------------------------------------------------------------------------------ AllToAll
TEST(PodCollectives, AllToAll) {
  DeviceMesh m = mesh_of({2});
  auto ins = per_device(2, {1, 4});  // d0: {0,1,2,3}, d1: {100,101,102,103}
  // split axis 1 (chunks of 2), concat axis 0: device j gets [chunk j of d0; chunk j of d1]
  auto out = run_node(
      m,
      gspmd_node("AllToAll",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"split_axis", int64_t{1}}, {"concat_axis", int64_t{0}}}),
      ins, DType::kFloat32, {2, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 1, 100, 101}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{2, 3, 102, 103}));
  // split == concat: shape unchanged, chunks swapped
  out = run_node(
      m,
      gspmd_node("AllToAll",
                 {{"mesh_axes", std::vector<int64_t>{0}}, {"split_axis", int64_t{1}}, {"concat_axis", int64_t{1}}}),
      ins, DType::kFloat32, {1, 4});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 1, 100, 101}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{2, 3, 102, 103}));
  // 2x3 over y with 3 members, split 0 -> concat 1 on int64
  Tensor a = typed<int64_t>(DType::kInt64, {3, 1}, {0, 1, 2}), b = typed<int64_t>(DType::kInt64, {3, 1}, {10, 11, 12}),
         c = typed<int64_t>(DType::kInt64, {3, 1}, {20, 21, 22});
  auto r = pod::all_to_all({&a, &b, &c}, 0, 1);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].shape, (Shape{1, 3}));
  EXPECT_EQ(vals<int64_t>(r[1]), (std::vector<int64_t>{1, 11, 21}));
  EXPECT_EQ(vals<int64_t>(r[2]), (std::vector<int64_t>{2, 12, 22}));
}

// ------------------------------------------------------------------------------------------------ CollectivePermute
TEST(PodCollectives, CollectivePermuteShiftPlusMinusOneZeroFill) {
  DeviceMesh m = mesh_of({2, 3});
  std::vector<Tensor> ins;
  for (int d = 0; d < 6; ++d) ins.push_back(floats({1, 2}, {float(d + 1), float(-(d + 1))}));
  // over y (size 3): tile t receives from t-1; tile 0 gets zeros
  auto out =
      run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{1}}, {"shift", int64_t{1}}}), ins,
               DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{1, -1}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{2, -2}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{4, -4}));
  EXPECT_EQ(vals(out[5]), (std::vector<float>{5, -5}));
  // shift -1: tile t receives from t+1; the last tile gets zeros
  out = run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{1}}, {"shift", int64_t{-1}}}),
                 ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{2, -2}));
  EXPECT_EQ(vals(out[1]), (std::vector<float>{3, -3}));
  EXPECT_EQ(vals(out[2]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{5, -5}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{6, -6}));
  EXPECT_EQ(vals(out[5]), (std::vector<float>{0, 0}));
  // over x (size 2), shift 1: devices 3,4,5 receive from 0,1,2
  out = run_node(m, gspmd_node("CollectivePermute", {{"mesh_axes", std::vector<int64_t>{0}}, {"shift", int64_t{1}}}),
                 ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{2, -2}));
}

// ------------------------------------------------------------------------------------------------ partition-id ops
TEST(PodPartitionOps, ShardSliceWithPadding) {
  DeviceMesh m = mesh_of({2, 3});
  Tensor x = floats({1, 7}, {1, 2, 3, 4, 5, 6, 7});
  std::vector<Tensor> ins(6, x);  // replicated operand
  auto out =
      run_node(m,
               gspmd_node("ShardSlice",
                          {{"axis", int64_t{1}}, {"mesh_axes", std::vector<int64_t>{1}}, {"shard_size", int64_t{3}}}),
               ins, DType::kFloat32, {1, 3});
  for (int x0 = 0; x0 < 2; ++x0) {
    EXPECT_EQ(vals(out[3 * x0 + 0]), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(vals(out[3 * x0 + 1]), (std::vector<float>{4, 5, 6}));
    EXPECT_EQ(vals(out[3 * x0 + 2]), (std::vector<float>{7, 0, 0}));
  }
  // over both axes, shard 2 of 7 along axis 1: tile = device; tiles 4, 5 are past the end except element 6
  out = run_node(
      m,
      gspmd_node("ShardSlice",
                 {{"axis", int64_t{-1}}, {"mesh_axes", std::vector<int64_t>{0, 1}}, {"shard_size", int64_t{2}}}),
      ins, DType::kFloat32, {1, 2});
  EXPECT_EQ(vals(out[0]), (std::vector<float>{1, 2}));
  EXPECT_EQ(vals(out[3]), (std::vector<float>{7, 0}));
  EXPECT_EQ(vals(out[4]), (std::vector<float>{0, 0}));
  EXPECT_EQ(vals(out[5]), (std::vector<float>{0, 0}));
}

TEST(PodPartitionOps, MaskPad) {
  DeviceMesh m = mesh_of({2, 3});
  // full size 7 split 3 ways over y: shards of 3, tile 2 holds global 6 (real), 7, 8 (padding)
  std::vector<Tensor> ins;
  for (int d = 0; d < 6; ++d) ins.push_back(floats({2, 3}, {1, 2, 3, 4, 5, 6}));
  const float ninf = -std::numeric_limits<float>::infinity();
  auto out = run_node(
      m,
      gspmd_node(
          "MaskPad",
          {{"axis", int64_t{1}}, {"mesh_axes", std::vector<int64_t>{1}}, {"full_size", int64_t{7}}, {"value", ninf}}),
      ins, DType::kFloat32, {2, 3});
  for (int x0 = 0; x0 < 2; ++x0) {
    EXPECT_EQ(vals(out[3 * x0 + 0]), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(vals(out[3 * x0 + 1]), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(vals(out[3 * x0 + 2]), (std::vector<float>{1, ninf, ninf, 4, ninf, ninf}));
  }
  // int64, axis 0, value 0: full size 1 of shards of 1 row over x: the x=1 row is padding
  Tensor a = typed<int64_t>(DType::kInt64, {1, 2}, {7, 8});
  pod::mask_pad(a, 0, 1, 1, 0.f);
  EXPECT_EQ(vals<int64_t>(a), (std::vector<int64_t>{0, 0}));
  Tensor b = typed<int64_t>(DType::kInt64, {1, 2}, {7, 8});
  pod::mask_pad(b, 1, 0, 1, ninf);  // -inf saturates to the lowest int64
  EXPECT_EQ(vals<int64_t>(b), (std::vector<int64_t>{7, std::numeric_limits<int64_t>::lowest()}));
}

TEST(PodPartitionOps, PartitionOffset) {
  DeviceMesh m = mesh_of({2, 3});
  auto out =
      run_node(m, gspmd_node("PartitionOffset", {{"mesh_axes", std::vector<int64_t>{1}}, {"shard_size", int64_t{5}}}),
               {}, DType::kInt64, {1});
  for (int d = 0; d < 6; ++d) EXPECT_EQ(vals<int64_t>(out[d]), (std::vector<int64_t>{(d % 3) * 5})) << d;
  out = run_node(m,
                 gspmd_node("PartitionOffset", {{"mesh_axes", std::vector<int64_t>{0, 1}}, {"shard_size", int64_t{4}}}),
                 {}, DType::kInt64, {1});
  for (int d = 0; d < 6; ++d) EXPECT_EQ(vals<int64_t>(out[d]), (std::vector<int64_t>{d * 4})) << d;
  out = run_node(m, gspmd_node("PartitionOffset", {{"mesh_axes", std::vector<int64_t>{0}}, {"shard_size", int64_t{3}}}),
                 {}, DType::kInt64, {1});
  for (int d = 0; d < 6; ++d) EXPECT_EQ(vals<int64_t>(out[d]), (std::vector<int64_t>{(d / 3) * 3})) << d;
}

TEST(PodErrors, UnknownGspmdOpAndBadAxis) {
  DeviceMesh m = mesh_of({2});
  auto ins = per_device(2, {1, 2});
  EXPECT_THROW(run_node(m, gspmd_node("Frobnicate", {}), ins, DType::kFloat32, {1, 2}), UnsupportedError);
  try {
    run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{5}}}), ins,
             DType::kFloat32, {1, 4});
    FAIL() << "expected an error";
  } catch (const UnsupportedError&) {
    FAIL() << "not an UnsupportedError";
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("node 'AllGather_0' (AllGather) on device 0: ", 0), 0u) << e.what();
  }
  // declared output shape disagrees with the op
  EXPECT_THROW(run_node(m, gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{1}}}), ins,
                        DType::kFloat32, {1, 2}),
               InternalError);
}

// ------------------------------------------------------------------------------------------------ memory
// x (input shard, 32 B) -> AllGather (64 B) -> AllReduce (64 B) -> ShardSlice (32 B, output); plus a replicated
// param W (16 B, unused) and a program constant C (8 B). Params and constants are resident; x, a, b are freed after
// their last use. Live bytes per device: start 56; node 0: 56+64=120 then -32 -> 88; node 1: 88+64=152 then -64 -> 88;
// node 2: 88+32=120 then -64 -> 56. Peak = 152.
TEST(PodMemory, PeakMemoryExactBytes) {
  DeviceMesh m = mesh_of({2});
  Graph global;
  int gx = global.add_value(V("X", DType::kFloat32, {4, 4}));
  Value gw = V("W", DType::kFloat32, {4});
  gw.is_initializer = true;
  gw.data = std::make_shared<Tensor>(Tensor::from_floats({4}, {1, 2, 3, 4}));
  int gwi = global.add_value(gw);
  int gy = global.add_value(V("Y", DType::kFloat32, {4, 4}));
  global.inputs = {gx};
  global.outputs = {gy};

  SpmdProgram p;
  p.mesh = m;
  Graph& g = p.program;
  int x = g.add_value(V("x", DType::kFloat32, {2, 4}));
  Value w = V("w", DType::kFloat32, {4});
  w.is_initializer = true;
  int wi = g.add_value(w);
  Value c = V("c", DType::kFloat32, {2});
  c.is_initializer = true;
  c.data = std::make_shared<Tensor>(Tensor::from_floats({2}, {5, 6}));
  g.add_value(c);
  int a = g.add_value(V("a", DType::kFloat32, {4, 4}));
  int b = g.add_value(V("b", DType::kFloat32, {4, 4}));
  int y = g.add_value(V("y", DType::kFloat32, {2, 4}));
  Node n0 = gspmd_node("AllGather", {{"mesh_axes", std::vector<int64_t>{0}}, {"axis", int64_t{0}}});
  n0.inputs = {x};
  n0.outputs = {a};
  Node n1 = gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}});
  n1.inputs = {a};
  n1.outputs = {b};
  Node n2 = gspmd_node("ShardSlice",
                       {{"axis", int64_t{0}}, {"mesh_axes", std::vector<int64_t>{0}}, {"shard_size", int64_t{2}}});
  n2.inputs = {b};
  n2.outputs = {y};
  g.add_node(n0);
  g.add_node(n1);
  g.add_node(n2);
  g.inputs = {x};
  g.outputs = {y};
  p.inputs = {ProgramBinding{x, gx, split0(2, {0})}};
  p.params = {ProgramBinding{wi, gwi, TensorSharding::replicated(1)}};
  p.outputs = {ProgramBinding{y, gy, split0(2, {0})}};

  std::vector<float> xv(16);
  for (int i = 0; i < 16; ++i) xv[i] = static_cast<float>(i);
  std::vector<Tensor> inputs = {Tensor::from_floats({4, 4}, xv)};
  PodRun r = run_spmd(p, global, inputs);
  ASSERT_EQ(r.outputs.size(), 1u);
  std::vector<float> want(16);
  for (int i = 0; i < 16; ++i) want[i] = 2.f * static_cast<float>(i);
  EXPECT_EQ(vals(r.outputs[0]), want);
  ASSERT_EQ(r.devices.size(), 2u);
  for (const DeviceStats& s : r.devices) {
    EXPECT_EQ(s.peak_memory_bytes, 152) << "device " << s.device;
    EXPECT_GE(s.communication_wall_s, 0.0);
  }
  EXPECT_EQ(r.devices[1].device, 1);
  EXPECT_EQ(r.host_flops, 0.0);
  EXPECT_GT(r.wall_s, 0.0);

  // the param must have data in the global graph
  global.values[gwi].data.reset();
  EXPECT_THROW(run_spmd(p, global, inputs), InputError);
}

TEST(PodErrors, WrongInputs) {
  DeviceMesh m = mesh_of({2});
  Graph global;
  int gx = global.add_value(V("X", DType::kFloat32, {2, 2}));
  global.inputs = {gx};
  SpmdProgram p;
  p.mesh = m;
  EXPECT_THROW(run_spmd(p, global, {}), InputError);
  int x = p.program.add_value(V("x", DType::kFloat32, {1, 2}));
  p.program.inputs = {x};
  p.inputs = {ProgramBinding{x, gx, split0(2, {0})}};
  EXPECT_THROW(run_spmd(p, global, {Tensor(DType::kFloat32, {3, 2})}), InputError);
  EXPECT_THROW(run_spmd(p, global, {Tensor(DType::kInt64, {2, 2})}), InputError);
  EXPECT_NO_THROW(run_spmd(p, global, {Tensor(DType::kFloat32, {2, 2})}));
}

// ------------------------------------------------------------------------------------------------ ai.onnx nodes
Node onnx_node(const std::string& name, const std::string& op, std::vector<int> in, std::vector<int> out) {
  Node n;
  n.name = name;
  n.op_type = op;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// Y = X + C on one device. X 24 B (input), C 12 B (constant), Y 24 B: peak = 60.
TEST(PodSingle, RunSingleAdd) {
  Graph g;
  int x = g.add_value(V("X", DType::kFloat32, {2, 3}));
  Value c = V("C", DType::kFloat32, {3});
  c.is_initializer = true;
  c.data = std::make_shared<Tensor>(Tensor::from_floats({3}, {10, 20, 30}));
  int ci = g.add_value(c);
  int y = g.add_value(V("Y", DType::kFloat32, {2, 3}));
  g.add_node(onnx_node("add", "Add", {x, ci}, {y}));
  g.inputs = {x};
  g.outputs = {y};
  PodRun r = run_single(g, {Tensor::from_floats({2, 3}, {1, 2, 3, 4, 5, 6})});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(vals(r.outputs[0]), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].peak_memory_bytes, 60);
  EXPECT_EQ(r.host_flops, 6.0);  // one FLOP per output element
  EXPECT_GE(r.devices[0].compute_wall_s, 0.0);
}

TEST(PodSingle, KernelErrorsNameTheNodeUnsupportedPropagates) {
  Graph g;
  int x = g.add_value(V("X", DType::kFloat32, {2, 3}));
  int z = g.add_value(V("Z", DType::kFloat32, {4}));
  int y = g.add_value(V("Y", DType::kFloat32, {2, 3}));
  g.add_node(onnx_node("bad", "Add", {x, z}, {y}));
  g.inputs = {x, z};
  g.outputs = {y};
  std::vector<Tensor> in = {Tensor(DType::kFloat32, {2, 3}), Tensor(DType::kFloat32, {4})};
  try {
    run_single(g, in);
    FAIL() << "expected an error";
  } catch (const UnsupportedError& e) {
    FAIL() << "unexpected UnsupportedError: " << e.what();
  } catch (const InternalError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("node 'bad' (Add) on device 0: ", 0), 0u) << e.what();
  }
  g.nodes[0].op_type = "NoSuchOp";
  EXPECT_THROW(run_single(g, in), UnsupportedError);
}

// Megatron row-parallel matmul on 2 devices: X[2,4] split on dim 1, W[4,3] split on dim 0; the local MatMul gives a
// partial sum, AllReduce completes it; then Add of a replicated bias.
TEST(PodSpmd, RowParallelMatMulAllReduceAdd) {
  DeviceMesh m = mesh_of({2});
  Graph global;
  int gx = global.add_value(V("X", DType::kFloat32, {2, 4}));
  Value gw = V("W", DType::kFloat32, {4, 3});
  gw.is_initializer = true;
  gw.data = std::make_shared<Tensor>(Tensor::from_floats({4, 3}, {1, 0, 2, 0, 1, 1, 3, 1, 0, 1, 2, 1}));
  int gwi = global.add_value(gw);
  Value gb = V("B", DType::kFloat32, {3});
  gb.is_initializer = true;
  gb.data = std::make_shared<Tensor>(Tensor::from_floats({3}, {100, 200, 300}));
  int gbi = global.add_value(gb);
  int gy = global.add_value(V("Y", DType::kFloat32, {2, 3}));
  global.inputs = {gx};
  global.outputs = {gy};

  SpmdProgram p;
  p.mesh = m;
  Graph& g = p.program;
  int x = g.add_value(V("x", DType::kFloat32, {2, 2}));
  Value w = V("w", DType::kFloat32, {2, 3});
  w.is_initializer = true;
  int wi = g.add_value(w);
  Value b = V("b", DType::kFloat32, {3});
  b.is_initializer = true;
  int bi = g.add_value(b);
  int z = g.add_value(V("z", DType::kFloat32, {2, 3}));
  int s = g.add_value(V("s", DType::kFloat32, {2, 3}));
  int y = g.add_value(V("y", DType::kFloat32, {2, 3}));
  g.add_node(onnx_node("mm", "MatMul", {x, wi}, {z}));
  Node ar = gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{0}}, {"reduction", std::string("sum")}});
  ar.inputs = {z};
  ar.outputs = {s};
  g.add_node(ar);
  g.add_node(onnx_node("add", "Add", {s, bi}, {y}));
  g.inputs = {x};
  g.outputs = {y};
  TensorSharding xs = TensorSharding::replicated(2);
  xs.dims[1] = {0};
  p.inputs = {ProgramBinding{x, gx, xs}};
  p.params = {ProgramBinding{wi, gwi, split0(2, {0})}, ProgramBinding{bi, gbi, TensorSharding::replicated(1)}};
  p.outputs = {ProgramBinding{y, gy, TensorSharding::replicated(2)}};

  PodRun r = run_spmd(p, global, {Tensor::from_floats({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})});
  ASSERT_EQ(r.outputs.size(), 1u);
  // X.W = [[1+0+9+4, 0+2+3+8, 2+2+0+4], [5+0+21+8, 0+6+7+16, 10+6+0+8]] = [[14,13,8],[34,29,24]]
  EXPECT_EQ(vals(r.outputs[0]), (std::vector<float>{114, 213, 308, 134, 229, 324}));
  // FLOPs: MatMul 2*2*3*2 = 24 per device, Add 6 per device, two devices
  EXPECT_EQ(r.host_flops, 60.0);
  // peak per device: x 16 + w 24 + b 12 = 52 at start; +z 24 = 76 (x freed -> 60); +s 24 = 84 (z freed -> 60);
  // +y 24 = 84 (s freed -> 60)
  for (const DeviceStats& st : r.devices) EXPECT_EQ(st.peak_memory_bytes, 84);

  // run_single on the global graph gives the same numbers
  Graph single = global;
  int gz = single.add_value(V("Z", DType::kFloat32, {2, 3}));
  single.add_node(onnx_node("mm", "MatMul", {gx, gwi}, {gz}));
  single.add_node(onnx_node("add", "Add", {gz, gbi}, {gy}));
  PodRun r1 = run_single(single, {Tensor::from_floats({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})});
  EXPECT_EQ(vals(r1.outputs[0]), (std::vector<float>{114, 213, 308, 134, 229, 324}));
}

// 300 nodes on a 4x4 mesh: x <- Add(AllReduce_y(MatMul(x, I/4)), 0) a hundred times leaves x unchanged (exactly:
// x/4 summed over the 4 devices of y, which all hold the same x). Checks the loop scales (O(nodes * devices)).
TEST(PodSpmd, ThreeHundredNodesOnSixteenDevices) {
  DeviceMesh m = mesh_of({4, 4});
  Graph global;
  int gx = global.add_value(V("X", DType::kFloat32, {32, 64}));
  Value gw = V("W", DType::kFloat32, {64, 64});
  gw.is_initializer = true;
  Tensor wt(DType::kFloat32, {64, 64});
  for (int i = 0; i < 64; ++i) wt.data<float>()[i * 64 + i] = 0.25f;
  gw.data = std::make_shared<Tensor>(std::move(wt));
  int gwi = global.add_value(gw);
  int gy = global.add_value(V("Y", DType::kFloat32, {32, 64}));
  global.inputs = {gx};
  global.outputs = {gy};

  SpmdProgram p;
  p.mesh = m;
  Graph& g = p.program;
  int x = g.add_value(V("x", DType::kFloat32, {8, 64}));
  Value w = V("w", DType::kFloat32, {64, 64});
  w.is_initializer = true;
  int wi = g.add_value(w);
  Value zero = V("zero", DType::kFloat32, {64});
  zero.is_initializer = true;
  zero.data = std::make_shared<Tensor>(DType::kFloat32, Shape{64});
  int zi = g.add_value(zero);
  int cur = x;
  for (int i = 0; i < 100; ++i) {
    std::string k = std::to_string(i);
    int z = g.add_value(V("z" + k, DType::kFloat32, {8, 64}));
    int s = g.add_value(V("s" + k, DType::kFloat32, {8, 64}));
    int o = g.add_value(V("o" + k, DType::kFloat32, {8, 64}));
    g.add_node(onnx_node("mm" + k, "MatMul", {cur, wi}, {z}));
    Node ar = gspmd_node("AllReduce", {{"mesh_axes", std::vector<int64_t>{1}}});
    ar.name = "ar" + k;
    ar.inputs = {z};
    ar.outputs = {s};
    g.add_node(ar);
    g.add_node(onnx_node("add" + k, "Add", {s, zi}, {o}));
    cur = o;
  }
  g.inputs = {x};
  g.outputs = {cur};
  p.inputs = {ProgramBinding{x, gx, split0(2, {0})}};
  p.params = {ProgramBinding{wi, gwi, TensorSharding::replicated(2)}};
  p.outputs = {ProgramBinding{cur, gy, split0(2, {0})}};
  std::vector<float> xv(32 * 64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(i % 97) - 48.f;
  PodRun r = run_spmd(p, global, {Tensor::from_floats({32, 64}, xv)});
  EXPECT_EQ(vals(r.outputs.at(0)), xv);
  EXPECT_EQ(r.devices.size(), 16u);
  EXPECT_EQ(r.host_flops, 16.0 * 100 * (2.0 * 8 * 64 * 64 + 8 * 64));
  // resident: W 16384 + zero 256; x 2048; peak adds z/s/o of 2048 each at most two at a time
  for (const DeviceStats& st : r.devices) EXPECT_EQ(st.peak_memory_bytes, 16384 + 256 + 2048 + 2048);
  std::printf("300 nodes x 16 devices: %.3f s wall (compute %.3f s, collectives %.3f s per device 0)\n", r.wall_s,
              r.devices[0].compute_wall_s, r.devices[0].communication_wall_s);
}

}  // namespace
}  // namespace gspmd
