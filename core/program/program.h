// core/program: the SPMD program (GSPMD paper §3.3-3.4), what the partitioner (core/partition) produces and the cost
// model (core/cost), the emulator and the exporters read.
//
// The program is ONE graph on local (per-shard, padded) shapes that every device runs; what differs between devices
// is only the partition id, read by the `gspmd` ops. Its size does not depend on the device count
// (docs/architecture.md, invariant 2): replica groups and per-device offsets are computed at run/export time from the
// mesh.
//
// The program's own ops (the `gspmd` domain: the collectives and the per-device ops that read the partition id) are
// defined, with their names, attributes and meaning, in core/program/program_ops.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/ir.h"
#include "core/program/program_ops.h"
#include "core/sharding/sharding.h"

namespace gspmd {

/// Links a value of the SPMD program to the global value it holds a shard of.
struct ProgramBinding {
  int local = -1;   // value id in SpmdProgram::program
  int global = -1;  // value id in the unpartitioned graph
  TensorSharding sharding;
  /// Params only: the step may free this weight slice after its last reader (a training step's weights and
  /// optimizer state, whose updated values are outputs: XLA's input-output aliasing, JAX's donate_argnums). Set by
  /// partition from the step's MemoryRoles::donated. The emulator and memory_breakdown (core/cost/cost.h) then free
  /// it after its last use instead of keeping it resident; export writes it as a graph input.
  bool donated = false;
};

/// One collective of the program, for the report and explain (docs/architecture.md, invariant 5).
struct CollectiveRecord {
  int node = -1;                             // node id in SpmdProgram::program
  Collective kind = Collective::kAllReduce;  // display it with collective_name (program_ops.h)
  std::vector<int> mesh_axes;
  int64_t bytes = 0;     // per-device payload of one execution: the larger of the local operand and result
  std::string for_node;  // name of the global node that needed it ("" for graph outputs)
  std::string value;     // name of the global value resharded
  std::string reason;    // e.g. "operand 0 of MatMul_12 is unreduced over {model}; Add needs the full value"
};

/// The partitioned model: one program for all devices plus how to feed and read it.
struct SpmdProgram {
  DeviceMesh mesh;
  Graph program;                        // local shapes; node names derive from the global node names
  std::vector<ProgramBinding> inputs;   // one per program.inputs, same order as the global graph inputs
  std::vector<ProgramBinding> params;   // program initializers that are per-device slices of a global initializer
                                        // (the program value has no data; slice with shard_tensor)
  std::vector<ProgramBinding> outputs;  // one per program.outputs, same order as the global outputs
  std::vector<CollectiveRecord> collectives;
  std::vector<std::string> warnings;            // replication fallbacks etc., each naming the node and tensor
  std::vector<TensorSharding> final_shardings;  // per global value: the sharding it actually has in the program
  std::vector<int> value_origin;  // per program value: the global value it holds a shard or copy of, -1 for
                                  // temporaries (index shapes, partition-id arithmetic, halo pieces)
  std::vector<int> node_origin;   // per program node: the global node it was emitted for, -1 for the reshards of
                                  // the graph outputs
  /// (constant, value) pairs of program value ids: the int64 constant holds the value's local shape (the shape
  /// operand of a Reshape or Expand, core/rules RuleMaker::shape_operand); attach_program_symbols gives it the
  /// value's dims as its elements.
  std::vector<std::pair<int, int>> shape_of;
  /// For a graph over dim symbols (Graph::dim_hints), per program value that holds a global value (value_origin >=
  /// 0): the number of shards of each of its dims (1 for a dim it holds whole); empty for the others, and empty
  /// altogether for a static graph. What a split symbolic dim's local size ceil(d / k) needs.
  std::vector<std::vector<int64_t>> value_tiles;
  /// An int attribute of a program node that is an expression over the dim symbols (a ShardSlice's shard_size
  /// ceil(batch / 2), a MaskPad's full_size batch): the node holds its value at the hints.
  struct SymbolicAttr {
    int node = -1;
    std::string attr;
    DimExpr expr;
  };
  std::vector<SymbolicAttr> sym_attrs;
  /// What the program assumes of the dim symbols beyond the model's own Graph::dim_guards, as equalities that hold
  /// at the sizes it serves: a halo window over a symbolic dim needs shards as wide as its halos
  /// (`height == max(height, 7)`). attach_program_symbols appends them to program.dim_guards.
  std::vector<std::pair<DimExpr, DimExpr>> dim_guards;
  /// The expression of node `node`'s attribute `attr`, or its value `value` when it has none.
  DimExpr attr_expr(int node, const std::string& attr, int64_t value) const;
};

/// A 64-bit fingerprint (FNV-1a) of the program's structure: the mesh (shape, axis names, device order), every value's
/// name, dtype, local shape and initializer flag, every node (op type, domain, name, inputs, outputs, attributes,
/// tensor attributes by content), and the input/param/output bindings with their shardings. Initializer data is NOT
/// included, so it is the same whether the model was loaded with or without its weights. Equal programs give equal
/// fingerprints in every process and on every host (no pointer or hash-seed dependence); it identifies the program
/// an exported device model belongs to (`gspmd.program_fingerprint`) and lets MPI ranks check they run the same one.
uint64_t program_fingerprint(const SpmdProgram& p);

/// FNV-1a 64 over `n` bytes, continuing from `h` (start with kFnvOffset). Used by program_fingerprint.
inline constexpr uint64_t kFnvOffset = 1469598103934665603ull;
uint64_t fnv1a(uint64_t h, const void* data, size_t n);

}  // namespace gspmd
