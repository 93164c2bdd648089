// backend/profile: the measured "host" target preset (this machine as one device of the pod).
#pragma once

#include <cstdint>
#include <string>

#include "core/cost/target.h"
#include "core/ir/ir.h"
#include "core/partition/spmd.h"

namespace gspmd {

/// Measures this machine with the executor's own kernels and returns it as a Target named "host" (about 0.3 s, once
/// per process; later calls return the cached result):
///   contraction_curve  FLOP/s of square f32 oneDNN matmuls of 64, 128, 256, 512 and 1024 (best of 20 or 5, with the
///                  OpenMP threads in effect), made non-decreasing; peak_flops is its last point;
///   conv_efficiency  a 3x3 64->64-channel convolution on 56x56 (231 MFLOP) against the curve at its FLOPs (<= 1);
///   hbm_bandwidth  bytes read + written per second by a oneDNN ReLU over 32 Mi floats (best of 3), the executor's
///                  memory-bound path;
///   hbm_bytes      physical memory (sysconf);
///   link_bandwidth bytes per second of a 64 MiB memcpy (best of 3): the emulator's collectives and MPI's shared
///                  memory transport are copies;
///   link_latency   1 us (an assumption, not measured: docs/cost-model.md);
///   op_overhead    seconds per op of a chain of 256 Relu nodes on 16 floats through run_single (best of 3): the
///                  executor's fixed cost per node;
///   topology       "ring", links_per_axis 1 (all devices share one memory system).
/// The per-dtype peaks stay 0 (= peak_flops): f16/bf16/int8 kernels compute in f32 here. Never throws.
Target measure_host_target();

/// How steady measure_program_ops' timings were: per op, its slowest timed call over its fastest. On a quiet machine
/// with as many OpenMP threads as cores, repeats agree within a few times; a machine that is busy, or that runs more
/// threads than it has cores (oversubscription: a thread of a kernel descheduled while the others spin at its
/// barrier), makes calls of one op 10x to 100x apart, and the measured step with them.
struct MeasureSpread {
  int ops = 0;           // ops timed
  int unsteady = 0;      // ops whose slowest call took more than kUnsteadySpread times their fastest
  double worst = 1;      // the largest slowest / fastest ratio
  std::string worst_op;  // that op's type
  static constexpr double kUnsteadySpread = 4;
};

/// The summary's warning about `--target host`'s numbers, or "" when they look repeatable: OpenMP running more
/// `threads` than `cores` (oversubscription), or more than a tenth of the ops (and at least 2) with repeats more
/// than MeasureSpread::kUnsteadySpread apart (a busy machine; one small op's slow repeat is noise). E.g. "host: 3 of 12
/// measured ops varied more than 4x between repeats (worst 37.2x, a MatMul): the machine is busy, so the host times may
/// not repeat".
std::string host_spread_warning(const MeasureSpread& s, int threads, int cores);

/// Measures every distinct op of `p.program` (by op_signature, core/cost/cost.h) on this machine and adds its time to
/// `t.measured_ops`, divided by `share` (the fraction of a core this process gets when it runs: 1 alone, 0.5 for two
/// ranks per core). Each op runs through run_kernel, the executor's kernels, on inputs of its shapes: the program's
/// constant data where it has it, otherwise 0.5 in floating-point inputs and 0 in the others. Constants and params
/// replicated over the mesh are passed with an owner, as the executor binds them, so a convolution's weights are
/// reordered once (in the warm-up) and not in the timed calls; sliced params are reordered every call, as in a run.
/// One warm-up call (oneDNN creates its primitive), then the median of 5 calls (3 once they took 20 ms), each with
/// its inputs evicted from the caches first (clflush, on x86): operands come from memory, as the roofline assumes and
/// as in a program whose working set exceeds the caches. Seconds.
/// Skipped, and left to the roofline: gspmd ops (collectives and partition-id ops), signatures already in the table,
/// ops whose inputs need more than `max_input_bytes` of fresh memory, ops whose kernel throws (unsupported, or data
/// the placeholder values make invalid), and everything once `budget_s` seconds of measuring have passed. Returns
/// the number of signatures added. Never throws.
/// `spread` (optional) receives how steady the timed calls were (MeasureSpread).
int measure_program_ops(const SpmdProgram& p, Target& t, double share = 1, double budget_s = 5,
                        int64_t max_input_bytes = int64_t{1} << 30, MeasureSpread* spread = nullptr);

/// CPUs this process may run on: sched_getaffinity (std::thread::hardware_concurrency as a fallback), capped by the
/// cgroup's CPU quota when it has one (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us, rounded up: a
/// container limited to 2 CPUs on a 64-core host has 2), >= 1.
int host_cores();
/// Without OMP_NUM_THREADS, caps OpenMP's threads at host_cores(): OpenMP starts one thread per online CPU, which in a
/// CPU-limited container oversubscribes the quota (docs/executor.md, "Threads"). Returns the threads in effect.
int limit_threads_to_cores();
/// OpenMP threads a kernel uses here (omp_get_max_threads), >= 1.
int host_threads();

}  // namespace gspmd
