// Pipeline parallelism (core/pipeline/schedule.h): the pipelined graph computes what the model computes, on one
// device and partitioned over a stage axis, and its collectives are the shifts counted by hand.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "backend/pod/pod.h"
#include "core/ir/shift_op.h"
#include "core/partition/spmd.h"
#include "core/pipeline/schedule.h"
#include "tests/e2e/e2e_util.h"
#include "tests/frontend/frontend_test_util.h"

namespace gspmd {
namespace {

using e2e::make_decoder;
using e2e::scratch;
namespace fs = std::filesystem;

double worst_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    EXPECT_EQ(a[k].shape, b[k].shape);
    if (a[k].shape != b[k].shape || a[k].dtype != DType::kFloat32) continue;
    for (int64_t i = 0; i < a[k].numel(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(a[k].data<float>()[i] - b[k].data<float>()[i])));
  }
  return worst;
}

struct Case {
  std::string model;
  PipelineOptions o;
};

// The pipelined graph on one device (the Shift kernel) equals the model: GPipe and circular, microbatched, with
// layer counts that do not divide by the stages.
TEST(PipelineSchedule, OneDeviceComputesTheModel) {
  const fs::path d = scratch("pipeline_schedule");
  const fs::path dec5 = make_decoder(d, "d5",
                                     "--layers 5 --d-model 32 --heads 4 --vocab 64 --batch 4 --seq 8 "
                                     "--weights random",
                                     "pipeline_schedule_make5");
  const std::string gpt = "testdata/gpt/gpt_opset17.onnx", bert = "testdata/bert/bert_opset17.onnx";
  const std::vector<Case> cases = {
      {gpt, {.stages = 2, .microbatches = 2}},
      {gpt, {.stages = 2, .microbatches = 4, .schedule = PipelineSchedule::kCircular}},
      {gpt, {.stages = 4, .microbatches = 8}},
      {bert, {.stages = 2, .microbatches = 2}},
      {dec5.string(), {.stages = 2, .microbatches = 2}},
      {dec5.string(), {.stages = 2, .microbatches = 4, .schedule = PipelineSchedule::kCircular}},
      {dec5.string(), {.stages = 3, .microbatches = 2, .schedule = PipelineSchedule::kCircular}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model + " " + schedule_name(c.o.schedule) + " S=" + std::to_string(c.o.stages) +
                 " M=" + std::to_string(c.o.microbatches));
    const Graph g = load_model(c.model, test::load_opts());
    const PipelinedGraph p = pipeline_graph(g, c.o, test::load_opts().shape_function);
    const std::vector<Tensor> in = e2e::small_inputs(g);
    EXPECT_LT(worst_diff(run_single(p.graph, in).outputs, run_single(g, in).outputs), 1e-4);
  }
}

// The schedule's arithmetic, by hand.
TEST(PipelineSchedule, LayoutCountsIterationsSlotsAndTheBubble) {
  const Graph g = load_model("testdata/gpt/gpt_opset17.onnx", test::load_opts());
  {
    const PipelineLayout l =
        pipeline_graph(g, {.stages = 2, .microbatches = 4}, test::load_opts().shape_function).layout;
    EXPECT_EQ(l.iterations, 5);  // M + S - 1
    EXPECT_EQ(l.slots, 1);
    EXPECT_EQ(l.padded, 0);
    EXPECT_EQ(l.microbatch, 2);
    EXPECT_DOUBLE_EQ(l.bubble, 1.0 / 5.0);  // (S-1)/(M+S-1)
    EXPECT_EQ(l.shifts.size(), 6u);         // one per iteration, then the last microbatch's exit
    EXPECT_EQ(l.stage_layers, (std::vector<std::vector<int64_t>>{{0}, {1}}));
    // docs/pipeline.md's table: stage 0 holds m0..m3 in iterations 0..3, stage 1 in 1..4.
    for (int64_t t = 0; t < 5; ++t) {
      EXPECT_EQ(l.microbatch_at(t, 0), t < 4 ? t : -1);
      EXPECT_EQ(l.microbatch_at(t, 1), t >= 1 ? t - 1 : -1);
      EXPECT_EQ(l.layer_at(t, 1, 0), 1);
    }
  }
  {
    // Four stages for two layers: two padding stages, which still take their turn.
    const PipelineLayout l =
        pipeline_graph(g, {.stages = 4, .microbatches = 8}, test::load_opts().shape_function).layout;
    EXPECT_EQ(l.iterations, 11);
    EXPECT_EQ(l.padded, 2);
    EXPECT_DOUBLE_EQ(l.bubble, 1.0 - 16.0 / 44.0);
    EXPECT_EQ(l.stage_layers, (std::vector<std::vector<int64_t>>{{0}, {1}, {-1}, {-1}}));
  }
}

/// One partitioned pipeline: model, sharding file (its mesh's axis 0 is the stage axis), options, and the collectives
/// expected: per (kind, mesh axes) the count and the bytes of each.
struct Partitioned {
  std::string model, shardings;
  PipelineOptions o;
  struct Expect {
    Collective kind;
    std::vector<int> axes;
    int count;
    std::vector<int64_t> bytes;  // the distinct sizes, ascending
  };
  std::vector<Expect> expect;
};

