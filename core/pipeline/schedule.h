// core/pipeline: pipeline parallelism the GSPMD way (GSPMD §3.3, docs/pipeline.md). The repeated layer blocks of a
// forward graph (blocks.h) become one vectorized stage computation (vectorize.h) whose weights are stacked along a
// stage dim; a loop of iterations, unrolled, runs it on a state buffer [stages, microbatch, ...] and shifts that
// buffer one stage on after every iteration (the Shift op, shift.h). Sharding the stage dim over a mesh axis (the
// annotations of pipeline_annotations) makes every device compute its own stage and every shift a
// collective-permute; the other mesh axes shard inside each stage as usual. Prefix (embedding) and suffix (final
// norm, head) are copied unchanged: the prefix runs replicated over the stage axis, the suffix with its batch split
// over it (pipeline_annotations).
//
// Schedules. GPipe: stage s runs the consecutive layers s*K .. s*K+K-1 (K = ceil(L/S)) in each iteration; microbatch
// m enters stage 0 at iteration m and leaves the last stage after iteration m+S-1; T = M+S-1 iterations.
// Circular (interleaved): stage s runs layers s, s+S, s+2S, ... (R = ceil(L/S) rounds, one layer per iteration),
// the state wrapping from the last stage to the first between rounds; microbatches enter in groups of S, group g at
// iterations g*R*S + j; T = ceil(M/S)*R*S + ... (exactly M*R+S-1 when S divides M).
// Layers that do not fill the stages (L not a multiple of S) are padding slots: they compute a copy of a real layer
// and the state passes them unchanged (a select). The bubble fraction is the share of stage-slot computations that
// are not one of the M*L real ones: 1 - M*L/(T*K*S), (S-1)/(M+S-1) for GPipe with S dividing L.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/propagation/propagation.h"

namespace gspmd {

enum class PipelineSchedule { kGpipe, kCircular };

/// --pipeline's choices (docs/cli.md).
struct PipelineOptions {
  int64_t stages = 2;        // S: the size of the pipeline axis
  int64_t microbatches = 1;  // M (--microbatches): must divide the batch
  PipelineSchedule schedule = PipelineSchedule::kGpipe;
  std::string layers;  // --layers REGEX (find_layer_blocks); "" = found by weight names
};

/// What pipeline_graph built, for explain, the report and the tests.
struct PipelineLayout {
  PipelineSchedule schedule = PipelineSchedule::kGpipe;
  int64_t stages = 0, microbatches = 0;
  int64_t layers = 0;            // L: layer blocks found
  int64_t layers_per_block = 1;  // P: the model's consecutive layers in one block (2 when dense and MoE alternate)
  int64_t rounds = 1;            // R: circular rounds (1 for GPipe)
  int64_t slots = 1;             // K: layers each stage runs per iteration (1 for circular)
  int64_t iterations = 0;        // T: iterations of the loop (each one shift, then K stacked layers)
  int64_t padded = 0;            // padding slots: S*R*K - L
  int64_t batch = 0, microbatch = 0;
  double bubble = 0;  // 1 - M*L / (T*K*S)
  /// A stacked weight: [S] + shape (GPipe) or [R, S] + shape (circular); members[i] is the layer weight of g at
  /// row-major position i over the lead dims ("" for a padding slot, which holds a copy of a real layer's).
  struct StackedWeight {
    std::string name;
    int stage_dim = 0;  // the dim of the stacked weight that the stage axis shards
    std::vector<std::string> members;
  };
  std::vector<StackedWeight> weights;
  /// A stage-stacked buffer a shift produces (dim 0 = stage) and the value of g whose microbatch rows it carries:
  /// the stream entering the first layer, or a computed side input travelling with it.
  struct State {
    std::string name, carries;
  };
  std::vector<State> states;
  std::vector<std::string> shifts;  // the Shift nodes, in order (one per iteration, then the last exit)
  /// Values of g inside the layer blocks (gone from the pipelined graph), each to block 0's value at the same place.
  std::map<std::string, std::string> block_values;
  /// Block 0's values to their copies in the pipelined graph, one per layer application: stage-stacked (one dim
  /// more), or unstacked for a value computed from constants only.
  std::map<std::string, std::vector<std::string>> block_instances;
  /// Values that live across iterations besides the state buffers: the microbatch rows waiting to enter and the
  /// results that left (what --remat keeps rather than recomputes, TrainingOptions::remat_keep).
  std::vector<std::string> carried_values;
  std::vector<std::vector<int64_t>> stage_layers;  // per stage: the layers it runs in order (-1: padding)
  int64_t prefix_nodes = 0, suffix_nodes = 0;
  std::string stream;  // the value of g entering the first block
  /// The value the microbatch results are gathered into for the suffix ([batch, ...], named as the last block's
  /// output of g, which it replaces).
  std::string results;

