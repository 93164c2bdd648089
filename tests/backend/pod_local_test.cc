// backend/pod: the CollectiveExecutor seam (collective_executor.h). The interpreter runs a subset of the devices
// (run_spmd_local) with its collectives handed to an executor: here every device runs in its own thread, and a
// rendezvous executor meets the members of each group, as the MPI backend does across processes. The outputs equal
// run_spmd's bit for bit, on a Megatron MLP (all-reduce) and on an uneven, halo-exchanging 1-D convolution-like
// program (collective-permute, padding) partitioned by the real partitioner.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "backend/pod/collective_executor.h"
#include "backend/pod/pod.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::GraphBuilder;
using testing::mesh_of;

/// Devices run one per thread; the members of a group wait for each other, the last to arrive computes every
/// member's result with InProcessCollectives.
class RendezvousCollectives final : public CollectiveExecutor {
 public:
  std::vector<Tensor> run(const CollectiveCall& call, const std::vector<int64_t>& members,
                          const std::vector<const Tensor*>& ins) override {
    EXPECT_EQ(members.size(), 1u);
    const size_t n = call.group->size();
    const auto key = std::make_pair(call.node, (*call.group)[0]);
    std::unique_lock<std::mutex> lock(m_);
    Meeting& mt = meetings_[key];
    mt.ins.resize(n, nullptr);
    mt.ins[static_cast<size_t>(members[0])] = ins[0];
    if (++mt.arrived == n) {
      std::vector<int64_t> all;
      for (size_t t = 0; t < n; ++t) all.push_back(static_cast<int64_t>(t));
      mt.outs = InProcessCollectives().run(call, all, mt.ins);
      mt.done = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return mt.done; });
    }
    std::vector<Tensor> out;
    out.push_back(std::move(mt.outs[static_cast<size_t>(members[0])]));
    if (++mt.taken == n) meetings_.erase(key);
    return out;
  }

 private:
  struct Meeting {
    std::vector<const Tensor*> ins;
    std::vector<Tensor> outs;
    size_t arrived = 0, taken = 0;
    bool done = false;
  };
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::pair<const Node*, int64_t>, Meeting> meetings_;
};

