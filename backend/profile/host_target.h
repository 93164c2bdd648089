// backend/profile: the measured "host" target preset (this machine as one device of the pod).
#pragma once

#include "core/cost/target.h"

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

/// CPUs this process may run on (sched_getaffinity; std::thread::hardware_concurrency as a fallback), >= 1.
int host_cores();
/// OpenMP threads a kernel uses here (omp_get_max_threads), >= 1.
int host_threads();

}  // namespace gspmd