  /// The microbatch stage s computes in iteration t, or -1 when it idles (the bubble: warm-up, drain, or an empty
  /// slot of the last circular group).
  int64_t microbatch_at(int64_t t, int64_t s) const;
  /// The layer stage s runs in iteration t, slot k (-1: a padding slot).
  int64_t layer_at(int64_t t, int64_t s, int64_t k) const;
  /// A block named by its layers: "3", or "2-3" for a block of two layers; "padding" for -1.
  std::string block_name(int64_t layer) const;
};

/// A forward graph rewritten into the pipeline form.
struct PipelinedGraph {
  Graph graph;  // same inputs and outputs (names, order, types) as the original, same results
  PipelineLayout layout;
};

/// Builds the pipeline form of `g` (GSPMD §3.3, see above). `shapes` types the new nodes.
/// Throws InputError (one line, "--pipeline: ..." / "--microbatches: ...") when the graph has no repeated layer
/// blocks (find_layer_blocks' errors), fewer than 2 stages or microbatches < 1 are asked for, the batch (dim 0 of the
/// stream entering the first block) does not divide into the microbatches, a computed side input of the blocks
/// (a mask) does not lead with the batch, a graph output is computed inside the blocks, or a block op has no
/// batching rule (BlockStacker).
PipelinedGraph pipeline_graph(const Graph& g, const PipelineOptions& o, const ShapeFunction& shapes);

/// The batch a pipeline of `g` splits into microbatches: dim 0 of the stream entering the first layer block
/// (find_layer_blocks with `layers`, whose errors it throws).
int64_t pipeline_batch(const Graph& g, const std::string& layers = "");

/// The annotations of the pipelined graph from those of the original `g` (`a`, read by name against g): values that
/// both graphs have keep theirs; each stacked weight takes its members' annotation (which must agree) with the stage
/// dim sharded over mesh axis `axis`; a value inside the layer blocks gives its annotation, with the stage dim over
/// `axis` in front, to every stage-stacked copy of block 0's value at its place (a layer output's also to the
/// shifted state buffers), or as it is to the one copy of a value computed from constants; the other state buffers
/// get dim 0 over `axis` and their other dims, open, as `model_plan` (g propagated with `a`; propagated here when
/// null: O(rounds * edges * mesh rank)) shards the value they carry. The gathered results (PipelineLayout::results),
/// unless annotated, split their batch over the model plan's batch axes and then over `axis`, so that the suffix (the
/// head and a loss) runs on the stage axis as on one more data axis rather than replicated over it (the microbatch
/// results are concatenated microbatch-minor: each stage holds M/S of them, computed by the last stage). Throws
/// InputError naming the values when two layers' copies of a value, or a stacked weight's members, are annotated
/// differently.
Annotations pipeline_annotations(const Graph& g, const Annotations& a, const PipelinedGraph& p, int axis,
                                 const ShardingPlan* model_plan = nullptr);

/// "gpipe" / "circular".
const char* schedule_name(PipelineSchedule s);

}  // namespace gspmd
