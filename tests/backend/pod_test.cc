// The pod (backend/pod/pod.cc): partition ops, errors, memory, single-device and SPMD runs.
#include "tests/backend/pod_test_util.h"

namespace gspmd {
namespace {

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
