// The pod tests' helpers (tests/backend/pod_*_test.cc): programs built by hand, run on the emulated pod.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "backend/pod/collectives.h"
#include "backend/pod/pod.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {

using testing::mesh_of;
using testing::V;

inline TensorSharding split0(int rank, std::vector<int> axes) {
  TensorSharding s = TensorSharding::replicated(rank);
  s.dims[0] = std::move(axes);
  return s;
}

inline std::vector<int> all_axes(const DeviceMesh& m) {
  std::vector<int> a;
  for (int i = 0; i < m.rank(); ++i) a.push_back(i);
  return a;
}

inline Tensor floats(const Shape& s, std::vector<float> v) { return Tensor::from_floats(s, v); }

template <class T>
inline Tensor typed(DType dt, const Shape& s, std::vector<T> v) {
  Tensor t(dt, s);
  EXPECT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::memcpy(t.bytes.data(), v.data(), v.size() * sizeof(T));
  return t;
}

template <class T = float>
inline std::vector<T> vals(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.bytes.data(), v.size() * sizeof(T));
  return v;
}

// Tensors stacked along dim 0 (all the same type and shape) and the inverse.
inline Tensor stack0(const std::vector<Tensor>& ts) {
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
inline std::vector<Tensor> unstack0(const Tensor& t, int64_t n) {
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

inline Node gspmd_node(const std::string& op, std::map<std::string, AttrValue> attrs) {
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
inline std::vector<Tensor> run_node(const DeviceMesh& mesh, Node node, const std::vector<Tensor>& ins, DType out_type,
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
inline std::vector<Tensor> per_device(int64_t N, const Shape& s) {
  std::vector<Tensor> v;
  for (int64_t d = 0; d < N; ++d) {
    Tensor t(DType::kFloat32, s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(100 * d + i);
    v.push_back(std::move(t));
  }
  return v;
}

// ------------------------------------------------------------------------------------------------ AllReduce

}  // namespace gspmd
