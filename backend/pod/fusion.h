// backend/pod/fusion.h (private to backend/pod): the executor's matmul fusion and device stacking
// (docs/executor.md, "Fusion" and "Stacking devices that share weights"). A float32 MatMul and the elementwise nodes
// right after it that only refine its result (Add/Sub/Mul/Div by an operand that broadcasts into it, the erf GELU)
// run as one oneDNN matmul with post-ops; devices that hold the same weights run such a group as one stacked product.
// Both read the interpreter's state through FusionHost, which the Executor (executor.h) implements.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/kernels/onednn.h"
#include "core/ir/ir.h"

namespace gspmd::pod {

/// Consecutive program nodes that run as one oneDNN matmul with post-ops.
struct FusedGroup {
  int first = 0, last = 0;  // consecutive program nodes [first, last]; first is the MatMul
  int64_t a_batch = 1, b_batch = 1, m = 0, k = 0, n = 0;
  std::vector<dnn::PostOp> post;
  std::vector<int> operand;  // per post-op: the value read by a binary post-op (-1 for GELU)
  std::string label;         // "MatMul+Add+Gelu"
};

/// What fusion needs from the interpreter: the program, the local devices' values, parallel execution and errors.
/// Devices are local indices in [0, devices()).
class FusionHost {
 public:
  virtual ~FusionHost() = default;
  virtual const Graph& program() const = 0;
  /// Local devices (every one runs every group).
  virtual int64_t devices() const = 0;
  /// Devices that run concurrently, each on one OpenMP thread (1 = one after another).
  virtual int parallelism() const = 0;
  /// Value v stays bound for the whole run (a weight or a program constant).
  virtual bool resident(int v) const = 0;
  /// Value v is kept to the end (a program output).
  virtual bool kept(int v) const = 0;
  /// Device d's value v, or nullptr when it is not live.
  virtual const Tensor* value(int64_t d, int v) const = 0;
  /// Device d's input k of node n; throws (as fail) when it is not available.
  virtual const Tensor* input(const Node& n, int64_t d, size_t k) const = 0;
  /// Throws InternalError "node 'X' (Op) on device k: <what>".
  [[noreturn]] virtual void fail(const Node& n, int64_t d, const std::string& what) const = 0;
  /// f(i) for i in [0, count), up to parallelism() at a time; rethrows the lowest index's exception.
  virtual void parallel_for(int64_t count, const std::function<void(int64_t)>& f) = 0;
  /// Adds `seconds` of kernel time to device d's compute_wall_s.
  virtual void add_compute_s(int64_t d, double seconds) = 0;
};

/// The fused groups of host.program(), in program order and disjoint, planned from the program's declared shapes (so
/// every device runs the same groups) and from the resident scalars every device holds alike (the GELU's and scales'
/// constants). A plain MatMul is a group of its own when several devices may stack its product. Checks each group
/// with oneDNN (dnn::matmul_fused_supported) at the thread count the devices run with.
std::vector<FusedGroup> plan_fusion(FusionHost& host);

/// Runs group `g` on every local device and returns each device's result (the value of the group's last node, on its
/// declared shape). With `stack` (ExecutorOptions::stack), devices holding the same B and the same broadcast post-op
/// operands run one product over their stacked A's. Errors name the group's MatMul and a device (FusionHost::fail).
std::vector<Tensor> run_fused_group(FusionHost& host, const FusedGroup& g, bool stack);

}  // namespace gspmd::pod
