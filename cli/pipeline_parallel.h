// cli/pipeline_parallel: --pipeline's part of the command flow (compile_model, cli/compile.cc): the model rewritten
// into its pipelined form with the annotations carried over (core/pipeline), the microbatch count chosen with --auto,
// and --pipeline auto's search of the stage count (docs/pipeline.md).
#pragma once

#include <string>
#include <vector>

#include "cli/commands.h"

namespace gspmd::cli {

/// The trained weights of the pipelined graph `g` for those of the model, `trainable`: the stacked weights that stack
/// a trained layer weight, and the model's own weights that `g` keeps (the embedding, the head).
std::vector<std::string> pipelined_trainable(const std::vector<std::string>& trainable, const PipelineLayout& l,
                                             const Graph& g);

/// --pipeline AXIS: replaces p.graph by its pipelined form (core/pipeline/schedule.h), keeping the model as loaded in
/// p.reference for run --check, and returns the annotations `a` (read against the model) carried over to it.
/// Throws InputError for an AXIS that is not a mesh axis, a bad --schedule, the pipeline's own refusals
/// (pipeline_graph, pipeline_annotations) and --inputs with layer weights that are graph inputs.
Annotations apply_pipeline(Compiled& p, const CommonOptions& o, const Annotations& a, const ShapeFunction& shapes);

/// --pipeline auto (with --auto): the stage count S is searched. S = 1 is --auto's plan without a pipeline; every other
/// divisor S of the mesh's first axis of more than one device (up to 64) carves a stage axis out of it ([A, B] ->
/// [S, A/S, B]; [1, B] -> [S, 1, B/S]; the devices in the same order) and costs the real pipelined program, with the
/// fastest microbatch count (fastest_microbatches), under two plans: the S = 1 plan (its axes renumbered) and a plan
/// searched for S, --auto's search on the mesh each stage has ([A/S, B]) with S times the memory limit (a stage holds
/// about 1/S of the layers' weights, state and activations); each with its training choices. The plan that fits with
/// the shortest step wins; every count's better plan goes to Compiled::stage_search. The searches keep their best
/// plan when none fits (AutoOptions::best_if_none_fits), so that the stage counts are tried from it; when no count
/// fits either, the error names the closest.
/// Throws InputError without --auto, and when no stage count fits.
Compiled search_stages(const CommonOptions& o, bool load_data);

}  // namespace gspmd::cli
