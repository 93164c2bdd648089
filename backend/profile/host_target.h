// backend/profile: the measured "host" target preset (this machine as one device of the pod).
#pragma once

#include "core/cost/target.h"

namespace gspmd {

/// Measures this machine with the executor's own kernels and returns it as a Target named "host" (about 0.3 s, once
/// per process; later calls return the cached result):
///   peak_flops     f32 GFLOP/s of a 1024x1024x1024 oneDNN matmul (best of 5, with the OpenMP threads in effect);
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

}  // namespace gspmd