/// Runs every device of `p` in its own thread through run_spmd_local and assembles the outputs.
std::vector<Tensor> run_threaded(const SpmdProgram& p, const Graph& global, const std::vector<Tensor>& inputs,
                                 std::vector<DeviceStats>* stats = nullptr) {
  const int64_t N = p.mesh.num_devices();
  RendezvousCollectives coll;
  std::vector<LocalRun> runs(static_cast<size_t>(N));
  std::vector<std::string> errors(static_cast<size_t>(N));
  std::vector<std::thread> threads;
  for (int64_t d = 0; d < N; ++d)
    threads.emplace_back([&, d] {
      try {
        std::vector<std::vector<Tensor>> shards;
        for (size_t k = 0; k < p.inputs.size(); ++k) {
          int gk = -1;
          for (size_t i = 0; i < global.inputs.size(); ++i)
            if (global.inputs[i] == p.inputs[k].global) gk = static_cast<int>(i);
          shards.push_back({shard_tensor(inputs.at(static_cast<size_t>(gk)), p.inputs[k].sharding, p.mesh, d)});
        }
        runs[static_cast<size_t>(d)] = run_spmd_local(p, global, shards, {d}, coll);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(d)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  std::vector<Tensor> outs;
  for (size_t k = 0; k < p.outputs.size(); ++k) {
    std::vector<const Tensor*> shards;
    for (const LocalRun& r : runs) shards.push_back(&r.output_shards.at(k).at(0));
    outs.push_back(assemble_tensor(shards, p.outputs[k].sharding, p.mesh, global.values[p.outputs[k].global].shape));
  }
  if (stats)
    for (const LocalRun& r : runs) stats->push_back(r.devices.at(0));
  return outs;
}

SpmdProgram partition_with(const Graph& g, const DeviceMesh& mesh, const std::map<int, TensorSharding>& ann) {
  Annotations a;
  a.mesh = mesh;
  for (const auto& [v, s] : ann) a.by_value[v] = Annotation{s, 0, "test"};
  return partition(g, propagate(g, a), mesh);
}

TEST(PodLocal, MegatronMlpOneThreadPerDeviceEqualsRunSpmd) {
  GraphBuilder b;
  int x = b.input("x", {4, 6});
  int w1 = b.constant("w1", testing::rand_f({6, 8}, 1));
  int w2 = b.constant("w2", testing::rand_f({8, 6}, 2));
  int h = b.node("MatMul", {x, w1}, {4, 8});
  int r = b.node("Relu", {b.g.nodes[h].outputs[0]}, {4, 8});
  int y = b.node("MatMul", {b.g.nodes[r].outputs[0], w2}, {4, 6});
  b.g.outputs = {b.g.nodes[y].outputs[0]};
  DeviceMesh mesh = mesh_of({2, 2});
  TensorSharding xs = TensorSharding::replicated(2), w1s = TensorSharding::replicated(2),
                 w2s = TensorSharding::replicated(2);
  xs.dims[0] = {0};
  w1s.dims[1] = {1};
  w2s.dims[0] = {1};
  SpmdProgram p = partition_with(b.g, mesh, {{x, xs}, {w1, w1s}, {w2, w2s}});
  ASSERT_FALSE(p.collectives.empty());
  std::vector<Tensor> in = {testing::rand_f({4, 6}, 3)};
  PodRun ref = run_spmd(p, b.g, in);
  std::vector<DeviceStats> stats;
  std::vector<Tensor> got = run_threaded(p, b.g, in, &stats);
  ASSERT_EQ(got.size(), 1u);
  // Not bit-identical: run_spmd stacks the products of devices that share a weight slice into one matmul
  // (docs/executor.md), whose blocking sums in another order than one device's product.
  EXPECT_EQ(testing::compare_tensors(got[0], ref.outputs[0]), "");
  ASSERT_EQ(stats.size(), 4u);
  for (int64_t d = 0; d < 4; ++d) {
    EXPECT_EQ(stats[d].device, d);
    EXPECT_EQ(stats[d].peak_memory_bytes, ref.devices[d].peak_memory_bytes);
  }
}

TEST(PodLocal, UnevenHaloProgramOneThreadPerDeviceEqualsRunSpmd) {
  // x [1, 2, 7, 5] split along dim 2 over 3 devices (7 = 3+3+1: uneven), 3x3 convolution with padding 1: halo
  // exchange between neighbours and masked padding.
  GraphBuilder b;
  int x = b.input("x", {1, 2, 7, 5});
  int w = b.constant("w", testing::rand_f({4, 2, 3, 3}, 4));
  int c = b.node("Conv", {x, w}, {1, 4, 7, 5},
                 {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  b.g.outputs = {b.g.nodes[c].outputs[0]};
  DeviceMesh mesh = mesh_of({3});
  TensorSharding xs = TensorSharding::replicated(4);
  xs.dims[2] = {0};
  SpmdProgram p = partition_with(b.g, mesh, {{x, xs}});
  bool permute = false;
  for (const CollectiveRecord& r : p.collectives) permute |= collective_name(r.kind) == "collective-permute";
  EXPECT_TRUE(permute) << "no halo exchange in the program";
  std::vector<Tensor> in = {testing::rand_f({1, 2, 7, 5}, 5)};
  PodRun ref = run_spmd(p, b.g, in);
  std::vector<Tensor> got = run_threaded(p, b.g, in);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape, ref.outputs[0].shape);
  EXPECT_EQ(got[0].bytes, ref.outputs[0].bytes);
}

TEST(PodLocal, InProcessCollectivesNeedsEveryMember) {
  std::vector<int64_t> group = {0, 1};
  CollectiveCall call;
  call.op = Collective::kAllReduce;
  call.group = &group;
  Tensor t = Tensor::from_floats({1}, {1});
  EXPECT_THROW(InProcessCollectives().run(call, {0}, {&t}), InternalError);
}

}  // namespace
}  // namespace gspmd