SpmdProgram check_partitioned(const Partitioned& c) {
  SCOPED_TRACE(c.model + " " + schedule_name(c.o.schedule) + " S=" + std::to_string(c.o.stages) +
               " M=" + std::to_string(c.o.microbatches));
  const Graph g = load_model(c.model, test::load_opts());
  const Annotations a = read_sharding_file(c.shardings, g, nullptr);
  const PipelinedGraph p = pipeline_graph(g, c.o, test::load_opts().shape_function);
  const Annotations pa = pipeline_annotations(g, a, p, 0);
  const SpmdProgram prog = partition(p.graph, propagate(p.graph, pa), pa.mesh);
  const std::vector<Tensor> in = e2e::small_inputs(g);
  EXPECT_LT(worst_diff(run_spmd(prog, p.graph, in).outputs, run_single(g, in).outputs), 1e-4);
  std::map<std::pair<Collective, std::vector<int>>, std::pair<int, std::set<int64_t>>> got;
  for (const CollectiveRecord& r : prog.collectives) {
    auto& e = got[{r.kind, r.mesh_axes}];
    ++e.first;
    e.second.insert(r.bytes);
  }
  std::map<std::pair<Collective, std::vector<int>>, std::pair<int, std::set<int64_t>>> want;
  for (const auto& e : c.expect) want[{e.kind, e.axes}] = {e.count, {e.bytes.begin(), e.bytes.end()}};
  EXPECT_EQ(got, want);
  return prog;
}

constexpr Collective kPermute = Collective::kCollectivePermute, kAllReduce = Collective::kAllReduce,
                     kReduceScatter = Collective::kReduceScatter;

// The bundled GPT (2 layers, batch 8, seq 64, d_model 128) on stage 2 x model 2 with Megatron inside each stage:
// exact, and the collectives are
// - the shifts: one collective-permute over stage per iteration (T = M + S - 1 = 5) but the first, which shifts the
//   zero initial state (no data moves), of the local state, a microbatch [1, 2, 64, 128] of float32 = 65,536 bytes;
// - Megatron's two all-reduces over model per layer, now per iteration on one microbatch (65,536 bytes), plus the
//   embedding's (262,144 bytes) as without the pipeline;
// - one reduce-scatter over stage of each microbatch's results [2, 64, 128] (65,536 bytes) as it leaves the last
//   stage: the head runs with its batch split over stage (each stage takes one row of every microbatch), not
//   replicated over it.
TEST(PipelineSchedule, PartitionedGptShiftsOncePerIteration) {
  check_partitioned(
      {"testdata/gpt/gpt_opset17.onnx",
       "testdata/gpt/gpt.pipeline.sharding.json",
       {.stages = 2, .microbatches = 4},
       {{kPermute, {0}, 4, {65536}}, {kAllReduce, {1}, 11, {65536, 262144}}, {kReduceScatter, {0}, 4, {65536}}}});
}

// Circular on a 4-layer decoder over 2 stages: stage 0 runs layers 0 and 2, stage 1 layers 1 and 3 (R = 2 rounds).
// Microbatches enter at iterations 0 and 1 and leave after 4 and 5: T = M*R + S - 1 = 5 shifts, 4 of which move data
// (not the first: zeros), two of them cyclic (iterations 2 and 3 hand the last stage's state back to the first); each
// moves [1, 1, 8, 32] floats = 1,024 bytes. The results [2, 8, 32] (2,048 bytes; microbatches of one row) reach the
// head, whose batch is split over stage, in one reduce-scatter.
TEST(PipelineSchedule, PartitionedCircularDecoderWrapsBetweenRounds) {
  const fs::path d = scratch("pipeline_circular");
  const fs::path dec = make_decoder(d, "d4",
                                    "--layers 4 --d-model 32 --heads 4 --vocab 64 --batch 2 --seq 8 "
                                    "--weights random",
                                    "pipeline_circular_make");
  std::ofstream(d / "stage.sharding.json") << R"({"mesh": {"shape": [2], "axes": ["stage"]}, "tensors": {}})";
  const PipelineOptions o{.stages = 2, .microbatches = 2, .schedule = PipelineSchedule::kCircular};
  const PipelineLayout l =
      pipeline_graph(load_model(dec.string(), test::load_opts()), o, test::load_opts().shape_function).layout;
  EXPECT_EQ(l.rounds, 2);
  EXPECT_EQ(l.iterations, 5);
  EXPECT_DOUBLE_EQ(l.bubble, 1.0 - 8.0 / 10.0);  // (S-1)/(M*R+S-1)
  EXPECT_EQ(l.stage_layers, (std::vector<std::vector<int64_t>>{{0, 2}, {1, 3}}));
  // docs/pipeline.md's circular table: (microbatch, layer) per iteration and stage.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> table = {
      {{0, 0}, {1, 0}, {0, 2}, {1, 2}, {-1, 0}},   // stage 0
      {{-1, 1}, {0, 1}, {1, 1}, {0, 3}, {1, 3}}};  // stage 1
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t t = 0; t < 5; ++t) {
      SCOPED_TRACE(fmt::format("t{} stage {}", t, s));
      const auto [m, layer] = table[static_cast<size_t>(s)][static_cast<size_t>(t)];
      EXPECT_EQ(l.microbatch_at(t, s), m);
      if (m >= 0) EXPECT_EQ(l.layer_at(t, s, 0), layer);
    }
  const SpmdProgram prog = check_partitioned({dec.string(),
                                              (d / "stage.sharding.json").string(),
                                              o,
                                              {{kPermute, {0}, 4, {1024}}, {kReduceScatter, {0}, 1, {2048}}}});
  int cyclic = 0;
  for (const Node& n : prog.program.nodes)
    if (collective_of(n) == kPermute) cyclic += collective_attrs(n).wrap;
  EXPECT_EQ(cyclic, 2);
}

}  // namespace
}  // namespace gspmd
