// core/partition: the partitioner (GSPMD paper §3.3-3.4), which produces the SPMD program (core/program/program.h),
// and the program's dims over the dim symbols.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/cost/target.h"
#include "core/ir/ir.h"
#include "core/program/program.h"
#include "core/propagation/propagation.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// For a graph `g` loaded with its dim symbols kept (Graph::dim_hints, LoadOptions::keep_symbols; docs/shapes.md):
/// gives every program value of `p` (partitioned from `g` at the hints) that depends on a symbol its local dims as
/// expressions (Value::sym): a shard keeps its global value's expression on each dim the program keeps whole, the
/// shape constants of `p.shape_of` take their value's dims as elements, and the other values follow with the
/// symbolic shape rules (core/shapes/symbolic.h); `p.program` gets g's dim_hints and dim_guards, then p's own
/// dim_guards. Nothing for a static
/// `g`. Throws UnsupportedError("value 'x': its dim 0 (batch) is split over the mesh, ...: bind it with --dim") for a
/// plan that splits a symbolic dim (not partitioned yet), and UnsupportedError from the symbolic rules.
void attach_program_symbols(SpmdProgram& p, const Graph& g);

/// The smallest size of each symbol that the program's own guards (SpmdProgram::dim_guards, lower bounds such as a
/// halo window's `height == max(height, 17)`) bound, each at the smallest value in [1, its hint] where every guard
/// over it alone holds (they are monotone in it). Guards over several symbols are left out, and so is a symbol
/// whose guards do not hold at its hint. Empty for a program without guards.
std::map<std::string, int64_t> smallest_sizes(const SpmdProgram& p, const DimBindings& hints);

/// The soundness check of a program over the dim symbols (docs/shapes.md): program `p` (partitioned from `g` at
/// its hints, with attach_program_symbols) is typed again at the dims `at` (other values of the same symbols): every
/// value's shape is its expression at `at`, every constant over the symbols its elements at `at`, and each node's
/// shape function (core/shapes/shapes.h; the gspmd ops' own shapes, program_ops.h) must give those shapes from its
/// inputs. A literal size that the hints froze (a Slice bound, a Reshape's shape without an expression behind it)
/// types differently and is caught, naming the node. The partitioner's cost-driven choices may differ at other sizes
/// (a reduce-scatter and an all-gather instead of one all-reduce); the one program is checked, not a second one.
/// Throws UnsupportedError("node 'n' (Op) computes [..] for 'v', which is [..] over the dims with the dims at
/// batch=101, ...: ...").
void check_symbolic_program(const SpmdProgram& p, const Graph& g, const DimBindings& at);

/// Partitions `g` with the shardings of `plan` (one per value) over `mesh` (GSPMD §3.4): per node, operands are
/// resharded to a factor assignment chosen from the rule, the op runs on local shapes, and split reduction factors
/// make the result unreduced; unreduced values stay so through linear consumers and are reduced (all-reduce) where
/// a consumer needs the full value. Ops without a rule fall back to all-gather + full computation, with a warning.
/// Reshards are the cheapest step sequences on `target` (ReshardPlanner, core/partition/reshard.h).
/// `rules`: the graph's rule table (core/rules/rule.h RuleTable, shared with propagation); built here when null.
/// `roles` (a training step's, core/cost/cost.h; null for a forward graph) marks the donated weights and state, whose
/// params get ProgramBinding::donated, and the step's forward passes (roles->forward_ranges: the forward pass and the
/// loss, one per microbatch with --accumulate): a copy that a reshard made larger than the value's primary shard (an
/// all-gather) is not reused outside the phase it was made in (MemoryRoles::phase: a forward pass, or the backward
/// pass after it), so the backward pass and the recomputed (--remat) nodes gather again, the mirror image of the
/// forward's gathers (GSPMD §5), and so does every microbatch, instead of keeping every layer's gathered weights and
/// activations alive from the forward to the backward, or from one microbatch to the next. Copies are reused freely
/// within a phase (the last one's at the outputs), and loaded weight slices always.
/// Throws UnsupportedError when an op can be neither partitioned nor replicated, std::invalid_argument when `rules`
/// was built for another graph.
class RuleTable;
struct MemoryRoles;
SpmdProgram partition(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh,
                      const Target& target = Target::load("tpu-v3"), const RuleTable* rules = nullptr,
                      const MemoryRoles* roles = nullptr);

}  // namespace gspmd
