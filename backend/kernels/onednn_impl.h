// backend/kernels internal: what the oneDNN wrappers (onednn.cc, onednn_matmul.cc, onednn_conv.cc) share: the engine,
// the calling thread's stream, the process-wide primitive cache, plain memory descriptors and execution with a user
// scratchpad. The only header that includes dnnl.hpp; included only by onednn*.cc (the kernels use onednn.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include <omp.h>
#include <dnnl.hpp>

#include "backend/kernels/onednn.h"
#include "core/ir/ir.h"

namespace gspmd::dnn::detail {

using dnnl::memory;
using dt = dnnl::memory::data_type;

/// The process's CPU engine.
dnnl::engine& engine();
/// The calling thread's stream on engine() (oneDNN streams are not meant to be shared between threads).
dnnl::stream& stream();

/// Binary key: op kind + integers + floats, memcpy'd.
struct Key {
  std::string s;
  explicit Key(char kind) { s.push_back(kind); }
  Key& add(int64_t v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(float v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(const std::vector<int64_t>& v) {
    add(static_cast<int64_t>(v.size()));
    for (int64_t x : v) add(x);
    return *this;
  }
};

/// Thread-safe primitive cache. An empty primitive records "oneDNN has no implementation" for that key.
/// The key also holds the calling thread's OpenMP thread count: a primitive is specialised for the thread count it
/// was created with (the pod runs devices concurrently on one thread each, a single device on all threads).
class Cache {
 public:
  template <class Make>
  dnnl::primitive get(const Key& key, Make&& make, bool allow_unimplemented) {
    Key k = key;
    k.add(static_cast<int64_t>(omp_get_max_threads()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(k.s);
      if (it != map_.end()) return it->second;
    }
    dnnl::primitive p;
    try {
      p = make();
      ++created_;
    } catch (const dnnl::error& e) {
      if (!allow_unimplemented) throw InternalError(std::string("oneDNN: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (map_.size() >= kMaxEntries) map_.clear();
    map_.emplace(k.s, p);
    return p;
  }
  int64_t created() const { return created_; }

 private:
  std::atomic<int64_t> created_{0};
  static constexpr size_t kMaxEntries = 4096;
  std::mutex mu_;
  std::unordered_map<std::string, dnnl::primitive> map_;
};

/// The process-wide primitive cache.
Cache& cache();

memory::dims to_dims(const std::vector<int64_t>& v);

/// Element strides of a plain row-major layout of `d`.
memory::dims row_major_strides(const memory::dims& d);

/// A plain row-major float32 descriptor of `dims`.
memory::desc plain_md(const std::vector<int64_t>& dims);

/// A memory of descriptor `md` over the caller's buffer `p`.
memory mem(const memory::desc& md, const float* p);

/// Attributes of every primitive here: the caller provides the scratchpad (scratchpad_mode::user). With the library's
/// scratchpad, Debian's oneDNN (built without DNNL_ENABLE_CONCURRENT_EXEC) shares one buffer between primitives, and
/// the emulator's devices, which execute primitives concurrently on their own threads, corrupt each other's results.
dnnl::primitive_attr attrs();

/// The memory descriptor `what` (dnnl_query_src_md, dnnl_query_weights_md, ...) of primitive `p`; a zero
/// descriptor when it has none.
memory::desc query_md(const dnnl::primitive& p, dnnl_query_t what);

/// Executes `p` on this thread's stream with `args`, plus a scratchpad from a buffer of this thread (grown as needed)
/// when the primitive wants one.
void execute(dnnl::primitive& p, std::unordered_map<int, memory> args);

/// oneDNN's algorithm of a Binary op (binary, and matmul_fused's binary post-ops).
dnnl::algorithm binary_alg(Binary op);

}  // namespace gspmd::dnn::detail
